"""What a source offers: split discovery on the driver, reading a split from a position in tasks.

A split's position is opaque bytes (`b""` = the start); it is kept in the reading subtask's state
(`metadata.model.SplitState`), so a region that falls back re-reads from its owner's position.
Reads are deterministic: the same split and position always give the same records.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

import pyarrow as pa

__all__ = [
    "Batch",
    "PoisonRecord",
    "ReadResult",
    "Source",
    "TimedSource",
    "endless_splits",
    "num_records",
    "seconds_behind",
]

#: Records read or passed on together: an Arrow record batch, or a list of Python records (a
#: source that makes Python objects hands them on as they are; the engine converts them to
#: Arrow only where Arrow is needed, at a sink or a `map_batches`).
Batch: TypeAlias = pa.RecordBatch | list[Any]


def num_records(batch: Batch) -> int:
    """How many records `batch` holds."""
    return batch.num_rows if isinstance(batch, pa.RecordBatch) else len(batch)


class PoisonRecord(NamedTuple):
    """A record a source read but cannot decode (a Kafka value that is not JSON, a malformed
    JSON line, an unreadable Parquet row group). `ordinal`: its index among the records of this
    read (decoded or not); `record`: what it holds, as a JSON-able value naming where it is
    (e.g. topic, partition, offset and the raw bytes as text); `error`: what to raise when the
    pipeline fails on errors (its message names the split, the position and the fix)."""

    ordinal: int
    record: Any
    error: Exception


class ReadResult(NamedTuple):
    """Batches read from a split, the position after them (past any poison record), whether
    the split is done, and the records it could not decode (`poison`). With
    `Pipeline(on_error="dead-letter")` each poison record becomes a dead-letter row and the unit
    goes on; otherwise the first one's error declines the unit. `behind`: how many records
    lie between the position after the read and the split's end as the source knew it then
    (a Kafka partition's end offset, a file's rows; None: the source does not say), the
    consumer lag `regional inspect ROOT lag`, progress and metrics show. `unread_since`: when
    (ms since the Unix epoch) the oldest of those records was appended to the split, or a time
    no later than that (a Kafka record's timestamp, a file's modification time; None: the
    source does not say or cannot tell cheaply), from which `seconds_behind` measures the
    consumer lag in time."""

    batches: list[Batch]
    position: bytes
    finished: bool
    poison: tuple[PoisonRecord, ...] = ()
    behind: int | None = None
    unread_since: int | None = None


def seconds_behind(records_behind: int, unread_since_ms: int | None, now_ms: int) -> float | None:
    """The consumer lag in time of one split at `now_ms` (a checkpoint's wall-clock time): the
    age of the oldest record not read yet, ``now - unread_since`` in seconds; 0 when no record
    is behind, whatever the time; None when records are behind but their time is unknown. A
    record stamped in the future (a producer's clock ahead) counts as 0, never negative.

    >>> seconds_behind(0, None, 10_000), seconds_behind(5, None, 10_000)
    (0.0, None)
    >>> seconds_behind(5, 7_500, 10_000), seconds_behind(5, 12_000, 10_000)
    (2.5, 0.0)
    """
    if records_behind <= 0:
        return 0.0
    if unread_since_ms is None:
        return None
    return max(now_ms - unread_since_ms, 0) / 1000


@runtime_checkable
class Source(Protocol):
    """A source of splits. `bounded` sources finish once every split is read."""

    @property
    def bounded(self) -> bool: ...

    def discover(self) -> list[str]:
        """Every split id known now (called on the driver each epoch; new ids are new splits)."""
        ...

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        """Up to `max_records` records of `split_id` from `position` (called in tasks)."""
        ...


@runtime_checkable
class TimedSource(Protocol):
    """A source whose records carry their origin watermark and that tells its subtask's
    watermark itself (the keyed exchange's reader, DESIGN §4 rule 15): subtask `index` always
    reads split `split_of(index)`; `read_timed` is `read` plus each batch's origin watermark;
    `watermarks` is the subtask's watermark at an epoch's start and end positions."""

    def split_of(self, index: int) -> str: ...

    def read_timed(
        self, split_id: str, position: bytes, max_records: int
    ) -> tuple[ReadResult, list[int]]: ...

    def watermarks(
        self, split_id: str, start: bytes, end: bytes, *, exclude_after: int | None = None
    ) -> tuple[int, int]: ...


def endless_splits(source: object) -> bool:
    """Whether `source`'s splits never finish while it runs (its optional `endless_splits`
    attribute, False when absent): then every split it discovers is given a subtask at once,
    whatever `splits_per_subtask` says (`regional.runtime.epoch_plan.open_split_caps`)."""
    return bool(getattr(source, "endless_splits", False))
