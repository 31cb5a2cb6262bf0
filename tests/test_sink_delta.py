"""The Delta Lake sink (needs the extra regional-checkpoints[delta]): staging, commits through the
commit coordinator's protocol with Delta transaction markers, idempotent re-commits read from the
table's own log, conflicts, the data-file checks, and exactly-once output across a hard driver crash
on Spark, read back with deltalake and with DuckDB."""

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
import pytest
from counted_job import user_counts
from deltalake import DeltaTable  # the extra regional-checkpoints[delta]; `make test` installs it

from regional.coordinator import Commit
from regional.coordinator.commit import CommitCoordinator, perform_commit
from regional.dataflow.pipeline import Pipeline
from regional.errors import CommitError, RestoreError, SinkError
from regional.runtime.restore import roll_back_sinks
from regional.sinks.base import TableCommitter, TableRollback, WriteContext
from regional.sinks.delta import DeltaSink
from regional.sources.generator import GeneratorSource

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])


def _sink(tmp_path, name: str = "clicks") -> DeltaSink:
    return DeltaSink(str(tmp_path / name), schema=SCHEMA)


def _stage(sink: DeltaSink, cid: int, rows: list[dict], index: int = 0) -> tuple[bytes, ...]:
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


def _rows(path: str) -> list[tuple]:
    """The table's rows read with deltalake alone."""
    t = DeltaTable(path).to_pyarrow_table()
    return sorted(zip(t.column("user").to_pylist(), t.column("n").to_pylist(), strict=True))


def _duckdb_rows(path: str, columns: str = "user, n") -> list[tuple]:
    """The table's rows read by DuckDB over the data files the Delta log lists."""
    files = DeltaTable(path).file_uris()
    if not files:
        return []
    return sorted(duckdb.execute(f"SELECT {columns} FROM read_parquet({files!r})").fetchall())


