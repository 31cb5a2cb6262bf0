"""Merged state files on Spark (DESIGN §4 rule 16): one physical state file per Spark task and
checkpoint; a unit that falls back for 5 checkpoints keeps its owner's merged file alive (the
cleaner says which segment keeps it), a driver crash and resume stay exact, and the old file is
cleaned once the unit is fresh again and nothing references it."""

from __future__ import annotations

import pytest

from cleaner.run import scan
from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.faults import DriverCrash
from regional.runtime.spark import Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.spark

FALLBACKS = range(2, 7)  # unit 1 declines checkpoints 2..6: it falls back to checkpoint 1


def _record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def _count(ctx, r):
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"split": r["split"], "n": r["n"], "c": c.value()}


def _pipeline(tmp_path) -> Pipeline:
    p = Pipeline("merged", records_per_epoch=2)
    src = p.source(GeneratorSource(4, _record, records_per_split=20), parallelism=4, name="src")
    src.key_by(lambda r: r["split"]).process(_count, name="count").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    return p


def _state_files(storage: JobStorage) -> list[str]:
    return sorted(f.path for f in storage.list_files() if f.path.endswith(".state"))


def test_a_unit_on_fallback_for_5_checkpoints_keeps_its_merged_file_across_a_crash(spark, tmp_path):
    root = str(tmp_path / "ckpt")
    policy = load_policy(
        env={},
        overrides={
            "checkpointing": {
                "num-retained": 1,
                "timeout": "30 s",
                "region": {"max-unit-fallbacks": 10, "max-consecutive-regional": "unlimited"},
            }
        },
    ).policy
    faults = Faults(units={(c, 1): "fail" for c in FALLBACKS}, crash_at=(7, "after-metadata"))
    first = SparkRuntime(_pipeline(tmp_path), spark, root=root, policy=policy, faults=faults)
    storage = first.storage
    first.start()
    first.epoch()
    # checkpoint 1: 4 units in 2 Spark tasks, one merged state file per task
    [task0, task1] = _state_files(storage)
    assert task0.startswith("chk-1/u0-a1-") and task1.startswith("chk-1/u2-a1-")
    md1 = storage.read_metadata(1)
    unit1 = [s for s in md1.subtasks if s.unit_id == 1 and s.handles]
    [segment] = unit1[0].handles
    assert segment.path == task0 and segment.offset > 0 and segment.size > segment.length
    for _ in FALLBACKS:
        first.epoch()
    first.cleaning.drain()
    md6 = storage.read_metadata(6)
    assert [(u.unit_id, u.ref_checkpoint_id) for u in md6.fallback_units] == [(1, 1)]
    # checkpoints 2..5 are gone; checkpoint 1's first file stays for unit 1's segment only
    assert [p for p in _state_files(storage) if not p.startswith("chk-6/")] == [task0]
    plan = scan(storage, num_retained=1)
    [kept] = [f for f in plan.files if f.path == task0]
    assert kept.detail == (
        f"segment of unit 1 referenced by chk-6 (fallback owner 1); "
        f"live {segment.length} of {segment.size} bytes"
    )
    assert plan.live_bytes < plan.physical_bytes
    with pytest.raises(DriverCrash):
        first.epoch()  # checkpoint 7 (unit 1 fresh again) completes, then the driver dies
    first.cleaning.close()
    first.lease.release()  # as run() does when its driver dies

    resumed = SparkRuntime(_pipeline(tmp_path), spark, root=root, policy=policy)
    summary = resumed.run()
    assert summary.finished and summary.restored_from == 7
    out = read_table(str(tmp_path / "out")).to_pylist()
    got = sorted((r["split"], r["n"], r["c"]) for r in out)
    assert got == [(s, n, n + 1) for s in range(4) for n in range(20)]  # each record once
    # unit 1 is fresh since checkpoint 7: checkpoint 1's file went with the last reference
    left = _state_files(storage)
    assert task0 not in left and all(not p.startswith("chk-1/") for p in left)
