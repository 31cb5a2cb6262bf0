"""Continuous mode on the shared local[2] session (`regional.runtime.continuous`): a keyed job
run by two long-lived tasks commits exactly the rows micro-epoch mode commits, restores hot
state every epoch after the first; a failing unit falls back while its task keeps running; a
Python worker that dies loses only its own task, whose job the dispatcher resubmits (local mode
never retries a task: dynamic submission) while the other task keeps committing."""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from regional.coordinator.messages import Ack, Answer
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.continuous import ContinuousDispatcher
from regional.runtime.spark import Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.spark

SPLITS, PER_SPLIT, PER_EPOCH = 4, 20, 5


def _click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}


def _count(ctx: Any, record: dict) -> Any:
    state = ctx.value_state("count", 0)
    state.update(state.value() + 1)
    yield {**record, "count": state.value()}


def _pipeline(table: str) -> Pipeline:
    p = Pipeline("job", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, _click, records_per_split=PER_SPLIT), parallelism=4, name="src"
    )
    src.key_by(lambda r: r["user"]).process(_count, name="count").sink(
        ParquetSink(table), name="out"
    )
    return p


def _expected() -> list[tuple]:
    rows = []
    for split in range(SPLITS):
        seen: Counter[str] = Counter()
        for n in range(PER_SPLIT):
            r = _click(split, n)
            seen[r["user"]] += 1
            rows.append((split, n, r["user"], seen[r["user"]]))
    return sorted(rows)


def _rows(table: str) -> list[tuple]:
    t = read_table(table)
    cols = [t.column(c).to_pylist() for c in ("split", "n", "user", "count")]
    return sorted(zip(*cols, strict=True))


class _Acks:
    """Every unit's latest ack per checkpoint (an `EpochWatch`)."""

    def __init__(self) -> None:
        self.acks: dict[tuple[int, int], Ack] = {}

    def epoch_started(self, checkpoint_id: int, units: Sequence[int]) -> None:
        pass

    def unit_answered(self, answer: Answer) -> None:
        if isinstance(answer, Ack):
            self.acks[answer.checkpoint_id, answer.unit] = answer


def _run(
    spark: Any, tmp_path: Path, mode: str, faults: Faults | None = None, timeout: str = "20 s"
):
    table = str(tmp_path / mode / "table")
    watch = _Acks()
    region = {"timeout": timeout}
    policy = load_policy(env={}, overrides={"checkpointing": {"region": region}}).policy
    rt = SparkRuntime(
        _pipeline(table),
        spark,
        root=str(tmp_path / mode / "ckpt"),
        mode=mode,
        tasks=2,
        policy=policy,
        faults=faults,
        watch=watch,
    )
    summary = rt.run()
    assert summary.finished
    return rt, summary, _rows(table), watch.acks


def test_a_keyed_job_commits_the_micro_epoch_rows_with_hot_state_after_the_first_epoch(
    spark, tmp_path
):
    _, micro, micro_rows, _ = _run(spark, tmp_path, "micro-epoch")
    rt, summary, rows, acks = _run(spark, tmp_path, "continuous")
    assert rows == micro_rows == _expected()
    assert [c.kind for c in summary.checkpoints] == [c.kind for c in micro.checkpoints]
    assert isinstance(rt.dispatcher, ContinuousDispatcher)
    # two long-lived tasks served every epoch: submitted and connected once each, then stopped
    assert Counter(e.kind for e in rt.dispatcher.events) == {"submitted": 2, "connected": 2}
    for (cid, unit), ack in acks.items():
        # `count` has state from the first epoch on; the task that ran it kept it decoded
        assert (ack.state_hits, ack.state_misses) == ((0, 0) if cid == 1 else (1, 0)), (cid, unit)
    assert {cid for cid, _ in acks} == set(range(1, len(summary.checkpoints) + 1))


def test_a_failing_unit_falls_back_while_its_task_keeps_running(spark, tmp_path):
    rt, summary, rows, acks = _run(spark, tmp_path, "continuous", Faults(units={(2, 1): "fail"}))
    second = summary.checkpoints[1]
    assert (second.kind, second.fallback_units) == ("regional", (1,))
    assert "unit 1 fails checkpoint 2 (injected fault)" in second.causes[1]
    assert rows == _expected()
    assert isinstance(rt.dispatcher, ContinuousDispatcher)
    assert Counter(e.kind for e in rt.dispatcher.events) == {"submitted": 2, "connected": 2}
    # unit 1 failed at 2 before its state was restored, so the state of checkpoint 1 it falls
    # back to is still hot in its task; every unit restores hot
    assert all(acks[3, u].state_hits == 1 for u in range(SPLITS))


