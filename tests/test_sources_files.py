"""File and generator sources: splits, positions, discovery, determinism."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from regional.sources.files import FileSource
from regional.sources.generator import GeneratorSource


def _read_all(src, split, step):
    rows, pos, done = [], b"", False
    while not done:
        r = src.read(split, pos, step)
        rows += [x for b in r.batches for x in (b if isinstance(b, list) else b.to_pylist())]
        pos, done = r.position, r.finished
    return rows, pos


def test_parquet_files_are_read_in_order_from_any_position(tmp_path):
    pq.write_table(pa.table({"x": list(range(7))}), tmp_path / "b.parquet")
    pq.write_table(pa.table({"x": [100]}), tmp_path / "a.parquet")
    (tmp_path / "ignored.txt").write_text("not data")
    src = FileSource(str(tmp_path))
    assert src.discover() == ["a.parquet", "b.parquet"]
    rows, pos = _read_all(src, "b.parquet", 3)
    assert [r["x"] for r in rows] == list(range(7)) and pos == b"7"
    assert src.read("b.parquet", b"5", 10).batches[0].to_pylist() == [{"x": 5}, {"x": 6}]


def test_new_files_are_discovered_while_running(tmp_path):
    src = FileSource(str(tmp_path), format="jsonl", bounded=False)
    assert src.discover() == [] and not src.bounded
    (tmp_path / "f1.jsonl").write_text(json.dumps({"u": 1}) + "\n")
    assert src.discover() == ["f1.jsonl"]
    (tmp_path / "f0.jsonl").write_text(json.dumps({"u": 0}) + "\n")
    assert src.discover() == ["f0.jsonl", "f1.jsonl"]
    r = src.read("f0.jsonl", b"", 10)
    assert r.finished and r.batches[0].to_pylist() == [{"u": 0}]


def test_unknown_format_is_refused(tmp_path):
    with pytest.raises(ValueError, match="format 'csv' is unknown"):
        FileSource(str(tmp_path), format="csv")  # type: ignore[arg-type]


def test_generator_is_deterministic_bounded_and_rate_limited():
    src = GeneratorSource(3, lambda s, n: {"v": s * 100 + n}, records_per_split=5, max_per_read=2)
    first = src.read("g2", b"", 10)
    assert first.batches == [[{"v": 200}, {"v": 201}]] and not first.finished  # as made
    rows, pos = _read_all(src, "g2", 10)
    assert [r["v"] for r in rows] == [200, 201, 202, 203, 204] and pos == b"5"
    typed = GeneratorSource(1, lambda s, n: {"v": n}, schema=pa.schema([("v", pa.int8())]))
    [batch] = typed.read("g0", b"", 2).batches  # with a schema: Arrow of that schema
    assert batch.schema.field("v").type == pa.int8() and batch.to_pylist() == [{"v": 0}, {"v": 1}]
    unbounded = GeneratorSource(1, lambda s, n: {"n": n})
    assert not unbounded.bounded and not unbounded.read("g0", b"1000", 3).finished
