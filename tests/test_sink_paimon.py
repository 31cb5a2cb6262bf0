"""The Paimon sink (needs the extra regional-checkpoints[paimon]): staging, commits through the
commit coordinator's protocol, idempotent re-commits read from Paimon's own snapshots, the data-file
check, snapshot properties, and exactly-once output across a driver crash on Spark."""

from __future__ import annotations

import json
import os
import pickle
import sys
from collections import Counter

import duckdb
import pyarrow as pa
import pypaimon  # the extra regional-checkpoints[paimon]; `make test` installs it
import pytest

from regional.coordinator import Commit
from regional.coordinator.commit import perform_commit
from regional.errors import CommitError, SinkError
from regional.sinks.base import TableCommitter, WriteContext
from regional.sinks.paimon import PaimonSink

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])


def _sink(tmp_path, name: str = "db.clicks") -> PaimonSink:
    return PaimonSink(str(tmp_path / "warehouse"), name, schema=SCHEMA)


def _stage(
    sink: PaimonSink, cid: int, rows: list[dict], index: int = 0, job: str = "job"
) -> tuple[bytes, ...]:
    # through pickle, as a Spark task gets it
    writer = pickle.loads(pickle.dumps(sink))
    batch = pa.RecordBatch.from_pylist(rows)
    return writer.write(
        [batch],
        WriteContext(
            job_id=job,
            run_id="r1",
            checkpoint_id=cid,
            attempt=0,
            unit_id=index,
            vertex_id="out",
            index=index,
        ),
    )


def _rows(sink: PaimonSink) -> list[tuple]:
    t = sink.read()
    return sorted(zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True))


def _snapshots(sink: PaimonSink) -> list:
    return sink._table().snapshot_manager().list_snapshots()


def test_staged_rows_show_only_after_the_commit_which_records_checkpoint_and_fallback(tmp_path):
    sink = _sink(tmp_path)
    assert isinstance(sink, TableCommitter)
    c = _stage(sink, 4, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    c += _stage(sink, 4, [{"n": 3, "user": "c"}], index=1)  # column order does not matter
    assert sink.rows_of(c) == 3
    assert _rows(sink) == [] and _snapshots(sink) == []
    assert perform_commit(Commit(4, "out", "job-1-out", c, fallback={2: 3, 5: 0}), sink)
    assert _rows(sink) == [("a", 1), ("b", 2), ("c", 3)]
    [snap] = _snapshots(sink)
    assert (snap.commit_user, snap.commit_identifier) == ("job-1-out", 4)
    assert snap.commit_kind == "APPEND"
    assert snap.properties == {
        "regional.checkpoint-id": "4",
        "regional.fallback-units": '{"2":3,"5":0}',
    }
    # read back with pypaimon alone, as a user would
    table = pypaimon.CatalogFactory.create({"warehouse": sink.warehouse}).get_table("db.clicks")
    rb = table.new_read_builder()
    assert rb.new_read().to_arrow(rb.new_scan().plan().splits()).num_rows == 3


def test_recommit_is_skipped_from_paimon_snapshots_even_by_a_new_driver(tmp_path):
    sink = _sink(tmp_path)
    c1 = _stage(sink, 1, [{"user": "a", "n": 1}])
    c2 = _stage(sink, 2, [{"user": "b", "n": 2}])
    assert perform_commit(Commit(1, "out", "job", c1), sink)
    assert perform_commit(Commit(2, "out", "job", c2), sink)
    # a driver that crashed after committing 2 restores and re-commits 1 and 2
    after_crash = PaimonSink(sink.warehouse, "db.clicks")
    assert perform_commit(Commit(1, "out", "job", c1, recommit=True), after_crash) is False
    assert perform_commit(Commit(2, "out", "job", c2, recommit=True), after_crash) is False
    assert after_crash.latest_committed("job") == 2
    assert _rows(after_crash) == [("a", 1), ("b", 2)] and len(_snapshots(sink)) == 2
    # another job's commit user is not filtered by this one's identifiers
    c3 = _stage(sink, 1, [{"user": "c", "n": 3}])
    assert perform_commit(Commit(1, "out", "other-job", c3), after_crash)
    assert _rows(sink) == [("a", 1), ("b", 2), ("c", 3)]
    with pytest.raises(CommitError) as err:
        sink.commit("job", 1, c3)
    assert str(err.value) == (
        "Paimon table 'db.clicks': commit 1 of user 'job' is not after its latest commit 2; "
        "commits must be in checkpoint order"
    )


def test_a_fresh_run_with_restarted_lower_checkpoint_ids_is_not_dropped(tmp_path):
    sink = _sink(tmp_path)
    for cid in (1, 2, 3):
        sink.commit("job-run1-out", cid, _stage(sink, cid, [{"user": "a", "n": cid}]))
    fresh = PaimonSink(sink.warehouse, "db.clicks")  # a new root: ids from 1, a new commit user
    assert fresh.latest_committed("job-run2-out") is None
    for cid in (1, 2):
        c = _stage(fresh, cid, [{"user": "b", "n": cid}])
        assert perform_commit(Commit(cid, "out", "job-run2-out", c), fresh)
    assert _rows(fresh) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]
    assert fresh.latest_committed("job-run1-out") == 3


