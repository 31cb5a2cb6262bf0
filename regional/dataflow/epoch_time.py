"""What an event-time operator knows of time in one epoch of one unit (`EpochTime`).

Every record reaching an operator comes with its **origin watermark**: the watermark of the
place it was read at *before* the epoch that read it (a source split's, or for a record that
crossed a durable exchange, its writer subtask's watermark before the epoch that wrote it).
It is a deterministic function of the data and positions of the record's own unit, so the
late-data rule (`regional.dataflow.windows`), judged against it, gives the same verdict
whichever units fell back when. Windows and event-time timers of a *scope* (a split on a
forward chain, `KEY_SCOPE` after an exchange) fire at the end of the epoch, against the scope's
watermark at its end (`end`).
"""

from __future__ import annotations

import dataclasses

from metadata.watermarks import MIN_WATERMARK

__all__ = ["EpochTime"]


@dataclasses.dataclass
class EpochTime:
    """Watermarks of one unit's epoch, by scope (a split id, or `KEY_SCOPE` = the unit's
    subtask watermark): at the epoch's `start` and `end`; `now_ms` is the processing time
    (processing-time timers); `key_split` is the split id output chunks of key-scoped operators
    carry (the exchange split the unit reads); `late` counts late records of the epoch."""

    now_ms: int
    start: dict[str, int] = dataclasses.field(default_factory=dict)
    end: dict[str, int] = dataclasses.field(default_factory=dict)
    key_split: str = ""
    late: int = 0

    def start_of(self, scope: str) -> int:
        return self.start.get(scope, MIN_WATERMARK)
