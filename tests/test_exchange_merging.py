"""Exchange merging (DESIGN §4 rule 16 for the keyed exchange): one segment per partition per
upstream task per epoch, instead of one per partition per writer subtask; a writer unit
declared fallen back after staging is cut out of the task's segments before the commit; the
reader's watermark never counts a mark whose rows are unread; windows across the exchange
give the same rows with merging on and off. In this process (`run_units`), no Spark."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
import orders_job
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import windows_job
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from metadata.commit_log import CommitRecord, read_records
from metadata.exchange import WRITERS_KEY, Cursor, SegmentName, segment_name
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.exchange import (
    ORIGIN_COLUMN,
    ORIGIN_KEY,
    ExchangeReader,
    ExchangeWriter,
)
from regional.dataflow.keys import key_function
from regional.dataflow.partitioning import partition_of
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.dispatch import Dispatch
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.base import MergingWriter, WriteContext
from regional.sinks.parquet import ParquetSink, read_table
from regional.sinks.staging import StagedFile, StagingArea
from regional.sources.base import ReadResult
from regional.sources.generator import GeneratorSource

WRITERS, PARTITIONS, PER_SPLIT, PER_EPOCH = 8, 4, 12, 4
EPOCHS = PER_SPLIT // PER_EPOCH
JOB, READER = "xm", "by-key"


def _keys() -> list[str]:
    """Two keys per partition, key i in partition i % 4: every writer's epoch (4 consecutive
    records) has a record for each partition."""
    by_partition: dict[int, list[str]] = {q: [] for q in range(PARTITIONS)}
    for i in range(999):
        keys = by_partition[partition_of(f"k{i}", PARTITIONS)]
        if len(keys) < 2:
            keys.append(f"k{i}")
    return [by_partition[i % PARTITIONS][i // PARTITIONS] for i in range(2 * PARTITIONS)]


KEYS = _keys()


def _record(split: int, n: int) -> dict[str, Any]:
    return {"id": split * 1000 + n, "w": split, "k": KEYS[(split + n) % len(KEYS)]}


def _count(ctx: Any, r: dict[str, Any]) -> Any:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"k": r["k"], "id": r["id"], "c": c.value()}


def _pipeline(table: str, partitions: int = PARTITIONS) -> Pipeline:
    p = Pipeline(JOB, records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(WRITERS, _record, records_per_split=PER_SPLIT), parallelism=WRITERS
    )
    src.key_by(lambda r: r["k"], partitions=partitions, name=READER).process(
        _count, name="count"
    ).sink(ParquetSink(table), name="out")
    return p


class _Tasks(InProcessDispatcher):
    """The units of an epoch in `tasks` Spark-like tasks (unit i in task i % tasks, so each
    task's writers interleave with the other's); `lose` turns the acks of (checkpoint, unit)
    pairs into declines after the task staged their rows."""

    def __init__(
        self, env: TaskEnv, tasks: int = 1, lose: frozenset[tuple[int, int]] = frozenset()
    ) -> None:
        super().__init__(env, tasks=tasks, interleaved=True)
        self.lose = lose

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        return Dispatch(
            [
                Decline(a.checkpoint_id, a.unit, a.attempt, "timeout: the ack came too late")
                if isinstance(a, Ack) and (a.checkpoint_id, a.unit) in self.lose
                else a
                for a in super().run(works, deadline_ms, isolated=isolated).answers
            ]
        )


def _driver(
    tmp_path: Path,
    p: Pipeline,
    *,
    tasks: int = 1,
    lose: frozenset[tuple[int, int]] = frozenset(),
    merge: bool = True,
    job_id: str = JOB,
    **kw: Any,
) -> JobDriver:
    root = str(tmp_path / "ckpt")
    overrides = {
        "checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}},
    }
    policy = load_policy(env={}, overrides=overrides).policy
    env = TaskEnv(root, job_id, p, unit_timeout=30, merge_sink_files=merge)
    return JobDriver(
        p, _Tasks(env, tasks, lose), storage=JobStorage(root, job_id), policy=policy, **kw
    )


def _exchange(tmp_path: Path, reader: str = READER, job_id: str = JOB) -> Path:
    return tmp_path / "ckpt" / job_id / "exchange" / reader


def _records(tmp_path: Path) -> dict[int, CommitRecord]:
    area = StagingArea.at(str(_exchange(tmp_path)), "x")
    return {r.identifier: r for r in area.records() if not r.commit_user.startswith("_")}


def _segments_per_epoch(exchange: Path) -> list[int]:
    """The segments each commit of the exchange at `exchange` published (that had rows)."""
    records = read_records(pafs.LocalFileSystem(), str(exchange), since=0)
    return [
        len([f for f in r.files if not f.startswith("_")])
        for r in sorted(records, key=lambda r: r.identifier)
        if r.rows and not r.commit_user.startswith("_")
    ]


def _check_exact(tmp_path: Path) -> None:
    rows = read_table(str(tmp_path / "table")).to_pylist()
    ids = sorted(r["id"] for r in rows)
    assert ids == sorted(_record(s, n)["id"] for s in range(WRITERS) for n in range(PER_SPLIT))
    per_key = Counter(_record(s, n)["k"] for s in range(WRITERS) for n in range(PER_SPLIT))
    assert sorted((r["k"], r["c"]) for r in rows) == sorted(
        (k, c) for k, n in per_key.items() for c in range(1, n + 1)
    )


def _staged(tmp_path: Path) -> list[str]:
    staging = _exchange(tmp_path) / "_staging" / JOB
    return sorted(os.listdir(staging)) if staging.exists() else []


def test_the_exchange_writer_is_a_merging_writer() -> None:
    assert isinstance(ExchangeWriter("x", lambda r: r, 2), MergingWriter)


@pytest.mark.parametrize(("tasks", "per_epoch"), [(1, PARTITIONS), (2, 2 * PARTITIONS)])
def test_one_segment_per_partition_per_task_per_epoch_and_exact_output(
    tmp_path: Path, tasks: int, per_epoch: int
) -> None:
    assert _driver(tmp_path, _pipeline(str(tmp_path / "table")), tasks=tasks).run().finished
    assert _segments_per_epoch(_exchange(tmp_path)) == [per_epoch] * EPOCHS  # unmerged: 8 x 4 = 32
    _check_exact(tmp_path)
    assert _staged(tmp_path) == []
    # every published segment holds only its partition's keys, in writer order, and is
    # named after the lowest writer of its task (writers i % tasks == t: task t's lowest is t)
    for q in range(PARTITIONS):
        directory = _exchange(tmp_path) / f"n{PARTITIONS}" / f"p{q}"
        for name in sorted(os.listdir(directory)):
            segment = segment_name(name)
            assert segment is not None and segment.writer < tasks
            t = pq.read_table(directory / name)
            assert {partition_of(k, PARTITIONS) for k in t.column("k").to_pylist()} == {q}
            writers = t.column("w").to_pylist()
            assert writers == sorted(writers)
            assert {w % tasks for w in writers} == {segment.writer}


def test_parts_name_their_rows_and_the_segment_after_the_lowest_writer(tmp_path: Path) -> None:
    writer = ExchangeWriter("x", lambda r: r["k"], 2)
    writer.bind(str(tmp_path / "exchange" / "x"), None)

    def part(w: int, rows: list[dict[str, Any]]) -> tuple[WriteContext, list[pa.RecordBatch]]:
        context = WriteContext(
            job_id="j", run_id="r", checkpoint_id=3, attempt=0, unit_id=w, vertex_id="x-w",
            index=w,
        )  # fmt: skip
        return context, [pa.RecordBatch.from_pylist(rows)] if rows else []

    keys = {q: next(f"k{i}" for i in range(99) if partition_of(f"k{i}", 2) == q) for q in (0, 1)}
    # parts out of writer order: the segment is named after writer 2 and holds writer order
    parts = [
        part(5, [{"k": keys[0], "v": 50}, {"k": keys[1], "v": 51}]),
        part(2, [{"k": keys[0], "v": 20}]),
        part(7, []),
    ]
    out = writer.write_merged(parts)
    items = [[msgspec.msgpack.decode(c, type=StagedFile) for c in cs] for cs in out]
    assert [len(i) for i in items] == [2, 1, 0]
    assert {os.path.basename(i.file)[:34] for cs in items for i in cs} == {
        "n2-p0-c00000000000000000003-w00002",
        "n2-p1-c00000000000000000003-w00002",
    }
    [p0_of_5, _], [p0_of_2] = items[0], items[1]
    assert (p0_of_2.first_row, p0_of_2.rows, p0_of_2.file_rows) == (0, 1, 2)
    assert (p0_of_5.first_row, p0_of_5.rows, p0_of_5.file_rows) == (1, 1, 2)
    # several committables name one file: published once, named once
    assert writer.published_paths([c for cs in out for c in cs]) == [
        "exchange/x/n2/p0/00000000000000000003-00002.parquet",
        "exchange/x/n2/p1/00000000000000000003-00002.parquet",
    ]
    # writer 2 falls back: partition 0's segment is rewritten with writer 5's row only
    writer.commit("u", 3, out[0])
    p0 = tmp_path / "exchange" / "x" / "n2" / "p0" / SegmentName(3, 2).file_name()
    assert pq.read_table(p0).column("v").to_pylist() == [50]
    assert os.listdir(tmp_path / "exchange" / "x" / "_staging" / "j") == []


@pytest.mark.parametrize("crash", [None, "after-metadata", "after-commit"])
@pytest.mark.parametrize("tasks", [1, 2])
def test_a_writer_declared_fallen_back_after_staging_is_cut_out_of_its_tasks_segments(
    tmp_path: Path, crash: str | None, tasks: int
) -> None:
    table = str(tmp_path / "table")
    lose = frozenset({(2, 1)})  # writer unit 1's ack at checkpoint 2 came too late
    if crash is None:
        assert _driver(tmp_path, _pipeline(table), tasks=tasks, lose=lose).run().finished
    else:
        faults = Faults(crash_at=(2, crash))
        first = _driver(tmp_path, _pipeline(table), tasks=tasks, lose=lose, faults=faults)
        with pytest.raises(DriverCrash):
            first.run()
        again = _driver(tmp_path, _pipeline(table), tasks=tasks)
        summary = again.run()
        assert summary.finished and summary.restored_from is not None
    _check_exact(tmp_path)
    assert _staged(tmp_path) == []
    records = _records(tmp_path)
    assert records[2].rows == (WRITERS - 1) * PER_EPOCH  # without writer 1's rows
    assert records[1].rows == WRITERS * PER_EPOCH


def test_a_restore_with_other_partitions_moves_only_the_committed_parts(tmp_path: Path) -> None:
    table = str(tmp_path / "table")
    # crash after checkpoint 2's metadata: its segments (writer 1 cut out) are not published
    faults = Faults(crash_at=(2, "after-metadata"))
    first = _driver(tmp_path, _pipeline(table), lose=frozenset({(2, 1)}), faults=faults)
    with pytest.raises(DriverCrash):
        first.run()
    assert _staged(tmp_path) and 2 not in _records(tmp_path)  # read from the staged files
    summary = _driver(tmp_path, _pipeline(table, partitions=2)).run()  # repartitions them
    assert summary.finished and summary.restored_from is not None
    _check_exact(tmp_path)


def _batches(result: ReadResult) -> list[pa.RecordBatch]:
    assert all(isinstance(b, pa.RecordBatch) for b in result.batches)
    return [b for b in result.batches if isinstance(b, pa.RecordBatch)]


# --- the reader's watermark ---------------------------------------------------------------


def test_a_reader_never_counts_a_mark_whose_writers_rows_it_has_not_read(tmp_path: Path) -> None:
    """Two tasks per epoch: writers {0, 2} and {1, 3}, so writer 2's rows live in segment
    (Y, 0), writer 1's in (Y, 1). Read partition 0 row by row: at every cursor, a mark (Y, w)
    counts only when every row of w up to epoch Y was read."""
    base = tmp_path / "exchange" / "x"
    writer = ExchangeWriter("x", lambda r: r["k"], 1)
    writer.bind(str(base), None)
    for y in (1, 2):
        committables: list[bytes] = []
        for task in ((0, 2), (1, 3)):
            parts = []
            for w in task:
                context = WriteContext(
                    job_id="j", run_id="r", checkpoint_id=y, attempt=0, unit_id=w,
                    vertex_id="x-w", index=w, watermarks=(y * 100 + w, y * 100 + 100 + w),
                )  # fmt: skip
                rows = [{"k": "k", "w": w, "y": y, "i": i} for i in range(w + 1)]
                parts.append((context, [pa.RecordBatch.from_pylist(rows)]))
            out = writer.write_merged(parts)
            committables += [c for cs in out for c in cs]
        writer.commit("u", y, committables)
    reader = ExchangeReader("x", 1, bounded=True, writers=4)
    reader.bind(str(base), None)
    marks = reader.marks()
    assert len(marks) == 8
    position, read = b"", Counter[tuple[int, int]]()
    total = sum((w + 1) for w in range(4)) * 2
    for _ in range(total + 1):
        reached = reader.reached(1, 0, Cursor.decode(position))
        for m in marks:
            rows_of_w = (m.writer + 1) * m.checkpoint_id  # w + 1 rows per epoch
            done = sum(n for (y, w), n in read.items() if w == m.writer and y <= m.checkpoint_id)
            if reached(m):
                assert done == rows_of_w, (m, position)
        result = reader.read("n1-p0", position, 1)
        for b in _batches(result):
            for r in b.to_pylist():
                read[r["y"], r["w"]] += 1
        position = result.position
    assert sum(read.values()) == total
    assert all(reader.reached(1, 0, Cursor.decode(position))(m) for m in marks)


def test_inside_a_merged_segment_a_reader_counts_the_writers_it_read_whole(
    tmp_path: Path,
) -> None:
    base = tmp_path / "exchange" / "x"
    writer = ExchangeWriter("x", lambda r: r["k"], 1)
    writer.bind(str(base), None)
    parts = []
    for w in (0, 1, 2):
        context = WriteContext(
            job_id="j", run_id="r", checkpoint_id=1, attempt=0, unit_id=w, vertex_id="x-w",
            index=w, watermarks=(0, 10 + w),
        )  # fmt: skip
        parts.append((context, [pa.RecordBatch.from_pylist([{"k": "k", "w": w}] * 2)]))
    writer.commit("u", 1, [c for cs in writer.write_merged(parts) for c in cs])
    [segment] = os.listdir(base / "n1" / "p0")
    assert pq.read_metadata(base / "n1" / "p0" / segment).metadata[WRITERS_KEY] == b"0:2,1:2,2:2"
    reader = ExchangeReader("x", 1, bounded=True, writers=3)
    reader.bind(str(base), None)
    marks = reader.marks()
    counted = [
        [m.writer for m in marks if reader.reached(1, 0, Cursor(1, 0, row))(m)] for row in range(6)
    ]
    assert counted == [[], [], [0], [0], [0, 1], [0, 1]]


# --- event time: windows across the exchange, merging on and off ----------------------------


def _windows(tmp_path: Path, *, merge: bool, tasks: int) -> tuple[list[Any], list[Any], Path]:
    table, dead = str(tmp_path / "table"), str(tmp_path / "dead")
    p = windows_job.pipeline(
        "sliding",
        table,
        partitions=3,
        parallelism=windows_job.SPLITS,
        on_late="dead-letter",
        dead_letter=ParquetSink(dead),
    )
    driver = _driver(tmp_path, p, tasks=tasks, merge=merge, job_id="clicks")
    assert driver.run().finished
    late = sorted(
        (json.loads(r["record"])["split"], json.loads(r["record"])["n"])
        for r in read_table(dead).to_pylist()
    )
    return windows_job.rows(table), late, tmp_path / "ckpt" / "clicks" / "exchange" / "by-user"


@pytest.mark.parametrize("tasks", [1, 2])
def test_windows_across_the_exchange_are_the_same_with_merging_on_and_off(
    tmp_path: Path, tasks: int
) -> None:
    off_rows, off_late, off_dir = _windows(tmp_path / "off", merge=False, tasks=tasks)
    on_rows, on_late, on_dir = _windows(tmp_path / "on", merge=True, tasks=tasks)
    assert on_rows == off_rows and on_late == off_late
    assert off_late  # the job has late records: their verdict is the same
    off = _segments_per_epoch(off_dir)
    on = _segments_per_epoch(on_dir)
    assert sum(on) < sum(off) and max(on) <= 3 * tasks  # 3 partitions
    # merged segments of writers at different watermarks carry each row's own origin
    metas = [pq.read_schema(p) for p in on_dir.glob("n3/p*/*.parquet")]
    assert metas and all(ORIGIN_KEY in (s.metadata or {}) for s in metas)
    assert all(ORIGIN_COLUMN not in pq.read_schema(p).names for p in off_dir.glob("n3/p*/*"))


def test_a_rewritten_segment_keeps_its_origins(tmp_path: Path) -> None:
    base = tmp_path / "exchange" / "x"
    writer = ExchangeWriter("x", lambda r: r["k"], 1)
    writer.bind(str(base), None)
    parts = []
    for w in (0, 1, 2):
        context = WriteContext(
            job_id="j", run_id="r", checkpoint_id=1, attempt=0, unit_id=w, vertex_id="x-w",
            index=w, watermarks=(100 * w, 100 * w + 50),
        )  # fmt: skip
        parts.append((context, [pa.RecordBatch.from_pylist([{"k": "k", "w": w}])]))
    out = writer.write_merged(parts)
    writer.commit("u", 1, [*out[0], *out[2]])  # writer 1 fell back after staging
    reader = ExchangeReader("x", 1, bounded=True, writers=3)
    reader.bind(str(base), None)
    result, origins = reader.read_timed("n1-p0", b"", 10)
    assert [r["w"] for b in _batches(result) for r in b.to_pylist()] == [0, 2]
    assert all(ORIGIN_COLUMN not in b.schema.names for b in _batches(result))
    assert origins == [0, 200]
    [segment] = os.listdir(base / "n1" / "p0")
    meta = pq.read_metadata(base / "n1" / "p0" / segment).metadata
    assert meta[ORIGIN_KEY] == b"0"  # kept through the rewrite
    # the rewrite's writers list no longer adds up: a reader inside it waits for its end
    assert [m.writer for m in reader.marks() if reader.reached(1, 0, Cursor(1, 0, 1))(m)] == []


def test_orders_job_in_two_tasks_counts_every_order_once(tmp_path: Path) -> None:
    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    assert _driver(tmp_path, p, tasks=2, job_id="orders").run().finished
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()


@pytest.mark.parametrize("lost", [2, 3])
def test_a_savepoint_after_a_writer_was_cut_out_of_merged_segments_restores_exactly(
    tmp_path: Path, lost: int
) -> None:
    """The savepoint (a global checkpoint after the loss) copies the unread backlog, merged
    and rewritten segments among it, into the savepoint; restored in another root."""
    table = str(tmp_path / "table")
    first = _driver(tmp_path / "a", _pipeline(table), lose=frozenset({(lost, 1)}))
    summary = first.run(max_checkpoints=3, stop_with_savepoint=True)
    assert summary.savepoint is not None and not summary.finished
    resumed = _driver(tmp_path / "b", _pipeline(table), restore_from=summary.savepoint).run()
    assert resumed.finished and resumed.restored_from is not None
    _check_exact(tmp_path)


_key_values = st.one_of(
    st.integers(-3, 3), st.sampled_from(["a", "b", "ü", ""]), st.booleans(), st.none()
)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(_key_values, st.integers(0, 99)), max_size=12), min_size=1, max_size=3
    ),
    st.sampled_from(["int", "str", "bool", "timestamp"]),
    st.integers(1, 5),
)
def test_a_field_key_places_arrow_rows_where_the_record_path_places_their_records(
    parts: list[list[tuple[Any, int]]], kind: str, partitions: int
) -> None:
    """`key_by("k")` partitions Arrow batches by column (one hash per distinct key): the
    same rows in the same partitions and order as the key function's record-by-record path."""
    import datetime as dt

    def value(k: Any) -> Any:
        if k is None:
            return None
        return {
            "int": lambda: int(k) if not isinstance(k, str) else len(k),
            "str": lambda: str(k),
            "bool": lambda: bool(k),
            "timestamp": lambda: (
                dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=hash(str(k)) % 1000)
            ),
        }[kind]()

    types = {"int": pa.int64(), "str": pa.string(), "bool": pa.bool_(),
             "timestamp": pa.timestamp("ms", "UTC")}  # fmt: skip
    schema = pa.schema([("k", types[kind]), ("n", pa.int64())])
    batches = [
        [pa.RecordBatch.from_pylist([{"k": value(k), "n": n} for k, n in rows], schema=schema)]
        for rows in parts
    ]
    by_column = ExchangeWriter("x", key_function("k"), partitions).partition_tables(batches)
    by_record = ExchangeWriter("x", lambda r: r["k"], partitions).partition_tables(batches)
    assert [{q: t.to_pylist() for q, t in g.items()} for g in by_column] == [
        {q: t.to_pylist() for q, t in g.items()} for g in by_record
    ]
