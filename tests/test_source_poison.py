"""Poison records at the source (issue 26): a JSON line that does not parse, a Parquet row
group that does not decode, a Kafka value that is not JSON. With `on_error="dead-letter"` each
becomes one dead-letter row (the record, its split, where it was, the error), committed exactly
once with its checkpoint, and the unit keeps going; with `on_error="fail"` the unit declines
with an error naming the file and line (or row group). Kafka against a real broker is in
tests/test_source_kafka.py (the Spark test of issue 26)."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource, FileSourceError


def _lines(path: Path, bad_at: int | None = None, n: int = 12) -> None:
    with open(path, "w") as f:
        for i in range(n):
            f.write("{oops\n" if i == bad_at else json.dumps({"file": path.stem, "n": i}) + "\n")


def test_a_malformed_json_line_is_a_poison_record_naming_its_line(tmp_path):
    _lines(tmp_path / "clicks-07.jsonl", bad_at=4)
    src = FileSource(str(tmp_path), format="jsonl")
    first = src.read("clicks-07.jsonl", b"", 3)
    assert (first.poison, first.position) == ((), b"3")
    second = src.read("clicks-07.jsonl", first.position, 3)
    assert [r["n"] for b in second.batches for r in b.to_pylist()] == [3, 5]
    assert second.position == b"6"  # the bad line takes its place: positions stay line numbers
    [poison] = second.poison
    assert (poison.ordinal, poison.record) == (
        1,
        {"file": "clicks-07.jsonl", "line": 5, "text": "{oops"},
    )
    assert isinstance(poison.error, FileSourceError)
    assert str(poison.error).startswith(
        f"line 5 of 'clicks-07.jsonl' in the file source at {tmp_path} is not a JSON object ("
    )


def test_an_unreadable_parquet_row_group_is_a_poison_record_and_is_skipped_whole(tmp_path):
    path = tmp_path / "part-0.parquet"
    table = pa.table({"n": pa.array(range(30), pa.int64())})
    pq.write_table(
        table,
        path,
        row_group_size=10,
        write_page_checksum=True,
        compression="none",
        use_dictionary=False,
    )
    meta = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    middle = meta.data_page_offset + meta.total_compressed_size // 2
    data[middle : middle + 8] = b"\xde\xad\xbe\xef" * 2  # damage row group 1's data page
    path.write_bytes(bytes(data))
    src = FileSource(str(tmp_path))
    r = src.read("part-0.parquet", b"5", 10)  # rows 5..14: the end of group 0, group 1 is bad
    assert [x["n"] for b in r.batches for x in b.to_pylist()] == [5, 6, 7, 8, 9]
    assert r.position == b"20"  # past the whole bad group, so it is reported once
    [poison] = r.poison
    assert (poison.ordinal, poison.record) == (
        5,
        {"file": "part-0.parquet", "row_group": 1, "rows": [10, 20]},
    )
    assert str(poison.error).startswith(
        f"row group 1 (rows 10..19) of 'part-0.parquet' in the file source at {tmp_path} does "
        "not decode ("
    )
    rest = src.read("part-0.parquet", r.position, 100)
    assert [x["n"] for b in rest.batches for x in b.to_pylist()] == list(range(20, 30))
    assert rest.finished and rest.poison == ()


def _copy(r: dict) -> dict:
    return {"file": r["file"], "n": r["n"]}


def _job(tmp_path: Path, on_error: str, *, operator: bool = True) -> tuple[JobDriver, Pipeline]:
    data = tmp_path / "in"
    data.mkdir(exist_ok=True)
    _lines(data / "clicks-00.jsonl")
    _lines(data / "clicks-01.jsonl", bad_at=6)
    dead = ParquetSink(str(tmp_path / "dead")) if on_error == "dead-letter" else None
    p = Pipeline("files", records_per_epoch=4, on_error=on_error, dead_letter=dead)
    src = p.source(FileSource(str(data), format="jsonl"), parallelism=2, name="src")
    (src.map(_copy, name="copy") if operator else src).sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    root = str(tmp_path / "ckpt")
    policy = load_policy(
        env={}, overrides={"checkpointing": {"timeout": "30 s", "tolerable-failed-checkpoints": 0}}
    ).policy
    env = TaskEnv(root, "files", p, unit_timeout=10)
    storage = JobStorage(root, "files")
    return JobDriver(p, InProcessDispatcher(env), storage=storage, policy=policy), p


@pytest.mark.parametrize("operator", [True, False], ids=["with-operator", "source-to-sink"])
def test_a_poison_line_is_one_dead_letter_row_and_the_unit_keeps_going(tmp_path, operator):
    driver, _ = _job(tmp_path, "dead-letter", operator=operator)
    summary = driver.run()
    assert summary.finished and {c.kind for c in summary.checkpoints} == {"global"}
    out = read_table(str(tmp_path / "out")).to_pylist()
    assert sorted((r["file"], r["n"]) for r in out) == sorted(
        [("clicks-00", n) for n in range(12)] + [("clicks-01", n) for n in range(12) if n != 6]
    )
    [row] = read_table(str(tmp_path / "dead")).to_pylist()
    assert {k: row[k] for k in ("checkpoint_id", "operator", "split_id", "split_position")} == {
        "checkpoint_id": 2,
        "operator": "src",
        "split_id": "clicks-01.jsonl",
        "split_position": "4",
    }
    assert (row["record_index"], json.loads(row["record"])) == (
        2,
        {"file": "clicks-01.jsonl", "line": 7, "text": "{oops"},
    )
    assert row["error_type"] == "FileSourceError"
    assert row["error_message"].startswith("line 7 of 'clicks-01.jsonl' in the file source at ")
    assert [c.records_dead_lettered for c in summary.checkpoints] == [0, 1, 0, 0]


def test_without_dead_letters_the_poison_line_declines_its_unit_naming_the_line(tmp_path):
    driver, _ = _job(tmp_path, "fail")
    from regional.errors import JobFailedError

    with pytest.raises(JobFailedError):
        driver.run()
    [event] = [e for e in [driver.last_event] if e is not None]
    assert event.causes[1].startswith(
        "declined: FileSourceError: line 7 of 'clicks-01.jsonl' in the file source at "
    )


# --- hostile JSON lines (issue 32 §3): screened before any parser sees them ----------------

_READ_ALL = """
import json, sys
from regional.sources.files import FileSource
src, name = FileSource(sys.argv[1], format="jsonl"), sys.argv[2]
position, rows, poison, finished = b"", [], [], False
while not finished:
    r = src.read(name, position, 3)
    rows += [row for b in r.batches for row in b.to_pylist()]
    poison += [(p.ordinal, p.record["line"], str(p.error)) for p in r.poison]
    position, finished = r.position, r.finished
