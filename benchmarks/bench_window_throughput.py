"""Windowed count throughput: records per second of a per-minute count per key over at least a
million records, regional against Structured Streaming on the same Parquet files, no faults,
side by side in one run.

The input: `--files` Parquet files of `--records` records in total, each record a key (one of
`--keys`) and an event time (a `timestamp[ms]`, `--minutes` minutes of event time, in order
within a file up to 3 s). Contenders, all reading the same files:

* `regional, columnar`: FileSource (a subtask per file, event time ``ts``, 5 s out of order)
  -> keyed exchange by ``key`` (`--partitions`) -> ``window(Tumbling("1 min"),
  aggregate=count())`` -> Parquet; the count runs over Arrow columns (a field key, a field event
  time: `regional.dataflow.window_operator`);
* `regional, record-wise`: the same job with the same count as a plain `Aggregate` (one Python
  call per record), to show what the columnar path buys;
* `spark-ss`: ``readStream.parquet(...).withWatermark("ts", "5 seconds").groupBy(window("ts",
  "1 minute"), "key").count()``, append mode, Parquet sink, ``trigger(availableNow=True)``.
* `spark-sql`: the same count as one Spark SQL batch job, ``read.parquet(...).groupBy(window(
  "ts", "1 minute"), "key").count()`` written as Parquet: the issue's baseline (the regional
  jobs' time should be at most 1.3x its time).

Measured: records / seconds from the start of the run to its end (the regional jobs run to the
end of their bounded input, Spark until its available-now query terminates or its batch job
ends). Every window both a regional job and Spark committed has the same count (checked); the
batch job and the regional jobs commit every window (checked); Spark's append mode leaves the
windows its watermark has not passed unemitted at the end, so it commits fewer. With
`--rounds N`, every contender runs N times, in an order rotated from round to round, and the
median counts.

    .venv/bin/python -m benchmarks.bench_window_throughput [--records 1000000] [--rounds 3]
        [--quick]

Run by hand (not a test); writes benchmarks/results/window-throughput.json.
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

from benchmarks.report import RESULTS, print_table, write_results
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Aggregate, Tumbling, Window, count
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource

BASE_MS = 1_795_000_000_000  # 2026-11-17T...Z
MINUTE = 60_000


def write_input(directory: str, args: argparse.Namespace) -> None:
    """`args.files` Parquet files holding `args.records` records between them."""
    os.makedirs(directory)
    per_file = args.records // args.files
    span = args.minutes * MINUTE
    for f in range(args.files):
        n = np.arange(per_file, dtype=np.int64)
        ts = BASE_MS + n * span // per_file + f * 7 - (n * 7919 % 4) * 1000
        keys = (n * 7919 + f) % args.keys
        table = pa.table(
            {"key": pa.array(keys, pa.int64()), "ts": pa.array(ts, pa.timestamp("ms", "UTC"))}
        )
        pq.write_table(table, f"{directory}/part-{f:03d}.parquet", row_group_size=50_000)


def minute_row(key: Any, w: Window, value: Any) -> dict[str, Any]:
    return {"key": key, "end": w.end, "count": value}


def job(name: str, args: argparse.Namespace, data: str, table: str, *, columnar: bool) -> Pipeline:
    agg = count() if columnar else Aggregate(*count()[:4])  # the same count, one call a record
    p = Pipeline(name, records_per_epoch=args.per_epoch)
    (
        p.source(
            FileSource(data, format="parquet"),
            parallelism=args.files,
            name="events",
            event_time="ts",
            max_out_of_orderness="5 s",
        )
        .key_by("key", partitions=args.partitions, name="by-key")
        .window(Tumbling("1 min"), aggregate=agg, emit=minute_row, name="minutes")
        .sink(ParquetSink(table), name="out")
    )
    return p


def run_regional(
    spark: Any, args: argparse.Namespace, data: str, work: str, columnar: bool
) -> dict[str, Any]:
    name = "columnar" if columnar else "record-wise"
    table = f"{work}/{name}-table"
    runtime = SparkRuntime(
        job(name, args, data, table, columnar=columnar), spark, root=f"{work}/{name}"
    )
    started = time.perf_counter()
    summary = runtime.run()
    seconds = time.perf_counter() - started
    assert summary.finished
    rows = {(r["key"], r["end"]): r["count"] for r in read_table(table).to_pylist()}
    return {"mode": f"regional, {name}", "seconds": seconds, "rows": rows}


def run_spark_ss(spark: Any, args: argparse.Namespace, data: str, work: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    out = f"{work}/spark-ss-table"
    stream = (
        spark.readStream.schema("key LONG, ts TIMESTAMP")
        .parquet(data)
        .withWatermark("ts", "5 seconds")
        .groupBy(F.window("ts", "1 minute"), "key")
        .count()
        .selectExpr("key", "unix_millis(window.end) AS end", "count")
    )
    started = time.perf_counter()
    query = (
        stream.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", f"{work}/spark-ss-ckpt")
        .outputMode("append")
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    seconds = time.perf_counter() - started
    rows = {
        (r["key"], r["end"]): r["count"]
        for r in spark.read.parquet(out).collect()  # the committed files (_spark_metadata)
    }
    return {"mode": "spark-ss", "seconds": seconds, "rows": rows}


def run_spark_sql(spark: Any, args: argparse.Namespace, data: str, work: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    out = f"{work}/spark-sql-table"
    started = time.perf_counter()
    (
        spark.read.schema("key LONG, ts TIMESTAMP")
        .parquet(data)
        .groupBy(F.window("ts", "1 minute"), "key")
        .count()
        .selectExpr("key", "unix_millis(window.end) AS end", "count")
        .write.mode("overwrite")
        .parquet(out)
    )
    seconds = time.perf_counter() - started
    rows = {(r["key"], r["end"]): r["count"] for r in spark.read.parquet(out).collect()}
    return {"mode": "spark-sql", "seconds": seconds, "rows": rows}


COLUMNS = (
    ("mode", "mode", "<22"),
    ("records", "records", ">9"),
    ("seconds", "seconds", ">8"),
    ("records_per_s", "records/s", ">10"),
    ("windows", "windows", ">8"),
    ("vs_spark_ss", "vs Spark SS", ">11"),
    ("x_spark_sql_time", "x Spark SQL time", ">16"),
)

CONTENDERS = ("regional, columnar", "regional, record-wise", "spark-ss", "spark-sql")


def run_one(spark: Any, args: argparse.Namespace, work: str, mode: str) -> dict[str, Any]:
    """One run of contender `mode` in a directory of its own under `work`."""
    os.makedirs(work)
    data = f"{os.path.dirname(work)}/input"
    if mode == "spark-ss":
        return run_spark_ss(spark, args, data, work)
    if mode == "spark-sql":
        return run_spark_sql(spark, args, data, work)
    return run_regional(spark, args, data, work, columnar=mode == "regional, columnar")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--files", type=int, default=4, help="input files = source subtasks")
    ap.add_argument("--partitions", type=int, default=4, help="window subtasks")
    ap.add_argument("--keys", type=int, default=1_000)
    ap.add_argument("--minutes", type=int, default=60, help="minutes of event time")
    ap.add_argument("--per-epoch", type=int, default=100_000, help="records_per_epoch")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--rounds", type=int, default=1, help="runs of every contender (median)")
    ap.add_argument("--quick", action="store_true", help="100,000 records, 2 files, 2 subtasks")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    if args.quick:
        args.records, args.files, args.partitions, args.per_epoch = 100_000, 2, 2, 20_000
    work = tempfile.mkdtemp(prefix="regional-bench-window-throughput-")
    write_input(f"{work}/input", args)
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    seconds: dict[str, list[float]] = {m: [] for m in CONTENDERS}
    got: dict[str, dict[Any, int]] = {}
    try:
        for r in range(args.rounds):
            for k in range(len(CONTENDERS)):
                mode = CONTENDERS[(k + r) % len(CONTENDERS)]
                run = run_one(spark, args, f"{work}/round{r}-{k}", mode)
                seconds[mode].append(run["seconds"])
                if got.setdefault(mode, run["rows"]) != run["rows"]:
                    raise AssertionError(f"{mode}: round {r} committed other counts than round 0")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    for mode in CONTENDERS[:2]:
        for spark_mode in ("spark-ss", "spark-sql"):
            theirs = got[spark_mode]
            for window in got[mode].keys() & theirs.keys():
                if got[mode][window] != theirs[window]:
                    raise AssertionError(
                        f"{mode}: window {window} counted {got[mode][window]}, {spark_mode} "
                        f"{theirs[window]}"
                    )
    assert got[CONTENDERS[0]] == got[CONTENDERS[1]], "the columnar and record-wise counts differ"
    assert got[CONTENDERS[0]] == got["spark-sql"], "regional and the batch job commit other windows"
    median = {m: statistics.median(s) for m, s in seconds.items()}
    rows = [
        {
            "mode": m,
            "records": args.records,
            "seconds": round(median[m], 2),
            "records_per_s": round(args.records / median[m]),
            "windows": len(got[m]),
            "vs_spark_ss": round(median["spark-ss"] / median[m], 2),
            "x_spark_sql_time": round(median[m] / median["spark-sql"], 2),
        }
        for m in CONTENDERS
    ]
    print(
        f"\n{args.records:,} records in {args.files} files, {args.keys} keys, {args.minutes} "
        f"minutes of event time, {args.partitions} window subtasks, records_per_epoch "
        f"{args.per_epoch:,}, master {args.master}, median of {args.rounds} rounds in rotating "
        "order; every window committed by two contenders agrees\n"
    )
    print_table(COLUMNS, rows)
    stem = "window-throughput-quick" if args.quick else "window-throughput"
    write_results(
        f"{args.out}/{stem}.json",
        master=args.master,
        config={k: v for k, v in vars(args).items() if k != "out"},
        rows=rows,
    )
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