def test_staged_rows_show_only_after_the_commit_which_records_marker_checkpoint_and_fallback(
    tmp_path,
):
    sink = _sink(tmp_path)
    assert isinstance(sink, TableCommitter) and not isinstance(sink, TableRollback)
    c = _stage(sink, 4, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    c += _stage(sink, 4, [{"n": 3, "user": "c"}], index=1)  # column order does not matter
    assert sink.rows_of(c) == 3
    staged = sorted(os.listdir(sink.path))
    assert [f for f in staged if f != "_delta_log"] == sorted(
        os.path.basename(f) for f in sink.data_files(c)
    )
    assert _rows(sink.path) == [] and _duckdb_rows(sink.path) == []
    assert perform_commit(Commit(4, "out", "job-1-out", c, fallback={2: 3, 5: 0}), sink)
    assert _rows(sink.path) == [("a", 1), ("b", 2), ("c", 3)] == _duckdb_rows(sink.path)
    table = DeltaTable(sink.path)
    assert table.version() == 1 and table.transaction_version("job-1-out") == 4
    info = table.history(1)[0]
    assert (info["operation"], info["regional.checkpoint-id"]) == ("WRITE", "4")
    assert info["regional.commit-user"] == "job-1-out"
    assert info["regional.fallback-units"] == '{"2":3,"5":0}'
    stats = table.get_add_actions(flatten=True).column("num_records").to_pylist()
    assert sorted(stats) == [1, 2]


def test_recommit_after_a_lost_response_is_skipped_from_the_marker_even_by_a_new_driver(
    tmp_path,
):
    sink = _sink(tmp_path)
    c1 = _stage(sink, 1, [{"user": "a", "n": 1}])
    c3 = _stage(sink, 3, [{"user": "b", "n": 2}])  # checkpoint 2 had nothing to commit
    assert perform_commit(Commit(1, "out", "job", c1), sink)
    assert perform_commit(Commit(3, "out", "job", c3), sink)
    # the driver crashed before it heard that 3 was committed; a new one re-commits 1 and 3
    after_crash = DeltaSink(sink.path)
    assert after_crash.latest_committed("job") == 3
    assert perform_commit(Commit(1, "out", "job", c1, recommit=True), after_crash) is False
    assert perform_commit(Commit(3, "out", "job", c3, recommit=True), after_crash) is False
    assert _rows(sink.path) == [("a", 1), ("b", 2)] and DeltaTable(sink.path).version() == 2
    with pytest.raises(CommitError) as err:
        after_crash.commit("job", 3, c3)  # without perform_commit's check: refused, not added
    assert str(err.value) == (
        f"Delta table {sink.path}: commit 3 of user 'job' is not after its latest commit 3; "
        "commits must be in checkpoint order"
    )
    assert DeltaTable(sink.path).version() == 2


def test_a_fresh_run_with_restarted_lower_checkpoint_ids_is_not_dropped(tmp_path):
    sink = _sink(tmp_path)
    for cid in (1, 2, 3):
        perform_commit(
            Commit(cid, "out", "job-run1-out", _stage(sink, cid, [{"user": "a", "n": cid}])), sink
        )
    fresh = DeltaSink(sink.path)  # a new run of the job: a new commit user, ids from 1 again
    assert fresh.latest_committed("job-run2-out") is None
    c = _stage(fresh, 1, [{"user": "b", "n": 1}])
    assert perform_commit(Commit(1, "out", "job-run2-out", c), fresh)
    assert _rows(sink.path) == [("a", 1), ("a", 2), ("a", 3), ("b", 1)]
    table = DeltaTable(sink.path)
    assert (
        table.transaction_version("job-run1-out"),
        table.transaction_version("job-run2-out"),
    ) == (3, 1)


def test_a_commit_by_another_driver_of_the_same_commit_user_meanwhile_is_a_conflict(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 1, [{"user": "a", "n": 1}])
    assert sink.latest_committed("job") is None  # decided on version 0
    other_driver = DeltaSink(sink.path)
    assert perform_commit(
        Commit(1, "out", "job", _stage(sink, 1, [{"user": "z", "n": 9}])), other_driver
    )
    with pytest.raises(CommitError) as err:
        sink.commit("job", 1, c)
    assert str(err.value) == (
        f"Delta table {sink.path}: checkpoint 1 of commit user 'job' was not committed: the "
        "table changed after version 0 in a way that conflicts with it (Failed to commit "
        "transaction: Concurrent transaction failed.); is another driver of this job running? "
        "The commit is retried and skipped if the other writer committed it"
    )
    assert _rows(sink.path) == [("z", 9)]
    # the retry reads the table afresh and skips what the other driver committed
    assert perform_commit(Commit(1, "out", "job", c), sink) is False
    # other writers' appends in between are not conflicts
    sink.latest_committed("job")
    assert perform_commit(
        Commit(1, "out", "other-job", _stage(sink, 1, [{"user": "o", "n": 0}])), other_driver
    )
    sink.commit("job", 2, _stage(sink, 2, [{"user": "b", "n": 2}]))
    assert _rows(sink.path) == [("b", 2), ("o", 0), ("z", 9)]


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
        f"Delta table {sink.path}: cannot commit checkpoint 3: data file(s) {path} are missing "
        "(were they deleted?); nothing was committed; restore from a newer checkpoint or restore "
        "the files"
    )
    assert DeltaTable(sink.path).version() == 0 and _rows(sink.path) == []


def test_files_already_in_the_table_without_a_marker_are_not_committed_twice(tmp_path):
    sink = _sink(tmp_path)
    c = _stage(sink, 1, [{"user": "a", "n": 1}])
    perform_commit(Commit(1, "out", "job", c), sink)
    [path] = sink.data_files(c)
    # as if delta.setTransactionRetentionDuration had expired the marker of 'job'
    with pytest.raises(CommitError) as err:
        perform_commit(Commit(1, "out", "job-marker-gone", c, recommit=True), sink)
    assert str(err.value) == (
        f"Delta table {sink.path}: cannot commit checkpoint 1: data file(s) {path} are already "
        "in the table but commit user 'job-marker-gone' has no transaction marker (did "
        "delta.setTransactionRetentionDuration expire it?); nothing was committed, committing "
        "again would duplicate their rows"
    )
    assert _rows(sink.path) == [("a", 1)]


