"""Which engine runs an expression stage (`Stream.where` + `Stream.select`): the cost per call
and per record of one ``WHERE amount > 0 AND country IN ('DE','FR')`` and a ``SELECT`` of three
expressions (``user``, ``amount * 1.19 AS gross``, ``upper(country) AS c``) over one Arrow
record batch of 10, 1,000 and 20,000 rows, side by side in one run (no Spark: the work of one
task on one batch):

1. **duckdb**: one connection reused for every call (one per worker in a job), the batch
   registered as ``input`` and the query text transpiled from Spark SQL by `sqlglot`;
2. **acero**: the same query as `pyarrow.compute` expressions (written out: what a compiler
   to `pc.Expression` would make), run as a `pyarrow.acero` filter + project plan;
3. **pyarrow eager** (``regional.dataflow.sql_stages.SqlStage``, what the stages run): the
   query compiled from Spark SQL by ``regional.dataflow.expressions``, each operator one
   `pyarrow.compute` kernel call over the batch's columns, then ``RecordBatch.filter``;
4. **polars**: `polars.from_arrow` + the same filter and projection as polars expressions,
   back to Arrow (zero-copy where polars can).

Prints µs per call and µs per record for each; the issue's target is <= 0.05 µs per record of
machinery for the expression stages (at the batch sizes a task sees: thousands of rows).

    .venv/bin/python -m benchmarks.bench_expressions [--rounds 5] [--seconds 0.3] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc
import sqlglot

from benchmarks.report import print_table
from regional.dataflow.sql_stages import SqlStage

WHERE = "amount > 0 AND country IN ('DE','FR')"
SELECT = ("user", "amount * 1.19 AS gross", "upper(country) AS c")
SIZES = (10, 1_000, 20_000)
COUNTRIES = ("DE", "FR", "IT", "ES", "PL")


def batch_of(rows: int) -> pa.RecordBatch:
    """`rows` rows of (user, amount, country): about a third pass the filter."""
    return pa.RecordBatch.from_pydict(
        {
            "user": [f"u{i % 97}" for i in range(rows)],
            "amount": [float((i * 37) % 200 - 50) for i in range(rows)],
            "country": [COUNTRIES[i % len(COUNTRIES)] for i in range(rows)],
        }
    )


def duckdb_variant() -> Callable[[pa.RecordBatch], pa.Table]:
    import duckdb

    spark_sql = f"SELECT {', '.join(SELECT)} FROM input WHERE {WHERE}"
    query = sqlglot.transpile(spark_sql, read="spark", write="duckdb")[0]
    con = duckdb.connect()

    def run(batch: pa.RecordBatch) -> pa.Table:
        con.register("input", batch)
        try:
            return con.sql(query).to_arrow_table()
        finally:
            con.unregister("input")

    return run


def acero_variant() -> Callable[[pa.RecordBatch], pa.Table]:
    where = (pc.field("amount") > 0) & pc.is_in(pc.field("country"), pa.array(["DE", "FR"]))
    exprs = [
        pc.field("user"),
        pc.multiply(pc.field("amount"), pa.scalar(1.19)),
        pc.utf8_upper(pc.field("country")),
    ]

    def run(batch: pa.RecordBatch) -> pa.Table:
        plan = acero.Declaration.from_sequence(
            [
                acero.Declaration("table_source", acero.TableSourceNodeOptions(pa.table(batch))),
                acero.Declaration("filter", acero.FilterNodeOptions(where)),
                acero.Declaration(
                    "project", acero.ProjectNodeOptions(exprs, ["user", "gross", "c"])
                ),
            ]
        )
        return plan.to_table(use_threads=False)

    return run


def eager_variant(schema: pa.Schema) -> Callable[[pa.RecordBatch], pa.RecordBatch]:
    stage = SqlStage(
        "sql", schema, query=f"SELECT {', '.join(SELECT)} FROM input WHERE {WHERE}", name="bench"
    )
    return stage.apply


def polars_variant() -> Callable[[pa.RecordBatch], pa.Table]:
    import polars as pl

    def run(batch: pa.RecordBatch) -> pa.Table:
        frame: Any = pl.from_arrow(batch)
        out = frame.filter((pl.col("amount") > 0) & pl.col("country").is_in(["DE", "FR"])).select(
            pl.col("user"),
            (pl.col("amount") * 1.19).alias("gross"),
            pl.col("country").str.to_uppercase().alias("c"),
        )
        return out.to_arrow()

    return run


def per_call_us(
    fn: Callable[[pa.RecordBatch], Any], batch: pa.RecordBatch, seconds: float
) -> float:
    """Median µs of one call of `fn(batch)` over calls for about `seconds`."""
    fn(batch)
    calls, start = 0, time.perf_counter()
    while True:
        fn(batch)
        calls += 1
        spent = time.perf_counter() - start
        if spent >= seconds:
            return spent / calls * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds per size")
    parser.add_argument("--seconds", type=float, default=0.3, help="time per measurement")
    parser.add_argument("--quick", action="store_true", help="one round, 0.05 s per size")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.seconds = 1, 0.05
    schema = batch_of(1).schema
    variants = {
        "duckdb": duckdb_variant(),
        "acero": acero_variant(),
        "pyarrow eager": eager_variant(schema),
        "polars": polars_variant(),
    }
    reference = variants["duckdb"](batch_of(1_000)).to_pylist()
    for name, fn in variants.items():
        out = fn(batch_of(1_000))
        got = out.to_pylist()
        assert len(got) == len(reference) and all(
            g["user"] == r["user"] and g["c"] == r["c"] and abs(g["gross"] - r["gross"]) < 1e-9
            for g, r in zip(got, reference, strict=True)
        ), f"{name} disagrees with duckdb"
    rows: list[dict[str, Any]] = []
    for size in SIZES:
        batch = batch_of(size)
        times: dict[str, list[float]] = {n: [] for n in variants}
        for _ in range(args.rounds):  # interleaved: a loaded machine slows every variant alike
            for name, fn in variants.items():
                times[name].append(per_call_us(fn, batch, args.seconds / args.rounds))
        eager = statistics.median(times["pyarrow eager"])
        for name in variants:
            us = statistics.median(times[name])
            rows.append(
                {
                    "rows": f"{size:,}",
                    "engine": name,
                    "call": f"{us:,.1f}",
                    "record": f"{us / size:.4f}",
                    "ratio": f"{us / eager:.2f}x",
                }
            )
    print_table(
        [
            ("rows", "rows", ">7"),
            ("engine", "engine", "<14"),
            ("call", "µs/call", ">10"),
            ("record", "µs/record", ">10"),
            ("ratio", "vs eager", ">9"),
        ],
        rows,
    )


if __name__ == "__main__":
    main()
