"""Sink output merging in the lakehouse sinks (Delta, Iceberg, Paimon; the extras
regional-checkpoints[delta,iceberg,paimon]): `write_merged` stages one data file for the units
of a task; a commit of every part adds that one file, a commit of some parts adds a rewrite of it
with exactly their rows; a retried commit never duplicates a row; discarding deletes a merged file
only with its last part; committables of older versions (without the part fields) still commit.
Rows are read back with each table's own reader, and with DuckDB over the table's data files."""

from __future__ import annotations

import os
import pickle
import shutil

import duckdb
import msgspec
import pyarrow as pa
import pyiceberg.table
import pypaimon
import pytest
from deltalake import DeltaTable
from pyiceberg.catalog import load_catalog

from regional.coordinator import Commit
from regional.coordinator.commit import perform_commit
from regional.errors import CommitError
from regional.sinks.base import MergingWriter, WriteContext
from regional.sinks.delta import DeltaSink
from regional.sinks.iceberg import IcebergSink
from regional.sinks.paimon import PaimonSink

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])

A = [("a", 1), ("b", 2)]
B = [("c", 3)]
C = [("d", 4), ("e", 5)]


def _batch(rows: list[tuple[str, int]]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([{"user": u, "n": n} for u, n in rows])


def _context(cid: int, unit: int, job: str = "job") -> WriteContext:
    return WriteContext(
        job_id=job,
        run_id="r1",
        checkpoint_id=cid,
        attempt=0,
        unit_id=unit,
        vertex_id="out",
        index=0,
    )


def _merged(sink, cid: int, parts: list[list[tuple[str, int]]]) -> list[tuple[bytes, ...]]:
    """`write_merged` of one part per unit (unit i: `parts[i]`) by a writer as a Spark task
    gets it (through pickle)."""
    writer = pickle.loads(pickle.dumps(sink))
    assert isinstance(writer, MergingWriter)
    return writer.write_merged(
        [(_context(cid, unit), [_batch(rows)] if rows else []) for unit, rows in enumerate(parts)]
    )


def _flat(*committables: tuple[bytes, ...]) -> list[bytes]:
    return [c for cs in committables for c in cs]


# --- Delta ---------------------------------------------------------------------------------------


def _delta(tmp_path) -> DeltaSink:
    return DeltaSink(str(tmp_path / "delta"), schema=SCHEMA)


def _delta_rows(path: str) -> list[tuple]:
    t = DeltaTable(path).to_pyarrow_table()
    return sorted(zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True))


def _delta_duckdb(path: str) -> list[tuple]:
    files = DeltaTable(path).file_uris()
    if not files:
        return []
    return sorted(duckdb.execute(f"SELECT user, n FROM read_parquet({files!r})").fetchall())


def _delta_adds(path: str) -> list[tuple[str, int]]:
    """(file, numRecords) of every data file in the table."""
    adds = pa.table(DeltaTable(path).get_add_actions(flatten=True))
    return sorted(
        zip(adds.column("path").to_pylist(), adds.column("num_records").to_pylist(), strict=True)
    )


def _parquet_files(directory: str) -> list[str]:
    return sorted(f for f in os.listdir(directory) if f.endswith(".parquet"))


def test_delta_a_merged_file_committed_whole_is_one_add_with_every_row(tmp_path):
    sink = _delta(tmp_path)
    a, empty, c = _merged(sink, 1, [A, [], C])
    assert empty == () and len(a) == len(c) == 1
    [staged] = _parquet_files(sink.path)
    assert sink.rows_of(_flat(a, c)) == 4 and sink.missing_files(_flat(a, c)) == []
    assert sink.data_files(_flat(a, c)) == [f"{sink.path}/{staged}"]
    assert perform_commit(Commit(1, "out", "job", _flat(a, c)), sink) is True
    assert _delta_rows(sink.path) == sorted(A + C) == _delta_duckdb(sink.path)
    assert _delta_adds(sink.path) == [(staged, 4)]  # one add action, the whole file's rows


def test_delta_a_part_not_committed_is_rewritten_out_and_the_merged_file_deleted(tmp_path):
    sink = _delta(tmp_path)
    a, _b, c = _merged(sink, 1, [A, B, C])
    [merged] = _parquet_files(sink.path)
    sink.commit("job", 1, _flat(a, c))  # unit 1 was declared fallen back after it was staged
    assert _delta_rows(sink.path) == sorted(A + C) == _delta_duckdb(sink.path)
    rewritten = merged.removesuffix(".parquet") + "-k0.2_3.2.parquet"
    assert _delta_adds(sink.path) == [(rewritten, 4)]
    assert _parquet_files(sink.path) == [rewritten]  # the merged file is gone
    assert sink.missing_files(_flat(a, c)) == []  # resolved through its rewrite