def test_discard_deletes_the_staged_files_of_a_failed_attempt_and_nothing_else(tmp_path):
    from regional.sinks.parquet import ParquetSink

    sink, other = _sink(tmp_path), _sink(tmp_path, "other")
    parquet = ParquetSink(str(tmp_path / "parquet"))
    mine = _stage(sink, 1, [{"user": "a", "n": 1}, {"user": "b", "n": 2}])
    theirs = _stage(other, 1, [{"user": "c", "n": 3}])
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
    files = sink.data_files(mine)
    assert sink.missing_files(mine) == []
    sink.discard(mine + theirs + staged)  # defence in depth: never another sink's files
    sink.discard(mine)  # already gone is fine
    assert sink.missing_files(mine) == files
    assert other.missing_files(theirs) == [] and parquet.missing_files(staged) == []
    assert sorted(os.listdir(sink.path)) == ["_delta_log"]


@pytest.mark.parametrize(
    "name",
    [
        "../escaped.parquet",
        "_delta_log/00000000000000000000.json",
        "/etc/passwd.parquet",
        "sub/x.parquet",
    ],
)
def test_a_file_name_that_would_escape_the_table_is_refused(tmp_path, name):
    sink = _sink(tmp_path)
    [good] = _stage(sink, 1, [{"user": "a", "n": 1}])
    fields = msgspec.msgpack.decode(good)
    assert fields[0] == "delta"
    bad = msgspec.msgpack.encode([*fields[:2], name, *fields[3:]])
    expected = (
        f"Delta table {sink.path}: a committable names file {name!r}, which is not a data file "
        "name in the table directory (it would escape the table or hide in it); refusing it: "
        "the checkpoint's committables are damaged"
    )
    for call in (
        lambda: perform_commit(Commit(1, "out", "job", (good, bad), recommit=True), sink),
        lambda: sink.commit("job", 1, (good, bad)),
        lambda: sink.discard((good, bad)),
    ):
        with pytest.raises(CommitError) as err:
            call()
        assert str(err.value) == expected
    assert sink.missing_files((good,)) == []  # nothing was deleted
    assert DeltaTable(sink.path).version() == 0


def test_a_restore_below_the_latest_commit_is_refused_as_the_sink_cannot_roll_back(tmp_path):
    sink = _sink(tmp_path)
    for cid in (1, 3, 5):
        sink.commit("job", cid, _stage(sink, cid, [{"user": "a", "n": cid}]))
    pipeline = Pipeline("job")
    pipeline.source(GeneratorSource(1, lambda split, i: {"x": i})).sink(
        DeltaSink(sink.path), name="out"
    )
    committers = {"out": CommitCoordinator("out", commit_user="job")}
    assert roll_back_sinks(pipeline, committers, 5, own_root=True) == ()
    with pytest.raises(RestoreError) as refused:
        roll_back_sinks(pipeline, committers, 2, own_root=True)
    assert str(refused.value) == (
        "sink 'out' holds commits of commit user 'job' up to 5, newer than the restored "
        "checkpoint 2; restoring would write their output again and the sink cannot roll back. "
        "Restore a checkpoint at or after 5, or remove those commits from the table by hand and "
        "start again"
    )


def test_rows_that_do_not_fit_the_table_are_refused_with_the_columns(tmp_path):
    sink = _sink(tmp_path)
    with pytest.raises(SinkError) as err:
        _stage(sink, 1, [{"user": "a", "count": 1}])
    assert str(err.value) == (
        f"records for Delta table {sink.path} do not fit its columns ['user', 'n']: missing "
        "['n'], unknown ['count']; map the records to the table's columns before the sink"
    )
    assert sorted(os.listdir(sink.path)) == ["_delta_log"]


