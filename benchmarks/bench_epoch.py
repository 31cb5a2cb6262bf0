"""The cost of one epoch, regional against plain Spark, side by side in one run (local Spark).

For each shape (default 1,024 regions x 10 records and 64 regions x 500 records per epoch),
five variants, interleaved epoch by epoch, each with the same number of Spark tasks (one per
core):

0. **regional, pipelined**: the same job's `run()` for as many epochs after the interleaved
   ones (the next epoch's tasks start while the previous epoch commits), per epoch, against
   as many plain Spark epochs in a row;
1. **regional**: one `epoch()` at a time (it returns after its commit): the per-epoch
   overhead job of `bench_spark_overhead` (generator -> map -> Parquet table), a checkpoint
   every epoch (restore the split positions, snapshot, upload,
   metadata, exactly-once commit, cleaning), with file merging (DESIGN §4 rule 16: one
   physical state file and one staged data file per Spark task and checkpoint), and each
   task's units in one pass (DESIGN §6);
2. **regional, no task pass**: the same with `task_pass=False` (each unit's record path run
   on its own, one unit after another);
2b. **regional, state from bytes**: the same as 1 with `hot_state=False` (every epoch decodes
   its operator state instead of taking what the worker kept: DESIGN §6);
3. **regional, files per unit**: the same with `merge_state=False, merge_sink_files=False`
   (a state file and a staged file per unit: the layout before merging);
4. **plain Spark**: one Spark job per epoch doing the same Python work without checkpoints
   (the map, and the running count per key in a dict, a record at a time), writing **one
   Parquet file per Spark task** (what a user would write instead);
5. **floor**: a trivial job with the same task count (Spark's own per-epoch cost).

Prints the median epoch time of each, the ratio regional / plain Spark (issue 33's targets:
`epoch()` <= 1.5 and `run()` <= 1.3 at 1,024 x 10; <= 1.4 and <= 1.2 at 64 x 5,000 and
16 x 20,000), the files each checkpoint wrote (state files, staged data
files, metadata and event; from the checkpoint's metadata) per checkpoint and per Spark task,
and the split of the regional epoch on the driver (`regional.runtime.timing.EpochTiming`)
and, inside the dispatch, the units' task seconds per phase summed over units.

    .venv/bin/python -m benchmarks.bench_epoch [--shapes 1024x10,64x500] [--epochs 12]
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

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.report import RESULTS, print_table, write_results
from regional.dataflow.pipeline import Pipeline
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.runtime.timing import PARTS, TASK_PARTS, EpochTiming
from regional.sinks.parquet import ParquetSink
from regional.sinks.staging import StagedFile
from regional.sources.generator import GeneratorSource


def record(split: int, n: int) -> dict[str, int]:
    """Record `n` of split `split`."""
    return {"s": split, "n": n}


def doubled(r: dict[str, int]) -> dict[str, int]:
    """The map both variants run on every record."""
    return {"s": r["s"], "n": r["n"] * 2}


def split_of(r: dict[str, int]) -> int:
    return r["s"]


def counted(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    """A running count per split (keyed state: every unit checkpoints a state segment)."""
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {**r, "c": c.value()}


def map_job(name: str, *, regions: int, records: int, table: str) -> Pipeline:
    """`regions` splits of `records` records per epoch -> `doubled` -> a running count per
    split -> the Parquet table."""
    p = Pipeline(name, records_per_epoch=records)
    src = p.source(GeneratorSource(regions, record), parallelism=regions)
    src.map(doubled).key_by(split_of).process(counted).sink(ParquetSink(table))
    return p


def _plain_partition(records: int, epoch: int, out: str):  # type: ignore[no-untyped-def,unused-ignore]
    def run(splits: Iterator[int]) -> Iterator[int]:
        rows = []
        first_split = None
        for split in splits:
            first_split = split if first_split is None else first_split
            first = epoch * records
            # the same user work the same way: the map, then a running count per key kept in
            # a dict (as `counted` keeps it in value state), a record at a time
            counts: dict[int, int] = {}
            for i in range(first, first + records):
                r = doubled(record(split, i))
                key = split_of(r)
                c = counts[key] = counts.get(key, first) + 1
                rows.append({**r, "c": c})
        if rows:  # one Parquet file per Spark task
            pq.write_table(pa.Table.from_pylist(rows), f"{out}/e{epoch}-t{first_split}.parquet")
        yield len(rows)

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


def files_written(rt: SparkRuntime, checkpoint_id: int) -> dict[str, int]:
    """The files checkpoint `checkpoint_id` wrote, from its metadata: physical state files
    (fresh segments' paths), staged data files (the distinct files the committables of fresh
    sink subtasks name: one per task when merged), and the metadata and event objects."""
    md = rt.storage.read_metadata(checkpoint_id)
    fresh = [s for s in md.subtasks if s.ref_checkpoint_id is None]
    state = len({h.path for s in fresh for h in s.handles})
    staged = len(
        {msgspec.msgpack.decode(c, type=StagedFile).file for s in fresh for c in s.committables}
    )
    return {"state": state, "staged": staged, "metadata+event": 2, "total": state + staged + 2}


def run_shape(
    spark: Any, work: str, regions: int, records: int, epochs: int, tasks: int
) -> dict[str, Any]:
    """One shape's interleaved epochs: the medians, the files per checkpoint, the splits."""
    sc = spark.sparkContext
    plain_dir = f"{work}/plain-{regions}x{records}"
    os.makedirs(plain_dir)

    def runtime(
        name: str, merge: bool, task_pass: bool = True, hot_state: bool = True
    ) -> SparkRuntime:
        name = f"{name}-{regions}x{records}"
        job = map_job(name, regions=regions, records=records, table=f"{work}/{name}")
        rt = SparkRuntime(
            job,
            spark,
            root=f"{work}/ckpt-{name}",
            tasks=tasks,
            merge_state=merge,
            merge_sink_files=merge,
            task_pass=task_pass,
            hot_state=hot_state,
        )
        rt.start()  # warm the workers, restore (nothing)
        return rt

    variants = {
        "merged": runtime("merged", True),
        "one by one": runtime("one-by-one", True, task_pass=False),
        "from bytes": runtime("from-bytes", True, hot_state=False),
        "per-unit": runtime("per-unit", False),
    }
    wall: dict[str, list[float]] = {k: [] for k in (*variants, "plain", "floor")}
    timings: dict[str, list[EpochTiming]] = {k: [] for k in variants}
    files: dict[str, dict[str, int]] = {}
    warm = 2
    try:
        steps = [*variants, "plain", "floor"]
        for epoch in range(warm + epochs):
            seconds = {}
            # the order rotates epoch by epoch: whichever runs first in a round is slower
            # (about 20 % here, whatever it is), so a fixed order would favour the others
            turn = epoch % len(steps)
            for name in steps[turn:] + steps[:turn]:
                if name == "plain":
                    seconds[name] = plain_epoch(sc, regions, records, tasks, epoch, plain_dir)
                    continue
                if name == "floor":
                    seconds[name] = floor_epoch(sc, tasks)
                    continue
                rt = variants[name]
                started = time.perf_counter()
                rt.epoch()
                seconds[name] = time.perf_counter() - started
                assert rt.last_timing is not None
                if epoch >= warm:
                    timings[name].append(rt.last_timing)
                if epoch == warm:
                    files[name] = files_written(rt, rt.last_timing.checkpoint_id)
            if epoch >= warm:
                for name, sec in seconds.items():
                    wall[name].append(sec)
        for rt in variants.values():
            rt.cleaning.drain()
        # pipelined: `run()` starts an epoch's tasks while the previous epoch commits
        started = time.perf_counter()
        variants["merged"].run(max_checkpoints=epochs)
        wall["merged, run()"] = [(time.perf_counter() - started) / epochs]
        started = time.perf_counter()
        for epoch in range(epochs):
            plain_epoch(sc, regions, records, tasks, warm + epochs + epoch, plain_dir)
        wall["plain, block"] = [(time.perf_counter() - started) / epochs]
    finally:
        for rt in variants.values():
            rt.cleaning.close()
            rt.lease.release()
    files["plain"] = {"state": 0, "staged": min(tasks, regions), "metadata+event": 0}
    files["plain"]["total"] = files["plain"]["staged"]
    medians = {name: statistics.median(v) for name, v in wall.items()}
    return {"medians": medians, "files": files, "timings": timings}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1024x10,64x500", help="REGIONSxRECORDS, comma-separated")
    ap.add_argument("--epochs", type=int, default=12, help="measured epochs (after 2 warm-up)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="4 measured epochs")
    ap.add_argument("--out", default=RESULTS, help="directory of the results JSON")
    args = ap.parse_args()
    if args.quick:
        args.epochs = 4
    shapes = [tuple(int(x) for x in shape.split("x")) for shape in args.shapes.split(",")]
    work = tempfile.mkdtemp(prefix="regional-bench-epoch-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    tasks = spark.sparkContext.defaultParallelism
    results = {f"{r}x{n}": run_shape(spark, work, r, n, args.epochs, tasks) for r, n in shapes}
    print(
        f"\nSpark master {args.master} ({tasks} tasks per epoch); medians of {args.epochs} "
        f"interleaved epochs after 2 warm-up epochs; {os.cpu_count()} CPUs\n"
    )
    rows = []
    for shape, res in results.items():
        m, f = res["medians"], res["files"]
        for name, label in (
            ("merged, run()", "regional, pipelined run() (merged)"),
            ("plain, block", "plain Spark, same epochs in a row"),
            ("merged", "regional epoch(), files merged"),
            ("one by one", "regional epoch(), merged, no task pass"),
            ("from bytes", "regional epoch(), merged, no hot state"),
            ("per-unit", "regional epoch(), files per unit"),
            ("plain", "plain Spark (one file per task)"),
            ("floor", "floor (trivial job, same tasks)"),
        ):
            files = f.get(name)
            base = "plain, block" if name == "merged, run()" else "plain"
            rows.append(
                {
                    "shape": shape,
                    "variant": label,
                    "s": f"{m[name]:.3f}",
                    "ratio": f"{m[name] / m[base]:.2f}",
                    "files": "-" if files is None else str(files["total"]),
                    "per_task": "-" if files is None else f"{files['total'] / tasks:.1f}",
                    "state": "-" if files is None else str(files["state"]),
                    "staged": "-" if files is None else str(files["staged"]),
                }
            )
    print_table([("shape", "shape", "<8"), ("variant", "variant", "<33"), ("s", "epoch s", ">8"),
                 ("ratio", "vs plain", ">9"), ("files", "files/chk", ">10"),
                 ("per_task", "per task", ">9"), ("state", "state", ">6"),
                 ("staged", "staged", ">7")], rows)  # fmt: skip
    for shape, res in results.items():
        m = res["medians"]
        print(
            f"ratio regional / plain Spark at {shape}: epoch() {m['merged'] / m['plain']:.2f}, "
            f"pipelined run() {m['merged, run()'] / m['plain, block']:.2f}"
        )
    split = []
    for shape, res in results.items():
        merged = res["timings"]["merged"]
        for part in (*PARTS, "total"):
            split.append({"shape": shape, "part": part, "ms": _median(merged, f"{part}_s") * 1000})
        for part in TASK_PARTS:
            split.append(
                {
                    "shape": shape,
                    "part": f"task-{part}",
                    "ms": _median(merged, f"task_{part}_s") * 1000,
                }
            )
    print("\nsplit of a regional (merged) epoch on the driver, then task ms per phase summed")
    print("over the units (median ms)")
    print_table(
        [("shape", "shape", "<8"), ("part", "part", "<14"), ("ms", "ms", ">8")],
        [{**r, "ms": f"{r['ms']:.1f}"} for r in split],
    )
    print("\nrestoring operator state: hot state against decoding every epoch (medians per epoch)")
    restores = []
    for shape, res in results.items():
        for name in ("merged", "from bytes"):
            timings = res["timings"][name]
            restores.append(
                {
                    "shape": shape,
                    "variant": "hot state" if name == "merged" else "from bytes",
                    "ms": f"{_median(timings, 'task_restore_s') * 1000:.1f}",
                    "hits": f"{_median(timings, 'task_state_hits'):g}",
                    "misses": f"{_median(timings, 'task_state_misses'):g}",
                }
            )
    print_table(
        [("shape", "shape", "<8"), ("variant", "variant", "<11"), ("ms", "task-restore ms", ">16"),
         ("hits", "hits", ">6"), ("misses", "misses", ">7")],
        restores,
    )  # fmt: skip
    suffix = "-quick" if args.quick else ""
    write_results(
        os.path.join(args.out, f"epoch{suffix}.json"),
        master=args.master,
        config={"shapes": args.shapes, "epochs": args.epochs, "tasks": tasks},
        epoch_s={shape: res["medians"] for shape, res in results.items()},
        ratio={
            shape: res["medians"]["merged"] / res["medians"]["plain"]
            for shape, res in results.items()
        },
        files_per_checkpoint={shape: res["files"] for shape, res in results.items()},
        split_ms=split,
        restores=restores,
    )
    spark.stop()


if __name__ == "__main__":
    main()