def test_delta_a_commit_retried_after_a_crash_before_or_after_the_table_commit_adds_rows_once(
    tmp_path, monkeypatch
):
    sink = _delta(tmp_path)
    a, _b, c = _merged(sink, 1, [A, B, C])
    [merged] = _parquet_files(sink.path)
    saved = (tmp_path / "saved.parquet").as_posix()
    shutil.copy(f"{sink.path}/{merged}", saved)

    # crash after the rewrite, before the table commit
    def crash(*args, **kwargs):
        raise KeyboardInterrupt("driver killed")

    monkeypatch.setattr(DeltaTable, "create_write_transaction", crash)
    with pytest.raises(KeyboardInterrupt):
        sink.commit("job", 1, _flat(a, c))
    monkeypatch.undo()
    assert _delta_rows(sink.path) == [] and len(_parquet_files(sink.path)) == 2
    after_crash = DeltaSink(sink.path)
    assert perform_commit(Commit(1, "out", "job", _flat(a, c), recommit=True), after_crash)
    assert _delta_rows(sink.path) == sorted(A + C) == _delta_duckdb(sink.path)

    # crash after the table commit, before the merged file was deleted: a new driver skips it
    shutil.copy(saved, f"{sink.path}/{merged}")
    again = DeltaSink(sink.path)
    assert again.missing_files(_flat(a, c)) == []
    assert perform_commit(Commit(1, "out", "job", _flat(a, c), recommit=True), again) is False
    with pytest.raises(CommitError, match="not after its latest commit 1"):
        again.commit("job", 1, _flat(a, c))
    assert _delta_rows(sink.path) == sorted(A + C) == _delta_duckdb(sink.path)
    assert len(_delta_adds(sink.path)) == 1


def test_delta_discarding_a_merged_file_deletes_it_with_its_last_part(tmp_path):
    sink = _delta(tmp_path)
    a, b, c = _merged(sink, 1, [A, B, C])
    [merged] = _parquet_files(sink.path)
    writer = pickle.loads(pickle.dumps(sink))
    writer.discard(b)
    writer.discard(a)
    assert _parquet_files(sink.path) == [merged]  # unit 2's rows may still commit
    writer.discard(c)
    assert _parquet_files(sink.path) == []


def test_delta_a_committable_of_the_old_format_still_decodes_and_commits(tmp_path):
    sink = _delta(tmp_path)
    [new] = pickle.loads(pickle.dumps(sink)).write([_batch(A)], _context(1, 0))
    old = msgspec.msgpack.encode(msgspec.msgpack.decode(new)[:6])  # no part fields
    assert len(msgspec.msgpack.decode(old)) == 6
    assert sink.rows_of([old]) == 2 and sink.missing_files([old]) == []
    sink.commit("job", 1, [old])
    assert _delta_rows(sink.path) == sorted(A) == _delta_duckdb(sink.path)


# --- Iceberg -------------------------------------------------------------------------------------

ICEBERG_USER = "clicks-0123456789ab-out"  # as the driver makes them: <job>-<run id>-<sink>


def _iceberg(tmp_path) -> IcebergSink:
    return IcebergSink(str(tmp_path / "warehouse"), "db.clicks", schema=SCHEMA)


def _iceberg_table(sink: IcebergSink):
    """The table as a user loads it, with pyiceberg alone."""
    return load_catalog("regional", **sink.catalog_properties).load_table(sink.table_name)


def _iceberg_rows(sink: IcebergSink) -> list[tuple]:
    t = _iceberg_table(sink).scan().to_arrow()
    return sorted(zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True))


def _iceberg_files(sink: IcebergSink) -> list[tuple[str, int]]:
    """(file name, record count) of the current snapshot's data files, from its manifests."""
    table = _iceberg_table(sink)
    snapshot = table.current_snapshot()
    if snapshot is None:
        return []
    return sorted(
        (e.data_file.file_path.rsplit("/", 1)[-1], e.data_file.record_count)
        for m in snapshot.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io, discard_deleted=True)
    )


