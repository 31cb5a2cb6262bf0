"""The cost of a keyed stage after a durable exchange, regional against plain Spark (issue 42 §6).

One job per shape, the same Python work on both sides, side by side in one run (local Spark):

* **regional**: generator -> `doubled` (map) -> ``key_by(record_key, partitions=P)`` ->
  ``process(count per key)`` (value state) -> Parquet table, a checkpoint every epoch
  (`JobDriver.epoch()`, one at a time), and the same job's pipelined `run()` per epoch;
* **plain Spark**: a two-stage RDD job per epoch: ``mapPartitions`` (the generator and the map,
  as (key, record) pairs) -> ``partitionBy(P)`` -> ``mapPartitions`` (the running count per
  key in a dict, a record at a time) -> one Parquet file per task;
* **plain Spark, one partition per core**: the same with ``partitionBy(<Spark tasks>)`` (P
  reduce tasks cost Spark a task each; regional runs its P reader subtasks in as many Spark
  tasks as there are cores).

Shapes are ``REGIONSxRECORDS[:P]`` (source splits x records per split and epoch, exchange
partitions; default `64x5000:64,16x20000:16,1024x10:64,1024x10:1024`). Regional and plain
epochs interleave, the order rotating epoch by epoch; medians after 2 warm-up epochs. The
regional readers may read twice a partition's mean share per epoch, so none falls behind.
Prints the medians and the ratios regional / plain Spark; writes `keyed_exchange.json`.

    .venv/bin/python -m benchmarks.bench_keyed_exchange [--shapes 64x5000:64,...]
        [--epochs 8] [--keys 4096] [--master local[2]] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.report import RESULTS, print_table, write_results
from regional.dataflow.pipeline import Pipeline
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

__all__ = ["Shape", "counted", "doubled", "keyed_job", "main", "record_key"]


class Shape(NamedTuple):
    """Source splits, records per split and epoch, exchange partitions."""

    regions: int
    records: int
    partitions: int

    @property
    def label(self) -> str:
        return f"{self.regions}x{self.records} P={self.partitions}"

    @classmethod
    def parse(cls, text: str) -> Shape:
        size, _, partitions = text.partition(":")
        regions, records = (int(x) for x in size.split("x"))
        return cls(regions, records, int(partitions) if partitions else regions)


class Records:
    """The generator's records: record `n` of split `split` has key (n·7919 + split) % keys."""

    def __init__(self, keys: int) -> None:
        self.keys = keys

    def __call__(self, split: int, n: int) -> dict[str, int]:
        return {"key": (n * 7919 + split) % self.keys, "s": split, "n": n}


def doubled(r: dict[str, int]) -> dict[str, int]:
    """The map both sides run on every record."""
    return {"key": r["key"], "s": r["s"], "n": r["n"] * 2}


def record_key(r: dict[str, int]) -> int:
    """The key both sides partition by (a function of a record: user work)."""
    return r["key"]


