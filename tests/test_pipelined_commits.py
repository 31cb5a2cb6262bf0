"""Pipelined commits in `JobDriver.run` (issue 28): epoch N+1's tasks start while checkpoint N's
commits run on the driver; commits stay in order, a crash anywhere is still exact, and
`JobDriver.epoch()` still returns after its commit. The units run in this process, on the
driver's dispatch thread (a dispatcher that says it is `background_safe`, as Spark's is)."""

from __future__ import annotations

import pytest
from counted_job import EXACT, PER_EPOCH, SPLITS, counted_pipeline

from metadata.storage import JobStorage
from regional.coordinator import TriggerCheckpoint
from regional.coordinator.decisions import Commit
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table


def _pipeline(table: str) -> Pipeline:
    return counted_pipeline("piped", ParquetSink(table))


def _driver(tmp_path, background_safe: bool = True, **kw) -> JobDriver:
    p = _pipeline(str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    policy = load_policy(
        env={}, overrides={"checkpointing": {"timeout": "30 s", "num-retained": 1}}
    ).policy
    env = TaskEnv(root, "piped", p, unit_timeout=30)
    dispatcher = InProcessDispatcher(env, background_safe=background_safe)
    return JobDriver(p, dispatcher, storage=JobStorage(root, "piped"), policy=policy, **kw)


def _rows(tmp_path) -> list[tuple[int, int, int]]:
    t = read_table(str(tmp_path / "table")).to_pylist()
    return sorted((r["split"], r["n"], r["c"]) for r in t)


def _order(seen) -> list[tuple[str, int]]:
    return [
        ("trigger" if isinstance(d, TriggerCheckpoint) else "commit", d.checkpoint_id)
        for d in seen
        if isinstance(d, TriggerCheckpoint | Commit)
    ]


def test_the_next_epoch_starts_before_the_previous_commit_and_commits_stay_in_order(tmp_path):
    seen: list = []
    summary = _driver(tmp_path, observe=seen.append).run()
    assert summary.finished and _rows(tmp_path) == EXACT
    order = _order(seen)
    commits = [cid for kind, cid in order if kind == "commit"]
    assert commits == sorted(commits) and len(commits) == len(set(commits))
    # checkpoint 1 commits after checkpoint 2's tasks were dispatched
    assert order.index(("trigger", 2)) < order.index(("commit", 1))
    assert [c.checkpoint_id for c in summary.checkpoints] == list(
        range(1, len(summary.checkpoints) + 1)
    )


def test_a_dispatcher_that_is_not_background_safe_commits_before_the_next_trigger(tmp_path):
    seen: list = []
    assert _driver(tmp_path, background_safe=False, observe=seen.append).run().finished
    order = _order(seen)
    assert order.index(("commit", 1)) < order.index(("trigger", 2))
    assert _rows(tmp_path) == EXACT


def test_epoch_still_returns_after_its_commit(tmp_path):
    driver = _driver(tmp_path)
    driver.start()
    for epoch in (1, 2):
        driver.epoch()
        assert len(_rows(tmp_path)) == SPLITS * PER_EPOCH * epoch
    driver.cleaning.close()
    driver.lease.release()


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_a_crash_at_any_step_of_a_pipelined_run_resumes_exactly(tmp_path, step):
    with pytest.raises(DriverCrash):
        _driver(tmp_path, faults=Faults(crash_at=(3, step))).run()
    summary = _driver(tmp_path).run()
    assert summary.finished and summary.restored_from == (2 if step == "after-acks" else 3)
    # a crash in checkpoint 3's held commits stops checkpoint 4's tasks' files too: id 4 is free
    assert summary.checkpoints[0].checkpoint_id == 4
    assert _rows(tmp_path) == EXACT
