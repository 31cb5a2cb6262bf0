"""Sink output merging (DESIGN §4 rule 16): one staged data file per task, sink and epoch; a
unit declared fallen back after its rows were staged is cut out of the file before the commit.

Read back with DuckDB and pyarrow.dataset, not only with our own reader."""

from __future__ import annotations

import os
from collections.abc import Sequence

import duckdb
import msgspec
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from counted_job import EXACT, PER_EPOCH, PER_SPLIT, SPLITS, counted_pipeline
from hypothesis import given
from hypothesis import strategies as st

from metadata.commit_log import CommitRecord
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.pipeline import Pipeline
from regional.errors import CommitError
from regional.policy import load_policy
from regional.runtime.dispatch import Dispatch
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.base import WriteContext
from regional.sinks.merging import FilePart, kept_ranges, merged_table, take_ranges
from regional.sinks.parquet import ParquetSink, read_table
from regional.sinks.staging import StagedFile, StagingArea


def _pipeline(table: str) -> Pipeline:
    return counted_pipeline("merged", ParquetSink(table))


class _OneTask(InProcessDispatcher):
    """Every unit of an epoch in one task (as one Spark task would run them); `lose` turns the
    acks of (checkpoint, unit) pairs into declines after the task staged their rows (an ack
    the coordinator saw too late)."""

    def __init__(self, env: TaskEnv, lose: frozenset[tuple[int, int]] = frozenset()) -> None:
        super().__init__(env)
        self.lose = lose

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        answers = [
            Decline(a.checkpoint_id, a.unit, a.attempt, "timeout: the ack came too late")
            if isinstance(a, Ack) and (a.checkpoint_id, a.unit) in self.lose
            else a
            for a in super().run(works, deadline_ms, isolated=isolated).answers
        ]
        return Dispatch(answers)


