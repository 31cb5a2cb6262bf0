"""The Iceberg sink (needs the extra regional-checkpoints[iceberg]): staging, commits through the
commit coordinator's protocol, idempotent re-commits read from the snapshot ancestry, the identity
of a fresh run, concurrent commits, the data-file and file-name checks, rollback, and exactly-once
output across unit faults and a hard driver crash on Spark, read back with pyiceberg and DuckDB."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import textwrap

import duckdb
import msgspec
import pyarrow as pa
import pyiceberg.io.pyarrow  # the extra regional-checkpoints[iceberg]; `make test` installs it
import pyiceberg.manifest
import pytest
from clicks_job import PER_SPLIT, SPLITS, click, count, expected_rows
from pyiceberg.catalog import load_catalog
from pyiceberg.table.snapshots import ancestors_of

from regional.coordinator import Commit
from regional.coordinator.commit import perform_commit
from regional.errors import CommitError, RestoreError, SinkError
from regional.sinks.base import TableCommitter, TableRollback, WriteContext
from regional.sinks.iceberg import CHECKPOINT_PROPERTY, IcebergSink

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
USER = "clicks-0123456789ab-out"  # as the driver makes them: <job>-<run id>-<sink>


def _sink(tmp_path, name: str = "db.clicks") -> IcebergSink:
    return IcebergSink(str(tmp_path / "warehouse"), name, schema=SCHEMA)


def _stage(sink: IcebergSink, cid: int, rows: list[dict], index: int = 0) -> tuple[bytes, ...]:
    # through pickle, as a Spark task gets it
    writer = pickle.loads(pickle.dumps(sink))
    batch = pa.RecordBatch.from_pylist(rows)
    return writer.write(
        [batch],
        WriteContext(
            job_id="job",
            run_id="r1",
            checkpoint_id=cid,
            attempt=0,
            unit_id=index,
            vertex_id="out",
            index=index,
        ),
    )


def _table(sink: IcebergSink):
    """The table as a user loads it, with pyiceberg alone."""
    return load_catalog("regional", **sink.catalog_properties).load_table(sink.table_name)


def _rows(sink: IcebergSink) -> list[tuple]:
    t = _table(sink).scan().to_arrow()
    return sorted(zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True))


def _summaries(sink: IcebergSink) -> list[dict]:
    table = _table(sink)
    return [
        {k: v for k, v in s.summary.model_dump().items() if k.startswith("regional.")}
        for s in reversed(list(ancestors_of(table.current_snapshot(), table.metadata)))
    ]


def test_staged_rows_show_only_after_the_commit_which_records_job_user_checkpoint_fallback(
    tmp_path,
):
    sink = _sink(tmp_path)
    assert isinstance(sink, TableCommitter) and isinstance(sink, TableRollback)
    c = _stage(sink, 4, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    c += _stage(sink, 4, [{"n": 3, "user": "c"}], index=1)  # column order does not matter
    assert sink.rows_of(c) == 3
    files = sink.data_files(c)
    assert [os.path.basename(f)[: len("out-0-c4-a0-")] for f in files] == [
        "out-0-c4-a0-",
        "out-1-c4-a0-",
    ]
    assert all(f.startswith(f"file://{tmp_path}/warehouse/db/clicks/data/") for f in files)
    assert _rows(sink) == [] and _table(sink).current_snapshot() is None
    assert perform_commit(Commit(4, "out", USER, c, fallback={2: 3, 5: 0}), sink)
    assert _rows(sink) == [("a", 1), ("b", 2), ("c", 3)]
    assert _summaries(sink) == [
        {
            "regional.job-id": "clicks",
            "regional.commit-user": USER,
            "regional.checkpoint-id": "4",
            "regional.fallback-units": '{"2":3,"5":0}',
        }
    ]
    assert sorted(sink.current_files()) == sorted(files)


def test_a_lost_commit_response_then_a_new_driver_recommits_nothing(tmp_path):
    sink = _sink(tmp_path)
    c1 = _stage(sink, 1, [{"user": "a", "n": 1}])
    c2 = _stage(sink, 2, [{"user": "b", "n": 2}])
    assert perform_commit(Commit(1, "out", USER, c1), sink)
    assert perform_commit(Commit(2, "out", USER, c2), sink)  # ... and the response is lost
    after_crash = IcebergSink(sink.warehouse, "db.clicks")  # same commit user, from the checkpoint
    assert perform_commit(Commit(1, "out", USER, c1, recommit=True), after_crash) is False
    assert perform_commit(Commit(2, "out", USER, c2, recommit=True), after_crash) is False
    assert after_crash.committed_identifiers(USER) == frozenset({1, 2})
    assert _rows(sink) == [("a", 1), ("b", 2)] and len(_summaries(sink)) == 2
    with pytest.raises(CommitError) as err:
        sink.commit(USER, 1, c1)
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': commit 1 of user {USER!r} is not after its latest commit "
        "2; commits must be in checkpoint order"
    )


def test_a_fresh_run_with_restarted_lower_checkpoint_ids_is_not_dropped(tmp_path):
    sink = _sink(tmp_path)
    for cid in (1, 2, 3):
        assert perform_commit(
            Commit(cid, "out", USER, _stage(sink, cid, [{"user": "a", "n": cid}])), sink
        )
    fresh_user = "clicks-ba9876543210-out"  # a fresh run of the job: new run id, ids from 1
    fresh = IcebergSink(sink.warehouse, "db.clicks")
    assert fresh.committed_identifiers(fresh_user) == frozenset()
    assert perform_commit(
        Commit(1, "out", fresh_user, _stage(sink, 1, [{"user": "b", "n": 1}])), fresh
    )
    assert perform_commit(
        Commit(2, "out", fresh_user, _stage(sink, 2, [{"user": "b", "n": 2}])), fresh
    )
    assert _rows(sink) == [("a", 1), ("a", 2), ("a", 3), ("b", 1), ("b", 2)]
    assert [s["regional.commit-user"] for s in _summaries(sink)] == [USER] * 3 + [fresh_user] * 2
    assert fresh.committed_identifiers(USER) == frozenset({1, 2, 3})


def test_the_ancestry_walk_reads_only_new_snapshots(tmp_path):
    sink = _sink(tmp_path)
    for cid in range(1, 6):
        sink.commit(USER, cid, _stage(sink, cid, [{"user": "a", "n": cid}]))
    after_crash = IcebergSink(sink.warehouse, "db.clicks")
    assert after_crash.committed_identifiers(USER) == frozenset(range(1, 6))
    assert after_crash.snapshots_read == 5  # the whole history, once
    after_crash.commit(USER, 6, _stage(sink, 6, [{"user": "a", "n": 6}]))
    after_crash.commit(USER, 7, _stage(sink, 7, [{"user": "a", "n": 7}]))
    assert after_crash.committed_identifiers(USER) == frozenset(range(1, 8))
    assert after_crash.snapshots_read == 7  # then one snapshot per commit


def test_a_concurrent_commit_is_an_error_and_the_retry_rereads_the_table(tmp_path, monkeypatch):
    sink = _sink(tmp_path)
    other = _table(sink)  # another writer of the table
    c = _stage(sink, 1, [{"user": "a", "n": 1}])
    read_footer = pyiceberg.io.pyarrow.parquet_file_to_data_file
    interleaved = []

    def other_writer_commits_meanwhile(*args):  # while the sink prepares its snapshot
        if not interleaved:
            interleaved.append(other.append(pa.table({"user": ["z"], "n": [9]}, schema=SCHEMA)))
        return read_footer(*args)

    monkeypatch.setattr(
        pyiceberg.io.pyarrow, "parquet_file_to_data_file", other_writer_commits_meanwhile
    )
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(1, "out", USER, c), sink)
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': commit of checkpoint 1 (commit user {USER!r}) met a "
        "concurrent commit to the table and was not made (Requirement failed: branch main was "
        "created concurrently); it is retried after re-reading the table's snapshots"
    )
    assert _rows(sink) == [("z", 9)]  # nothing of ours, not taken as success
    assert perform_commit(Commit(1, "out", USER, c), sink)  # the coordinator's retry
    assert _rows(sink) == [("a", 1), ("z", 9)]
    assert perform_commit(Commit(1, "out", USER, c, recommit=True), sink) is False


def test_a_missing_data_file_is_refused_before_anything_is_committed(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 3, [{"user": "a", "n": 1}])
    [path] = sink.data_files(c)
    os.remove(path.removeprefix("file://"))
    assert sink.missing_files(c) == [path]
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(3, "out", USER, c, recommit=True), sink)
    assert str(err.value) == (
        f"cannot re-commit checkpoint 3 of sink 'out': data file(s) {path} are missing (were "
        "they cleaned?); restore from a newer checkpoint or restore the files"
    )
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(3, "out", USER, c), sink)  # not a re-commit: the sink checks too
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': cannot commit checkpoint 3: data file(s) {path} are "
        "missing (were they deleted?); nothing was committed; restore from a newer checkpoint "
        "or restore the files"
    )
    assert _summaries(sink) == [] and _rows(sink) == []


def test_files_committed_under_another_commit_user_are_refused(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 3, [{"user": "a", "n": 1}])
    sink.commit(USER, 3, c)
    [path] = sink.data_files(c)
    [snapshot] = _table(sink).snapshots()
    other_user = "clicks-ba9876543210-out"  # fooled: its own commits do not include 3
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(3, "out", other_user, c), sink)
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': cannot commit checkpoint 3 of user {other_user!r}: data "
        f"file(s) {path} were already committed by snapshot {snapshot.snapshot_id} (commit "
        f"user {USER!r}, checkpoint 3); committing them again would duplicate their rows; "
        "nothing was committed (is another run committing this job's checkpoints?)"
    )
    assert _rows(sink) == [("a", 1)] and len(_summaries(sink)) == 1


def test_files_committed_by_a_snapshot_without_commit_user_are_refused(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 5, [{"user": "a", "n": 1}])
    [path] = sink.data_files(c)
    other = _table(sink)  # the commit user of the summary is lost: the identifier check misses it
    other.add_files([path], snapshot_properties={CHECKPOINT_PROPERTY: "5"})
    assert sink.committed_identifiers(USER) == frozenset()
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(5, "out", USER, c, recommit=True), sink)
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': cannot commit checkpoint 5 of user {USER!r}: data file(s) "
        f"{path} were already committed by snapshot {other.current_snapshot().snapshot_id} "
        "(commit user None, checkpoint 5); committing them again would duplicate their rows; "
        "nothing was committed (is another run committing this job's checkpoints?)"
    )
    assert _rows(sink) == [("a", 1)]


def test_files_of_an_expired_snapshot_are_refused_at_the_first_commit_of_a_new_driver(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 1, [{"user": "a", "n": 1}])
    sink.commit(USER, 1, c)  # ... and the response is lost
    [path] = sink.data_files(c)
    other = _table(sink)
    other.append(pa.table({"user": ["z"], "n": [9]}, schema=SCHEMA))
    mine = other.snapshots()[0].snapshot_id
    other.maintenance.expire_snapshots().by_id(mine).commit()  # its summary is gone
    after_crash = IcebergSink(sink.warehouse, "db.clicks")
    assert after_crash.committed_identifiers(USER) == frozenset()
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(1, "out", USER, c, recommit=True), after_crash)
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': cannot commit checkpoint 1 of user {USER!r}: Cannot add "
        f"files that are already referenced by table, files: {path}; was it committed by a "
        "snapshot that has since expired or by another writer? nothing was committed"
    )
    assert _rows(sink) == [("a", 1), ("z", 9)]


def test_a_file_not_named_for_the_checkpoint_is_refused(tmp_path):
    sink = _sink(tmp_path)
    early = _stage(sink, 2, [{"user": "a", "n": 1}])
    [good] = _stage(sink, 3, [{"user": "b", "n": 2}])
    table_uuid, name, rows, *_ = msgspec.msgpack.decode(good)  # then the part fields
    data = tmp_path / "warehouse" / "db" / "clicks" / "data"
    os.rename(data / name, data / "hand-made.parquet")
    renamed = msgspec.msgpack.encode([table_uuid, "hand-made.parquet", rows])
    for committables, file in ((early, sink.data_files(early)[0]), ([renamed], None)):
        file = file or f"file://{data}/hand-made.parquet"
        with pytest.raises(CommitError) as err:
            sink.commit(USER, 3, committables)
        assert str(err.value) == (
            f"Iceberg table 'db.clicks': cannot commit checkpoint 3 of user {USER!r}: data file "
            f"{file} is not named as the sink names the files of checkpoint 3 (<sink>-<subtask>-"
            "c3-a<attempt>-<12 hex>.parquet); nothing was committed (is the checkpoint metadata "
            "from another writer or tampered with?)"
        )
    assert _rows(sink) == []


def test_the_manifests_read_per_commit_do_not_grow_with_the_history(tmp_path, monkeypatch):
    sink = _sink(tmp_path)
    reads = {"manifests": 0, "manifest lists": 0}
    fetch, read_list = (
        pyiceberg.manifest.ManifestFile.fetch_manifest_entry,
        (pyiceberg.manifest.read_manifest_list),
    )

    def fetch_counted(self, *args, **kwargs):
        reads["manifests"] += 1
        return fetch(self, *args, **kwargs)

    def read_list_counted(*args):
        reads["manifest lists"] += 1
        return read_list(*args)

    monkeypatch.setattr(pyiceberg.manifest.ManifestFile, "fetch_manifest_entry", fetch_counted)
    monkeypatch.setattr(pyiceberg.manifest, "read_manifest_list", read_list_counted)

    def commit(user: str, cid: int) -> tuple[int, int]:
        staged = _stage(sink, cid, [{"user": user, "n": cid}])
        before = dict(reads)
        assert perform_commit(Commit(cid, "out", user, staged), sink)
        return reads["manifests"] - before["manifests"], (
            reads["manifest lists"] - before["manifest lists"]
        )

    # a checkpoint committed for the first time: no manifest read (pyiceberg's whole-table
    # check read one per earlier commit), only the parent's manifest list (the fast append's)
    assert [commit(USER, cid) for cid in range(1, 31)] == [(0, 0)] + [(0, 1)] * 29
    # a fresh run whose checkpoint ids meet the first run's: the first run's snapshot of that
    # checkpoint is read (its own manifest), whatever the table's age
    fresh = "clicks-ba9876543210-out"
    assert [commit(fresh, cid) for cid in range(1, 31)] == [(1, 2)] * 30
    assert (
        len(_summaries(sink)) == 60
        and len(_table(sink).current_snapshot().manifests(_table(sink).io)) == 60
    )


@pytest.mark.parametrize(
    "name",
    ["../../../outside.parquet", "/etc/passwd", "a/./b.parquet", "s3://bucket/x.parquet", ""],
)
def test_a_file_name_that_would_leave_the_table_is_refused(tmp_path, name):
    sink = _sink(tmp_path)
    [good] = _stage(sink, 1, [{"user": "a", "n": 1}])
    table_uuid, _, rows, *_ = msgspec.msgpack.decode(good)
    bad = msgspec.msgpack.encode([table_uuid, name, rows])
    expected = (
        f"Iceberg table 'db.clicks': committable names data file {name!r}, which is outside "
        f"the table's data location file://{tmp_path}/warehouse/db/clicks/data; refusing it "
        "(is the checkpoint metadata from another table or tampered with?)"
    )
    for attempt in (
        lambda: sink.commit(USER, 1, [good, bad]),
        lambda: sink.missing_files([bad]),
        lambda: sink.discard([bad]),
    ):
        with pytest.raises(CommitError) as err:
            attempt()
        assert str(err.value) == expected
    assert _rows(sink) == []


def test_discard_deletes_the_staged_files_of_a_failed_attempt_and_only_those(tmp_path):
    from regional.sinks.parquet import ParquetSink

    sink, other = _sink(tmp_path), _sink(tmp_path, "db.other")
    parquet = ParquetSink(str(tmp_path / "parquet"))
    mine = _stage(sink, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
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
    assert sink.missing_files(mine) == []
    sink.discard(mine + theirs + staged)  # never another sink's or table's files
    sink.discard(mine)  # already gone is fine
    assert sink.missing_files(mine) == sink.data_files(mine)
    assert other.missing_files(theirs) == [] and parquet.missing_files(staged) == []
    assert os.listdir(tmp_path / "warehouse" / "db" / "clicks" / "data") == []


def test_rollback_undoes_the_users_commits_after_a_checkpoint(tmp_path):
    sink = _sink(tmp_path)
    for cid in (2, 3, 4):
        sink.commit(USER, cid, _stage(sink, cid, [{"user": "a", "n": cid}]))
    assert sink.rollback(USER, 4) == []
    assert sink.rollback(USER, 2) == [3, 4]
    assert _rows(sink) == [("a", 2)] and sink.committed_identifiers(USER) == frozenset({2})
    # the restored job commits 3 and 4 again
    sink.commit(USER, 3, _stage(sink, 3, [{"user": "a", "n": 30}]))
    assert _rows(sink) == [("a", 2), ("a", 30)]
    assert sink.rollback(USER, 1) == [2, 3]  # back to the table before the user's first commit
    assert _rows(sink) == [] and _table(sink).current_snapshot() is None
    assert IcebergSink(sink.warehouse, "db.clicks").committed_identifiers(USER) == frozenset()


def test_rollback_is_refused_when_another_writer_committed_since(tmp_path):
    sink = _sink(tmp_path)
    sink.commit(USER, 1, _stage(sink, 1, [{"user": "a", "n": 1}]))
    sink.commit(USER, 2, _stage(sink, 2, [{"user": "a", "n": 2}]))
    other = _table(sink)
    other.append(pa.table({"user": ["z"], "n": [9]}, schema=SCHEMA))
    sink.commit(USER, 3, _stage(sink, 3, [{"user": "a", "n": 3}]))
    with pytest.raises(RestoreError) as err:
        sink.rollback(USER, 1)
    other.refresh()
    theirs = other.snapshots()[2].snapshot_id
    assert str(err.value) == (
        f"Iceberg table 'db.clicks': cannot roll back the commits of user {USER!r} after "
        f"checkpoint 1: snapshot(s) {theirs} of other writers came after them and would be "
        "dropped too; remove the commits by hand (e.g. delete their rows) or restore a newer "
        "checkpoint"
    )
    assert _rows(sink) == [("a", 1), ("a", 2), ("a", 3), ("z", 9)]
    assert sink.rollback(USER, 2) == [3]  # nobody else after checkpoint 3's snapshot's parent
    assert _rows(sink) == [("a", 1), ("a", 2), ("z", 9)]


def test_rows_that_do_not_fit_the_table_are_refused_with_the_columns(tmp_path):
    sink = _sink(tmp_path)
    with pytest.raises(SinkError) as err:
        _stage(sink, 1, [{"user": "a", "count": 1}])
    assert str(err.value) == (
        "records for Iceberg table 'db.clicks' do not fit its columns ['user', 'n']: missing "
        "['n'], unknown ['count']; map the records to the table's columns before the sink"
    )
    assert not (tmp_path / "warehouse" / "db" / "clicks" / "data").exists()


def test_partitioned_missing_and_misnamed_tables_are_refused(tmp_path):
    sink = _sink(tmp_path)
    catalog = load_catalog("regional", **sink.catalog_properties)
    with catalog.create_table("db.parted", schema=SCHEMA).update_spec() as spec:
        spec.add_identity("user")
    with pytest.raises(SinkError) as err:
        IcebergSink(sink.warehouse, "db.parted")
    assert str(err.value) == (
        f"Iceberg table 'db.parted' in {sink.warehouse}: only unpartitioned tables are "
        "supported; it is partitioned by [\n  1000: user: identity(1)\n]"
    )
    with pytest.raises(SinkError) as err:
        IcebergSink(sink.warehouse, "db.nope")
    assert str(err.value) == (
        f"Iceberg table 'db.nope' does not exist in the catalog of {sink.warehouse}: create "
        "it, or pass schema= to IcebergSink to create it"
    )
    with pytest.raises(SinkError) as err:
        IcebergSink(sink.warehouse, "clicks")
    assert str(err.value) == "Iceberg table 'clicks': expected 'namespace.table'"


def test_without_the_extra_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyiceberg.catalog", None)  # the import now fails
    with pytest.raises(SinkError, match=r"pip install 'regional-checkpoints\[iceberg\]"):
        IcebergSink(str(tmp_path), "db.t", schema=SCHEMA)


# --- on Spark: exactly-once across unit faults and a hard driver crash ------------------------

CLICKS = pa.schema(
    [("split", pa.int64()), ("n", pa.int64()), ("user", pa.string()), ("count", pa.int64())]
)


def iceberg_pipeline(warehouse: str):
    """tests/clicks_job.py's job (8 splits of 20 clicks, a keyed count) into an Iceberg table."""
    from clicks_job import PER_EPOCH

    from regional.dataflow.pipeline import Pipeline
    from regional.sources.generator import GeneratorSource

    p = Pipeline("clicks", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT), parallelism=4, name="src"
    )
    counted = src.key_by(lambda r: r["user"]).process(count, name="count")
    counted.sink(IcebergSink(warehouse, "db.clicks", schema=CLICKS), name="out")
    return p