def test_a_killed_python_worker_loses_only_its_task_which_is_resubmitted(spark, tmp_path):
    rt, summary, rows, acks = _run(spark, tmp_path, "continuous", Faults(units={(2, 2): "crash"}))
    second = summary.checkpoints[1]
    # the lost task's other unit re-ran alone and committed; the crashing unit fell back
    assert (second.kind, second.fallback_units) == ("regional", (2,))
    assert second.causes[2].endswith("Python worker exited unexpectedly (crashed)")
    assert all(c.kind == "global" for c in summary.checkpoints[2:])
    assert rows == _expected()
    assert isinstance(rt.dispatcher, ContinuousDispatcher)
    events = [(e.kind, e.task) for e in rt.dispatcher.events]
    lost = rt.dispatcher.placement.task_of[2]
    other = 1 - lost
    assert ("lost", lost) in events and ("ended", lost) in events
    assert events.count(("submitted", lost)) == 2 and events.count(("connected", lost)) == 2
    # the other task was never touched: one job, one attempt, hot state all along
    assert events.count(("submitted", other)) == 1 and events.count(("connected", other)) == 1
    mine = [u for u, t in rt.dispatcher.placement.task_of.items() if t == other]
    assert all(acks[cid, u].state_hits == 1 for cid in (2, 3, 4) for u in mine)


def test_a_task_stuck_past_the_deadline_is_cancelled_alone_and_started_again(spark, tmp_path):
    faults = Faults(units={(2, 2): "stall"})  # a C-level loop SIGALRM cannot break
    rt, summary, rows, _ = _run(spark, tmp_path, "continuous", faults, timeout="3 s")
    assert isinstance(rt.dispatcher, ContinuousDispatcher)
    stuck = rt.dispatcher.placement.task_of[2]
    mine = sorted(u for u, t in rt.dispatcher.placement.task_of.items() if t == stuck)
    second = summary.checkpoints[1]
    assert sorted(second.causes) == mine  # the stuck task's units, no other
    assert all(second.causes[u].startswith("timeout: no answer after") for u in mine)
    # the stuck task's new worker imports afresh, which may take longer than the next epoch's
    # 3 s deadline on a loaded machine: its units fall back until it catches up, as they would
    # in micro-epoch mode; the run ends exactly
    assert summary.checkpoints[-1].kind == "global"
    assert rows == _expected()
    events = [(e.kind, e.task) for e in rt.dispatcher.events]
    # started again (more than once if its fresh worker missed the next deadline too)
    assert ("cancelled", stuck) in events and events.count(("submitted", stuck)) >= 2
    assert events.count(("submitted", 1 - stuck)) == 1  # the other task ran on


def test_regional_run_continuous_commits_exactly_and_stops_its_tasks(
    spark, tmp_path, capsys, monkeypatch
):
    import msgspec
    from test_run_cli_spark import PIPELINE, SIBLING
    from test_run_cli_spark import _expected as cli_expected
    from test_run_cli_spark import _rows as cli_rows

    from metadata.events import CheckpointEvent, Outcome
    from regional.cli import main

    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("REGIONAL_CHECKPOINT_DIR", "unset")
    (tmp_path / "run_cli_orders.py").write_text(SIBLING)
    job = tmp_path / "job.py"
    job.write_text(PIPELINE)
    root = tmp_path / ".regional" / "checkpoints"
    try:
        assert main(["run", str(job), "--json", "--continuous"]) == 0
    finally:
        sys.modules.pop("run_cli_orders", None)
    out = capsys.readouterr().out
    events = [msgspec.json.decode(line, type=CheckpointEvent) for line in out.splitlines()]
    assert [e.kind for e in events] == [Outcome.GLOBAL] * len(events)
    assert cli_rows(str(root) + "-table") == cli_expected()
    # the long-lived tasks returned: no job of this run is still active
    assert not spark.sparkContext.statusTracker().getActiveJobsIds()


def test_more_tasks_than_free_slots_fail_at_start_naming_them_and_give_the_slots_back(
    spark, tmp_path
):
    from regional.runtime.continuous import ContinuousStartError
    from regional.runtime.spark import SparkDispatcher, task_env

    env = task_env(_pipeline(str(tmp_path / "t")), str(tmp_path), "job", load_policy(env={}).policy,
                   Faults(), "run-x")  # fmt: skip
    sc = spark.sparkContext
    alone = SparkDispatcher(sc, env, tasks=3, job_id="job")
    dispatcher = ContinuousDispatcher(
        sc, env, tasks=3, job_id="job", run_id="run-x", isolated=alone, connect_timeout_s=3
    )
    with pytest.raises(ContinuousStartError) as failed:
        dispatcher.start()  # local[2]: two slots for three long-lived tasks
    message = str(failed.value)
    assert "did not connect to the driver channel at 127.0.0.1:" in message
    assert "run at most as many tasks as the cluster has free cores" in message
    assert not sc.statusTracker().getActiveJobsIds()
