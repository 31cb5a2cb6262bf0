"""A poisoned JSON-lines file on Spark in a stage with no operator (a source straight into a
sink, issue 32 §3): a line nested 100,000 deep (it used to kill the Python worker), a line that
is not UTF-8 (it used to reach the table), a bare null, a line that is no JSON, and a record
whose event time is past the supported range. The job finishes; the table holds exactly the
good rows and the dead-letter table one row per bad record (both read with DuckDB)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from regional.dataflow.pipeline import Pipeline
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.files import FileSource

pytestmark = pytest.mark.spark

BAD_LINES = {
    "a.jsonl": {3: b'{"n":' * 100_000 + b"1" + b"}" * 100_000, 6: b"null"},
    "b.jsonl": {2: b'{"n": 2, "ts": 2000, "s": "caf\xe9"}', 5: b"not json at all"},
}


def _write(directory: Path) -> list[tuple[str, int]]:
    """Two files of 8 lines (some bad, one with a time out of range); the good (file, n)."""
    directory.mkdir()
    good = []
    for name, bad in BAD_LINES.items():
        lines = []
        for n in range(8):
            if n in bad:
                lines.append(bad[n])
                continue
            ts = 2**63 - 1 if (name, n) == ("b.jsonl", 7) else n * 1000
            lines.append(json.dumps({"file": name, "n": n, "ts": ts}).encode())
            if ts == n * 1000:
                good.append((name, n))
        (directory / name).write_bytes(b"\n".join(lines) + b"\n")
    return good


def test_a_poisoned_file_into_a_sink_commits_the_good_rows_and_dead_letters_the_rest(
    spark, tmp_path
):
    good = _write(tmp_path / "in")
    p = Pipeline(
        "poisoned-files",
        records_per_epoch=3,
        on_error="dead-letter",
        dead_letter=ParquetSink(str(tmp_path / "dead")),
    )
    src = p.source(
        FileSource(str(tmp_path / "in"), format="jsonl"), parallelism=2, name="src", event_time="ts"
    )
    src.sink(ParquetSink(str(tmp_path / "out")), name="out")
    summary = SparkRuntime(p, spark, root=str(tmp_path / "ckpt")).run()
    assert summary.finished

    out = duckdb.sql(
        f"select file, n from read_parquet('{tmp_path}/out/*.parquet') order by file, n"
    ).fetchall()
    assert out == sorted(good)
    dead = duckdb.sql(
        "select split_id, operator, record, error_type, error_message "
        f"from read_parquet('{tmp_path}/dead/*.parquet') "
        "order by split_id, checkpoint_id, record_index"
    ).fetchall()
    lines = [(f, json.loads(r).get("line"), t) for f, _, r, t, _ in dead]
    assert lines == [
        ("a.jsonl", 4, "FileSourceError"),
        ("a.jsonl", 7, "FileSourceError"),
        ("b.jsonl", 3, "FileSourceError"),
        ("b.jsonl", 6, "FileSourceError"),
        ("b.jsonl", None, "EventTimeError"),
    ]
    assert {o for _, o, _, _, _ in dead} == {"src"}
    messages = [m for *_, m in dead]
    assert "is nested more than 64 levels deep, the limit" in messages[0]
    assert "is not a JSON object (null)" in messages[1]
    assert "is not UTF-8 (byte 0xe9 at offset 30 is invalid)" in messages[2]
    assert json.loads(dead[2][2])["text"] == '{"n": 2, "ts": 2000, "s": "caf\\xe9"}'
    assert "is not a JSON object (Expecting value" in messages[3]
    assert "is 9223372036854775807 ms, outside the supported event times" in messages[4]
