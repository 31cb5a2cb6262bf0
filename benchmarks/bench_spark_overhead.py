"""Overhead of regional checkpoints on Spark, measured side by side in one run (local Spark).

1. Throughput: the same Arrow transformation over the same Parquet files (8 files, one region
   each), (a) as a `regional` pipeline with a checkpoint every epoch (FileSource -> map_batches ->
   ParquetSink, exactly-once commits) and (b) as a plain Spark job without checkpointing
   (one RDD job, a task per file: read with Arrow, transform, write Parquet).
   Ratio = time(a) / time(b).
2. Per-epoch overhead per region at 8, 64 and 256 regions: a generator -> map -> Parquet sink
   pipeline with a few records per region and epoch; the mean epoch time (trigger, Spark job,
   snapshot upload, metadata, commit, cleaning) divided by the number of regions.

    .venv/bin/python -m benchmarks.bench_spark_overhead [--rows 16000000] [--epochs 2]
        [--master local[2]] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from regional.dataflow.pipeline import Pipeline
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource
from regional.sources.generator import GeneratorSource

REGIONS = (8, 64, 256)  # the per-epoch overhead's region counts (--quick: the first two)


def transform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The work both variants do: a derived column and a filter."""
    score = pc.add(pc.multiply(batch["value"], 3), batch["user"])
    keep = pc.greater(pc.bit_wise_and(score, 7), 1)
    return pa.RecordBatch.from_arrays(
        [pc.filter(batch["user"], keep), pc.filter(score, keep)], names=["user", "score"]
    )


def make_data(directory: str, files: int, rows: int) -> None:
    os.makedirs(directory, exist_ok=True)
    per = rows // files
    for f in range(files):
        n = pa.array(range(f * per, (f + 1) * per), pa.int64())
        table = pa.table({"user": pc.bit_wise_and(n, 1023), "value": n})
        pq.write_table(
            table, os.path.join(directory, f"part-{f:03d}.parquet"), row_group_size=250_000
        )


def regional_throughput(spark, data: str, work: str, rows: int, epochs: int) -> tuple[float, int]:
    p = Pipeline("bench", records_per_epoch=-(-rows // 8 // epochs))
    src = p.source(FileSource(data), parallelism=8, name="files")
    src.map_batches(transform, name="transform").sink(ParquetSink(f"{work}/out"), name="out")
    t0 = time.perf_counter()
    summary = SparkRuntime(p, spark, root=f"{work}/ckpt").run()
    seconds = time.perf_counter() - t0
    assert summary.finished
    return seconds, read_table(f"{work}/out").num_rows


def plain_throughput(spark, data: str, work: str) -> tuple[float, int]:
    """One Spark job, a task per file: read it with Arrow, transform, write Parquet."""
    out = f"{work}/plain"
    os.makedirs(out, exist_ok=True)
    files = sorted(os.listdir(data))

    def run(names):
        for name in names:
            table = pq.read_table(os.path.join(data, name))
            batches = [transform(b) for b in table.to_batches()]
            result = pa.Table.from_batches(batches)
            pq.write_table(result, os.path.join(out, name))
            yield result.num_rows

    t0 = time.perf_counter()
    rows = sum(spark.sparkContext.parallelize(files, len(files)).mapPartitions(run).collect())
    return time.perf_counter() - t0, rows


def epoch_overhead(spark, regions: int, epochs: int, work: str) -> float:
    p = Pipeline(f"overhead-{regions}", records_per_epoch=10)
    src = p.source(GeneratorSource(regions, lambda s, n: {"s": s, "n": n}), parallelism=regions)
    src.map(lambda r: {"s": r["s"], "n": r["n"] * 2}).sink(ParquetSink(f"{work}/out-{regions}"))
    times: list[float] = []
    runtime = SparkRuntime(
        p, spark, root=f"{work}/ckpt-{regions}", progress=lambda r: times.append(r.seconds)
    )
    runtime.run(max_checkpoints=epochs + 1)
    return statistics.median(times[1:])  # the first epoch pays for worker start-up


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16_000_000)
    parser.add_argument("--epochs", type=int, default=2, help="epochs of the throughput run")
    parser.add_argument("--overhead-epochs", type=int, default=5)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--repeat", type=int, default=3, help="throughput runs (median)")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="800,000 rows, 1 run; overhead at 8 and 64 regions, 2 epochs",
    )
    args = parser.parse_args()
    regions: tuple[int, ...] = REGIONS
    if args.quick:
        args.rows, args.repeat, args.overhead_epochs, regions = 800_000, 1, 2, REGIONS[:2]
    work = tempfile.mkdtemp(prefix="regional-bench-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    cores = spark.sparkContext.defaultParallelism
    make_data(f"{work}/data", 8, args.rows)
    # warm both paths once on a small copy (worker start-up, Catalyst)
    make_data(f"{work}/warm", 8, 80_000)
    plain_throughput(spark, f"{work}/warm", f"{work}/warm-plain")
    regional_throughput(spark, f"{work}/warm", f"{work}/warm-regional", 80_000, 1)

    plain_runs, reg_runs = [], []
    for i in range(args.repeat):  # interleaved, medians: this VM's timing noise is large
        plain_s, plain_rows = plain_throughput(spark, f"{work}/data", f"{work}/p{i}")
        reg_s, reg_rows = regional_throughput(
            spark, f"{work}/data", f"{work}/r{i}", args.rows, args.epochs
        )
        assert plain_rows == reg_rows, (plain_rows, reg_rows)
        plain_runs.append(plain_s)
        reg_runs.append(reg_s)
    plain_s, reg_s = statistics.median(plain_runs), statistics.median(reg_runs)
    print(
        f"\nSpark master {args.master} ({cores} cores); {args.rows:,} rows in 8 Parquet files; "
        f"median of {args.repeat} interleaved runs\n"
    )
    print("variant                                   seconds   rows/s        ratio")
    plain_rate = args.rows / plain_s
    print(f"plain Spark job (no checkpoints)          {plain_s:7.2f}   {plain_rate:>11,.0f}   1.00")
    print(
        f"regional, 8 regions, checkpoint/epoch     {reg_s:7.2f}   {args.rows / reg_s:>11,.0f}"
        f"   {reg_s / plain_s:.2f}   ({args.epochs} data epochs + final checkpoint)"
    )
    print("\nregions  epoch (median)  per region")
    for n in regions:
        epoch = epoch_overhead(spark, n, args.overhead_epochs, work)
        print(f"{n:>7}  {epoch:>12.3f} s  {epoch / n * 1000:>7.2f} ms")
    spark.stop()


if __name__ == "__main__":
    main()
