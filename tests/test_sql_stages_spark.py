"""The SQL stages agree with Spark SQL: for random rows and random expressions of the supported
subset, `where` and `select` over one Arrow batch give what Spark SQL gives evaluating the same
text on the same rows (the shared local SparkSession; few examples, small rows)."""

from __future__ import annotations

import math
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from regional.dataflow.sql_stages import SqlStage

pytestmark = pytest.mark.spark

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.int64()), ("x", pa.float64()), ("s", pa.string())])
ROWS = st.lists(
    st.fixed_dictionaries(
        {
            "a": st.none() | st.integers(-50, 50),
            "b": st.none() | st.integers(-50, 50),
            "x": st.none() | st.floats(-100, 100, allow_nan=False).map(lambda f: round(f, 3)),
            "s": st.none() | st.sampled_from(["", "a", "ab", "DE", "fr", "x%y"]),
        }
    ),
    min_size=1,
    max_size=8,
)


def _numbers(depth: int) -> st.SearchStrategy[str]:
    # no literal with a decimal point: Spark makes it a decimal, a SQL stage a double
    leaf = st.sampled_from(["a", "b", "x", "1", "7", "length(s)"])
    if depth == 0:
        return leaf
    sub = _numbers(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({' '.join(t)})"),
        sub.map(lambda e: f"abs({e})"),
        sub.map(lambda e: f"(-{e})"),
        sub.map(lambda e: f"({e} / 4)"),
        sub.map(lambda e: f"coalesce({e}, 0)"),
        sub.map(lambda e: f"CAST({e} AS DOUBLE)"),
    )


def _conditions(depth: int) -> st.SearchStrategy[str]:
    numbers = _numbers(1)
    leaf = st.one_of(
        st.tuples(numbers, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), numbers).map(
            lambda t: " ".join(t)
        ),
        st.sampled_from(
            [
                "s = 'DE'",
                "s IN ('DE', 'a', '')",
                "s IN ('fr', NULL)",
                "s IS NULL",
                "a IS NOT NULL",
                "s LIKE 'a%'",
                "a BETWEEN -10 AND 10",
                "upper(s) = 'FR'",
            ]
        ),
    )
    if depth == 0:
        return leaf
    sub = _conditions(depth - 1)
    return st.one_of(
        leaf,
        st.tuples(sub, st.sampled_from(["AND", "OR"]), sub).map(lambda t: f"({' '.join(t)})"),
        sub.map(lambda e: f"NOT ({e})"),
    )


VALUES = st.one_of(
    _numbers(2),
    _conditions(1),
    st.sampled_from(
        [
            "upper(s)",
            "concat(s, '-', s)",
            "CASE WHEN a > 0 THEN 'pos' WHEN a < 0 THEN 'neg' END",
            "if(x > 0, a, b)",
            "CAST(a AS STRING)",
        ]
    ),
)


def _same(ours: list[dict[str, Any]], spark: list[dict[str, Any]]) -> bool:
    if len(ours) != len(spark):
        return False
    for mine, theirs in zip(ours, spark, strict=True):
        for k, v in mine.items():
            w = theirs[k]
            if isinstance(v, float) and isinstance(w, float):
                if not math.isclose(v, w, rel_tol=1e-9, abs_tol=1e-9):
                    return False
            elif v != w:
                return False
    return True


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ROWS, _conditions(2), st.lists(VALUES, min_size=1, max_size=3))
def test_where_and_select_equal_spark_sql_on_the_same_rows(spark, rows, condition, values):
    from pyspark.sql.types import DoubleType, LongType, StringType, StructField, StructType

    items = [f"{v} AS c{i}" for i, v in enumerate(values)]
    batch = pa.RecordBatch.from_pylist(rows, schema=SCHEMA)
    frame = spark.createDataFrame(
        rows,
        StructType(
            [
                StructField("a", LongType()),
                StructField("b", LongType()),
                StructField("x", DoubleType()),
                StructField("s", StringType()),
            ]
        ),
    ).coalesce(1)

    kept = SqlStage("where", SCHEMA, where=condition, name="w").apply(batch).to_pylist()
    expected = [r.asDict() for r in frame.where(condition).collect()]
    assert _same(kept, expected), (condition, kept, expected)

    selected = SqlStage("select", SCHEMA, select=items, name="s").apply(batch).to_pylist()
    expected = [r.asDict() for r in frame.selectExpr(*items).collect()]
    assert _same(selected, expected), (items, selected, expected)