JOB = textwrap.dedent(
    """
    import os
    from regional.runtime.spark import Faults
    from test_sink_iceberg import iceberg_pipeline

    pipeline = iceberg_pipeline(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-iceberg")
    if os.environ.get("KILL_AT"):  # unit 1 fails checkpoint 2; the driver process dies
        faults = Faults(
            units={(2, 1): "fail"}, crash_at=(int(os.environ["KILL_AT"]), "after-commit"),
            hard=True,
        )
    """
)


def _read_back(warehouse: str) -> tuple[list[tuple], list[tuple], list[dict]]:
    """Rows read with pyiceberg, rows read with DuckDB over the current snapshot's data files,
    and the snapshots' regional summaries, oldest first."""
    sink = IcebergSink(warehouse, "db.clicks")
    by_pyiceberg = _table(sink).scan().to_arrow()
    files = [f.removeprefix("file://") for f in sink.current_files()]
    by_duckdb = duckdb.sql(
        f'select split, n, "user", count from read_parquet({files!r})'
    ).fetchall()
    ours = sorted(zip(*(by_pyiceberg.column(c).to_pylist() for c in CLICKS.names), strict=True))
    return ours, sorted(by_duckdb), _summaries(sink)


@pytest.fixture(scope="module")
def fault_free(spark, tmp_path_factory) -> list[tuple]:
    from regional.runtime.spark import SparkRuntime

    tmp = tmp_path_factory.mktemp("iceberg-clean")
    summary = SparkRuntime(iceberg_pipeline(str(tmp / "wh")), spark, root=str(tmp / "ckpt")).run()
    assert summary.finished
    rows, duck, _ = _read_back(str(tmp / "wh"))
    assert rows == duck == expected_rows()
    return rows


