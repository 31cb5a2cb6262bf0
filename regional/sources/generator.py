"""A deterministic generator source for tests, demos and benchmarks.

Split `g<i>` yields records ``make(i, n)`` for ``n = 0, 1, ...``; the position is the next `n`.
Bounded with `records_per_split`, unbounded without. `max_per_read` limits how many records one
epoch reads from a split (a rate limit counted in epochs, so runs stay deterministic).

The records are handed on as `make` returned them (a list per read): operators get those very
objects, and a sink converts them to Arrow once. With `schema`, a read is an Arrow record batch
of that schema instead. (Going through Arrow and back cost a record-wise operator about 1.3 µs
per record in `to_pylist`, more than the rest of a small unit's work.)

>>> src = GeneratorSource(2, lambda split, n: {"split": split, "n": n}, records_per_split=3)
>>> src.discover()
['g0', 'g1']
>>> r = src.read("g1", b"", 2)
>>> r.batches, r.finished
([[{'split': 1, 'n': 0}, {'split': 1, 'n': 1}]], False)
>>> src.read("g1", r.position, 2).finished
True
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pyarrow as pa

from regional.sources.base import Batch, ReadResult

__all__ = ["GeneratorSource"]


def _decode(position: bytes) -> int:
    return int(position) if position else 0


class GeneratorSource:
    """`num_splits` splits of records made by `make(split_index, sequence_number)`."""

    def __init__(
        self,
        num_splits: int,
        make: Callable[[int, int], dict[str, Any]],
        *,
        records_per_split: int | None = None,
        max_per_read: int | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        if num_splits < 1:
            raise ValueError(f"GeneratorSource needs num_splits >= 1, got {num_splits}")
        self.num_splits = num_splits
        self.make = make
        self.records_per_split = records_per_split
        self.max_per_read = max_per_read
        self.schema = schema

    @property
    def bounded(self) -> bool:
        return self.records_per_split is not None

    @property
    def endless_splits(self) -> bool:
        """Unbounded, a split never finishes (`regional.sources.base.endless_splits`)."""
        return self.records_per_split is None

    def discover(self) -> list[str]:
        return [f"g{i}" for i in range(self.num_splits)]

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        index = int(split_id[1:])
        start = _decode(position)
        count = max_records if self.max_per_read is None else min(max_records, self.max_per_read)
        end = start + count
        if self.records_per_split is not None:
            end = min(end, self.records_per_split)
        rows = [self.make(index, n) for n in range(start, end)]
        batches: list[Batch] = []
        if rows:
            batches.append(
                rows
                if self.schema is None
                else pa.RecordBatch.from_pylist(rows, schema=self.schema)
            )
        finished = self.records_per_split is not None and end >= self.records_per_split
        return ReadResult(batches, str(end).encode(), finished)
