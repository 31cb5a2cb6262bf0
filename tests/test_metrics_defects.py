"""Issue 45 item 5, the metrics defects: each test failed before its fix (in-process jobs,
no Spark)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metadata.events import CheckpointEvent
from metadata.storage import JobStorage


def _run_orders(tmp_path: Path) -> list[CheckpointEvent]:
    import orders_job

    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv

    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "orders", p, unit_timeout=30)
    events: list[CheckpointEvent] = []
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"))
    driver.progress = events.append
    assert driver.run().finished
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()
    return events


def test_progress_records_count_the_source_records_only_not_the_exchange_reads(
    tmp_path: Path,
) -> None:
    """`records` in progress (and `regional_records_in_total`) summed every source vertex's
    reads, the keyed exchange's readers too: about twice the input. It is the input now; the
    exchange's reads are counted apart (`records_exchanged`)."""
    import orders_job

    events = _run_orders(tmp_path)
    total = orders_job.FILES * orders_job.ORDERS_PER_FILE
    assert sum(e.records_in for e in events) == total
    assert sum(e.records_exchanged for e in events) == total


def test_the_job_watermark_does_not_drop_to_minus_inf_when_a_subtask_runs_out_of_files(
    tmp_path: Path,
) -> None:
    """A source subtask whose files all finished while another subtask still reads (its
    source not finished yet) reads no split: its watermark is "nothing known" (-inf) and the
    job's watermark, the lowest over the units, fell back to -inf near the end of a fault-free
    run. A unit that reads no split holds nothing back now: it keeps its last watermark."""
    import json

    import orders_job

    from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.files import FileSource

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, n in (("a.jsonl", 3), ("b.jsonl", 60)):
        rows = [json.dumps({"n": i, "ts": 1_000 * i}) for i in range(n)]
        (inputs / name).write_text("\n".join(rows) + "\n")
    p = Pipeline("wm", records_per_epoch=10)
    p.source(
        FileSource(str(inputs), format="jsonl"), parallelism=2, name="files", event_time="ts"
    ).sink(ParquetSink(str(tmp_path / "out")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "wm", p, unit_timeout=30)
    events: list[CheckpointEvent] = []
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "wm"))
    driver.progress = events.append
    assert driver.run().finished
    marks = [e.watermark_ms for e in events]
    assert marks[-1] == MAX_WATERMARK
    first_known = next(i for i, m in enumerate(marks) if m != MIN_WATERMARK)
    assert MIN_WATERMARK not in marks[first_known:], marks
    known = [m for m in marks[first_known:] if m is not None]
    assert known == sorted(known)  # never back: no split was given late here


def test_after_a_restore_a_stuck_units_fallbacks_agree_with_its_lag(tmp_path: Path) -> None:
    """After a restore the coordinator's streak of a stuck unit restarts at max-unit-fallbacks
    (the limit's count), while its lag counts every checkpoint id since its owner: the stuck
    line said "3 fallbacks in a row" where the unit lag was 4. The stuck line's number is the
    unit's lag now, the same number as `inspect lag`, the events' unit_lag and the metric."""
    import orders_job

    from regional.policy import CheckpointingPolicy, Policy, RegionPolicy
    from regional.runtime.driver import JobDriver
    from regional.runtime.faults import DriverCrash, Faults
    from regional.runtime.task import TaskEnv

    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    policy = Policy(checkpointing=CheckpointingPolicy(region=RegionPolicy(max_unit_fallbacks=2)))
    first = Faults(units={(c, 4): "fail" for c in (2, 3, 4, 5)}, crash_at=(5, "after-acks"))
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=first.unit_faults())
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"),
        faults=first, policy=policy,
    )  # fmt: skip
    with pytest.raises(DriverCrash):
        driver.run()
    second = Faults(units={(c, 4): "fail" for c in range(5, 9)})
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=second.unit_faults())
    events: list[CheckpointEvent] = []
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"),
        faults=second, policy=policy,
    )  # fmt: skip
    driver.progress = events.append
    assert driver.run().finished
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()
    stuck = [(e.checkpoint_id, s.fallbacks, e.unit_lag.get(4)) for e in events for s in e.stuck]
    assert stuck, "unit 4 was stuck after the restore"
    assert all(fallbacks == lag for _, fallbacks, lag in stuck), stuck


def test_records_in_and_out_per_operator_count_each_record_once_despite_fallbacks(
    tmp_path: Path,
) -> None:
    """Records in / out per operator, as the units fresh in completed checkpoints counted
    them: a unit that fell back re-reads its records later, and they count once."""
    import orders_job

    from regional.runtime.driver import JobDriver
    from regional.runtime.faults import Faults
    from regional.runtime.task import TaskEnv

    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    faults = Faults(units={(2, 1): "fail", (3, 4): "fail", (4, 4): "fail"})
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=faults.unit_faults())
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"))
    assert driver.run().finished
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()
    total = orders_job.FILES * orders_job.ORDERS_PER_FILE
    assert driver.metrics.operator_records == {
        "parse": (total, total, 0),
        "totals": (total, total, 0),
    }


def test_dead_letters_by_reason_and_late_records_per_operator(tmp_path: Path) -> None:
    """The windows job behind an exchange with a poison check upstream: the metrics count
    the dead letters by reason and the late records per operator, as committed."""
    import orders_job
    import windows_job as job
    from prometheus_client import generate_latest

    from regional.runtime.driver import JobDriver
    from regional.runtime.prometheus import job_registry
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink, read_table

    p = job.pipeline(
        "tumbling", str(tmp_path / "table"), partitions=2, parallelism=job.SPLITS,
        on_late="dead-letter", dead_letter=ParquetSink(str(tmp_path / "dead")), checked=True,
    )  # fmt: skip
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "clicks", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "clicks"))
    assert driver.run().finished
    dead = read_table(str(tmp_path / "dead")).to_pylist()
    late = sum(1 for r in dead if r["error_type"] == "LateRecord")
    poison = sum(1 for r in dead if r["error_type"] == "ValueError")
    assert late > 0 and poison > 0
    m = driver.metrics
    assert m.dead_letters_by_reason == {"late": late, "user function error": poison}
    assert m.operator_records["win"][2] == late == m.records_late
    clicks = job.SPLITS * job.PER_SPLIT
    assert m.operator_records["check"] == (clicks, clicks - poison, 0)
    text = generate_latest(job_registry(driver)).decode().splitlines()
    assert f'regional_dead_letters_total{{job="clicks",reason="late"}} {float(late)}' in text
    assert f'regional_operator_records_late_total{{job="clicks",operator="win"}} {late}.0' in text
