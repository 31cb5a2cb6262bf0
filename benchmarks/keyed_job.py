"""The keyed job of the storage benchmarks (`bench_slow_storage`, `bench_storage_kept`):
generator -> count per key (the per-unit state) -> Parquet table, one region per split."""

from __future__ import annotations

import dataclasses
from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

__all__ = ["KeyedRecords", "count_per_key", "count_per_key_job", "record_key"]


@dataclasses.dataclass(frozen=True)
class KeyedRecords:
    """The generator's records: record `n` of split `split` has key (n·7919 + split) % `keys`,
    so each split's state holds a count for each of `keys` keys."""

    keys: int

    def __call__(self, split: int, n: int) -> dict[str, int]:
        return {"key": (n * 7919 + split) % self.keys, "n": n}


def count_per_key(ctx: Any, record: dict[str, int]) -> Any:
    """How many records of this key so far, kept in value state `n`."""
    n = ctx.value_state("n", 0)
    n.update(n.value() + 1)
    yield {"key": record["key"], "n": n.value()}


def record_key(record: dict[str, int]) -> int:
    return record["key"]


def count_per_key_job(name: str, *, regions: int, records: int, keys: int, table: str) -> Pipeline:
    """`regions` splits of `records` records per epoch each, counted per key (over `keys`
    keys), written to the Parquet table at `table` (sink `out`)."""
    pipeline = Pipeline(name, records_per_epoch=records)
    src = pipeline.source(GeneratorSource(regions, KeyedRecords(keys)), parallelism=regions)
    src.key_by(record_key).process(count_per_key, name="count").sink(ParquetSink(table), name="out")
    return pipeline