@pytest.mark.spark
def test_unit_faults_and_a_killed_driver_then_resume_write_the_fault_free_rows_once(
    tmp_path, fault_free
):
    job = tmp_path / "job.py"
    job.write_text(JOB)
    root = str(tmp_path / "ckpt")
    here = os.path.dirname(__file__)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), here])}

    def run(**extra: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "regional.cli", "run", str(job), "--master", "local[2]"]
        return subprocess.run(
            [*cmd, "--checkpoint-dir", root],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=300,
        )

    killed = run(KILL_AT="4")  # right after checkpoint 4's commit: its response is "lost"
    assert killed.returncode == 70, killed.stderr
    assert "checkpoint    2  regional" in killed.stdout
    resumed = run()
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint 4" in resumed.stdout and "job finished" in resumed.stdout

    rows, by_duckdb, summaries = _read_back(root + "-iceberg")
    assert rows == by_duckdb == fault_free
    [user] = {s["regional.commit-user"] for s in summaries}  # kept across the crash
    assert user.startswith("clicks-") and user.endswith("-out")
    ids = [int(s["regional.checkpoint-id"]) for s in summaries]
    assert ids == sorted(set(ids))  # checkpoint 4 was not committed twice
    fallback = {
        int(s["regional.checkpoint-id"]): json.loads(s["regional.fallback-units"])
        for s in summaries
    }
    assert fallback[2] == {"1": 1} and fallback[4] == {}
