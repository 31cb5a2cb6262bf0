"""The Parquet table sink: staged files invisible until committed, idempotent ordered commits."""

from __future__ import annotations

import pyarrow as pa
import pytest

from regional.decisions import Commit
from regional.errors import CommitError
from regional.operators import TableCommitter, perform_commit
from regional.sinks.parquet import ParquetSink, committed_files, read_table


def _stage(sink, cid, values, index=0, attempt=1):
    return sink.write(
        [pa.record_batch({"v": values})],
        checkpoint_id=cid,
        vertex_id="out",
        index=index,
        attempt=attempt,
    )


def test_only_committed_files_are_read(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    assert isinstance(sink, TableCommitter)
    c1 = _stage(sink, 1, [1, 2])
    declined = _stage(sink, 1, [99], index=1)
    sink.commit("job", 1, c1)
    c2 = _stage(sink, 2, [3])
    assert read_table(sink.path).column("v").to_pylist() == [1, 2]
    sink.commit("job", 2, c2)
    assert read_table(sink.path).column("v").to_pylist() == [1, 2, 3]
    sink.discard(declined)
    sink.discard(declined)  # already gone is fine
    assert len(committed_files(sink.path)) == 2
    assert sink.rows_of(c1 + c2) == 3


def test_commits_are_idempotent_and_ordered(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    c = _stage(sink, 5, [1])
    commit = Commit(5, "out", "job", c, recommit=True)
    assert perform_commit(commit, sink) is True
    assert perform_commit(commit, sink) is False  # re-commit after restore: skipped
    assert read_table(sink.path).num_rows == 1
    with pytest.raises(
        CommitError, match="commit 4 of user 'job' is not after its latest commit 5"
    ):
        sink.commit("job", 4, _stage(sink, 4, [2]))
    sink.commit("other-job", 1, _stage(sink, 1, [7], index=3))
    assert sink.committed_identifiers("job") == frozenset({5})
    assert read_table(sink.path).num_rows == 2


def test_recommit_with_a_missing_data_file_is_refused(tmp_path):
    sink = ParquetSink(str(tmp_path / "t"))
    c = _stage(sink, 3, [1])
    sink.discard(c)
    [missing] = sink.missing_files(c)
    with pytest.raises(CommitError, match=f"data file\\(s\\) {missing} are missing"):
        perform_commit(Commit(3, "out", "job", c, recommit=True), sink)
    assert _stage(sink, 4, []) == ()  # no rows, no file, no committable


def test_sink_on_s3(s3_server):
    uri = s3_server.uri(s3_server.new_bucket(), "table")
    sink = ParquetSink(uri)
    sink.commit("job", 1, _stage(sink, 1, [1, 2, 3]))
    assert read_table(uri).column("v").to_pylist() == [1, 2, 3]
    assert sink.committed_identifiers("job") == frozenset({1})


def test_the_commit_object_records_the_fallback_units(tmp_path):
    import json

    sink = ParquetSink(str(tmp_path / "t"))
    perform_commit(Commit(3, "out", "job-r-out", _stage(sink, 3, [1]), fallback={2: 1}), sink)
    [record] = (tmp_path / "t" / "_commits" / "job-r-out").glob("*.json")
    assert record.name == "00000000000000000003.json"
    assert json.loads(record.read_text())["fallback"] == {"2": 1}