def test_a_starting_driver_deletes_only_its_jobs_files_of_lost_attempts(tmp_path):
    sink = _sink(tmp_path)
    committed = _stage(sink, 1, [{"user": "a", "n": 1}])
    sink.commit("job-r1-out", 1, committed)
    pending = _stage(sink, 2, [{"user": "b", "n": 2}])  # the restored checkpoint re-commits it
    lost = _stage(sink, 2, [{"user": "x", "n": 9}], index=1)  # its worker died
    other_job = _stage(sink, 2, [{"user": "o", "n": 5}], job="jo")  # 'jo' is a prefix of 'job'
    also_pending = _stage(sink, 2, [{"user": "w", "n": 7}], index=2)
    [lost_file] = sink.data_files(lost)
    assert lost_file.rsplit("/", 1)[-1].startswith("data-rg~job~r1-c2-u1-a0-")
    assert sink.clean_staged("job", keep=pending + also_pending) == [lost_file]
    assert sink.missing_files(lost) == [lost_file]
    assert sink.missing_files(committed + pending + other_job + also_pending) == []
    assert perform_commit(Commit(2, "out", "job-r1-out", pending, recommit=True), sink)
    assert _rows(sink) == [("a", 1), ("b", 2)]
    # once nothing names it (a later start), an uncommitted file of the job is deleted too
    assert sink.clean_staged("job", keep=()) == sink.data_files(also_pending)


def test_partitioned_table_one_committable_per_partition(tmp_path):
    sink = PaimonSink(str(tmp_path / "wh"), "db.p", schema=SCHEMA, partition_keys=["user"])
    c = _stage(sink, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 2}, {"user": "a", "n": 3}])
    after_crash = PaimonSink(sink.warehouse, "db.p")  # decodes without the writer's objects
    files = after_crash.data_files(c)
    assert len(c) == 2 and sorted(f.split("/")[-3] for f in files) == ["user=a", "user=b"]
    assert after_crash.missing_files(c) == [] and after_crash.rows_of(c) == 3
    assert perform_commit(Commit(1, "out", "job", c), after_crash)
    assert _rows(sink) == [("a", 1), ("a", 3), ("b", 2)]
    lost = _stage(sink, 2, [{"user": "c", "n": 4}])
    [lost_file] = sink.data_files(lost)
    assert "/user=c/bucket-0/" in lost_file
    assert after_crash.clean_staged("job", keep=()) == [lost_file]  # committed files stay


