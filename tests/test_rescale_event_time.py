"""Rescaling the downstream of an exchange must not change event-time results (issue 32 §2).

A restore with another number of partitions moves the backlog the old readers had not read
into one *moved backlog* segment per new partition (`regional.dataflow.exchange.repartition`).
Each row keeps its origin watermark, the rows are sorted by the segment they were first
published in, and a new reader's watermark passes a writer's mark only once every moved row
before it is read (`metadata.watermarks.mark_reached`): the pure rule, property-tested here;
then the rewrite on files; then a job with tumbling, sliding and session windows and
event-time timers after an exchange, rescaled 5 -> 3 -> 4 (and 2 -> 3) in this process, also
through unit faults and a driver crash, equal to the fault-free run row for row (outputs read
with DuckDB). The same job on real Spark is in `tests/test_rescale_event_time_spark.py`."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path
from typing import Any

import duckdb
import orders_job
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import windows_job as job
from hypothesis import example, given, settings
from hypothesis import strategies as st

from metadata.exchange import (
    MOVED_KEY,
    MOVED_WRITER,
    Cursor,
    SegmentName,
    first_published,
    moved_runs,
    split_id,
)
from metadata.storage import JobStorage
from metadata.watermarks import MIN_WATERMARK, WatermarkMark, mark_reached, reader_watermark
from regional.dataflow.exchange import (
    ORIGIN_COLUMN,
    ORIGIN_KEY,
    ExchangeReader,
    ExchangeWriter,
    repartition,
)
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.window_operator import FIRED_WATERMARK
from regional.dataflow.windows import Tumbling, count
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.rescale import redistribute_keys
from regional.runtime.restore import find_restore_point
from regional.runtime.task import TaskEnv
from regional.sinks.base import WriteContext
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

# --- the pure rule: a new reader's watermark and the moved backlog ------------------------


class _Row:
    """A row of the exchange in the model: written by `writer` in epoch `epoch`, first
    published in `segment`, with the origin watermark it is judged late against."""

    def __init__(self, writer: int, epoch: int, segment: SegmentName, origin: int) -> None:
        self.writer, self.epoch, self.segment, self.origin = writer, epoch, segment, origin


@st.composite
def _backlogs(draw: Any) -> tuple[list[WatermarkMark], int, list[_Row]]:
    """Writers committing marks and rows over a few epochs (a writer that fell back commits
    neither), merged per task (segment named after the task's lowest writer) into a few old
    partitions; old readers at any cursor. Returns the marks, the writers and one new
    partition's moved backlog: the unread rows, in the order `repartition` reads them
    (segment, then old partition), a random subset (the keys of this new partition), sorted
    stably by the segment each was first published in, as `repartition` writes them."""
    writers = draw(st.integers(1, 4))
    epochs = draw(st.integers(1, 4))
    old_partitions = draw(st.integers(1, 3))
    marks: list[WatermarkMark] = []
    watermark = dict.fromkeys(range(writers), MIN_WATERMARK)
    by_partition: list[list[_Row]] = [[] for _ in range(old_partitions)]
    for epoch in range(1, epochs + 1):
        task = [draw(st.integers(0, writers - 1)) for _ in range(writers)]
        lowest = {t: min(w for w in range(writers) if task[w] == t) for t in set(task)}
        for w in range(writers):
            if not draw(st.booleans()):
                continue  # fell back in this epoch: no rows, no mark
            segment = SegmentName(epoch, lowest[task[w]])
            for q in range(old_partitions):
                for _ in range(draw(st.integers(0, 2))):
                    by_partition[q].append(_Row(w, epoch, segment, watermark[w]))
            watermark[w] = max(watermark[w], 0) + draw(st.integers(0, 5))
            marks.append(WatermarkMark(epoch, w, watermark[w]))
    unread: list[tuple[SegmentName, int, _Row]] = []
    for q, rows in enumerate(by_partition):
        rows.sort(key=lambda r: (r.segment, r.writer))  # a segment holds writers in order
        read = draw(st.integers(0, len(rows)))  # the old reader's cursor
        unread += [(r.segment, q, r) for r in rows[read:]]
    unread.sort(key=lambda u: (u[0], u[1]))
    mine = [r for _, _, r in unread if draw(st.booleans())]
    return marks, writers, sorted(mine, key=lambda r: r.segment)


@settings(max_examples=400, deadline=None)
@given(_backlogs())
def test_a_new_readers_watermark_passes_a_mark_only_after_every_moved_row_before_it(
    backlog: tuple[list[WatermarkMark], int, list[_Row]],
) -> None:
    marks, writers, rows = backlog
    footer = {MOVED_KEY: moved_runs([r.segment for r in rows])}
    moved = SegmentName(max((m.checkpoint_id for m in marks), default=0), MOVED_WRITER)
    for cursor in range(len(rows) + 1):
        if cursor < len(rows):
            reached = mark_reached(moved, moved=first_published(footer, len(rows), cursor))
        else:  # read whole: the first unread segment is a later one
            reached = mark_reached(SegmentName(moved.checkpoint_id + 1, 0))
        unread = rows[cursor:]
        for m in marks:
            if reached(m):  # never counted while one of its writer's rows is unread
                assert not [
                    r for r in unread if r.writer == m.writer and r.epoch <= m.checkpoint_id
                ]
        # so no unread row is judged against a watermark above its origin
        watermark = reader_watermark(marks, writers, reached)
        assert all(watermark <= r.origin for r in unread)
    assert all(reached(m) for m in marks)  # and once read, every mark counts


def test_a_moved_backlog_whose_footer_does_not_say_holds_every_mark() -> None:
    moved = SegmentName(9, MOVED_WRITER)
    reached = mark_reached(moved, moved=first_published({MOVED_KEY: b"3:0:5"}, 2, 0))
    assert not reached(WatermarkMark(1, 0, 0))


# --- the rewrite, on files ----------------------------------------------------------------


def _context(checkpoint_id: int, writer: int, before: int, after: int) -> WriteContext:
    return WriteContext(
        job_id="j", run_id="r", checkpoint_id=checkpoint_id, attempt=0, unit_id=writer,
        vertex_id="x-writer", index=writer, watermarks=(before, after),
    )  # fmt: skip


def test_the_moved_backlog_keeps_each_rows_origin_and_holds_the_watermark_until_read(
    tmp_path: Path,
) -> None:
    """Two partitions, writers 0 and 1 with different watermarks: epoch 1 merged in one task
    (origin column), epoch 2 unmerged (origin in the footer). The old readers read nothing.
    Moved into 3 partitions: every record keeps its origin, and each new reader's watermark
    stays -inf (writer 1's first mark, 1, waits for its rows) until its backlog is read."""
    old = ExchangeWriter("x", lambda r: r["k"], 2)
    old.bind(str(tmp_path / "exchange" / "x"), None)
    keys = [f"k{i}" for i in range(8)]
    origin_of: dict[tuple[str, int, int], int] = {}
    for epoch, (b0, b1) in ((1, (MIN_WATERMARK, 100)), (2, (10, 200))):
        parts = []
        for w, before in ((0, b0), (1, b1)):
            rows = [{"k": k, "w": w, "e": epoch} for k in keys]
            origin_of.update({(k, w, epoch): before for k in keys})
            parts.append(
                (_context(epoch, w, before, before + 10), [pa.RecordBatch.from_pylist(rows)])
            )
        committables = (
            [c for cs in old.write_merged(parts) for c in cs]
            if epoch == 1
            else [c for ctx, batches in parts for c in old.write(batches, ctx)]
        )
        old.commit("u", epoch, committables)
    new = ExchangeWriter("x", lambda r: r["k"], 3)
    new.bind(old.path, None)
    assert repartition(old, new, 2, {}, [], 3, 2) == 4 * len(keys)

    reader = ExchangeReader("x", 3, bounded=True, writers=2)
    reader.bind(old.path, None)
    marks = reader.marks()
    seen = []
    for q in range(3):
        start = Cursor(2, MOVED_WRITER).encode()
        view = reader.watermark(split_id(3, q), start, marks)
        result, origins = reader.read_timed(split_id(3, q), start, 1_000)
        batches = [b for b in result.batches if isinstance(b, pa.RecordBatch)]
        if not batches:
            continue
        assert view.watermark == MIN_WATERMARK  # writer 0's rows of epoch 1 are unread
        for batch, origin in zip(batches, origins, strict=True):
            for r in batch.to_pylist():
                assert ORIGIN_COLUMN not in r
                seen.append((r["k"], r["w"], r["e"]))
                assert origin == origin_of[r["k"], r["w"], r["e"]], r
        # read whole: both writers' marks of epoch 2 count
        assert reader.watermark(split_id(3, q), result.position, marks).watermark == 20
        moved = pq.read_table(f"{old.path}/n3/p{q}/{SegmentName(2, MOVED_WRITER).file_name()}")
        assert int(moved.schema.metadata[ORIGIN_KEY]) == MIN_WATERMARK
    assert sorted(seen) == sorted(origin_of)


def test_a_rescale_gives_every_new_subtask_the_lowest_fired_watermark() -> None:
    """A window operator's fired watermark is not list state to deal round-robin: a new
    subtask holds keys of every old subtask, so it starts from the lowest (it used to get an
    arbitrary old subtask's, or none at all when scaling up, which failed every epoch)."""
    old = [
        OperatorState({KEY_SCOPE: {f"k{i}": {"n": i}}}, {FIRED_WATERMARK: [w]})
        for i, w in enumerate((300, 100, 200))
    ]
    for parallelism in (2, 4):
        new = redistribute_keys(old, parallelism)
        assert [s.lists[FIRED_WATERMARK] for s in new] == [[100]] * parallelism


# --- the whole job, in this process -------------------------------------------------------


def _driver(directory: Path, partitions: int, faults: Faults | None = None) -> JobDriver:
    p = job.all_operators(str(directory / "out"), partitions)
    root = str(directory / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "clicks", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, "clicks"),
        policy=policy,
        faults=faults,
    )


def outputs(directory: Path) -> dict[str, list[tuple[Any, ...]]]:
    """Every committed row of the job's tables, read with DuckDB (not the job's reader):
    per window operator (user, start, end, count), the sessionizer's (user, clicks, end),
    and the dead letters as (operator, split, n), each sorted."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    queries = {kind: 'SELECT user, start, "end", value FROM t' for kind in job.WINDOW_OPERATORS}
    queries[job.TIMERS] = 'SELECT user, clicks, "end" FROM t'
    queries["dead"] = "SELECT operator, record FROM t"
    for table, query in queries.items():
        files = glob.glob(os.path.join(directory, "out", table, "*.parquet"))
        if not files:
            out[table] = []
            continue
        con = duckdb.connect()
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r}, union_by_name=true)")
        rows = con.execute(query).fetchall()
        if table == "dead":
            rows = [(op, json.loads(r)["split"], json.loads(r)["n"]) for op, r in rows]
        out[table] = sorted(rows)
    return out


#: The records every run must dead-letter: each window operator's late clicks (every 23rd,
#: 40 s behind), no on-time one.
LATE = sorted(
    (op, s, n)
    for op in job.WINDOW_OPERATORS
    for s in range(job.SPLITS)
    for n in range(22, job.PER_SPLIT, 23)
)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Any, ...]]]:
    directory = tmp_path_factory.mktemp("fault-free")
    assert _driver(directory, 5).run().finished
    out = outputs(directory)
    assert out["dead"] == LATE
    assert all(out[t] for t in (*job.WINDOW_OPERATORS, job.TIMERS))
    return out


@pytest.mark.parametrize("layouts", [(5, 3, 4), (2, 3)], ids=["5-3-4", "2-3"])
def test_a_rescaled_job_gives_the_fault_free_rows_row_for_row(
    tmp_path: Path, fault_free: dict[str, list[tuple[Any, ...]]], layouts: tuple[int, ...]
) -> None:
    *before, last = layouts
    for partitions in before:
        assert not _driver(tmp_path, partitions).run(max_checkpoints=3).finished
    summary = _driver(tmp_path, last).run()
    assert summary.finished and summary.restored_from is not None
    assert outputs(tmp_path) == fault_free


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_unit_faults_and_a_driver_crash_in_the_rescaled_run_change_nothing(
    tmp_path: Path, fault_free: dict[str, list[tuple[Any, ...]]], step: str
) -> None:
    for partitions in (5, 3):
        _driver(tmp_path, partitions).run(max_checkpoints=3)
    # the run at 4 partitions starts at checkpoint 7, global (the rescaled state is kept
    # only until a checkpoint succeeds); then units fall back on both sides of the exchange
    # (upstream units 0-3, downstream 4-7) and the driver crashes
    units = {(8, 1): "fail", (8, 5): "fail", (9, 6): "fail", (9, 2): "fail", (10, 4): "fail"}
    with pytest.raises(DriverCrash):
        _driver(tmp_path, 4, Faults(units=units, crash_at=(10, step))).run()
    summary = _driver(tmp_path, 4).run()
    assert summary.finished and summary.restored_from is not None
    assert outputs(tmp_path) == fault_free


@pytest.mark.parametrize("partitions", [3, 6])
def test_a_writer_that_fell_back_keeps_its_watermark_through_a_rescale_of_another_stage(
    tmp_path: Path, fault_free: dict[str, list[tuple[Any, ...]]], partitions: int
) -> None:
    """Upstream writers 1 and 2 fall back in the checkpoint the rescaled run restores (owners
    2 and 1). A writer learns the watermark its next records carry (their origin) from the
    mark in the committables it restores; a restore that rewrites the checkpoint for another
    partition count kept only fresh subtasks' committables, so a fallen-back writer started
    from -inf and its first epoch's late records were judged on time (issue 41). Every
    writer subtask of the rewritten checkpoint must carry the mark its owner committed."""
    faults = Faults(units={(3, 1): "fail", (2, 2): "fail", (3, 2): "fail"})
    assert not _driver(tmp_path, 5, faults).run(max_checkpoints=3).finished
    storage = JobStorage(str(tmp_path / "ckpt"), "clicks")
    latest = storage.find_latest_restorable()
    assert latest is not None and latest.checkpoint_id == 3
    writer_id = "by-user-writer"
    writers = {s.index: s for s in latest.subtasks if s.vertex_id == writer_id}
    assert {i: s.ref_checkpoint_id for i, s in writers.items()} == {0: None, 1: 2, 2: 1, 3: None}

    driver = _driver(tmp_path, partitions)
    writer = driver.pipeline.sink_of(writer_id)
    assert isinstance(writer, ExchangeWriter)
    owned = {  # each writer's mark in the checkpoint that owns its state
        i: writer.committed_watermark(
            (s if s.ref_checkpoint_id is None else next(
                o for o in storage.read_metadata(s.ref_checkpoint_id).subtasks
                if (o.vertex_id, o.index) == (writer_id, i)
            )).committables
        )
        for i, s in writers.items()
    }  # fmt: skip
    assert all(m is not None and m > MIN_WATERMARK for m in owned.values()), owned
    point = find_restore_point(
        storage, driver.pipeline, driver.layout, restore_from=None, mode="claim",
        resume_mode="claim", run_id="probe",
    )  # fmt: skip
    assert point is not None and point.metadata is not latest  # rewritten
    restored = {
        s.index: writer.committed_watermark(s.committables)
        for s in point.metadata.subtasks
        if s.vertex_id == writer_id
    }
    assert restored == owned

    summary = driver.run()
    assert summary.finished and summary.restored_from is not None
    out = outputs(tmp_path)
    # The sessionizer's rows depend on the order a user's clicks from different writers
    # arrive, which an upstream fallback changes with or without a rescale (its timers are
    # not a commutative aggregate, DESIGN §4 rule 15); the windows and the late records are
    # exact.
    assert {k: v for k, v in out.items() if k != job.TIMERS} == {
        k: v for k, v in fault_free.items() if k != job.TIMERS
    }


# --- property: fallbacks, a rescale of the reading stage, a crash: the fault-free rows ----------


def skewed_click(split: int, n: int) -> dict[str, Any]:
    """`windows_job.click`, split s 30 s ahead of split s - 1: a writer that falls back for
    an epoch is still ahead of the others, so the readers' watermark does not cover its late
    clicks, only its own watermark does."""
    record = job.click(split, n)
    record["ts"] += split * 30_000
    return record


def _slim_driver(directory: Path, partitions: int, faults: Faults | None = None) -> JobDriver:
    """A small job: 3 click splits (`skewed_click`) -> exchange by user (`partitions`) -> a
    tumbling count, late clicks dead-lettered."""
    out = directory / "out"
    dead = ParquetSink(str(out / "dead"))
    p = Pipeline("slim", records_per_epoch=8, on_error="dead-letter", dead_letter=dead)
    keyed = p.source(
        GeneratorSource(3, skewed_click, records_per_split=48), parallelism=3, name="clicks",
        event_time=job.ts_of, max_out_of_orderness=job.BOUND_MS / 1000,
    ).key_by(job.user, partitions=partitions, name="by-user")  # fmt: skip
    keyed.window(
        Tumbling("10 s"), aggregate=count(), emit=job.emit, on_late="dead-letter", name="tumbling"
    ).sink(ParquetSink(str(out / "tumbling")), name="out-tumbling")
    root = str(directory / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.7}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "slim", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "slim"), policy=policy,
        faults=faults,
    )  # fmt: skip


@pytest.fixture(scope="module")
def slim_fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Any, ...]]]:
    directory = tmp_path_factory.mktemp("slim-fault-free")
    assert _slim_driver(directory, 2).run().finished
    out = outputs(directory)
    assert out["tumbling"] and out["dead"]
    return out


@settings(max_examples=8, deadline=None)
# split 2's writer, ahead of the others, falls back in the checkpoint restored: its late click
# was counted into a window before the restore kept its watermark (issue 41)
@example(first=2, second=3, stop_after=3, failing={(3, 2)}, crash=None)
@example(first=2, second=1, stop_after=3, failing={(3, 2)}, crash="after-commit")
@given(
    first=st.integers(1, 4),
    second=st.integers(1, 5),
    stop_after=st.integers(2, 5),
    failing=st.sets(st.tuples(st.integers(1, 5), st.integers(0, 2)), max_size=6),
    crash=st.none() | st.sampled_from(CRASH_STEPS),
)
def test_fallbacks_a_rescale_and_a_crash_give_the_fault_free_rows(
    tmp_path_factory: pytest.TempPathFactory,
    slim_fault_free: dict[str, list[tuple[Any, ...]]],
    first: int,
    second: int,
    stop_after: int,
    failing: set[tuple[int, int]],
    crash: str | None,
) -> None:
    """Upstream writer units (0-2) fail in random checkpoints of a first run, which stops
    after a few (so the checkpoint restored may hold fallen-back writers); a second run at
    another partition count may crash at any step of its second checkpoint; a third resumes
    to the end. The windows and the late clicks are the fault-free run's."""
    directory = tmp_path_factory.mktemp("slim")
    faults = Faults(units={(c, u): "fail" for c, u in failing if c <= stop_after})
    _slim_driver(directory, first, faults).run(max_checkpoints=stop_after)
    if crash is not None:
        crash_at = (stop_after + 2, crash)
        with pytest.raises(DriverCrash):
            _slim_driver(directory, second, Faults(crash_at=crash_at)).run()
    summary = _slim_driver(directory, second).run()
    assert summary.finished
    assert outputs(directory) == slim_fault_free
