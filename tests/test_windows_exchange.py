"""Windows after a durable keyed exchange, in this process (`tests/windows_job.py`): the writers'
watermarks travel with their committed segments; the rows equal a brute-force group-by over the
input without the records the job dead-lettered as late; with unit faults on both sides and a
driver crash the committed rows *and* the late records equal the fault-free run's (`hold`);
the reader's watermark and what holds it back; the `exclude` policy."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orders_job
import pytest
import windows_job as job

from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from metadata.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    WatermarkMark,
    format_watermark,
    parse_mark,
    watermarks_table,
)
from regional.cli import main
from regional.dataflow.exchange import ExchangeReader
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table

#: upstream units 0-3 (clicks -> exchange writer), downstream units 4-6 (reader -> win -> out)
UNIT_FAULTS = {(2, 1): "fail", (3, 1): "fail", (3, 5): "fail", (4, 0): "fail", (5, 6): "fail"}


def _run(
    tmp_path: Path,
    kind: str,
    faults: Faults | None = None,
    progress: Any = None,
    **kw: Any,
) -> tuple[JobDriver, str, str]:
    table, dead = str(tmp_path / "table"), str(tmp_path / "dead")
    p = job.pipeline(
        kind,
        table,
        partitions=3,
        parallelism=job.SPLITS,
        on_late="dead-letter",
        dead_letter=ParquetSink(dead),
    )
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "clicks", p, unit_timeout=30, faults=faults.unit_faults(), **kw)
    driver = JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, "clicks"),
        policy=policy,
        faults=faults,
        progress=progress,
    )
    return driver, table, dead


def _late(dead: str) -> list[tuple[int, int]]:
    """(split, n) of every record dead-lettered as late."""
    rows = read_table(dead).to_pylist()
    assert all(r["error_type"] == "LateRecord" and r["operator"] == "win" for r in rows)
    return sorted((json.loads(r["record"])["split"], json.loads(r["record"])["n"]) for r in rows)


def brute_force(kind: str, late: list[tuple[int, int]]) -> list[tuple[Any, ...]]:
    """Per (user, window) over every click not in `late`: what a batch group-by gives."""
    gone = set(late)
    clicks = [
        job.click(s, n)
        for s in range(job.SPLITS)
        for n in range(job.PER_SPLIT)
        if (s, n) not in gone
    ]
    if kind == "session":
        out = []
        for u in sorted({c["user"] for c in clicks}):
            stamps = [c["ts"] for c in clicks if c["user"] == u]
            out += [(u, s, e, n) for s, e, n in job.batch_sessions(stamps)]
        return sorted(out)
    per: Counter[tuple[Any, ...]] = Counter()
    for c in clicks:
        for w in job.ASSIGNERS[kind].assign(c["ts"]):
            per[(c["user"], w.start, w.end)] += 1
    return sorted((*k, n) for k, n in per.items())


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_windows_after_an_exchange_equal_a_group_by_over_the_on_time_records(
    tmp_path: Path, kind: str
) -> None:
    driver, table, dead = _run(tmp_path, kind)
    assert driver.run().finished
    late = _late(dead)
    # exactly the records 40 s behind (every 23rd), no on-time record
    assert late == [(s, n) for s in range(job.SPLITS) for n in range(22, job.PER_SPLIT, 23)]
    assert job.rows(table) == brute_force(kind, late)


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_faults_on_both_sides_and_a_driver_crash_give_the_fault_free_rows_row_for_row(
    tmp_path: Path, step: str
) -> None:
    clean, clean_table, clean_dead = _run(tmp_path / "clean", "sliding")
    assert clean.run().finished
    first, table, dead = _run(tmp_path, "sliding", Faults(units=UNIT_FAULTS, crash_at=(6, step)))
    with pytest.raises(DriverCrash):
        first.run()
    again, _, _ = _run(tmp_path, "sliding")
    summary = again.run()
    assert summary.finished and summary.restored_from is not None
    assert job.rows(table) == job.rows(clean_table)
    assert _late(dead) == _late(clean_dead)


def test_a_writer_that_keeps_falling_back_holds_the_readers_watermark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # upstream unit 1 (writer 1) fails checkpoints 2-5: its committed watermark stays at 1's
    faults = Faults(units={(c, 1): "fail" for c in range(2, 6)})
    driver, _, dead = _run(tmp_path, "tumbling", faults)
    driver.run(max_checkpoints=5)
    reader = driver.pipeline.vertices["by-user"].source
    assert isinstance(reader, ExchangeReader)
    marks = reader.marks()
    assert {m.writer for m in marks if m.checkpoint_id in (2, 3, 4, 5)} == {0, 2, 3}
    unit = driver.coordinator.unit_states(4)
    [state] = [s for s in unit if s.vertex_id == "by-user"]
    [split] = state.split_states
    view = reader.watermark(split.split_id, split.position, marks)
    writer1 = max(m.watermark for m in marks if m.writer == 1)
    assert view.watermark == writer1 and view.holders == (1,) and view.held_since == 1
    # the inspector's view says the same, and who holds it back
    newest = driver.coordinator.latest_completed_id
    storage = JobStorage(str(tmp_path / "ckpt"), "clicks")
    latest = CompletedCheckpointStore.load(storage).latest()
    assert latest is not None and latest.checkpoint_id == newest
    views = watermarks_table(storage, latest)
    rows = [r for r in views.to_pylist() if r["kind"] == "exchange"]
    assert [(r["split"], r["watermark_ms"], r["held_by"]) for r in rows] == [
        (f"n3-p{q}", writer1, "writer 1 (unit 1): fell back since checkpoint 2") for q in range(3)
    ]
    [split1] = [r for r in views.to_pylist() if r["kind"] == "split" and r["unit"] == 1]
    assert split1["watermark_ms"] == writer1 and split1["checkpoint_id"] == newest
    assert split1["held_by"] == "unit 1 fell back: its state is from checkpoint 1"
    assert main(["inspect", str(tmp_path / "ckpt"), "watermarks", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert [r["held_by"] for r in printed if r["kind"] == "exchange"] == [rows[0]["held_by"]] * 3
    released = reader.watermark(split.split_id, split.position, marks, exclude_after=3)
    assert released.released == (1,) and released.watermark > writer1
    # and the held writer's records are never late: the run ends like a fault-free one
    assert driver.run().finished
    assert _late(dead) == [(s, n) for s in range(job.SPLITS) for n in range(22, job.PER_SPLIT, 23)]


def test_the_exclude_policy_releases_a_stuck_writer_and_judges_its_records_late(
    tmp_path: Path,
) -> None:
    faults = Faults(units={(c, 1): "fail" for c in range(2, 7)})
    driver, table, dead = _run(tmp_path, "tumbling", faults, exclude_after=2)
    assert driver.run().finished
    late = _late(dead)
    # writer 1's records re-read after it was released are behind the others: late, and
    # the rows are the group-by over what was not (exactness traded for freshness)
    assert any(s == 1 and n % 23 != 22 for s, n in late)
    assert job.rows(table) == brute_force("tumbling", late)


def test_a_reader_before_any_writer_committed_is_at_minus_infinity(tmp_path: Path) -> None:
    reader = ExchangeReader("x", 2, bounded=True, writers=2)
    reader.bind(str(tmp_path / "x"), None)
    assert reader.watermark("n2-p0", b"", []).watermark == MIN_WATERMARK
    view = reader.watermark("n2-p0", b"", [WatermarkMark(1, 0, 500)])
    assert (view.watermark, view.holders, view.held_since) == (MIN_WATERMARK, (1,), None)


def test_timers_after_an_exchange_close_every_quiet_users_session(tmp_path: Path) -> None:
    table = str(tmp_path / "table")
    p = job.sessionizer(table, partitions=2)
    root = str(tmp_path / "ckpt")
    faults = Faults(units={(3, 1): "fail", (4, 2): "fail"})
    env = TaskEnv(root, "s", p, unit_timeout=30, faults=faults.unit_faults())
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "s"), faults=faults
    )
    assert driver.run().finished
    assert sorted((r["user"], r["clicks"], r["end"]) for r in read_table(table).to_pylist()) == (
        job.expected_sessions()
    )


def test_events_progress_and_prometheus_show_late_records_and_the_lowest_watermark(
    tmp_path: Path,
) -> None:
    from prometheus_client import generate_latest

    from regional.cli.progress import checkpoint_line
    from regional.report.html import render_html
    from regional.report.summary import build_report
    from regional.runtime.prometheus import job_registry

    events: list[Any] = []
    driver, _, dead = _run(tmp_path, "tumbling", Faults(units={(3, 1): "fail"}), events.append)
    assert driver.run().finished
    assert sum(e.records_late for e in events) == len(_late(dead)) > 0
    third = next(e for e in events if e.checkpoint_id == 3)
    assert third.fallback_units == (1,) and third.watermark_unit not in (None, 1)
    assert events[-1].watermark_ms == MAX_WATERMARK  # the input ended: everything fired
    line = checkpoint_line(third)
    assert f"watermark {format_watermark(third.watermark_ms)} (unit {third.watermark_unit})" in line
    page = render_html(build_report([], events, job_id="clicks"))
    assert '<h2 id="watermarks">Watermarks</h2>' in page
    row = f"<tr><td>3</td><td>{format_watermark(third.watermark_ms)}</td>"
    assert row + f"<td>{third.watermark_unit}</td>" in page
    assert f"<td>{format_watermark(MAX_WATERMARK)}</td><td>{events[-1].watermark_unit}</td>" in page
    text = generate_latest(job_registry(driver)).decode()
    assert f'regional_records_late_total{{job="clicks"}} {float(len(_late(dead)))}' in text
    last = events[-1]
    u = last.watermark_unit  # the unit's id and (no names given) its name label
    assert f'regional_watermark_seconds{{job="clicks",name="unit {u}",unit="{u}"}} +Inf' in text


def test_the_cleaner_deletes_superseded_watermark_marks_and_keeps_the_needed_ones(
    tmp_path: Path,
) -> None:
    driver, _, _ = _run(tmp_path, "tumbling")
    summary = driver.run()
    assert summary.finished
    directory = tmp_path / "ckpt" / "clicks" / "exchange" / "by-user" / "_watermarks"
    left = sorted(m for p in directory.iterdir() if (m := parse_mark(p.name)) is not None)
    last = summary.checkpoints[-1].checkpoint_id
    written = {(c, w) for c in range(1, last + 1) for w in range(job.SPLITS)}
    assert {(m.checkpoint_id, m.writer) for m in left} < written  # some were deleted
    assert {m.checkpoint_id for m in left} >= {last}  # the newest are kept
    assert min(m.checkpoint_id for m in left) > 1
    # what is left still gives every kept checkpoint its watermark: the newest says +inf
    storage = JobStorage(str(tmp_path / "ckpt"), "clicks")
    latest = CompletedCheckpointStore.load(storage).latest()
    assert latest is not None
    rows = watermarks_table(storage, latest).to_pylist()
    assert {r["watermark"] for r in rows if r["kind"] == "exchange"} == {"+inf"}


def test_a_subtask_reading_one_file_per_epoch_advances_its_watermark_with_its_files(
    tmp_path: Path,
) -> None:
    # one file per split and epoch: every split finishes in the epoch that reads it
    clicks = tmp_path / "clicks"
    clicks.mkdir()
    for s in range(job.SPLITS):
        for k in range(0, job.PER_SPLIT, job.PER_EPOCH):
            with open(clicks / f"c{k:04d}-s{s}.jsonl", "w") as out:
                for n in range(k, k + job.PER_EPOCH):
                    out.write(json.dumps({**job.click(s, n), "amount": 1}) + "\n")
    table, dead = str(tmp_path / "table"), str(tmp_path / "dead")
    p = job.file_pipeline("tumbling", str(clicks), table, dead)
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "clicks", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "clicks"))
    driver.run(max_checkpoints=5)
    assert not driver.finished and read_table(table).num_rows > 0  # windows closed already
    assert driver.run().finished
    late = job.late_records(dead)
    got = [(u, s, e, c) for u, s, e, c, _ in job.totals(table)]
    assert got == brute_force("tumbling", late)


class _QuietAndBusy:
    """Split "busy" delivers 10 clicks of user u per read, a second apart; split "quiet"
    never delivers anything (both unbounded)."""

    bounded = False

    def discover(self) -> list[str]:
        return ["busy", "quiet"]

    def read(self, split: str, position: bytes, max_records: int) -> Any:
        from regional.sources.base import ReadResult

        start = int(position or b"0")
        if split == "quiet":
            return ReadResult([], position, False)
        rows = [{"user": "u", "ts": n * 1000} for n in range(start, start + 10)]
        return ReadResult([rows], str(start + 10).encode(), False)


def _idle_job(tmp_path: Path, idle: Any) -> tuple[JobDriver, str]:
    from regional.dataflow.pipeline import Pipeline
    from regional.dataflow.windows import Tumbling, count

    table = str(tmp_path / "table")
    p = Pipeline("idle", splits_per_subtask=2)
    (
        p.source(_QuietAndBusy(), event_time=lambda r: r["ts"], idle_timeout=idle)
        .key_by(job.user, partitions=1, name="by-user")
        .window(Tumbling("5 s"), aggregate=count(), emit=job.emit, name="win")
        .sink(ParquetSink(table), name="out")
    )
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "idle", p, unit_timeout=30)
    return JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "idle")
    ), table


def test_a_quiet_split_holds_the_exchange_watermark_unless_an_idle_timeout_releases_it(
    tmp_path: Path,
) -> None:
    held, held_table = _idle_job(tmp_path / "held", None)
    held.run(max_checkpoints=6)
    assert read_table(held_table).num_rows == 0  # the quiet split holds every window open
    released, table = _idle_job(tmp_path / "released", 0.001)  # 1 ms: idle at once
    released.run(max_checkpoints=6)
    rows = job.rows(table)
    assert rows and rows[0] == ("u", 0, 5_000, 5)  # windows closed by the busy split alone
