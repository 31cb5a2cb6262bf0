"""Symbolic links in a table or an exchange never lead regional out of it (issue 25 item 2): a
link in `T/_staging/<job>`, `T/_commits/<user>`, an exchange partition directory or a segment
linked to an outside file: nothing outside is read, written or deleted, and the error names the
path and the link."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from metadata.exchange import Cursor, split_id
from regional.coordinator.commit import CommitCoordinator
from regional.dataflow.exchange import ExchangeReader, ExchangeWriter, exchange_path
from regional.errors import CommitError
from regional.runtime.restore import clean_staged_sinks
from regional.sinks.base import WriteContext
from regional.sinks.parquet import ParquetSink


def _context(cid: int, index: int = 0) -> WriteContext:
    return WriteContext(
        job_id="job",
        run_id="r1",
        checkpoint_id=cid,
        attempt=0,
        unit_id=index,
        vertex_id="out",
        index=index,
    )


def _tree(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A directory that is not ours, with a file in it."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "precious.staged").write_bytes(b"not regional's")
    return folder


def test_a_staging_link_out_of_the_table_is_refused_at_start_and_nothing_outside_goes(
    tmp_path, outside
):
    table = tmp_path / "t"
    sink = ParquetSink(str(table))
    sink.commit("job", 1, sink.write([pa.record_batch({"v": [1]})], _context(1)))
    shutil.rmtree(table / "_staging" / "job")
    os.symlink(outside, table / "_staging" / "job")  # _staging/job -> outside
    before = _tree(outside)
    pipeline = SimpleNamespace(sink_of={"out": sink}.__getitem__)
    committers = {"out": CommitCoordinator("out", commit_user="job")}
    with pytest.raises(CommitError) as refused:
        clean_staged_sinks(pipeline, committers, "job", None)  # type: ignore[arg-type]
    real = os.path.realpath(table)
    assert str(refused.value) == (
        f"table {table}: {table}/_staging/job is a symbolic link to {outside}, outside the "
        f"table {real}; regional never reads, writes or deletes through a link out of the "
        "table: remove the link"
    )
    with pytest.raises(CommitError, match="_staging/job, which is a symbolic link"):
        sink.write([pa.record_batch({"v": [2]})], _context(2))  # a task stages nothing there
    assert _tree(outside) == before


def test_a_commit_log_link_out_of_the_table_gets_no_record(tmp_path, outside):
    table = tmp_path / "t"
    sink = ParquetSink(str(table))
    staged = sink.write([pa.record_batch({"v": [1]})], _context(1))
    (table / "_commits").mkdir()
    os.symlink(outside, table / "_commits" / "job")
    before = _tree(outside)
    with pytest.raises(CommitError, match=r"_commits/job is a symbolic link to .*, outside the "):
        sink.commit("job", 1, staged)
    assert _tree(outside) == before


def _exchange(tmp_path: Path) -> tuple[ExchangeWriter, ExchangeReader, Path]:
    job = tmp_path / "root" / "job"
    path = exchange_path(str(job), "orders")
    writer = ExchangeWriter("orders", lambda r: r["k"], 2)
    writer.bind(path, None)
    reader = ExchangeReader("orders", 2, bounded=True)
    reader.bind(path, None)
    return writer, reader, Path(path)


def test_an_exchange_partition_linked_out_receives_no_segment(tmp_path, outside):
    writer, reader, path = _exchange(tmp_path)
    staged = writer.write([pa.RecordBatch.from_pylist([{"k": k} for k in range(20)])], _context(1))
    (path / "n2").mkdir(parents=True)
    os.symlink(outside, path / "n2" / "p0")
    before = _tree(outside)
    with pytest.raises(CommitError, match=r"n2/p0, which is a symbolic link to .*outside the job"):
        writer.commit("job", 1, staged)
    link = r"exchange 'orders': .*n2/p0 is a symbolic link to .*, outside the job root"
    with pytest.raises(CommitError, match=link):
        reader.read(split_id(2, 0), Cursor().encode(), 100)
    assert _tree(outside) == before


def test_a_segment_linked_to_an_outside_file_is_not_read(tmp_path, outside):
    writer, reader, path = _exchange(tmp_path)
    staged = writer.write([pa.RecordBatch.from_pylist([{"k": k} for k in range(20)])], _context(1))
    writer.commit("job", 1, staged)
    [segment] = list((path / "n2" / "p0").iterdir())
    foreign = outside / "foreign.parquet"
    os.replace(segment, foreign)  # a Parquet file outside, with rows of its own
    os.symlink(foreign, segment)
    with pytest.raises(CommitError) as refused:
        reader.read(split_id(2, 0), Cursor().encode(), 100)
    assert str(refused.value).startswith(
        f"exchange 'orders': {segment} is a symbolic link to {foreign}, outside the job root "
    )
