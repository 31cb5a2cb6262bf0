"""Regression tests for the defects of issue 26 that need no Spark: an unbounded source with
more splits than subtasks reads all of them, checkpoint ids are never reused after a failed
job resumes, and the `after-commit` crash point fires after every sink committed. The driver
runs the real task code in this process (`regional.runtime.local.InProcessDispatcher`)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from metadata.events import read_events
from metadata.layout import EVENTS_DIR, event_checkpoint_id
from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.errors import JobFailedError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def _driver(tmp_path: Path, p: Pipeline, job: str, **kw: Any) -> JobDriver:
    root = str(tmp_path / "ckpt")
    overrides = kw.pop("overrides", {})
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s", **overrides}})
    env = TaskEnv(root, job, p, unit_timeout=10, faults=kw.get("faults", Faults()).unit_faults())
    storage = JobStorage(root, job)
    return JobDriver(p, InProcessDispatcher(env), storage=storage, policy=policy.policy, **kw)


def test_an_unbounded_source_with_more_splits_than_subtasks_reads_every_split(tmp_path):
    """Defect 1: 8 partitions, parallelism 4, `splits_per_subtask=1`: half were never read."""
    p = Pipeline("wide", records_per_epoch=10)
    src = p.source(GeneratorSource(8, _record), parallelism=4, name="src")  # unbounded
    src.sink(ParquetSink(str(tmp_path / "out")), name="out")
    summary = _driver(tmp_path, p, "wide").run(max_checkpoints=3)
    assert [c.kind for c in summary.checkpoints] == ["global"] * 3
    splits = Counter(read_table(str(tmp_path / "out")).column("split").to_pylist())
    assert sorted(splits) == list(range(8))  # every split, each read at the same pace
    assert set(splits.values()) == {15}  # 3 epochs x 10 records per subtask / 2 splits


def _two_sinks(tmp_path: Path) -> Pipeline:
    p = Pipeline("ids", records_per_epoch=5)
    src = p.source(GeneratorSource(4, _record, records_per_split=100), parallelism=4, name="src")
    src.sink(ParquetSink(str(tmp_path / "a")), name="a")
    src.map(lambda r: {**r, "copy": True}, name="copy").sink(
        ParquetSink(str(tmp_path / "b")), name="b"
    )
    return p


def test_a_new_run_after_a_failed_one_never_reuses_a_checkpoint_id(tmp_path):
    """Defect 2: after a job failed on aborted checkpoints, its next run numbered from the
    latest completed checkpoint again: two events for one id, stale aborts, wrong counts."""
    fail = Faults(units={(c, u): "fail" for c in range(3, 20) for u in (0, 1)})
    first = _driver(
        tmp_path,
        _two_sinks(tmp_path),
        "ids",
        faults=fail,
        overrides={"tolerable-failed-checkpoints": 2},
    )
    with pytest.raises(JobFailedError, match="3 consecutive checkpoints aborted"):
        first.run()
    storage = JobStorage(str(tmp_path / "ckpt"), "ids")
    before = [e.checkpoint_id for e in read_events(storage)[0]]
    assert before == [1, 2, 3, 4, 5]  # 3-5 aborted (2 of 4 units failed > 0.3)
    second = _driver(tmp_path, _two_sinks(tmp_path), "ids")
    summary = second.run(max_checkpoints=2)
    assert summary.restored_from == 2
    assert [c.checkpoint_id for c in summary.checkpoints] == [6, 7]
    ids = [event_checkpoint_id(p) for p in storage.list_dir(EVENTS_DIR)]
    assert ids == [1, 2, 3, 4, 5, 6, 7]  # one event per id, none written twice


def test_the_after_commit_crash_point_fires_after_every_sink_committed(tmp_path):
    """Defect 3: it fired after the first sink's commit, so a test "crashing after the
    commit" crashed between two sinks' commits."""
    driver = _driver(
        tmp_path, _two_sinks(tmp_path), "ids", faults=Faults(crash_at=(2, "after-commit"))
    )
    with pytest.raises(DriverCrash, match="checkpoint 2, after-commit"):
        driver.run()
    for sink in ("a", "b"):
        assert read_table(str(tmp_path / sink)).num_rows == 2 * 4 * 5  # both hold checkpoint 2