def counted(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    """A running count per key in value state, one row out per record in."""
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {**r, "c": c.value()}


def keyed_job(name: str, shape: Shape, keys: int, table: str) -> Pipeline:
    """generator -> `doubled` -> key_by(`record_key`, partitions=P) -> `counted` -> `table`;
    each reader may read twice its partition's mean share of an epoch."""
    share = shape.regions * shape.records // shape.partitions
    p = Pipeline(name, records_per_epoch=2 * max(shape.records, share, 1))
    src = p.source(
        GeneratorSource(shape.regions, Records(keys), max_per_read=shape.records),
        parallelism=shape.regions,
    )
    src.map(doubled).key_by(record_key, partitions=shape.partitions, name="by-key").process(
        counted, name="count"
    ).sink(ParquetSink(table), name="out")
    return p


def _plain_map(records: int, epoch: int, keys: int):  # type: ignore[no-untyped-def,unused-ignore]
    make = Records(keys)

    def run(splits: Iterable[int]) -> Iterator[tuple[int, dict[str, int]]]:
        first = epoch * records
        for split in splits:
            for i in range(first, first + records):
                r = doubled(make(split, i))
                yield record_key(r), r

    return run


def _plain_count(epoch: int, out: str):  # type: ignore[no-untyped-def,unused-ignore]
    def run(task: int, pairs: Iterable[tuple[int, dict[str, int]]]) -> Iterator[int]:
        counts: dict[int, int] = {}
        rows = []
        for key, r in pairs:
            c = counts[key] = counts.get(key, 0) + 1
            rows.append({**r, "c": c})
        if rows:  # one Parquet file per Spark task
            pq.write_table(pa.Table.from_pylist(rows), f"{out}/e{epoch}-t{task}.parquet")
        yield len(rows)

    return run


def plain_epoch(
    sc: Any, shape: Shape, keys: int, tasks: int, epoch: int, out: str, reducers: int = 0
) -> float:
    """One epoch of the plain two-stage Spark job (`reducers` reduce tasks, default P); its
    wall seconds."""
    started = time.perf_counter()
    (
        sc.parallelize(range(shape.regions), tasks)
        .mapPartitions(_plain_map(shape.records, epoch, keys))
        .partitionBy(reducers or shape.partitions)
        .mapPartitionsWithIndex(_plain_count(epoch, out))
        .collect()
    )
    return time.perf_counter() - started


def run_shape(
    spark: Any, work: str, shape: Shape, keys: int, epochs: int, tasks: int
) -> dict[str, float]:
    """One shape's interleaved epochs, then `run()` and plain epochs in a row: the medians."""
    sc = spark.sparkContext
    tag = f"{shape.regions}x{shape.records}-p{shape.partitions}"
    plain_dir = f"{work}/plain-{tag}"
    os.makedirs(plain_dir)
    job = keyed_job(f"keyed-{tag}", shape, keys, f"{work}/table-{tag}")
    rt = SparkRuntime(job, spark, root=f"{work}/ckpt-{tag}", tasks=tasks)
    rt.start()
    os.makedirs(f"{plain_dir}-cores")
    steps = ["regional", "plain", "plain, per core"]
    wall: dict[str, list[float]] = {name: [] for name in steps}
    warm = 2
    try:
        for epoch in range(warm + epochs):
            seconds: dict[str, float] = {}
            turn = epoch % len(steps)  # the order rotates: the first of a round is slower
            for name in steps[turn:] + steps[:turn]:
                if name == "plain":
                    seconds[name] = plain_epoch(sc, shape, keys, tasks, epoch, plain_dir)
                elif name == "plain, per core":
                    seconds[name] = plain_epoch(
                        sc, shape, keys, tasks, epoch, f"{plain_dir}-cores", reducers=tasks
                    )
                else:
                    started = time.perf_counter()
                    rt.epoch()
                    seconds[name] = time.perf_counter() - started
            if epoch >= warm:
                for name, sec in seconds.items():
                    wall[name].append(sec)
        rt.cleaning.drain()
        started = time.perf_counter()
        rt.run(max_checkpoints=epochs)
        run_s = (time.perf_counter() - started) / epochs
        started = time.perf_counter()
        for epoch in range(epochs):
            plain_epoch(sc, shape, keys, tasks, warm + epochs + epoch, plain_dir)
        block_s = (time.perf_counter() - started) / epochs
    finally:
        rt.cleaning.close()
        rt.lease.release()
    medians = {name: statistics.median(v) for name, v in wall.items()}
    return {**medians, "regional run()": run_s, "plain, in a row": block_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--shapes",
        default="64x5000:64,16x20000:16,1024x10:64,1024x10:1024",
        help="REGIONSxRECORDS:PARTITIONS, comma-separated",
    )
    ap.add_argument("--epochs", type=int, default=8, help="measured epochs (after 2 warm-up)")
    ap.add_argument("--keys", type=int, default=4096, help="distinct keys")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="3 measured epochs")
    ap.add_argument("--out", default=RESULTS, help="directory of the results JSON")
    args = ap.parse_args()
    if args.quick:
        args.epochs = 3
    shapes = [Shape.parse(s) for s in args.shapes.split(",")]
    work = tempfile.mkdtemp(prefix="regional-bench-keyed-exchange-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    tasks = spark.sparkContext.defaultParallelism
    results = {}
    for shape in shapes:  # each shape's medians as soon as it is measured
        results[shape.label] = m = run_shape(spark, work, shape, args.keys, args.epochs, tasks)
        print(f"{shape.label}: " + ", ".join(f"{k} {v:.3f} s" for k, v in m.items()), flush=True)
    print(
        f"\nSpark master {args.master} ({tasks} tasks); medians of {args.epochs} interleaved "
        f"epochs after 2 warm-up epochs; {args.keys} keys; {os.cpu_count()} CPUs\n"
    )
    rows = [
        {
            "shape": label,
            "regional": f"{m['regional']:.3f}",
            "plain": f"{m['plain']:.3f}",
            "ratio": f"{m['regional'] / m['plain']:.2f}",
            "cores": f"{m['plain, per core']:.3f}",
            "cores_ratio": f"{m['regional'] / m['plain, per core']:.2f}",
            "run": f"{m['regional run()']:.3f}",
            "block": f"{m['plain, in a row']:.3f}",
            "run_ratio": f"{m['regional run()'] / m['plain, in a row']:.2f}",
        }
        for label, m in results.items()
    ]
    print_table([("shape", "shape", "<20"), ("regional", "epoch() s", ">10"),
                 ("plain", "plain s", ">8"), ("ratio", "ratio", ">6"),
                 ("cores", "per core s", ">11"), ("cores_ratio", "ratio", ">6"),
                 ("run", "run() s", ">8"), ("block", "plain s", ">8"),
                 ("run_ratio", "ratio", ">6")], rows)  # fmt: skip
    suffix = "-quick" if args.quick else ""
    write_results(
        os.path.join(args.out, f"keyed_exchange{suffix}.json"),
        master=args.master,
        config={"shapes": args.shapes, "epochs": args.epochs, "keys": args.keys, "tasks": tasks},
        epoch_s=results,
        ratio={label: m["regional"] / m["plain"] for label, m in results.items()},
        ratio_per_core={
            label: m["regional"] / m["plain, per core"] for label, m in results.items()
        },
        run_ratio={
            label: m["regional run()"] / m["plain, in a row"] for label, m in results.items()
        },
    )
    spark.stop()


if __name__ == "__main__":
    main()
