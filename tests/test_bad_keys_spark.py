"""Keys on real Spark, across a real keyed exchange: an interval join of int keys with the same
numbers as floats gives the same rows at 1 and at 4 partitions (7 == 7.0 is placed alike by
the record and the column path), and a record without the key field is one dead letter of the
exchange writer while the job goes on. The committed Parquet files are read with DuckDB."""

from __future__ import annotations

import glob
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any

import duckdb
import pytest

from regional.dataflow.pipeline import Pipeline
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.spark

FIX = "or run the pipeline with on_error='dead-letter' to set such records aside"


def left(split: int, n: int) -> dict[str, Any]:
    return {"id": f"l{split}-{n}", "k": n % 5, "ts": 1_000 + n}


def right(split: int, n: int) -> dict[str, Any]:
    row: dict[str, Any] = {"id": f"r{split}-{n}", "k": float(n % 5), "ts": 1_000 + n}
    if (split, n) == (1, 3):
        del row["k"]
    return row


def pair(a: Any, b: Any) -> dict[str, Any]:
    return {"l": a["id"], "r": b["id"]}


def _pipeline(tmp: Path, partitions: int) -> Pipeline:
    p = Pipeline(
        "nums", records_per_epoch=4, on_error="dead-letter", dead_letter=ParquetSink(f"{tmp}/dead")
    )
    lefts, rights = (
        p.source(
            GeneratorSource(2, fn, records_per_split=10),
            parallelism=2,
            name=name,
            event_time="ts",
            max_out_of_orderness="10 s",
        )
        for name, fn in (("left", left), ("right", right))
    )
    lefts.key_by("k").interval_join(
        rights.key_by("k"), between=("-1 s", "1 s"), emit=pair, partitions=partitions, name="j"
    ).sink(ParquetSink(f"{tmp}/table"), name="out")
    return p


def _duckdb(directory: Path, query: str) -> list[tuple[Any, ...]]:
    files = glob.glob(os.path.join(directory, "*.parquet"))
    if not files:
        return []
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r}, union_by_name=true)")
    return sorted(con.execute(query).fetchall())


def test_int_and_float_keys_join_alike_at_1_and_4_partitions_on_spark(
    spark: Any, tmp_path: Path
) -> None:
    got, dead = {}, {}
    for partitions in (1, 4):
        tmp = tmp_path / f"p{partitions}"
        runtime = SparkRuntime(_pipeline(tmp, partitions), spark, root=str(tmp / "ckpt"))
        assert runtime.run().finished
        got[partitions] = Counter(_duckdb(tmp / "table", "SELECT l, r FROM t"))
        dead[partitions] = [
            (op, json.loads(rec), kind, msg)
            for op, rec, kind, msg in _duckdb(
                tmp / "dead", "SELECT operator, record, error_type, error_message FROM t"
            )
        ]
    expected = Counter(
        (f"l{a}-{n}", f"r{b}-{m}")
        for a in range(2)
        for b in range(2)
        for n in range(10)
        for m in range(10)
        if n % 5 == m % 5 and (b, m) != (1, 3)
    )
    assert got[1] == expected
    assert got[4] == expected
    r13 = right(1, 3)
    assert (
        dead[1]
        == dead[4]
        == [
            (
                "j-right-writer",
                r13,
                "UserFunctionError",
                f"exchange writer 'j-right-writer': the key field 'k' is missing from record "
                f"{r13!r}; give every record that field, {FIX}",
            )
        ]
    )