def test_a_missing_data_file_is_refused_before_anything_is_committed(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 3, [{"user": "a", "n": 1}])
    [path] = sink.data_files(c)
    os.remove(path)
    assert sink.missing_files(c) == [path]
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(3, "out", "job", c, recommit=True), sink)
    assert str(err.value) == (
        f"cannot re-commit checkpoint 3 of sink 'out': data file(s) {path} are missing (were "
        "they cleaned?); restore from a newer checkpoint or restore the files"
    )
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(3, "out", "job", c), sink)  # not a re-commit: the sink checks too
    assert str(err.value) == (
        f"Paimon table 'db.clicks': cannot commit checkpoint 3: data file(s) {path} are missing "
        "(were they deleted?); nothing was committed; restore from a newer checkpoint or restore "
        "the files"
    )
    assert _snapshots(sink) == [] and _rows(sink) == []  # the table stays readable


def test_discard_deletes_the_staged_files_of_a_failed_attempt(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    files = sink.data_files(c)
    assert files and all(os.path.exists(f) for f in files)
    sink.discard(c)
    sink.discard(c)  # already gone is fine
    assert sink.missing_files(c) == files


def test_discard_skips_committables_of_other_sinks(tmp_path):
    from regional.sinks.parquet import ParquetSink

    paimon, other = _sink(tmp_path), _sink(tmp_path, "db.other")
    parquet = ParquetSink(str(tmp_path / "parquet"))
    mine = _stage(paimon, 1, [{"user": "a", "n": 1}])
    theirs = _stage(other, 1, [{"user": "b", "n": 2}])
    staged = parquet.write(
        [pa.record_batch({"x": [1]})],
        WriteContext(
            job_id="job",
            run_id="r1",
            checkpoint_id=1,
            attempt=0,
            unit_id=0,
            vertex_id="p",
            index=0,
        ),
    )
    everything = mine + theirs + staged  # defence in depth: never delete another sink's files
    paimon.discard(everything)
    assert paimon.missing_files(mine) == paimon.data_files(mine)
    assert other.missing_files(theirs) == [] and parquet.missing_files(staged) == []
    parquet.discard(everything)
    assert other.missing_files(theirs) == [] and len(parquet.missing_files(staged)) == 1


def test_rows_that_do_not_fit_the_table_are_refused_with_the_columns(tmp_path):
    sink = _sink(tmp_path)
    with pytest.raises(SinkError) as err:
        _stage(sink, 1, [{"user": "a", "count": 1}])
    assert str(err.value) == (
        "records for Paimon table 'db.clicks' do not fit its columns ['user', 'n']: missing "
        "['n'], unknown ['count']; map the records to the table's columns before the sink"
    )
    assert not list((tmp_path / "warehouse" / "db.db" / "clicks").glob("bucket-*/*.parquet"))


def test_primary_key_tables_and_missing_tables_are_refused(tmp_path):
    warehouse = str(tmp_path / "warehouse")
    catalog = pypaimon.CatalogFactory.create({"warehouse": warehouse})
    catalog.create_database("db", True)
    pk = pa.schema([pa.field("user", pa.string(), nullable=False), ("n", pa.int64())])
    catalog.create_table(
        "db.pk", pypaimon.Schema.from_pyarrow_schema(pk, primary_keys=["user"]), False
    )
    with pytest.raises(SinkError) as err:
        PaimonSink(warehouse, "db.pk")
    assert str(err.value) == (
        f"Paimon table 'db.pk' in {warehouse}: only append tables without a primary key and "
        "with bucket = -1 are supported (PIP-30); it has primary keys ['user'], bucket mode "
        "HASH_DYNAMIC"
    )
    with pytest.raises(SinkError) as err:
        PaimonSink(warehouse, "db.nope")
    assert str(err.value) == (
        f"Paimon table 'db.nope' does not exist in warehouse {warehouse}: create it, or pass "
        "schema= to PaimonSink to create it"
    )


def test_without_the_extra_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pypaimon", None)  # import pypaimon now fails
    with pytest.raises(SinkError, match=r"pip install 'regional-checkpoints\[paimon\]"):
        PaimonSink(str(tmp_path), "db.t", schema=SCHEMA)


# --- on Spark: exactly-once across a driver crash --------------------------------------------

SPLITS, PER_SPLIT, PER_EPOCH = 4, 30, 10


def _click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}


def _count(ctx, record):
    state = ctx.value_state("count", 0)
    state.update(state.value() + 1)
    yield {**record, "count": state.value()}


