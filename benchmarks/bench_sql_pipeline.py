"""A SQL-style job against plain Spark doing the same (issue 44, §4): ``where`` + ``select`` + a
keyed windowed count by column over the same Parquet files, side by side in one run.

The input: `--files` Parquet files of `--per-file` orders each (user, country, amount, ts: a
``timestamp[ms, UTC]``, `--minutes` minutes of event time). The shapes of the issue are 64 files
x 5,000 and 16 x 20,000 (the default runs both). Contenders, reading the same files:

* `regional`: ``p.source(FileSource(..., format="parquet"), schema=ORDERS, event_time="ts")``
  -> ``where("amount > 0 AND country IN ('DE','FR')")`` -> ``select("user", "amount * 1.19 AS
  gross", "ts")`` -> ``key_by("user", partitions=P).window(Tumbling("1 min"),
  aggregate=count())`` -> Parquet: SQL stages over Arrow batches, the count over Arrow columns;
* `spark-sql`: ``read.parquet(...).where(...).selectExpr(...).groupBy(window("ts", "1
  minute"), "user").count()`` written as Parquet, one Spark SQL batch job.

Measured: seconds from the start of a run to its end, `--rounds` runs of each in alternating
order after one warm-up run of each on 8 x 2,000 (not counted), the median counted; every
window's count is checked equal between the two. Printed: the ratio regional / Spark per shape
(the issue's target: <= 1.2x), where the regional runs' time went (`EpochTiming`), and the
machinery of the expression stages alone: µs per record of ``SqlStage.apply`` (where +
select) over one batch of a file's size, without Spark (target <= 0.05 µs per record).

    .venv/bin/python -m benchmarks.bench_sql_pipeline [--rounds 3] [--quick]

Run by hand (not a test); writes benchmarks/results/sql-pipeline.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.bench_expressions import per_call_us
from benchmarks.report import RESULTS, print_table, write_results
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.sql_stages import SqlStage
from regional.dataflow.windows import Tumbling, count
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.runtime.timing import EpochTiming
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource

BASE_MS = 1_795_000_000_000
MINUTE = 60_000
WHERE = "amount > 0 AND country IN ('DE','FR')"
SELECT = ("user", "amount * 1.19 AS gross", "ts")
COUNTRIES = np.array(["DE", "FR", "IT", "ES", "PL"])
ORDERS = pa.schema(
    [
        ("user", pa.string()),
        ("country", pa.string()),
        ("amount", pa.float64()),
        ("ts", pa.timestamp("ms", "UTC")),
    ]
)
SHAPES = ((64, 5_000), (16, 20_000))
#: Where a regional run's time goes (`EpochTiming`, summed over its epochs): the Spark jobs
#: (`dispatch_s`; inside them the units' processing, summed over units in parallel tasks), the
#: commits, the metadata and the whole epochs.
PARTS = ("total_s", "dispatch_s", "task_process_s", "task_restore_s", "task_snapshot_s",
         "task_upload_s", "commit_s", "metadata_s", "plan_s")  # fmt: skip


def write_input(directory: str, files: int, per_file: int, args: argparse.Namespace) -> None:
    """`files` Parquet files of `per_file` orders (about 40% pass the `where`)."""
    os.makedirs(directory)
    span = args.minutes * MINUTE
    for f in range(files):
        n = np.arange(per_file, dtype=np.int64)
        mixed = n * 7919 + f
        table = pa.table(
            {
                "user": pa.array([f"u{k}" for k in mixed % args.users]),
                "country": pa.array(COUNTRIES[mixed % len(COUNTRIES)]),
                "amount": pa.array(((mixed * 37) % 200 - 50).astype(np.float64)),
                "ts": pa.array(BASE_MS + n * span // per_file, pa.timestamp("ms", "UTC")),
            },
            schema=ORDERS,
        )
        pq.write_table(table, f"{directory}/part-{f:03d}.parquet")


def job(data: str, table: str, files: int, per_file: int, args: argparse.Namespace) -> Pipeline:
    p = Pipeline("sql-pipeline", records_per_epoch=per_file)
    orders = p.source(
        FileSource(data, format="parquet"),
        parallelism=files,
        name="orders",
        schema=ORDERS,
        event_time="ts",
    )
    (
        orders.where(WHERE, name="big")
        .select(*SELECT, name="gross")
        .key_by("user", partitions=args.partitions, name="by-user")
        .window(Tumbling("1 min"), aggregate=count(), name="minutes")
        .sink(ParquetSink(table), name="out")
    )
    return p


def _ms(value: Any) -> int:
    return int(value.timestamp() * 1000)


def run_regional(
    spark: Any, data: str, work: str, files: int, per_file: int, args: argparse.Namespace
) -> tuple[float, dict[Any, int], dict[str, float]]:
    """One run of the regional job: its seconds, its windows' counts, and where its epochs'
    time went (summed over epochs: `regional.runtime.timing.EpochTiming`)."""
    table = f"{work}/table"
    timings: list[EpochTiming] = []

    def progress(_: Any) -> None:
        if runtime.last_timing is not None:
            timings.append(runtime.last_timing)

    pipeline = job(data, table, files, per_file, args)
    runtime = SparkRuntime(pipeline, spark, root=f"{work}/ckpt", progress=progress)
    started = time.perf_counter()
    assert runtime.run().finished
    seconds = time.perf_counter() - started
    parts = {part: sum(getattr(t, part) for t in timings) for part in PARTS}
    parts["epochs"] = len(timings)
    rows = read_table(table).to_pylist()
    return seconds, {(r["user"], _ms(r["window_end"])): r["count"] for r in rows}, parts


def run_spark_sql(spark: Any, data: str, work: str) -> tuple[float, dict[Any, int]]:
    from pyspark.sql import functions as F

    out = f"{work}/spark-sql-table"
    started = time.perf_counter()
    (
        spark.read.schema("user STRING, country STRING, amount DOUBLE, ts TIMESTAMP")
        .parquet(data)
        .where(WHERE)
        .selectExpr(*SELECT)
        .groupBy(F.window("ts", "1 minute"), "user")
        .count()
        .selectExpr("user", "unix_millis(window.end) AS end", "count")
        .write.mode("overwrite")
        .parquet(out)
    )
    seconds = time.perf_counter() - started
    rows = {(r["user"], r["end"]): r["count"] for r in spark.read.parquet(out).collect()}
    return seconds, rows


def expression_us_per_record(per_file: int, data: str, args: argparse.Namespace) -> float:
    """µs per record of the where + select stages alone over one file's batch."""
    batch = pq.read_table(f"{data}/part-000.parquet").combine_chunks().to_batches()[0]
    where = SqlStage("where", ORDERS, where=WHERE, name="big")
    select = SqlStage("select", where.output_schema, select=SELECT, name="gross")

    def both(b: pa.RecordBatch) -> pa.RecordBatch:
        return select.apply(where.apply(b))

    return per_call_us(both, batch, args.seconds) / per_file


