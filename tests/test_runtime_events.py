"""The runtime's metrics (`SparkRuntime.metrics`) and event log on the shared local session: a
regional checkpoint, an aborted one, and the global ones after them, as a user reads them
between epochs and afterwards from `<root>/<job>/events/`."""

from __future__ import annotations

import pytest

from metadata.events import read_events
from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.errors import JobFailedError
from regional.policy import load_policy
from regional.runtime.spark import Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.spark


def _record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def test_metrics_and_event_log_follow_fallbacks_and_aborts(spark, tmp_path):
    p = Pipeline("events", records_per_epoch=5)
    src = p.source(GeneratorSource(4, _record, records_per_split=10), parallelism=4, name="src")
    src.sink(ParquetSink(str(tmp_path / "table")), name="out")
    # unit 1 fails at 2 (regional); units 0-2 fail at 3 (3 of 4 > 0.3: aborted, rule 3c)
    faults = Faults(units={(2, 1): "fail", (3, 0): "fail", (3, 1): "fail", (3, 2): "fail"})
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "20 s"}}).policy
    seen = []
    root = str(tmp_path / "ckpt")
    runtime = SparkRuntime(p, spark, root=root, faults=faults, policy=policy)
    runtime.progress = lambda report: seen.append((report.checkpoint_id, runtime.metrics))
    summary = runtime.run()
    assert summary.finished
    kinds = [c.kind for c in summary.checkpoints]
    assert kinds[:3] == ["global", "regional", "aborted"] and set(kinds[3:]) == {"global"}

    after = dict(seen)
    assert (after[2].regional_checkpoint_count, after[2].global_checkpoint_count) == (1, 1)
    assert (after[2].oldest_ref_checkpoint_id, after[2].unit_lag) == (1, {1: 1})
    assert after[2].latest_completed_id == 2 and after[2].max_unit_lag == 1
    assert after[3].aborted_by_rule == {"3c-failure-ratio": 1} and after[3].unit_lag == {1: 1}
    final = runtime.metrics
    assert final.latest_completed_id == len(kinds) and final.unit_lag == {}
    assert final.global_checkpoint_count == len(kinds) - 2 and final.aborted_count == 1
    assert final.oldest_ref_checkpoint_id is None and final.commit_lag == 0

    events, problems = read_events(JobStorage(root, "events"))
    assert problems == []
    assert [(e.checkpoint_id, e.kind) for e in events] == [
        (c.checkpoint_id, c.kind) for c in summary.checkpoints
    ]
    regional, aborted, last = events[1], events[2], events[-1]
    assert (regional.fallback_units, regional.fresh_units) == ((1,), 3)
    assert regional.causes[1].startswith("declined: InjectedFault: unit 1 fails checkpoint 2")
    assert (regional.oldest_ref_checkpoint_id, regional.unit_lag) == (1, {1: 1})
    assert (aborted.abort_rule, aborted.fallback_units) == ("3c-failure-ratio", (0, 1, 2))
    assert aborted.message.startswith("checkpoint 3 aborted (rule 3c)")
    assert aborted.oldest_ref_checkpoint_id is None and aborted.aborted_by_rule == {
        "3c-failure-ratio": 1
    }
    assert (last.kind, last.unit_lag, last.regional_checkpoint_count) == ("global", {}, 1)
    assert all(e.trigger_time_ms <= e.time_ms for e in events)
    assert sum(e.records_in for e in events) == sum(c.records_in for c in summary.checkpoints)


def test_a_failed_event_write_is_logged_and_the_job_goes_on(spark, tmp_path, caplog):
    p = Pipeline("blocked", records_per_epoch=5)
    src = p.source(GeneratorSource(2, _record, records_per_split=5), parallelism=2, name="src")
    src.sink(ParquetSink(str(tmp_path / "table")), name="out")
    (tmp_path / "ckpt" / "blocked").mkdir(parents=True)
    (tmp_path / "ckpt" / "blocked" / "events").write_text("a file where the log's directory goes")
    summary = SparkRuntime(p, spark, root=str(tmp_path / "ckpt")).run()
    assert summary.finished and summary.count("global") == len(summary.checkpoints)
    assert [r.getMessage().split(":")[0] for r in caplog.records if "event" in r.getMessage()] == [
        f"event of checkpoint {c.checkpoint_id} not written" for c in summary.checkpoints
    ]


def test_the_last_event_of_a_failed_job_says_why(spark, tmp_path):
    p = Pipeline("failing", records_per_epoch=5)
    src = p.source(GeneratorSource(4, _record, records_per_split=10), parallelism=4, name="src")
    src.sink(ParquetSink(str(tmp_path / "table")), name="out")
    faults = Faults(units={(c, u): "fail" for c in (1, 2) for u in (0, 1)})  # 2 of 4 > 0.3
    policy = load_policy(
        env={}, overrides={"checkpointing": {"tolerable-failed-checkpoints": 1}}
    ).policy
    root = str(tmp_path / "ckpt")
    runtime = SparkRuntime(p, spark, root=root, faults=faults, policy=policy)
    with pytest.raises(JobFailedError) as failed:
        runtime.run()
    events, _ = read_events(JobStorage(root, "failing"))
    assert [(e.checkpoint_id, e.kind, e.abort_rule, e.fallback_units) for e in events] == [
        (1, "aborted", "3c-failure-ratio", (0, 1)),
        (2, "aborted", "3c-failure-ratio", (0, 1)),
    ]
    assert events[-1].message == str(failed.value) and "units" in events[-1].message
    assert events[-1].aborted_by_rule == {"3c-failure-ratio": 2}
