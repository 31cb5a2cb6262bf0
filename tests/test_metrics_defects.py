"""Issue 45 item 5, the metrics defects: each test failed before its fix (in-process jobs,
no Spark)."""

from __future__ import annotations

from pathlib import Path

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