def _driver(tmp_path, lose=frozenset(), **kw) -> JobDriver:
    p = _pipeline(str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    policy = load_policy(
        env={}, overrides={"checkpointing": {"timeout": "30 s", "num-retained": 1}}
    ).policy
    env = TaskEnv(root, "merged", p, unit_timeout=30)
    storage = JobStorage(root, "merged")
    return JobDriver(p, _OneTask(env, lose), storage=storage, policy=policy, **kw)


def _rows(tmp_path) -> list[tuple[int, int, int]]:
    return sorted(
        (r["split"], r["n"], r["c"]) for r in read_table(str(tmp_path / "table")).to_pylist()
    )


def _read_by_others(tmp_path) -> tuple[list[tuple], list[tuple]]:
    """The table as DuckDB and pyarrow.dataset read it (sorted rows)."""
    table = tmp_path / "table"
    by_duckdb = duckdb.sql(
        f"select split, n, c from read_parquet('{table}/**/*.parquet') order by all"
    ).fetchall()
    data = ds.dataset(str(table), format="parquet").to_table().to_pylist()
    return by_duckdb, sorted((r["split"], r["n"], r["c"]) for r in data)


def _records(tmp_path) -> dict[int, CommitRecord]:
    return {r.identifier: r for r in StagingArea.at(str(tmp_path / "table"), "t").records()}


def _staged(tmp_path) -> list[str]:
    staging = tmp_path / "table" / "_staging" / "merged"
    return sorted(os.listdir(staging)) if staging.exists() else []


def test_a_task_stages_one_file_for_all_its_units_and_each_ack_names_its_part(tmp_path):
    summary = _driver(tmp_path).run(max_checkpoints=1)
    assert summary.checkpoints[0].checkpoint_id == 1
    [record] = _records(tmp_path).values()
    assert len(record.files) == 1 and record.rows == SPLITS * PER_EPOCH  # 4 units, one file
    md = JobStorage(str(tmp_path / "ckpt"), "merged").read_metadata(1)
    parts = [
        msgspec.msgpack.decode(c, type=StagedFile)
        for s in md.subtasks
        if s.vertex_id == "out"
        for c in s.committables
    ]
    assert len({p.file for p in parts}) == 1
    assert sorted((p.first_row, p.rows, p.file_rows) for p in parts) == [
        (0, 3, 12),
        (3, 3, 12),
        (6, 3, 12),
        (9, 3, 12),
    ]
    assert _staged(tmp_path) == []  # published


def test_a_unit_declared_fallen_back_after_staging_is_cut_out_of_the_file(tmp_path):
    summary = _driver(tmp_path, lose=frozenset({(2, 1)})).run()
    assert summary.finished
    assert _rows(tmp_path) == EXACT
    assert _read_by_others(tmp_path) == (EXACT, EXACT)
    records = _records(tmp_path)
    [rewritten] = records[2].files
    assert "-k" in rewritten and records[2].rows == (SPLITS - 1) * PER_EPOCH
    assert all("-k" not in f for i, r in records.items() if i != 2 for f in r.files)
    assert _staged(tmp_path) == []  # the merged original went after the commit


@pytest.mark.parametrize("step", ["after-metadata", "after-commit"])
def test_a_crash_around_the_rewriting_commit_resumes_exactly(tmp_path, step):
    with pytest.raises(DriverCrash):
        _driver(tmp_path, lose=frozenset({(2, 1)}), faults=Faults(crash_at=(2, step))).run()
    assert _driver(tmp_path).run().finished
    assert _rows(tmp_path) == EXACT
    assert _read_by_others(tmp_path) == (EXACT, EXACT)
    assert _staged(tmp_path) == []


def test_a_crash_between_publishing_the_rewrite_and_its_record_resumes_exactly(
    tmp_path, monkeypatch
):
    real = StagingArea.write_record

    class Killed(BaseException):  # the driver process dies (no commit retry)
        pass

    def crash_on_2(self, record):
        if record.identifier == 2:
            raise Killed
        real(self, record)

    monkeypatch.setattr(StagingArea, "write_record", crash_on_2)
    with pytest.raises(Killed):
        _driver(tmp_path, lose=frozenset({(2, 1)})).run()
    published = [f for f in os.listdir(tmp_path / "table") if "-k" in f]
    assert len(published) == 1  # the rewrite is out, its record is not
    monkeypatch.setattr(StagingArea, "write_record", real)
    assert _driver(tmp_path).run().finished
    assert _rows(tmp_path) == EXACT
    assert _read_by_others(tmp_path) == (EXACT, EXACT)


def _context(unit: int) -> WriteContext:
    return WriteContext(
        job_id="job",
        run_id="r",
        checkpoint_id=1,
        attempt=0,
        unit_id=unit,
        vertex_id="out",
        index=unit,
    )


def test_discarding_keeps_a_merged_file_until_every_part_is_discarded(tmp_path):
    sink = ParquetSink(str(tmp_path))
    a, b = (pa.record_batch({"x": [i]}) for i in (1, 2))
    [ca, cb] = sink.write_merged([(_context(0), [a]), (_context(1), [b])])
    staging = tmp_path / "_staging" / "job"
    sink.discard(ca)
    assert len(os.listdir(staging)) == 1  # unit 1's rows may still commit
    sink.discard(cb)
    assert os.listdir(staging) == []


def test_a_committable_of_the_layout_before_merging_still_commits(tmp_path):
    sink = ParquetSink(str(tmp_path))
    [new] = sink.write([pa.record_batch({"x": [1, 2]})], _context(0))
    item = msgspec.msgpack.decode(new, type=StagedFile)
    old = msgspec.msgpack.encode([item.file, item.rows, item.size, item.checksum])  # 4 fields
    sink.commit("user", 1, [old])
    assert read_table(str(tmp_path)).column("x").to_pylist() == [1, 2]


def test_parts_that_overlap_are_refused_naming_the_file():
    parts = [FilePart(0, 3, 6), FilePart(2, 2, 6)]
    with pytest.raises(CommitError, match=r"merged staged file f: part rows 2\.\.3 of 6"):
        kept_ranges(parts, "f")


@given(
    st.lists(st.integers(0, 4), min_size=1, max_size=8),
    st.data(),
)
def test_a_commit_keeps_exactly_the_rows_of_its_parts_in_order(sizes, data):
    batches = [
        [pa.record_batch({"unit": [u] * n, "i": list(range(n))})] if n else []
        for u, n in enumerate(sizes)
    ]
    table, places = merged_table(batches)
    with_rows = [u for u, p in enumerate(places) if p is not None]
    if table is None:
        assert with_rows == []
        return
    committed = data.draw(st.lists(st.sampled_from(with_rows), min_size=1, unique=True))
    keep = kept_ranges([places[u] for u in committed], "f")
    kept = table if keep is None else take_ranges(table, keep)
    expected = [(u, i) for u in sorted(committed) for i in range(sizes[u])]
    got = zip(kept.column("unit").to_pylist(), kept.column("i").to_pylist(), strict=True)
    assert list(got) == expected
    assert (keep is None) == (set(committed) == set(with_rows))


def test_batches_made_from_pandas_merge(tmp_path):
    pd = pytest.importorskip("pandas")
    sink = ParquetSink(str(tmp_path))
    frames = [pa.RecordBatch.from_pandas(pd.DataFrame({"x": [i]})) for i in (1, 2)]
    [ca, cb] = sink.write_merged([(_context(0), frames), (_context(1), [frames[0]])])
    sink.commit("user", 1, [*ca, *cb])
    assert read_table(str(tmp_path)).column("x").to_pylist() == [1, 2, 1]


def _delta_driver(tmp_path, lose=frozenset(), **kw) -> JobDriver:
    from regional.sinks.delta import DeltaSink

    schema = pa.schema([("split", pa.int64()), ("n", pa.int64()), ("c", pa.int64())])
    p = counted_pipeline("merged", DeltaSink(str(tmp_path / "delta"), schema=schema))
    root = str(tmp_path / "ckpt")
    policy = load_policy(
        env={}, overrides={"checkpointing": {"timeout": "30 s", "num-retained": 1}}
    ).policy
    env = TaskEnv(root, "merged", p, unit_timeout=30)
    storage = JobStorage(root, "merged")
    return JobDriver(p, _OneTask(env, lose), storage=storage, policy=policy, **kw)


@pytest.mark.parametrize("crash", [None, "after-metadata", "after-commit"])
def test_a_delta_table_gets_one_file_per_task_and_a_late_unit_cut_out_exactly(tmp_path, crash):
    deltalake = pytest.importorskip("deltalake")
    lose = frozenset({(2, 1)})
    if crash is not None:
        with pytest.raises(DriverCrash):
            _delta_driver(tmp_path, lose, faults=Faults(crash_at=(2, crash))).run()
        assert _delta_driver(tmp_path).run().finished
    else:
        assert _delta_driver(tmp_path, lose).run().finished
    table = deltalake.DeltaTable(str(tmp_path / "delta"))
    rows = table.to_pyarrow_table().to_pylist()
    assert sorted((r["split"], r["n"], r["c"]) for r in rows) == EXACT
    files = table.file_uris()
    assert len(files) == PER_SPLIT // PER_EPOCH + 1  # a file per epoch, one more: the redo
    assert sum("-k" in f for f in files) == 1  # checkpoint 2's file, without unit 1's rows
