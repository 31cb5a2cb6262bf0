"""Unit names people know: a fallback unit shown with what it reads (DESIGN §2: a unit is a
set of subtasks; its sources' splits are what a user recognises).

`unit_name` is the one way a unit is named wherever it is shown: progress lines, events,
errors, the HTML report and `regional inspect ROOT lag`. A Kafka split is
``<topic>:<partition>``, a file split the file's name, so the names read
``unit 3 (events:3)`` or ``unit 0 (clicks-07.jsonl)``; a unit that reads no split (downstream of
a keyed exchange) is named by its number alone.

>>> unit_name(3, ["events:3"]), unit_name(0, ["clicks-07.jsonl"]), unit_name(5)
('unit 3 (events:3)', 'unit 0 (clicks-07.jsonl)', 'unit 5')
>>> unit_name(1, ["a:0", "a:4", "a:1", "a:5"])
'unit 1 (a:0, a:1, a:4 +1 more)'
>>> from metadata.model import SplitState
>>> unit_reads([SubtaskState("src", 1, 1, split_states=(SplitState("a:1", b"7"),))])
('a:1',)
"""

from __future__ import annotations

from collections.abc import Iterable

from metadata.model import SubtaskState

__all__ = ["SHOWN_SPLITS", "unit_name", "unit_reads"]

#: How many splits a name lists before it says how many more there are.
SHOWN_SPLITS = 3


def unit_name(unit_id: int, reads: Iterable[str] = (), limit: int = SHOWN_SPLITS) -> str:
    """``unit <id> (<split>, ...)``: the unit and the splits it reads (sorted, the first
    `limit`), or ``unit <id>`` when it reads none."""
    splits = sorted(set(reads))
    if not splits:
        return f"unit {unit_id}"
    more = f" +{len(splits) - limit} more" if len(splits) > limit else ""
    return f"unit {unit_id} ({', '.join(splits[:limit])}{more})"


def unit_reads(subtasks: Iterable[SubtaskState]) -> tuple[str, ...]:
    """The split ids in the split states of `subtasks` (one unit's), sorted, each once."""
    return tuple(sorted({s.split_id for t in subtasks for s in t.split_states}))