print(json.dumps({"rows": rows, "poison": poison, "position": position.decode()}))
"""


def _read_in_a_subprocess(directory: Path, name: str) -> dict:
    """Every row and poison record of file `name`, read 3 rows at a time by a FileSource in
    a subprocess: a parser that overflows its stack kills that process, never pytest."""
    import os
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-c", _READ_ALL, str(directory), name],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        check=False,
    )
    assert run.returncode == 0, f"exit {run.returncode}: {run.stderr[-2000:]}"
    return json.loads(run.stdout)


def test_lines_nested_100000_and_200000_deep_are_poison_records_not_a_crash(tmp_path):
    deep_object = b'{"a":' * 100_000 + b"1" + b"}" * 100_000
    deep_array = b"[" * 200_000 + b"]" * 200_000
    lines = [b'{"n": 0}', deep_object, b'{"n": 1}', deep_array, b'{"n": 2}']
    (tmp_path / "deep.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    got = _read_in_a_subprocess(tmp_path, "deep.jsonl")
    assert got["rows"] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert got["position"] == "5"
    where = f"of 'deep.jsonl' in the file source at {tmp_path} is nested more than 64 levels"
    assert [(ordinal, line) for ordinal, line, _ in got["poison"]] == [(1, 2), (0, 4)]
    assert all(f"line {line} {where} deep, the limit;" in e for _, line, e in got["poison"])
    assert "max_depth=" in got["poison"][0][2]


def test_a_null_line_is_poison_like_any_other_non_object_also_as_the_first_line(tmp_path):
    (tmp_path / "nulls.jsonl").write_bytes(b'null\n{"n": 1}\n12\n"x"\n[1]\nnull\n{"n": 2}\n')
    got = _read_in_a_subprocess(tmp_path, "nulls.jsonl")  # a first null line crashed pyarrow
    assert got["rows"] == [{"n": 1}, {"n": 2}]
    assert [(line, e.split(" is ", 1)[1].split(";")[0]) for _, line, e in got["poison"]] == [
        (1, "not a JSON object (null)"),
        (3, "not a JSON object (a JSON int)"),
        (4, "not a JSON object (a JSON str)"),
        (5, "not a JSON object (a JSON list)"),
        (6, "not a JSON object (null)"),
    ]


def test_invalid_utf8_is_a_poison_record_whose_text_is_escaped(tmp_path):
    (tmp_path / "bytes.jsonl").write_bytes(b'{"s": "ok"}\n{"s": "caf\xe9 \xff"}\n{"s": "fine"}\n')
    src = FileSource(str(tmp_path), format="jsonl")
    r = src.read("bytes.jsonl", b"", 10)
    table = pa.Table.from_batches(r.batches)
    assert table.to_pylist() == [{"s": "ok"}, {"s": "fine"}]
    table.validate(full=True)  # every string is UTF-8: a Parquet reader can read it back
    [poison] = r.poison
    assert poison.record == {"file": "bytes.jsonl", "line": 2, "text": '{"s": "caf\\xe9 \\xff"}'}
    assert str(poison.error) == (
        f"line 2 of 'bytes.jsonl' in the file source at {tmp_path} is not UTF-8 (byte 0xe9 at "
        "offset 10 is invalid); fix or remove the line, or run the pipeline with "
        "on_error='dead-letter' to set such lines aside"
    )


def test_a_line_over_the_size_limit_is_poison_and_its_text_is_cut(tmp_path):
    long = b'{"s": "' + b"x" * 300 + b'"}'
    (tmp_path / "long.jsonl").write_bytes(b'{"s": "a"}\n' + long + b'\n{"s": "b"}\n')
    src = FileSource(str(tmp_path), format="jsonl", max_line_bytes=100)
    r = src.read("long.jsonl", b"", 10)
    assert [row for b in r.batches for row in b.to_pylist()] == [{"s": "a"}, {"s": "b"}]
    [poison] = r.poison
    assert poison.record == {
        "file": "long.jsonl",
        "line": 2,
        "text": long[:100].decode(),
        "bytes": 309,
    }
    assert "is 309 bytes long, more than the limit of 100 bytes;" in str(poison.error)
    with pytest.raises(ValueError, match=r"FileSource max_line_bytes=0 is out of range"):
        FileSource(str(tmp_path), format="jsonl", max_line_bytes=0)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (b'{"s": "\\ud800"}', "not a JSON object (a string holds a lone UTF-16 surrogate"),
        (b'{"n": 1} {"n": 2}', "not a JSON object (Extra data: line 1 column 10"),
        # pyarrow reads a number beyond 64 bits as a double; line by line it is poison
        (b'{oops\n{"n": 123456789012345678901234567890}', "not an Arrow row beside the others"),
        (b'{"n": "three"}', "not an Arrow row beside the others (ArrowTypeError: Unable to merge"),
    ],
)
def test_lines_arrow_cannot_hold_beside_the_others_are_poison(tmp_path, bad, why):
    (tmp_path / "mixed.jsonl").write_bytes(b'{"n": 1}\n' + bad + b'\n{"n": 2}\n')
    r = FileSource(str(tmp_path), format="jsonl").read("mixed.jsonl", b"", 10)
    assert [row for b in r.batches for row in b.to_pylist()] == [{"n": 1}, {"n": 2}]
    lines = bad.count(b"\n") + 3
    assert (r.position, r.finished) == (str(lines).encode(), True)  # positions = line numbers
    poison = r.poison[-1]
    assert (poison.ordinal, poison.record["line"]) == (lines - 2, lines - 1)
    assert str(poison.error).startswith(
        f"line {lines - 1} of 'mixed.jsonl' in the file source at {tmp_path} is {why}"
    ), str(poison.error)


@pytest.mark.parametrize(
    ("value", "why"),
    [
        (b"[" * 200_000 + b"]" * 200_000, "nested more than 64 levels deep, the limit"),
        (
            b'{"s": "\\udfff"}',
            "a string holds a lone UTF-16 surrogate (\\udfff), which UTF-8 cannot encode",
        ),
    ],
)
def test_a_kafka_json_value_is_screened_like_a_json_line(value, why):
    from regional.sources.kafka import KafkaSourceError, decode_value

    with pytest.raises(KafkaSourceError) as raised:
        decode_value(value, "json", "events", 2, 10)
    assert str(raised.value) == (
        f"record at offset 10 of topic 'events' partition 2 does not decode as json "
        f"(ValueError: {why}); fix the producer or pass a decoder that accepts it "
        "(value=... / key=...)"
    )