def _iceberg_duckdb(sink: IcebergSink) -> list[tuple]:
    files = [f.removeprefix("file://") for f in sink.current_files()]
    if not files:
        return []
    return sorted(duckdb.execute(f'SELECT "user", n FROM read_parquet({files!r})').fetchall())


def _local_data_files(sink: IcebergSink) -> list[str]:
    """Names of the Parquet files under the table's data location (committed or not)."""
    data = _iceberg_table(sink).location_provider().data_path.removeprefix("file://")
    return sorted(f for _, _, files in os.walk(data) for f in files if f.endswith(".parquet"))


def test_iceberg_a_merged_file_committed_whole_is_one_data_file_with_every_row(tmp_path):
    sink = _iceberg(tmp_path)
    a, empty, c = _merged(sink, 1, [A, [], C])
    assert empty == () and len(a) == len(c) == 1
    [staged] = _local_data_files(sink)
    assert sink.rows_of(_flat(a, c)) == 4 and sink.missing_files(_flat(a, c)) == []
    assert [f.rsplit("/", 1)[-1] for f in sink.data_files(_flat(a, c))] == [staged]
    assert perform_commit(Commit(1, "out", ICEBERG_USER, _flat(a, c)), sink) is True
    assert _iceberg_rows(sink) == sorted(A + C) == _iceberg_duckdb(sink)
    assert _iceberg_files(sink) == [(staged, 4)]  # one data file, its metrics the whole file's


def test_iceberg_a_part_not_committed_is_rewritten_out_and_the_merged_file_deleted(tmp_path):
    sink = _iceberg(tmp_path)
    a, _, c = _merged(sink, 1, [A, B, C])
    [merged] = _local_data_files(sink)
    sink.commit(ICEBERG_USER, 1, _flat(a, c))  # unit 1 was declared fallen back after staging
    assert _iceberg_rows(sink) == sorted(A + C) == _iceberg_duckdb(sink)
    rewritten = merged.removesuffix(".parquet") + "-k0.2_3.2.parquet"
    assert _iceberg_files(sink) == [(rewritten, 4)]
    assert _local_data_files(sink) == [rewritten]  # the merged file is gone
    assert sink.missing_files(_flat(a, c)) == []  # resolved through its rewrite
    # the rewrite keeps the table's field ids: pyiceberg projects its columns by them
    assert _iceberg_table(sink).scan(selected_fields=("n",)).to_arrow().column("n").to_pylist()


def test_iceberg_a_commit_retried_after_a_crash_before_or_after_the_table_commit_adds_rows_once(
    tmp_path, monkeypatch
):
    sink = _iceberg(tmp_path)
    a, _, c = _merged(sink, 1, [A, B, C])
    [merged] = _local_data_files(sink)
    [merged_path] = {p.removeprefix("file://") for p in sink.data_files(_flat(a, c))}
    saved = (tmp_path / "saved.parquet").as_posix()
    shutil.copy(merged_path, saved)

    # crash after the rewrite, before the table commit
    def crash(*args, **kwargs):
        raise KeyboardInterrupt("driver killed")

    monkeypatch.setattr(pyiceberg.table.Transaction, "commit_transaction", crash)
    with pytest.raises(KeyboardInterrupt):
        sink.commit(ICEBERG_USER, 1, _flat(a, c))
    monkeypatch.undo()
    assert _iceberg_rows(sink) == [] and len(_local_data_files(sink)) == 2
    after_crash = IcebergSink(sink.warehouse, "db.clicks")
    assert perform_commit(Commit(1, "out", ICEBERG_USER, _flat(a, c), recommit=True), after_crash)
    assert _iceberg_rows(sink) == sorted(A + C) == _iceberg_duckdb(sink)

    # crash after the table commit, before the merged file was deleted: a new driver skips it
    shutil.copy(saved, merged_path)
    again = IcebergSink(sink.warehouse, "db.clicks")
    assert again.missing_files(_flat(a, c)) == []
    assert (
        perform_commit(Commit(1, "out", ICEBERG_USER, _flat(a, c), recommit=True), again) is False
    )
    with pytest.raises(CommitError, match="not after its latest commit 1"):
        again.commit(ICEBERG_USER, 1, _flat(a, c))
    # a commit of the same checkpoint by another commit user meets the duplicate-file backstop
    with pytest.raises(CommitError, match="already committed by snapshot"):
        again.commit("other-0123456789ab-out", 1, _flat(a, c))
    assert _iceberg_rows(sink) == sorted(A + C) == _iceberg_duckdb(sink)
    assert len(_iceberg_files(sink)) == 1 and merged in _local_data_files(sink)