COLUMNS = (
    ("shape", "files x records", "<16"),
    ("records", "records", ">9"),
    ("regional_s", "regional s", ">10"),
    ("spark_sql_s", "Spark SQL s", ">11"),
    ("ratio", "regional / Spark", ">16"),
    ("windows", "windows", ">8"),
    ("expr_us_per_record", "SQL stages µs/record", ">20"),
)


def run_shape(spark: Any, files: int, per_file: int, args: argparse.Namespace) -> dict[str, Any]:
    work = tempfile.mkdtemp(prefix=f"regional-bench-sql-{files}x{per_file}-")
    data = f"{work}/input"
    try:
        write_input(data, files, per_file, args)
        seconds: dict[str, list[float]] = {"regional": [], "spark-sql": []}
        parts: list[dict[str, float]] = []
        got: dict[str, dict[Any, int]] = {}
        for r in range(args.rounds):
            order = ("regional", "spark-sql") if r % 2 == 0 else ("spark-sql", "regional")
            for k, mode in enumerate(order):
                where = f"{work}/round{r}-{k}"
                os.makedirs(where)
                if mode == "regional":
                    took, rows, spent = run_regional(spark, data, where, files, per_file, args)
                    parts.append(spent)
                else:
                    took, rows = run_spark_sql(spark, data, where)
                seconds[mode].append(took)
                if got.setdefault(mode, rows) != rows:
                    raise AssertionError(f"{mode}: round {r} committed other counts than round 0")
        for window, n in got["spark-sql"].items():
            if got["regional"].get(window) != n:
                raise AssertionError(
                    f"window {window}: regional counted {got['regional'].get(window)}, Spark {n}"
                )
        assert got["regional"].keys() == got["spark-sql"].keys(), "other windows committed"
        expr = expression_us_per_record(per_file, data, args)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    median = {m: statistics.median(s) for m, s in seconds.items()}
    return {
        "shape": f"{files} x {per_file:,}",
        "records": files * per_file,
        "regional_s": round(median["regional"], 2),
        "spark_sql_s": round(median["spark-sql"], 2),
        "ratio": round(median["regional"] / median["spark-sql"], 2),
        "windows": len(got["regional"]),
        "expr_us_per_record": round(expr, 4),
        "rounds_s": {m: [round(x, 2) for x in s] for m, s in seconds.items()},
        "regional_parts_s": {
            k: round(statistics.median(p[k] for p in parts), 3) for k in (*PARTS, "epochs")
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--users", type=int, default=1_000)
    ap.add_argument("--minutes", type=int, default=10, help="minutes of event time")
    ap.add_argument("--partitions", type=int, default=4, help="window subtasks")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each contender (median)")
    ap.add_argument("--seconds", type=float, default=1.0, help="timing of the SQL stages alone")
    ap.add_argument("--quick", action="store_true", help="8 x 2,000 only, one round")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    shapes = ((8, 2_000),) if args.quick else SHAPES
    if args.quick:
        args.rounds = 1
    spark = spark_session(args.master, log_file=f"{tempfile.gettempdir()}/bench-sql-spark.log")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    try:
        if not args.quick:  # Spark's first jobs (JIT, class loading) are slow: not counted
            run_shape(spark, 8, 2_000, argparse.Namespace(**{**vars(args), "rounds": 1}))
        rows = [run_shape(spark, files, per_file, args) for files, per_file in shapes]
    finally:
        spark.stop()
    print(
        f"\nwhere + select + windowed count per user by column, {args.users} users, "
        f"{args.minutes} minutes of event time, {args.partitions} window subtasks, master "
        f"{args.master}, median of {args.rounds} rounds in alternating order; every window's "
        "count equal between the two\n"
    )
    print_table(COLUMNS, rows)
    print("\nwhere the regional runs' time went (median over rounds, summed over epochs; task_*")
    print("are summed over units running in parallel tasks):")
    for row in rows:
        spent = ", ".join(f"{k} {v}" for k, v in row["regional_parts_s"].items())
        print(f"  {row['shape']}: {spent}")
    stem = "sql-pipeline-quick" if args.quick else "sql-pipeline"
    write_results(
        f"{args.out}/{stem}.json",
        master=args.master,
        config={k: v for k, v in vars(args).items() if k != "out"},
        rows=rows,
    )
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
