"""The columnar keyed API (`key_by(field).apply_in_arrow(fn)`) against plain Spark doing the
same Arrow work per key in `mapPartitions`, side by side in one run (local Spark).

For each shape (regions x records per epoch; default 64 x 5,000 and 16 x 20,000), three
variants, interleaved epoch by epoch, each with one Spark task per core:

1. **regional, columnar**: a generator of Arrow batches -> `key_by("k").apply_in_arrow(fn)`
   -> a Parquet table, a checkpoint every epoch (`epoch()`: restore, snapshot, upload,
   metadata, exactly-once commit);
2. **regional, record-wise**: the same result with `key_by("k").process(fn)` per record;
3. **plain Spark**: one Spark job per epoch making the same Arrow batches, grouping each by
   key and running the same `fn` with a dict for its state, one Parquet file per task.

`fn` keeps a running total of `v` per key: a cumulative sum over the key's records plus the
total kept in state, one output row per record. Prints the median epoch time of each and the
ratios to plain Spark (target for the columnar API: <= 1.1).

    .venv/bin/python -m benchmarks.bench_columnar [--shapes 64x5000,16x20000] [--epochs 8]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from benchmarks.report import print_table
from regional.dataflow.pipeline import Pipeline
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

KEYS = 100
SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])


def record(split: int, n: int) -> dict[str, int]:
    """Record `n` of split `split`: one of `KEYS` keys and a value."""
    return {"k": (split * 31 + n) % KEYS, "v": n % 97}


def running(total: int, table: pa.Table) -> tuple[pa.Table, int]:
    """The user's Arrow work for one key: running totals of `v` after `total`."""
    sums = pc.add(pc.cumulative_sum(table["v"]), total)
    return pa.table({"k": table["k"], "v": table["v"], "total": sums}), sums[-1].as_py()


def columnar(ctx: Any, table: pa.Table) -> pa.Table:
    state = ctx.value_state("total", 0)
    out, total = running(state.value(), table)
    state.update(total)
    return out


def per_record(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    state = ctx.value_state("total", 0)
    total = state.value() + r["v"]
    state.update(total)
    yield {"k": r["k"], "v": r["v"], "total": total}


def job(name: str, *, regions: int, records: int, table: str, columnar_api: bool) -> Pipeline:
    p = Pipeline(name, records_per_epoch=records)
    src = p.source(GeneratorSource(regions, record, schema=SCHEMA), parallelism=regions)
    keyed = src.key_by("k")
    out = keyed.apply_in_arrow(columnar) if columnar_api else keyed.process(per_record)
    out.sink(ParquetSink(table))
    return p


def _plain_partition(records: int, epoch: int, out: str):  # type: ignore[no-untyped-def,unused-ignore]
    state: dict[tuple[int, int], int] = {}  # (split, key) -> total, like split-scoped state

    def run(splits: Iterator[int]) -> Iterator[int]:
        tables = []
        first_split = None
        for split in splits:
            first_split = split if first_split is None else first_split
            first = epoch * records
            batch = pa.Table.from_pylist(
                [record(split, i) for i in range(first, first + records)], schema=SCHEMA
            )
            groups: dict[int, list[int]] = {}
            for i, k in enumerate(batch.column("k").to_pylist()):
                groups.setdefault(k, []).append(i)
            for k, rows in groups.items():
                result, state[split, k] = running(
                    state.get((split, k), 0), batch.take(pa.array(rows, pa.int64()))
                )
                tables.append(result)
        if tables:
            pq.write_table(pa.concat_tables(tables), f"{out}/e{epoch}-t{first_split}.parquet")
        yield sum(t.num_rows for t in tables)

    return run


def plain_epoch(sc: Any, regions: int, records: int, tasks: int, epoch: int, out: str) -> float:
    started = time.perf_counter()
    sc.parallelize(range(regions), tasks).mapPartitions(
        _plain_partition(records, epoch, out)
    ).collect()
    return time.perf_counter() - started


def run_shape(spark: Any, work: str, regions: int, records: int, epochs: int) -> dict[str, float]:
    tasks = spark.sparkContext.defaultParallelism
    plain_dir = f"{work}/plain-{regions}x{records}"
    os.makedirs(plain_dir)
    runtimes = {}
    for name, columnar_api in (("columnar", True), ("record-wise", False)):
        label = f"{name}-{regions}x{records}"
        p = job(label, regions=regions, records=records, table=f"{work}/{label}",
                columnar_api=columnar_api)  # fmt: skip
        rt = SparkRuntime(p, spark, root=f"{work}/ckpt-{label}", tasks=tasks)
        rt.start()
        runtimes[name] = rt
    wall: dict[str, list[float]] = {k: [] for k in (*runtimes, "plain")}
    warm = 2
    try:
        steps = [*runtimes, "plain"]
        for epoch in range(warm + epochs):
            seconds = {}
            # the order rotates epoch by epoch: whichever runs first in a round is slower
            # (about 20 % in bench_epoch), so a fixed order would favour the others
            turn = epoch % len(steps)
            for name in steps[turn:] + steps[:turn]:
                if name == "plain":
                    seconds[name] = plain_epoch(
                        spark.sparkContext, regions, records, tasks, epoch, plain_dir
                    )
                    continue
                started = time.perf_counter()
                runtimes[name].epoch()
                seconds[name] = time.perf_counter() - started
            if epoch >= warm:
                for name, sec in seconds.items():
                    wall[name].append(sec)
    finally:
        for rt in runtimes.values():
            rt.cleaning.close()
            rt.lease.release()
    return {name: statistics.median(v) for name, v in wall.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="64x5000,16x20000", help="REGIONSxRECORDS, comma-separated")
    ap.add_argument("--epochs", type=int, default=8, help="measured epochs (after 2 warm-up)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="3 measured epochs, small shapes")
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.shapes = 3, "8x2000"
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    work = tempfile.mkdtemp(prefix="regional-bench-columnar-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    rows = []
    for regions, records in shapes:
        m = run_shape(spark, work, regions, records, args.epochs)
        for name, label in (
            ("columnar", "regional apply_in_arrow, epoch()"),
            ("record-wise", "regional process, epoch()"),
            ("plain", "plain Spark, same Arrow work"),
        ):
            rows.append(
                {
                    "shape": f"{regions}x{records}",
                    "variant": label,
                    "s": f"{m[name]:.3f}",
                    "ratio": f"{m[name] / m['plain']:.2f}",
                }
            )
    print(
        f"\nSpark master {args.master}; medians of {args.epochs} interleaved epochs after 2 "
        f"warm-up epochs; {os.cpu_count()} CPUs\n"
    )
    columns = [
        ("shape", "shape", "<9"),
        ("variant", "variant", "<34"),
        ("s", "epoch s", ">8"),
        ("ratio", "vs plain", ">9"),
    ]
    print_table(columns, rows)


if __name__ == "__main__":
    main()
