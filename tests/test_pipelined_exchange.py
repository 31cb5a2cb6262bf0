"""A pipelined `run()` of a job with a keyed exchange (issue 42 §6): the readers of epoch N+1
list the exchange while checkpoint N commits, so a commit in progress ends what they read, and
every order is still counted exactly once through unit faults and a driver crash at any step.
The units run in this process on the driver's dispatch thread (a dispatcher that says it is
`background_safe`, as Spark's is)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orders_job as job
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadata.commit_log import CommitRecord
from metadata.exchange import Cursor, SegmentName
from metadata.format import segment_checksum
from metadata.storage import JobStorage
from regional.coordinator import TriggerCheckpoint
from regional.coordinator.decisions import Commit
from regional.dataflow import exchange_reads
from regional.dataflow.exchange import ExchangeReader, ExchangeWriter
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv


def _driver(tmp_path: Path, faults: Faults | None = None, **kw: Any) -> JobDriver:
    if not (tmp_path / "orders").exists():
        job.write_orders(str(tmp_path / "orders"))
    p = job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.3}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        InProcessDispatcher(env, background_safe=True),
        storage=JobStorage(root, "orders"),
        policy=policy,
        faults=faults,
        **kw,
    )


def test_a_pipelined_run_with_an_exchange_counts_every_order_once(tmp_path: Path) -> None:
    seen: list[Any] = []
    summary = _driver(tmp_path, observe=seen.append).run()
    assert summary.finished
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()
    order = [
        ("trigger" if isinstance(d, TriggerCheckpoint) else "commit", d.checkpoint_id)
        for d in seen
        if isinstance(d, TriggerCheckpoint | Commit)
    ]
    # checkpoint 1 commits after checkpoint 2's tasks were dispatched: the run is pipelined
    assert order.index(("trigger", 2)) < order.index(("commit", 1))


#: upstream units are 0-2, downstream units 3-6 (`tests/test_exchange.py`)
UNIT_FAULTS = {(2, 0): "fail", (2, 4): "fail", (3, 1): "fail", (4, 5): "fail", (4, 6): "fail"}


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_unit_faults_and_a_crash_of_a_pipelined_run_commit_exactly_the_fault_free_rows(
    tmp_path: Path, step: str
) -> None:
    with pytest.raises(DriverCrash):
        _driver(tmp_path, Faults(units=UNIT_FAULTS, crash_at=(5, step))).run()
    summary = _driver(tmp_path).run()
    assert summary.finished and summary.restored_from is not None
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def _segment(tmp_path: Path, checkpoint: int) -> tuple[str, int, str]:
    """Publish segment (checkpoint, writer 0) of partition 0 with two rows; its record's
    entry (file, size, checksum)."""
    directory = tmp_path / "x" / "n1" / "p0"
    directory.mkdir(parents=True, exist_ok=True)
    name = SegmentName(checkpoint, 0).file_name()
    pq.write_table(pa.table({"c": [checkpoint, checkpoint]}), directory / name)
    data = (directory / name).read_bytes()
    return f"n1/p0/{name}", len(data), segment_checksum(data).hex()


def _record(writer: ExchangeWriter, checkpoint: int, entry: tuple[str, int, str]) -> None:
    file, size, checksum = entry
    writer.area.write_record(
        CommitRecord("user", checkpoint, [file], 0, sizes=[size], checksums=[checksum])
    )


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_commit_that_completes_while_a_reader_lists_is_read_now_or_next_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """Checkpoint 2's commit (publish, then record) completes just before or just after the
    reader reads the commit records: never a "missing segment" error, and its segment is read
    now or at the next listing."""
    reader = ExchangeReader("x", 1, bounded=True)
    reader.bind(str(tmp_path / "x"), None)
    writer = ExchangeWriter("x", lambda r: r, 1)
    writer.bind(str(tmp_path / "x"), None)
    _record(writer, 1, _segment(tmp_path, 1))
    real = exchange_reads._DECODED.records

    def commit() -> None:
        if not (tmp_path / "x" / "n1" / "p0" / SegmentName(2, 0).file_name()).exists():
            _record(writer, 2, _segment(tmp_path, 2))

    def commit_meanwhile(*args: Any, **kw: Any) -> Any:
        if when == "before":
            commit()
        records = real(*args, **kw)
        if when == "after":
            commit()
        return records

    monkeypatch.setattr(exchange_reads._DECODED, "records", commit_meanwhile)
    both = [SegmentName(1, 0), SegmentName(2, 0)]
    first = reader.committed(1, 0, Cursor(0, 0, 0))
    assert [s for s, _, _ in first] == (both if when == "before" else both[:1])
    assert [s for s, _, _ in reader.committed(1, 0, Cursor(0, 0, 0))] == both


def test_a_segment_published_before_its_record_ends_the_list(tmp_path: Path) -> None:
    reader = ExchangeReader("x", 1, bounded=True)
    reader.bind(str(tmp_path / "x"), None)
    writer = ExchangeWriter("x", lambda r: r, 1)
    writer.bind(str(tmp_path / "x"), None)
    _record(writer, 1, _segment(tmp_path, 1))
    entry = _segment(tmp_path, 2)  # checkpoint 2's commit published it, no record yet
    assert [s for s, _, _ in reader.committed(1, 0, Cursor(0, 0, 0))] == [SegmentName(1, 0)]
    _record(writer, 2, entry)
    assert [s for s, _, _ in reader.committed(1, 0, Cursor(0, 0, 0))] == [
        SegmentName(1, 0),
        SegmentName(2, 0),
    ]
