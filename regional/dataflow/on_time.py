"""The records of a chunk that are on time, with their event times: what the keyed event-time
operators that judge each record against its origin watermark share (the joins,
`drop_duplicates`; windows judge by their windows instead).

A record whose event time cannot be read is a dead letter (or its unit declines naming it); a
record below its origin watermark is **late**: counted in `EpochTime.late`, and a dead letter
when the operator says so (``on_late="dead-letter"``). Every other one is yielded.

>>> from regional.dataflow.epoch_time import EpochTime
>>> time = EpochTime(0)
>>> rows = [{"ts": 5}, {"ts": 12}]
>>> judge = Lateness("dedup 'd'", lambda r: r["ts"], None, "drop", lambda ts, origin: None)
>>> list(judge.on_time(rows, split="p", base=0, origin=10, dead=None, time=time, operator="d"))
[(1, {'ts': 12}, 12)]
>>> time.late
1
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.event_time import EventTimeError, record_time

__all__ = ["Lateness"]


class Lateness:
    """How one operator (or one side of a join) reads event times and judges lateness: `owner`
    names it in errors, `time_of` / `field` read a record's time, `on_late` is "drop" or
    "dead-letter", and `reason(ts, origin)` is the error a late record's dead letter carries."""

    def __init__(
        self,
        owner: str,
        time_of: Callable[[Any], Any],
        field: str | None,
        on_late: str,
        reason: Callable[[int, int], Exception | None],
    ) -> None:
        self.owner = owner
        self.time_of = time_of
        self.field = field
        self.on_late = on_late
        self.reason = reason

    def on_time(
        self,
        rows: Sequence[Any],
        *,
        split: str,
        base: int,
        origin: int,
        dead: DeadLetters | None,
        time: EpochTime,
        operator: str,
        source: str | None = None,
    ) -> Iterator[tuple[int, Any, int]]:
        """(index in the chunk, record, event time) of every record of `rows` (read from
        `split` by the source vertex `source` when known, `base` records of it before them
        this epoch) at or above `origin`."""
        owner, time_of, field = self.owner, self.time_of, self.field
        for i, record in enumerate(rows):
            try:
                ts = record_time(time_of, record, owner=owner, field=field)
            except EventTimeError:  # again, naming where the record is (only now: slow)
                where = f"split {split!r}, record {base + i} this epoch"
                try:
                    record_time(time_of, record, owner=owner, where=where, field=field)
                except EventTimeError as exc:
                    if dead is None:
                        raise
                    dead.add(operator, split, base + i, record, exc, source=source)
                continue
            if ts < origin:
                time.late += 1
                error = self.reason(ts, origin) if self.on_late == "dead-letter" else None
                if dead is not None and error is not None:
                    dead.add(operator, split, base + i, record, error, source=source)
                continue
            yield i, record, ts