def test_iceberg_discarding_a_merged_file_deletes_it_with_its_last_part(tmp_path):
    sink = _iceberg(tmp_path)
    a, b, c = _merged(sink, 1, [A, B, C])
    [merged] = _local_data_files(sink)
    writer = pickle.loads(pickle.dumps(sink))
    writer.discard(b)
    writer.discard(a)
    assert _local_data_files(sink) == [merged]  # unit 2's rows may still commit
    writer.discard(c)
    assert _local_data_files(sink) == []


def test_iceberg_a_committable_of_the_old_format_still_decodes_and_commits(tmp_path):
    sink = _iceberg(tmp_path)
    [new] = pickle.loads(pickle.dumps(sink)).write([_batch(A)], _context(1, 0))
    old = msgspec.msgpack.encode(msgspec.msgpack.decode(new)[:3])  # no part fields
    assert len(msgspec.msgpack.decode(old)) == 3
    assert sink.rows_of([old]) == 2 and sink.missing_files([old]) == []
    sink.commit(ICEBERG_USER, 1, [old])
    assert _iceberg_rows(sink) == sorted(A) == _iceberg_duckdb(sink)


# --- Paimon --------------------------------------------------------------------------------------


def _paimon(tmp_path) -> PaimonSink:
    return PaimonSink(str(tmp_path / "paimon"), "db.clicks", schema=SCHEMA)


def _paimon_table(sink: PaimonSink):
    """The table as a user loads it, with pypaimon alone."""
    return pypaimon.CatalogFactory.create({"warehouse": sink.warehouse}).get_table("db.clicks")


def _paimon_rows(sink: PaimonSink) -> list[tuple]:
    builder = _paimon_table(sink).new_read_builder()
    t = builder.new_read().to_arrow(builder.new_scan().plan().splits())
    return sorted(zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True))


def _paimon_files(sink: PaimonSink) -> list[tuple[str, int]]:
    """(file name, row count) of the data files of the table's current snapshot."""
    splits = _paimon_table(sink).new_read_builder().new_scan().plan().splits()
    return sorted((f.file_name, f.row_count) for split in splits for f in split.files)


def _paimon_duckdb(sink: PaimonSink) -> list[tuple]:
    splits = _paimon_table(sink).new_read_builder().new_scan().plan().splits()
    files = [f.file_path for split in splits for f in split.files]
    if not files:
        return []
    return sorted(duckdb.execute(f'SELECT "user", n FROM read_parquet({files!r})').fetchall())


def _bucket_files(sink: PaimonSink) -> list[str]:
    """Names of the data files in the table's bucket directory (committed or not)."""
    bucket = os.path.join(sink.warehouse, "db.db", "clicks", "bucket-0")
    return sorted(os.listdir(bucket)) if os.path.isdir(bucket) else []


def test_paimon_a_merged_file_committed_whole_is_one_data_file_with_every_row(tmp_path):
    sink = _paimon(tmp_path)
    a, empty, c = _merged(sink, 1, [A, [], C])
    assert empty == () and len(a) == len(c) == 1
    [staged] = _bucket_files(sink)
    assert staged.startswith("data-rg~job~r1-c1-u0-a0-")  # named after the first part
    assert sink.rows_of(_flat(a, c)) == 4 and sink.missing_files(_flat(a, c)) == []
    assert [f.rsplit("/", 1)[-1] for f in sink.data_files(_flat(a, c))] == [staged]
    assert perform_commit(Commit(1, "out", "job", _flat(a, c)), sink) is True
    assert _paimon_rows(sink) == sorted(A + C) == _paimon_duckdb(sink)
    assert _paimon_files(sink) == [(staged, 4)]  # one data file in the snapshot


def test_paimon_a_part_not_committed_is_rewritten_out_and_the_merged_file_deleted(tmp_path):
    sink = _paimon(tmp_path)
    a, _, c = _merged(sink, 1, [A, B, C])
    [merged] = _bucket_files(sink)
    sink.commit("job", 1, _flat(a, c))  # unit 1 was declared fallen back after it was staged
    assert _paimon_rows(sink) == sorted(A + C) == _paimon_duckdb(sink)
    rewritten = merged.removesuffix(".parquet") + "-k0.2_3.2-0.parquet"
    assert _paimon_files(sink) == [(rewritten, 4)]
    assert _bucket_files(sink) == [rewritten]  # the merged file is gone
    # the rewrite's statistics are its own rows' (pypaimon computed them)
    [entry] = _paimon_table(sink).new_read_builder().new_scan().plan().splits()[0].files
    assert entry.row_count == 4


