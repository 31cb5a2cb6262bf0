"""The Parquet table sink: staged files invisible to every reader until committed, idempotent
ordered commits that publish them, a commit log whose per-commit cost does not grow, cleaning of
lost attempts' staged files, and identity across restarts."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import duckdb
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
from counted_job import user_counts
from pyarrow import fs as pafs

from regional.coordinator.commit import perform_commit
from regional.coordinator.decisions import Commit
from regional.errors import CommitError
from regional.sinks.base import TableCommitter, TableRollback, TableStaging, WriteContext
from regional.sinks.parquet import ParquetSink, committed_files, read_table


def _stage(sink, cid, values, index=0, attempt=1, job="job", run="r1"):
    return sink.write(
        [pa.record_batch({"v": values})],
        WriteContext(
            job_id=job,
            run_id=run,
            checkpoint_id=cid,
            attempt=attempt,
            unit_id=index,
            vertex_id="out",
            index=index,
        ),
    )


def _bare(path) -> dict[str, list[int]]:
    """The rows as readers of the bare table path see them (sorted)."""
    arrow = ds.dataset(str(path), format="parquet").to_table().column("v").to_pylist()
    glob = f"{path}/**/*.parquet"
    duck = [r[0] for r in duckdb.execute("select v from read_parquet(?)", [glob]).fetchall()]
    return {"pyarrow": sorted(arrow), "duckdb": sorted(duck)}


def _both(values) -> dict[str, list[int]]:
    return {"pyarrow": sorted(values), "duckdb": sorted(values)}


def test_only_committed_files_are_read_by_every_reader(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    assert isinstance(sink, TableCommitter)
    assert isinstance(sink, TableRollback) and isinstance(sink, TableStaging)
    c1 = _stage(sink, 1, [1, 2])
    declined = _stage(sink, 1, [99], index=1)
    sink.commit("job", 1, c1)
    c2 = _stage(sink, 2, [3])
    assert read_table(sink.path).column("v").to_pylist() == [1, 2]
    assert _bare(sink.path) == _both([1, 2])  # staged files of 1 (declined) and 2 are not seen
    sink.commit("job", 2, c2)
    assert read_table(sink.path).column("v").to_pylist() == [1, 2, 3]
    assert _bare(sink.path) == _both([1, 2, 3])
    sink.discard(declined)
    sink.discard(declined)  # already gone is fine
    sink.discard(c1)  # a committed file is never deleted by a late discard
    assert [Path(f).parent for f in committed_files(sink.path)] == [tmp_path / "t"] * 2
    assert read_table(sink.path).num_rows == 3 and sink.rows_of(c1 + c2) == 3
    assert sorted(p.name for p in (tmp_path / "t").iterdir() if p.suffix != ".parquet") == [
        "_commits",
        "_staging",
    ]


def test_commits_are_idempotent_and_ordered(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    c = _stage(sink, 5, [1])
    commit = Commit(5, "out", "job", c, recommit=True)
    assert perform_commit(commit, sink) is True
    assert perform_commit(commit, sink) is False  # re-commit after restore: skipped
    assert read_table(sink.path).num_rows == 1
    with pytest.raises(CommitError) as refused:
        sink.commit("job", 4, _stage(sink, 4, [2]))
    assert str(refused.value) == (
        f"table {sink.path}: commit 4 of user 'job' is not after its latest commit 5; commits "
        "must be in checkpoint order"
    )
    sink.commit("other-job", 1, _stage(sink, 1, [7], index=3))
    assert sink.latest_committed("job") == 5 and sink.latest_committed("nobody") is None
    assert read_table(sink.path).num_rows == 2


def test_recommit_with_a_missing_data_file_is_refused(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    c = _stage(sink, 3, [1])
    sink.discard(c)
    [missing] = sink.missing_files(c)
    assert missing.startswith("_staging/job/part-job-r1-c3-out-0-u0-a1-")
    with pytest.raises(CommitError, match=f"data file\\(s\\) {missing} are missing"):
        perform_commit(Commit(3, "out", "job", c, recommit=True), sink)
    assert _stage(sink, 4, []) == ()  # no rows, no file, no committable


class _CountingHandler(pafs.FileSystemHandler):
    """The local file system, counting calls by name; after `moves_left` moves, a move
    fails (the driver died there)."""

    def __init__(self) -> None:
        self.fs = pafs.LocalFileSystem()
        self.calls: collections.Counter[str] = collections.Counter()
        self.moves_left: int | None = None

    def _call(self, name, *args):
        self.calls[name] += 1
        return getattr(self.fs, name)(*args)

    def get_type_name(self):
        return "counting"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self._call("get_file_info", paths)

    def get_file_info_selector(self, selector):
        self.calls["list"] += 1
        return self.fs.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.calls["create_dir"] += 1
        return self.fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        return self._call("delete_dir", path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.calls["delete_dir_contents"] += 1
        return self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        return self._call("delete_file", path)

    def move(self, src, dest):
        if self.moves_left is not None:
            if self.moves_left == 0:
                raise OSError(f"injected: the driver died before moving {src}")
            self.moves_left -= 1
        return self._call("move", src, dest)

    def copy_file(self, src, dest):
        return self._call("copy_file", src, dest)

    def open_input_stream(self, path):
        return self._call("open_input_stream", path)

    def open_input_file(self, path):
        return self._call("open_input_file", path)

    def open_output_stream(self, path, metadata):
        return self._call("open_output_stream", path, metadata)

    def open_append_stream(self, path, metadata):
        return self._call("open_append_stream", path, metadata)


def test_a_commit_interrupted_after_publishing_completes_without_duplicates(tmp_path):
    handler = _CountingHandler()
    sink = ParquetSink(str(tmp_path / "t"), filesystem=pafs.PyFileSystem(handler))
    sink.commit("job", 1, _stage(sink, 1, [1]))
    c2 = _stage(sink, 2, [2], index=0) + _stage(sink, 2, [3], index=1)
    handler.moves_left = 1  # the driver dies after publishing the first file of 2
    with pytest.raises(OSError, match="injected"):
        sink.commit("job", 2, c2)
    # the window: a bare-path reader sees part of checkpoint 2, never a row twice (off a
    # local disk a commit publishes from several threads: either file may be the first)
    assert _bare(sink.path) in (_both([1, 2]), _both([1, 3]))
    assert read_table(sink.path).column("v").to_pylist() == [1]  # no record yet
    after_crash = ParquetSink(sink.path)  # the restarted driver re-commits 2
    assert after_crash.missing_files(c2) == []  # published or staged: nothing is missing
    assert perform_commit(Commit(2, "out", "job", c2, recommit=True), after_crash) is True
    assert _bare(sink.path) == _both([1, 2, 3])
    assert sorted(read_table(sink.path).column("v").to_pylist()) == [1, 2, 3]


def test_a_lost_commit_response_then_a_restart_does_not_duplicate(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    c1, c2 = _stage(sink, 1, [1]), _stage(sink, 2, [2])
    assert perform_commit(Commit(1, "out", "job-a-out", c1), sink)
    assert perform_commit(Commit(2, "out", "job-a-out", c2), sink)  # ... the response is lost
    after_crash = ParquetSink(sink.path)  # the commit user comes back from the checkpoint
    assert after_crash.latest_committed("job-a-out") == 2
    assert perform_commit(Commit(1, "out", "job-a-out", c1, recommit=True), after_crash) is False
    assert perform_commit(Commit(2, "out", "job-a-out", c2, recommit=True), after_crash) is False
    assert sorted(read_table(sink.path).column("v").to_pylist()) == [1, 2]
    assert _bare(sink.path) == _both([1, 2])


def test_a_fresh_run_with_restarted_lower_checkpoint_ids_is_not_dropped(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    for cid in (1, 2, 3):
        sink.commit("job-run1-out", cid, _stage(sink, cid, [cid], run="run1"))
    fresh = ParquetSink(sink.path)  # a new checkpoint root: ids start at 1, a new commit user
    assert fresh.latest_committed("job-run2-out") is None
    for cid in (1, 2):
        c = _stage(fresh, cid, [10 + cid], run="run2")
        assert perform_commit(Commit(cid, "out", "job-run2-out", c), fresh)
    assert sorted(read_table(sink.path).column("v").to_pylist()) == [1, 2, 3, 11, 12]
    assert _bare(sink.path) == _both([1, 2, 3, 11, 12])


def test_clean_staged_deletes_only_this_jobs_lost_attempts(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    committed = _stage(sink, 1, [1])
    sink.commit("job-r1-out", 1, committed)
    pending = _stage(sink, 2, [2])  # in the restored checkpoint's queue: a re-commit needs it
    lost = _stage(sink, 2, [3], index=1, attempt=1) + _stage(sink, 3, [4], run="r0")
    other_job = _stage(sink, 2, [5], job="other")
    deleted = sink.clean_staged("job", keep=pending + committed)
    assert deleted == sorted(sink.missing_files(lost))
    assert len(deleted) == 2 and sink.missing_files(pending + other_job + committed) == []
    assert sink.clean_staged("job", keep=pending) == []  # nothing left to delete
    assert sink.clean_staged("../t", keep=[]) == []  # never outside the table
    assert perform_commit(Commit(2, "out", "job-r1-out", pending, recommit=True), sink)
    assert sorted(read_table(sink.path).column("v").to_pylist()) == [1, 2]


def test_a_starting_driver_keeps_what_its_restored_checkpoint_names(tmp_path):
    from metadata.model import CheckpointMetadata, SubtaskState
    from regional.coordinator.commit import CommitCoordinator
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.restore import clean_staged_sinks
    from regional.sources.generator import GeneratorSource

    sink = ParquetSink(str(tmp_path / "t"))
    in_state = _stage(sink, 4, [1])  # a sink subtask's committables in the restored checkpoint
    pending = _stage(sink, 3, [2], index=1)  # a commit the restored coordinator re-commits
    lost = _stage(sink, 5, [3], run="r0")  # written by the crashed run after checkpoint 4
    committer = CommitCoordinator("out", commit_user="job-r0-out")
    committer.checkpoint_complete(3, pending, recommit=True)
    restored = CheckpointMetadata(
        checkpoint_id=4,
        job_id="job",
        kind="global",
        trigger_time_ms=1,
        completion_time_ms=2,
        subtasks=(SubtaskState("out", 0, 0, committables=in_state),),
    )
    pipeline = Pipeline("job")
    pipeline.source(GeneratorSource(1, lambda split, i: {"v": i})).sink(sink, name="out")
    notes = clean_staged_sinks(pipeline, {"out": committer}, "job", restored)
    assert notes == ("sink 'out': deleted 1 staged file(s) of lost attempts",)
    assert sink.missing_files(in_state + pending) == [] and len(sink.missing_files(lost)) == 1
    # a fresh start (no checkpoint to restore) keeps nothing of the job's staged files
    assert clean_staged_sinks(pipeline, {"out": CommitCoordinator("out", "u")}, "job", None)
    assert len(sink.missing_files(in_state + pending)) == 2


def test_rollback_unpublishes_the_undone_commits_files(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    for cid in (998, 999, 1000, 1001):  # across two groups of the commit log
        sink.commit("job", cid, _stage(sink, cid, [cid]))
    sink.commit("other", 1, _stage(sink, 1, [7]))
    assert sink.rollback("job", 999) == [1000, 1001]
    assert sink.latest_committed("job") == 999
    assert ParquetSink(sink.path).latest_committed("job") == 999  # read from the table, too
    assert _bare(sink.path) == _both([7, 998, 999])
    assert sorted(read_table(sink.path).column("v").to_pylist()) == [7, 998, 999]
    sink.commit("job", 1000, _stage(sink, 1000, [1000, 1000]))  # written again
    assert _bare(sink.path) == _both([7, 998, 999, 1000, 1000])


def test_a_job_id_starting_with_an_underscore_is_still_seen_by_every_reader(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    sink.commit("_j-r1-out", 1, _stage(sink, 1, [1, 2], job="_j"))
    assert _bare(sink.path) == _both([1, 2])
    assert read_table(sink.path).column("v").to_pylist() == [1, 2]


def test_the_commit_record_is_grouped_and_records_the_fallback_units(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    perform_commit(Commit(3, "out", "job-r-out", _stage(sink, 3, [1]), fallback={2: 1}), sink)
    [record] = (tmp_path / "t" / "_commits" / "job-r-out").glob("*/*.json")
    assert record.relative_to(tmp_path / "t").as_posix() == (
        f"_commits/job-r-out/{0:020d}/{3:020d}.json"
    )
    assert json.loads(record.read_text())["fallback"] == {"2": 1}
    # a group directory left empty (a crash before its first record) is passed over
    (tmp_path / "t" / "_commits" / "job-r-out" / f"{1000:020d}").mkdir()
    assert ParquetSink(sink.path).latest_committed("job-r-out") == 3


def test_tables_of_the_older_layout_still_read_and_commit(tmp_path):
    import msgspec
    import pyarrow.parquet as pq

    table = tmp_path / "t"
    (table / "data").mkdir(parents=True)
    pq.write_table(pa.table({"v": [1]}), table / "data" / "old.parquet")
    pq.write_table(pa.table({"v": [2]}), table / "data" / "pending.parquet")
    (table / "_commits" / "job").mkdir(parents=True)
    old = {"commit_user": "job", "identifier": 4, "files": ["data/old.parquet"], "rows": 1}
    (table / "_commits" / "job" / f"{4:020d}.json").write_text(json.dumps(old))
    sink = ParquetSink(str(table))
    assert sink.latest_committed("job") == 4
    pending = (msgspec.msgpack.encode(["data/pending.parquet", 1]),)  # from an old checkpoint
    assert perform_commit(Commit(5, "out", "job", pending, recommit=True), sink)
    assert read_table(str(table)).column("v").to_pylist() == [1, 2]


def test_the_work_of_a_commit_does_not_grow_with_the_number_of_commits(tmp_path):
    handler = _CountingHandler()
    sink = ParquetSink(str(tmp_path / "t"), filesystem=pafs.PyFileSystem(handler))
    per_commit = []
    for cid in range(1, 1201):
        c = _stage(sink, cid, [cid])
        handler.calls.clear()
        assert perform_commit(Commit(cid, "out", "job", c), sink)
        per_commit.append(dict(handler.calls))
    # the first commit looks the latest up (one listing of the user's directory); every later
    # one makes the same calls, none of them a listing
    assert per_commit[0] == {**per_commit[1], "list": 1}
    assert all(calls == per_commit[1] for calls in per_commit[1:])
    assert "list" not in per_commit[1]
    # after a restart the lookup lists the user's directory and the newest group only
    handler.calls.clear()
    assert (
        ParquetSink(sink.path, filesystem=pafs.PyFileSystem(handler)).latest_committed("job")
        == 1200
    )
    assert handler.calls == {"list": 2}
    assert sorted(read_table(str(tmp_path / "t")).column("v").to_pylist()) == list(range(1, 1201))


def test_sink_on_s3(s3_server):
    uri = s3_server.uri(s3_server.new_bucket(), "table")
    sink = ParquetSink(uri)
    lost = _stage(sink, 1, [9], index=1)
    sink.commit("job", 1, _stage(sink, 1, [1, 2, 3]))
    assert read_table(uri).column("v").to_pylist() == [1, 2, 3]
    assert ParquetSink(uri).latest_committed("job") == 1
    assert sink.clean_staged("job", keep=[]) == sink.missing_files(lost)
    fs, base = pafs.FileSystem.from_uri(uri)
    assert ds.dataset(base, filesystem=fs, format="parquet").to_table().num_rows == 3


def test_a_commit_on_s3_publishes_every_file_once(s3_server):
    uri = s3_server.uri(s3_server.new_bucket(), "table")
    sink = ParquetSink(uri)
    staged = [c for i in range(20) for c in _stage(sink, 1, [i], index=i)]
    sink.commit("job", 1, staged)  # 20 copies + deletes, `publish_threads` at a time
    assert sorted(read_table(uri).column("v").to_pylist()) == list(range(20))
    fs, base = pafs.FileSystem.from_uri(uri)
    bare = ds.dataset(base, filesystem=fs, format="parquet").to_table()
    assert sorted(bare.column("v").to_pylist()) == list(range(20))
    assert sink.clean_staged("job", keep=[]) == []  # nothing left staged


# --- on Spark: exactly-once for every reader across unit faults and hard driver crashes ---------

JOB = textwrap.dedent(
    """
    import os
    from regional import GeneratorSource, ParquetSink, Pipeline
    from regional.runtime.spark import Faults

    def click(split, n):
        return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}

    def count(ctx, record):
        state = ctx.value_state("count", 0)
        state.update(state.value() + 1)
        yield {**record, "count": state.value()}

    pipeline = Pipeline("parquet-job", records_per_epoch=10)
    src = pipeline.source(GeneratorSource(4, click, records_per_split=50), parallelism=4)
    counted = src.key_by(lambda r: r["user"]).process(count, name="count")
    counted.sink(ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table"), name="out")
    if os.environ.get("KILL"):
        # unit 1 fails checkpoint 2, unit 2's Python worker dies in checkpoint 3; the driver
        # process ends (os._exit) at KILL = "<checkpoint>:<step>"
        cid, step = os.environ["KILL"].split(":")
        faults = Faults(
            units={(2, 1): "fail", (3, 2): "crash"}, crash_at=(int(cid), step), hard=True
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


def _readers(spark, table: str) -> dict[str, list[tuple]]:
    """The table's rows as each reader sees it: Spark, pyarrow and DuckDB on the bare path,
    and `regional.read_table`."""
    columns = ["split", "n", "user", "count"]

    def rows(t: pa.Table) -> list[tuple]:
        return sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True))

    glob = f"{table}/**/*.parquet"
    return {
        "spark": sorted(tuple(r) for r in spark.read.parquet(table).select(*columns).collect()),
        "pyarrow": rows(ds.dataset(table, format="parquet").to_table()),
        "duckdb": sorted(
            duckdb.execute('select split, n, "user", count from read_parquet(?)', [glob]).fetchall()
        ),
        "read_table": rows(read_table(table)),
    }