def test_partitioned_and_missing_tables_are_refused(tmp_path):
    path = str(tmp_path / "p")
    DeltaTable.create(path, SCHEMA, partition_by=["user"])
    with pytest.raises(SinkError) as err:
        DeltaSink(path)
    assert str(err.value) == (
        f"Delta table {path} is partitioned by ['user']: only unpartitioned tables are "
        "supported; write to an unpartitioned table"
    )
    with pytest.raises(SinkError) as err:
        DeltaSink(str(tmp_path / "nope"))
    assert str(err.value) == (
        f"Delta table {tmp_path / 'nope'} does not exist: create it, or pass schema= to "
        "DeltaSink to create it"
    )


def test_without_the_extra_the_error_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "deltalake", None)  # import deltalake now fails
    with pytest.raises(SinkError, match=r"pip install 'regional-checkpoints\[delta\]"):
        DeltaSink(str(tmp_path / "t"), schema=SCHEMA)


# --- on Spark: exactly-once across a hard driver crash ------------------------------------------

JOB = textwrap.dedent(
    """
    import os
    import pyarrow as pa
    from regional import GeneratorSource, Pipeline
    from regional.runtime.spark import Faults
    from regional.sinks.delta import DeltaSink

    def click(split, n):
        return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}

    def count(ctx, record):
        state = ctx.value_state("count", 0)
        state.update(state.value() + 1)
        yield {**record, "count": state.value()}

    SCHEMA = pa.schema(
        [("split", pa.int64()), ("n", pa.int64()), ("user", pa.string()), ("count", pa.int64())]
    )
    pipeline = Pipeline("delta-job", records_per_epoch=10)
    src = pipeline.source(GeneratorSource(4, click, records_per_split=30), parallelism=4)
    counted = src.key_by(lambda r: r["user"]).process(count, name="count")
    table = os.environ["REGIONAL_CHECKPOINT_DIR"] + "-delta"
    counted.sink(DeltaSink(table, schema=SCHEMA), name="out")
    if os.environ.get("KILL_AT"):
        # unit 1 fails checkpoint 2, unit 2's Python worker dies in checkpoint 3; the driver
        # process ends (os._exit) right after checkpoint KILL_AT's metadata, before its commit
        faults = Faults(
            units={(2, 1): "fail", (3, 2): "crash"},
            crash_at=(int(os.environ["KILL_AT"]), "after-metadata"),
            hard=True,
        )
    """
)


def _run(file, root, **env) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[2]"]
    return subprocess.run(
        [*cmd, "--checkpoint-dir", root],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=600,
    )


def _all_rows(path: str) -> tuple[list[tuple], list[tuple]]:
    """The rows read with deltalake, and read with DuckDB over the files the log lists."""
    columns = ["split", "n", "user", "count"]
    t = DeltaTable(path).to_pyarrow_table()
    delta = sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True))
    return delta, _duckdb_rows(path, ", ".join(f'"{c}"' for c in columns))


@pytest.mark.spark
def test_hard_driver_crash_then_resume_writes_the_fault_free_rows_exactly_once(tmp_path):
    file = tmp_path / "job.py"
    file.write_text(JOB)
    fault_free = user_counts(4, 30)

    root = str(tmp_path / "ckpt")
    killed = _run(file, root, KILL_AT="4")
    assert killed.returncode == 70, killed.stderr
    assert "checkpoint    2  regional" in killed.stdout
    resumed = _run(file, root)
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint 4" in resumed.stdout and "job finished" in resumed.stdout

    delta, via_duckdb = _all_rows(root + "-delta")
    assert delta == fault_free and via_duckdb == fault_free
    table = DeltaTable(root + "-delta")
    commits = [h for h in table.history() if "regional.checkpoint-id" in h]
    [user] = {h["regional.commit-user"] for h in commits}  # one commit user, kept across the crash
    assert user.startswith("delta-job-") and user.endswith("-out")
    ids = sorted(int(h["regional.checkpoint-id"]) for h in commits)
    assert len(ids) == len(set(ids)) and table.transaction_version(user) == ids[-1]
    fallback = {int(h["regional.checkpoint-id"]): h["regional.fallback-units"] for h in commits}
    assert fallback[2] == '{"1":1}' and json.loads(fallback[4]) == {}
