"""The dead letters of a job, counted by operator and reason (`regional inspect ROOT dead-letters`).

A dead-letter row (`regional.dataflow.dead_letters.DEAD_LETTER_SCHEMA`) names the operator that
set the record aside, the error, the split and position its epoch started reading at, and the
record's index there. This view reads the committed rows of the job's dead-letter sinks (their
location is recorded in every checkpoint, `CheckpointMetadata.sinks`) and groups them:

* **reason** (`reason_of`): ``late`` (behind the watermark: windows, joins, deduplication),
  ``bad event time`` (no usable event time), ``undecodable`` (a source could not decode the
  record), ``user function error`` (anything a user function raised);
* per (operator, reason, error type): how many, the checkpoints they came in, and samples with
  the split and position in the source's own terms (`regional.graph.unit_names`: ``events
  partition 3`` at ``offset 20 + record 2``, ``orders-03.jsonl`` at ``line 8``).

A record late for two window operators is a dead letter of each: it is counted once per
operator that judged it.

>>> import pyarrow as pa
>>> rows = pa.Table.from_pylist([
...     {"checkpoint_id": 3, "operator": "minutes", "split_id": "a", "split_position": "10",
...      "record_index": 2, "record": '{"n": 1}', "error_type": "LateRecord",
...      "error_message": "...", "traceback": ""},
...     {"checkpoint_id": 5, "operator": "minutes", "split_id": "a", "split_position": "30",
...      "record_index": 0, "record": '{"n": 9}', "error_type": "LateRecord",
...      "error_message": "...", "traceback": ""}])
>>> view = dead_letter_view(rows, samples=1)
>>> view.select(["operator", "reason", "records", "checkpoints", "split", "position"]).to_pylist()
[{'operator': 'minutes', 'reason': 'late', 'records': 2, 'checkpoints': '3-5', 'split': 'a', \
'position': 'position 10 + record 2'}]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

import pyarrow as pa

from regional.graph.unit_names import at_text, split_text

__all__ = [
    "DEAD_LETTER_VIEW_SCHEMA",
    "REASONS",
    "REASON_COUNTS_SCHEMA",
    "dead_letter_view",
    "reason_counts",
    "reason_of",
]

#: The reasons, in the order the view lists them.
REASONS = ("late", "bad event time", "undecodable", "user function error")
_SAMPLE_CHARS = 120


def reason_of(error_type: str) -> str:
    """Why a record is a dead letter, from its error type.

    >>> [reason_of(t) for t in ("LateRecord", "EventTimeError", "KafkaSourceError", "KeyError")]
    ['late', 'bad event time', 'undecodable', 'user function error']
    """
    if error_type == "LateRecord":
        return "late"
    if error_type == "EventTimeError":
        return "bad event time"
    if error_type.endswith("SourceError"):
        return "undecodable"
    return "user function error"


DEAD_LETTER_VIEW_SCHEMA = pa.schema(
    [
        ("operator", pa.string()),
        ("reason", pa.string()),
        ("error_type", pa.string()),
        ("records", pa.int64()),
        ("checkpoints", pa.string()),
        ("split", pa.string()),
        ("position", pa.string()),
        ("sample", pa.string()),
        ("error", pa.string()),
    ]
)


def _cut(text: str) -> str:
    return text if len(text) <= _SAMPLE_CHARS else text[: _SAMPLE_CHARS - 3] + "..."


def dead_letter_view(
    rows: pa.Table, *, samples: int = 1, exchanges: Mapping[str, str] | None = None
) -> pa.Table:
    """One row per sample (up to `samples` per group, in checkpoint order) of every (operator,
    reason, error type) group of dead-letter `rows`: the group's count and checkpoint range,
    then the sample's split and position in its source's terms (`split_text`, `at_text`: the
    position its epoch started at and the record's index after it; an exchange partition
    named by the exchange the operator reads, `exchanges`: operator -> exchange), record and
    error message (its first line; both cut to 120 characters)."""
    exchanges = exchanges or {}
    groups: dict[tuple[str, str, str], list[dict[str, object]]] = {}
    ordered = sorted(
        rows.to_pylist(),
        key=lambda r: (r["checkpoint_id"], r["split_id"], r["record_index"]),
    )
    for r in ordered:
        error_type = str(r["error_type"])
        key = (str(r["operator"]), reason_of(error_type), error_type)
        groups.setdefault(key, []).append(r)
    out = []
    for (operator, reason, error_type), members in sorted(
        groups.items(), key=lambda g: (g[0][0], REASONS.index(g[0][1]), g[0][2])
    ):
        first, last = members[0]["checkpoint_id"], members[-1]["checkpoint_id"]
        span = str(first) if first == last else f"{first}-{last}"
        for r in members[: max(samples, 1)]:
            record = str(r["record"])
            message = str(r["error_message"]).splitlines()
            out.append(
                {
                    "operator": operator,
                    "reason": reason,
                    "error_type": error_type,
                    "records": len(members),
                    "checkpoints": span,
                    "split": split_text(str(r["split_id"]), exchanges.get(operator)),
                    "position": at_text(
                        str(r["split_id"]),
                        str(r["split_position"] or ""),
                        int(cast(int, r["record_index"])),
                    ),
                    "sample": _cut(record),
                    "error": _cut(message[0] if message else ""),
                }
            )
    return pa.Table.from_pylist(out, schema=DEAD_LETTER_VIEW_SCHEMA)


#: Per (operator, reason): the dead letters of its groups, every error type together.
REASON_COUNTS_SCHEMA = pa.schema(
    [
        pa.field("operator", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("records", pa.int64(), nullable=False),
    ]
)


def reason_counts(view: pa.Table) -> pa.Table:
    """The dead letters per (operator, reason) of a `dead_letter_view` (each group counted
    once however many samples it shows), in the view's order: operator, then `REASONS`.

    >>> view = pa.Table.from_pylist([
    ...     {"operator": "parse", "reason": "user function error", "error_type": "KeyError",
    ...      "records": 2},
    ...     {"operator": "parse", "reason": "user function error", "error_type": "KeyError",
    ...      "records": 2},
    ...     {"operator": "parse", "reason": "user function error", "error_type": "ValueError",
    ...      "records": 3}], schema=DEAD_LETTER_VIEW_SCHEMA)
    >>> reason_counts(view).to_pylist()
    [{'operator': 'parse', 'reason': 'user function error', 'records': 5}]
    """
    groups: dict[tuple[str, str, str], int] = {}
    for r in view.to_pylist():
        groups[r["operator"], r["reason"], r["error_type"]] = r["records"]
    counts: dict[tuple[str, str], int] = {}
    for (operator, reason, _), n in groups.items():
        counts[operator, reason] = counts.get((operator, reason), 0) + n
    return pa.Table.from_pylist(
        [{"operator": o, "reason": r, "records": n} for (o, r), n in counts.items()],
        schema=REASON_COUNTS_SCHEMA,
    )
