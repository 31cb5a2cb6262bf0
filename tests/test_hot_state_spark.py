"""Hot state on Spark (DESIGN §6): with worker reuse, a unit whose next epoch runs in the
Python worker that ran its last one restores the state that worker kept, without decoding;
one that runs in another worker decodes its segment; the job commits exactly its rows either
way. Which idle worker takes an epoch's task is Spark's choice, so the test checks the rule
epoch by epoch against the worker each epoch's records name."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH = 4, 12, 3


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def _with_worker(r: dict[str, int]) -> dict[str, int]:
    return {**r, "pid": os.getpid()}  # the Python worker that ran the record's epoch


def _count(ctx: Any, r: dict[str, int]) -> Any:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {**r, "c": c.value()}


def _pipeline(table: str) -> Pipeline:
    p = Pipeline("hot-spark", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, _record, records_per_split=PER_SPLIT),
        parallelism=SPLITS,
        name="src",
    )
    src.map(_with_worker, name="worker").key_by(lambda r: r["n"] % 3).process(
        _count, name="count"
    ).sink(ParquetSink(table), name="out")
    return p


def test_a_unit_run_again_by_the_same_worker_restores_hot_state(spark: Any, tmp_path: Path) -> None:
    table = str(tmp_path / "table")
    # one task per epoch: every epoch's units run in one Python worker
    rt = SparkRuntime(_pipeline(table), spark, root=str(tmp_path / "ckpt"), tasks=1)
    rt.start()
    counts: list[tuple[int, int]] = []
    try:
        for _ in range(PER_SPLIT // PER_EPOCH):
            rt.epoch()
            assert rt.last_timing is not None
            counts.append((rt.last_timing.task_state_hits, rt.last_timing.task_state_misses))
    finally:
        rt.cleaning.close()
        rt.lease.release()
    rows = read_table(table).to_pylist()
    assert sorted((r["s"], r["n"], r["c"]) for r in rows) == sorted(
        (s, n, n // 3 + 1) for s in range(SPLITS) for n in range(PER_SPLIT)
    )
    # the worker of each epoch (its records read n // PER_EPOCH == epoch - 1)
    pids = [{r["pid"] for r in rows if r["n"] // PER_EPOCH == e} for e in range(len(counts))]
    assert all(len(p) == 1 for p in pids)
    assert counts[0] == (0, 0)  # nothing to restore yet
    for epoch in range(1, len(counts)):
        same = pids[epoch] == pids[epoch - 1]
        # the worker that ran the units' last epoch kept their states: every unit hits
        assert counts[epoch] == ((SPLITS, 0) if same else (0, SPLITS)), (epoch, pids, counts)