@pytest.mark.spark
def test_unit_faults_and_hard_driver_crashes_then_resume_every_reader_sees_the_rows_once(
    spark, tmp_path
):
    file = tmp_path / "job.py"
    file.write_text(JOB)
    fault_free = user_counts(4, 50)
    assert len(fault_free) == 4 * 50

    root = str(tmp_path / "ckpt")
    # killed after checkpoint 4's metadata, before its commit: the next run re-commits it
    killed = _run(file, root, KILL="4:after-metadata")
    assert killed.returncode == 70, killed.stderr
    assert "checkpoint    2  regional" in killed.stdout
    # killed after checkpoint 6's acks, before its metadata: its staged files are a lost run's
    killed = _run(file, root, KILL="6:after-acks")
    assert killed.returncode == 70, killed.stderr
    assert "checkpoint    5  global" in killed.stdout  # resumed after 4 (re-committed it)
    assert "checkpoint    6" not in killed.stdout  # died before reporting it
    table = Path(root + "-table")
    lost = sorted(p.name for p in (table / "_staging" / "parquet-job").iterdir())
    assert any("-c6-out-" in name for name in lost), lost
    resumed = _run(file, root)
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint 5" in resumed.stdout and "job finished" in resumed.stdout

    seen = _readers(spark, str(table))
    assert seen == dict.fromkeys(seen, fault_free)
    assert list((table / "_staging" / "parquet-job").iterdir()) == []  # lost attempts deleted
