"""The cost of one epoch at 1,024 regions, side by side in one run (local Spark).

Three variants, interleaved epoch by epoch, each with the same number of Spark tasks (one
per core):

1. **regional**: the per-epoch overhead job of `bench_spark_overhead` (generator -> map ->
   Parquet table), 1,024 regions of `--records` records per epoch, a checkpoint every epoch
   (restore the split positions, snapshot, upload, metadata, exactly-once commit, cleaning);
2. **plain Spark**: one Spark job per epoch doing the same Python work without checkpoints:
   for each of the 1,024 splits, generate its records, map them, write them as a Parquet
   file (the sink stages one file per region and epoch too);
3. **floor**: a trivial job with the same task count (Spark's own per-epoch cost).

Prints the median epoch time of each, the ratio regional / plain Spark (target <= 1.15) and
the split of the regional epoch on the driver (`regional.runtime.timing.EpochTiming`: plan,
dispatch = the Spark job, feed, metadata, commit, discard, clean, event) and, inside the
dispatch, the units' task seconds per phase summed over units (restore, process, snapshot,
upload; from the acks). Then the same regional job with a full scan
of the job root at every epoch (how the driver cleaned before incremental cleaning): the
cleaning time on the epoch's path, and what the background worker deleted.

    .venv/bin/python -m benchmarks.bench_epoch [--regions 1024] [--records 10] [--epochs 12]
        [--master local[2]] [--quick] [--out DIR]
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
import pyarrow.parquet as pq

from benchmarks.report import RESULTS, print_table, write_results
from regional.dataflow.pipeline import Pipeline
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.runtime.timing import PARTS, TASK_PARTS, EpochTiming
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def record(split: int, n: int) -> dict[str, int]:
    """Record `n` of split `split`."""
    return {"s": split, "n": n}


def doubled(r: dict[str, int]) -> dict[str, int]:
    """The map both variants run on every record."""
    return {"s": r["s"], "n": r["n"] * 2}


def map_job(name: str, *, regions: int, records: int, table: str) -> Pipeline:
    """`regions` splits of `records` records per epoch -> `doubled` -> the Parquet table."""
    p = Pipeline(name, records_per_epoch=records)
    src = p.source(GeneratorSource(regions, record), parallelism=regions)
    src.map(doubled).sink(ParquetSink(table))
    return p


def _plain_partition(records: int, epoch: int, out: str):  # type: ignore[no-untyped-def,unused-ignore]
    def run(splits: Iterator[int]) -> Iterator[int]:
        n = 0
        for split in splits:
            first = epoch * records
            rows = [doubled(record(split, i)) for i in range(first, first + records)]
            pq.write_table(pa.Table.from_pylist(rows), f"{out}/e{epoch}-s{split}.parquet")
            n += len(rows)
        yield n

    return run


def plain_epoch(sc: Any, regions: int, records: int, tasks: int, epoch: int, out: str) -> float:
    started = time.perf_counter()
    fn = _plain_partition(records, epoch, out)
    sc.parallelize(range(regions), tasks).mapPartitions(fn).collect()
    return time.perf_counter() - started


def floor_epoch(sc: Any, tasks: int) -> float:
    started = time.perf_counter()
    sc.parallelize(range(tasks), tasks).mapPartitions(lambda it: [sum(1 for _ in it)]).collect()
    return time.perf_counter() - started


def _median(timings: list[EpochTiming], field: str) -> float:
    return statistics.median(getattr(t, field) for t in timings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regions", type=int, default=1024)
    ap.add_argument("--records", type=int, default=10, help="records per region and epoch")
    ap.add_argument("--epochs", type=int, default=12, help="measured epochs (after 2 warm-up)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="4 measured epochs")
    ap.add_argument("--out", default=RESULTS, help="directory of the results JSON")
    args = ap.parse_args()
    if args.quick:
        args.epochs = 4
    work = tempfile.mkdtemp(prefix="regional-bench-epoch-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    sc = spark.sparkContext
    tasks = sc.defaultParallelism
    os.makedirs(f"{work}/plain")

    def runtime(name: str) -> SparkRuntime:
        job = map_job(name, regions=args.regions, records=args.records, table=f"{work}/{name}")
        rt = SparkRuntime(job, spark, root=f"{work}/ckpt-{name}", tasks=tasks)
        rt.start()  # warm the workers, restore (nothing)
        return rt

    incremental, full_scan = runtime("incremental"), runtime("full-scan")
    regional: list[EpochTiming] = []
    regional_s: list[float] = []  # epoch() wall time, lease and source checks included
    rescanned: list[EpochTiming] = []
    plain: list[float] = []
    floor: list[float] = []
    warm = 2
    try:
        for epoch in range(warm + args.epochs):
            started = time.perf_counter()
            incremental.epoch()
            r = time.perf_counter() - started
            full_scan.cleaning.rescan()  # this epoch's clean scans the whole root, as before
            full_scan.epoch()
            p = plain_epoch(sc, args.regions, args.records, tasks, epoch, f"{work}/plain")
            f = floor_epoch(sc, tasks)
            if epoch >= warm:
                assert incremental.last_timing and full_scan.last_timing
                regional.append(incremental.last_timing)
                regional_s.append(r)
                rescanned.append(full_scan.last_timing)
                plain.append(p)
                floor.append(f)
        incremental.cleaning.drain()
        full_scan.cleaning.drain()
    finally:
        incremental.cleaning.close()
        full_scan.cleaning.close()
        incremental.lease.release()
        full_scan.lease.release()
    reg_s = statistics.median(regional_s)
    plain_s, floor_s = statistics.median(plain), statistics.median(floor)
    print(
        f"\n{args.regions} regions x {args.records} records per epoch, Spark master "
        f"{args.master} ({tasks} tasks per epoch); medians of {args.epochs} interleaved epochs "
        f"after {warm} warm-up epochs; {os.cpu_count()} CPUs\n"
    )
    rows = [
        {"variant": name, "s": f"{sec:.3f}", "ratio": f"{sec / plain_s:.2f}"}
        for name, sec in (
            ("regional (checkpoint every epoch)", reg_s),
            ("plain Spark, same Python work", plain_s),
            ("floor (trivial job, same tasks)", floor_s),
        )
    ]
    print_table([("variant", "variant", "<36"), ("s", "epoch s", ">8"),
                 ("ratio", "vs plain", ">9")], rows)  # fmt: skip
    print(f"\nratio regional / plain Spark: {reg_s / plain_s:.2f} (target <= 1.15)\n")
    split = [
        {
            "part": part,
            "incremental": _median(regional, f"{part}_s") * 1000,
            "full": _median(rescanned, f"{part}_s") * 1000,
        }
        for part in (*PARTS, "total")
    ]
    print("split of a regional epoch on the driver (median ms)")
    shown = [{k: v if k == "part" else f"{v:.1f}" for k, v in r.items()} for r in split]
    print_table([("part", "part", "<9"), ("incremental", "incremental cleaning", ">20"),
                 ("full", "full scan every epoch", ">22")], shown)  # fmt: skip
    phases = [
        {"part": part, "ms": _median(regional, f"task_{part}_s") * 1000} for part in TASK_PARTS
    ]
    print(
        f"\ninside the dispatch: task ms per phase, summed over the {args.regions} units "
        f"(median; {tasks} tasks run in parallel)"
    )
    print_table(
        [("part", "phase", "<9"), ("ms", "task ms", ">9")],
        [{"part": t["part"], "ms": f"{t['ms']:.1f}"} for t in phases],
    )
    split += [{"part": f"task-{t['part']}", "incremental": t["ms"], "full": None} for t in phases]
    totals = {"incremental": incremental.cleaning.totals, "full-scan": full_scan.cleaning.totals}
    print("\nbackground cleaning worker (whole run)")
    for name, t in totals.items():
        print(
            f"  {name:<12} {t.plans} plans, {t.deleted} files deleted, {t.failed} failed, "
            f"busy {t.busy_s:.2f} s, submit waited {t.waited_s * 1000:.1f} ms"
        )
    suffix = "-quick" if args.quick else ""
    write_results(
        os.path.join(args.out, f"epoch{suffix}.json"),
        master=args.master,
        config={"regions": args.regions, "records": args.records, "epochs": args.epochs},
        epoch_s={"regional": reg_s, "plain": plain_s, "floor": floor_s},
        ratio=reg_s / plain_s,
        split_ms=split,
        cleaner={k: {f: getattr(v, f) for f in v.__struct_fields__} for k, v in totals.items()},
    )
    spark.stop()


if __name__ == "__main__":
    main()
