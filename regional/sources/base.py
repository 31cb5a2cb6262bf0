"""What a source offers: split discovery on the driver, reading a split from a position in tasks.

A split's position is opaque bytes (`b""` = the start); it is kept in the reading subtask's state
(`metadata.model.SplitState`), so a region that falls back re-reads from its owner's position.
Reads are deterministic: the same split and position always give the same records.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol, TypeAlias, runtime_checkable

import pyarrow as pa

__all__ = ["Batch", "ReadResult", "Source", "num_records"]

#: Records read or passed on together: an Arrow record batch, or a list of Python records (a
#: source that makes Python objects hands them on as they are; the engine converts them to
#: Arrow only where Arrow is needed, at a sink or a `map_batches`).
Batch: TypeAlias = pa.RecordBatch | list[Any]


def num_records(batch: Batch) -> int:
    """How many records `batch` holds."""
    return batch.num_rows if isinstance(batch, pa.RecordBatch) else len(batch)


class ReadResult(NamedTuple):
    """Batches read from a split, the position after them, and whether the split is done."""

    batches: list[Batch]
    position: bytes
    finished: bool


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