CLICKS = pa.schema(
    [("split", pa.int64()), ("n", pa.int64()), ("user", pa.string()), ("count", pa.int64())]
)


def _pipeline(warehouse: str):
    from regional.dataflow.pipeline import Pipeline
    from regional.sources.generator import GeneratorSource

    p = Pipeline("job", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, _click, records_per_split=PER_SPLIT), parallelism=4, name="src"
    )
    counted = src.key_by(lambda r: r["user"]).process(_count, name="count")
    counted.sink(PaimonSink(warehouse, "db.clicks", schema=CLICKS), name="out")
    return p


def _table_rows(warehouse: str) -> list[tuple]:
    table = pypaimon.CatalogFactory.create({"warehouse": warehouse}).get_table("db.clicks")
    rb = table.new_read_builder()
    t = rb.new_read().to_arrow(rb.new_scan().plan().splits())
    return sorted(zip(*(t.column(c).to_pylist() for c in CLICKS.names), strict=True))


def _rows_by_duckdb(warehouse: str) -> list[tuple]:
    """The rows of the data files Paimon's current snapshot lists, read by DuckDB (not Paimon)."""
    table = pypaimon.CatalogFactory.create({"warehouse": warehouse}).get_table("db.clicks")
    splits = table.new_read_builder().new_scan().plan().splits()
    files = [f.file_path for split in splits for f in split.files]
    assert files and all(files)
    columns = ", ".join(CLICKS.names)
    return sorted(duckdb.execute(f"SELECT {columns} FROM read_parquet({files!r})").fetchall())


@pytest.fixture(scope="module")
def fault_free_rows(spark, tmp_path_factory) -> list[tuple]:
    from regional.runtime.spark import SparkRuntime

    tmp = tmp_path_factory.mktemp("paimon-clean")
    summary = SparkRuntime(_pipeline(str(tmp / "wh")), spark, root=str(tmp / "ckpt")).run()
    assert summary.finished
    return _table_rows(str(tmp / "wh"))


@pytest.mark.spark
@pytest.mark.parametrize("step", ["after-metadata", "after-commit"])
def test_driver_crash_then_resume_writes_the_fault_free_rows_exactly_once(
    spark, tmp_path, fault_free_rows, step
):
    from regional.policy import load_policy
    from regional.runtime.spark import DriverCrash, Faults, SparkRuntime

    warehouse, root = str(tmp_path / "wh"), str(tmp_path / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"region": {"timeout": "20 s"}}})
    # unit 1 fails checkpoint 2 (it falls back to 1); the driver dies in checkpoint 4
    first = SparkRuntime(
        _pipeline(warehouse),
        spark,
        root=root,
        policy=policy.policy,
        faults=Faults(units={(2, 1): "fail"}, crash_at=(4, step)),
    )
    with pytest.raises(DriverCrash, match=f"checkpoint 4, {step}"):
        first.run()
    second = SparkRuntime(_pipeline(warehouse), spark, root=root, policy=policy.policy)
    summary = second.run()
    assert summary.restored_from == 4 and summary.finished

    rows = _table_rows(warehouse)
    assert len(rows) == SPLITS * PER_SPLIT and rows == fault_free_rows
    assert _rows_by_duckdb(warehouse) == fault_free_rows  # an independent reader agrees
    snapshots = (
        pypaimon.CatalogFactory.create({"warehouse": warehouse})
        .get_table("db.clicks")
        .snapshot_manager()
        .list_snapshots()
    )
    [user] = {s.commit_user for s in snapshots}  # one commit user, kept across the crash
    assert user.startswith("job-") and user.endswith("-out")
    ids = [s.commit_identifier for s in snapshots]
    assert ids == sorted(ids) and not [i for i, k in Counter(ids).items() if k > 1]
    props = {s.commit_identifier: s.properties for s in snapshots}
    assert props[2] == {"regional.checkpoint-id": "2", "regional.fallback-units": '{"1":1}'}
    assert json.loads(props[4]["regional.fallback-units"]) == {}