def test_paimon_a_commit_retried_after_a_crash_before_or_after_the_table_commit_adds_rows_once(
    tmp_path, monkeypatch
):
    sink = _paimon(tmp_path)
    a, _, c = _merged(sink, 1, [A, B, C])
    [merged] = _bucket_files(sink)
    bucket = os.path.join(sink.warehouse, "db.db", "clicks", "bucket-0")
    saved = (tmp_path / "saved.parquet").as_posix()
    shutil.copy(os.path.join(bucket, merged), saved)

    # crash after the rewrite, before the table commit
    def crash(*args, **kwargs):
        raise KeyboardInterrupt("driver killed")

    from pypaimon.write.table_commit import StreamTableCommit

    monkeypatch.setattr(StreamTableCommit, "commit", crash)
    with pytest.raises(KeyboardInterrupt):
        sink.commit("job", 1, _flat(a, c))
    monkeypatch.undo()
    rewritten = merged.removesuffix(".parquet") + "-k0.2_3.2-0.parquet"
    assert _paimon_rows(sink) == [] and _bucket_files(sink) == sorted([merged, rewritten])
    after_crash = PaimonSink(sink.warehouse, "db.clicks")
    assert perform_commit(Commit(1, "out", "job", _flat(a, c), recommit=True), after_crash)
    assert _paimon_rows(sink) == sorted(A + C) == _paimon_duckdb(sink)
    assert _bucket_files(sink) == [rewritten]  # the retry rewrote the same file

    # crash after the table commit, before the merged file was deleted: a new driver skips it
    shutil.copy(saved, os.path.join(bucket, merged))
    again = PaimonSink(sink.warehouse, "db.clicks")
    assert perform_commit(Commit(1, "out", "job", _flat(a, c), recommit=True), again) is False
    with pytest.raises(CommitError, match="not after its latest commit 1"):
        again.commit("job", 1, _flat(a, c))
    assert _paimon_rows(sink) == sorted(A + C) == _paimon_duckdb(sink)
    assert len(_paimon_files(sink)) == 1
    # the merged file left behind is deleted when no restored checkpoint names it any more
    assert [p.rsplit("/", 1)[-1] for p in again.clean_staged("job", keep=())] == [merged]
    assert _bucket_files(sink) == [rewritten]


def test_paimon_discarding_a_merged_file_deletes_it_with_its_last_part(tmp_path):
    sink = _paimon(tmp_path)
    a, b, c = _merged(sink, 1, [A, B, C])
    [merged] = _bucket_files(sink)
    writer = pickle.loads(pickle.dumps(sink))
    writer.discard(b)
    writer.discard(a)
    assert _bucket_files(sink) == [merged]  # unit 2's rows may still commit
    writer.discard(c)
    assert _bucket_files(sink) == []


def test_paimon_a_committable_of_the_old_format_still_decodes_and_commits(tmp_path):
    sink = _paimon(tmp_path)
    [new] = pickle.loads(pickle.dumps(sink)).write([_batch(A)], _context(1, 0))
    old = msgspec.msgpack.encode(msgspec.msgpack.decode(new)[:5])  # no part fields
    assert len(msgspec.msgpack.decode(old)) == 5
    assert sink.rows_of([old]) == 2 and sink.missing_files([old]) == []
    sink.commit("job", 1, [old])
    assert _paimon_rows(sink) == sorted(A) == _paimon_duckdb(sink)


def test_paimon_a_partitioned_table_writes_each_unit_on_its_own(tmp_path):
    schema = pa.schema([("user", pa.string()), ("n", pa.int64())])
    sink = PaimonSink(str(tmp_path / "p"), "db.clicks", schema=schema, partition_keys=["user"])
    parts = _merged(sink, 1, [A, [], C])
    assert [len(p) for p in parts] == [2, 0, 2]  # a whole message per partition of each unit
    sink.commit("job", 1, _flat(*parts))
    t = sink.read()
    rows = zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True)
    assert sorted(rows) == sorted(A + C)
