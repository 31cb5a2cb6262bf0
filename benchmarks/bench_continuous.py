"""Continuous mode against micro-epoch mode on Spark, side by side in one run (local Spark).

1. **Epoch round trip**: the dispatch part of `epoch()` (`EpochTiming.dispatch_s`: work sent,
   units run, answers back on the driver) on a small job (16 units x 1 record per epoch:
   generator -> map -> running count per split -> Parquet), p50 and p99 over the epochs, for
   the continuous dispatcher (long-lived tasks, work over the driver channel) and the
   `SparkDispatcher` (a Spark job per epoch), at 2 and 16 tasks, in alternating blocks.
2. **Pipelined `run()`**: the wall time per epoch of `run(max_checkpoints=N)` on the
   `bench_epoch` job at 1,024 x 10 and 64 x 5,000 (units x records per epoch), continuous
   against micro-epoch against plain Spark (the same Python work, a Spark job per epoch, no
   checkpoints), one task per core, in rounds that rotate the order.

Long-lived tasks each hold a Spark slot, so 16 tasks need a master with 16 slots
(`local[16]`, the default: slots are threads; the Python work still shares the machine's cores).

    .venv/bin/python -m benchmarks.bench_continuous [--epochs 40] [--rounds 3]
        [--run-epochs 6] [--shapes 1024x10,64x5000] [--master local[16]] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from typing import Any

from benchmarks.bench_epoch import map_job, plain_epoch
from benchmarks.report import print_table
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime

MODES = ("continuous", "micro-epoch")


def _runtime(spark: Any, work: str, name: str, mode: str, units: int, records: int,
             tasks: int) -> SparkRuntime:  # fmt: skip
    """The `bench_epoch` job in `mode` (not started: continuous tasks would hold their slots)."""
    job = map_job(name, regions=units, records=records, table=f"{work}/{name}")
    return SparkRuntime(job, spark, root=f"{work}/ckpt-{name}", tasks=tasks, mode=mode)


def _release(rt: SparkRuntime) -> None:
    rt.close()
    rt.cleaning.close()
    rt.lease.release()


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def round_trips(spark: Any, work: str, tasks: int, epochs: int) -> dict[str, list[float]]:
    """Seconds of each epoch's dispatch, per mode, in alternating blocks of `epochs` / 2 (each
    after 2 warm-up epochs). Not epoch by epoch: the long-lived tasks hold `tasks` slots, so
    the other mode's jobs would wait for them; a block's end stops them (`close`)."""
    rts = {m: _runtime(spark, work, f"rt-{m}-{tasks}", m, 16, 1, tasks) for m in MODES}
    out: dict[str, list[float]] = {m: [] for m in MODES}
    try:
        for block in range(2):
            for mode in MODES if block % 2 else MODES[::-1]:
                rt = rts[mode]
                rt.start()  # continuous: the tasks connect again
                for epoch in range(2 + epochs // 2):
                    rt.epoch()
                    assert rt.last_timing is not None
                    if epoch >= 2:
                        out[mode].append(rt.last_timing.dispatch_s)
                rt.close()
    finally:
        for rt in rts.values():
            _release(rt)
    return out


def pipelined(
    spark: Any, work: str, units: int, records: int, tasks: int, epochs: int, rounds: int
) -> dict[str, float]:
    """Median seconds per epoch of `run(max_checkpoints=epochs)` per mode, and of as many
    plain Spark epochs in a row, over `rounds` rounds whose order rotates."""
    shape = f"{units}x{records}"
    plain_dir = f"{work}/plain-{shape}"
    os.makedirs(plain_dir)
    rts = {m: _runtime(spark, work, f"run-{m}-{shape}", m, units, records, tasks) for m in MODES}
    steps = [*MODES, "plain"]
    per_epoch: dict[str, list[float]] = {s: [] for s in steps}
    plain_epochs = 0
    try:
        for rt in rts.values():  # a warm-up epoch each
            rt.start()
            rt.epoch()
        plain_epoch(spark.sparkContext, units, records, tasks, plain_epochs, plain_dir)
        plain_epochs += 1
        for r in range(rounds):
            for step in steps[r % 3 :] + steps[: r % 3]:
                if step == "plain":
                    started = time.perf_counter()
                    for _ in range(epochs):
                        plain_epoch(spark.sparkContext, units, records, tasks, plain_epochs,
                                    plain_dir)  # fmt: skip
                        plain_epochs += 1
                else:
                    rts[step].start()  # run() stops the long-lived tasks: connect them first
                    started = time.perf_counter()
                    summary = rts[step].run(max_checkpoints=epochs)
                    assert len(summary.checkpoints) == epochs
                per_epoch[step].append((time.perf_counter() - started) / epochs)
    finally:
        for rt in rts.values():
            _release(rt)
    return {s: statistics.median(v) for s, v in per_epoch.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=40, help="round-trip epochs per mode")
    ap.add_argument("--run-epochs", type=int, default=6, help="epochs per run() round")
    ap.add_argument("--rounds", type=int, default=3, help="run() rounds per mode")
    ap.add_argument("--shapes", default="1024x10,64x5000", help="UNITSxRECORDS for run()")
    ap.add_argument("--task-counts", default="2,16", help="task counts of the round trip")
    ap.add_argument("--master", default="local[16]")
    ap.add_argument("--quick", action="store_true", help="10 epochs, 2 rounds of 3")
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.rounds, args.run_epochs = 10, 2, 3
    work = tempfile.mkdtemp(prefix="regional-bench-continuous-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    task_counts = [int(t) for t in args.task_counts.split(",")]
    trips = {t: round_trips(spark, work, t, args.epochs) for t in task_counts}
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    runs = {f"{u}x{n}": pipelined(spark, work, u, n, 2, args.run_epochs, args.rounds)
            for u, n in shapes}  # fmt: skip
    print(f"\nSpark master {args.master}; {os.cpu_count()} CPUs")
    print(f"\n1. epoch round trip (dispatch of epoch(), 16 units x 1 record), {args.epochs} "
          "epochs in 2 blocks per mode, each after 2 warm-up epochs, ms")  # fmt: skip
    rows = []
    for tasks, got in trips.items():
        micro = _quantile(got["micro-epoch"], 0.5)
        for mode in MODES:
            rows.append(
                {
                    "tasks": tasks,
                    "mode": mode,
                    "p50": f"{_quantile(got[mode], 0.5) * 1000:.1f}",
                    "p99": f"{_quantile(got[mode], 0.99) * 1000:.1f}",
                    "ratio": f"{_quantile(got[mode], 0.5) / micro:.2f}",
                }
            )
    print_table([("tasks", "tasks", ">5"), ("mode", "mode", "<12"), ("p50", "p50 ms", ">8"),
                 ("p99", "p99 ms", ">8"), ("ratio", "p50 vs micro", ">13")], rows)  # fmt: skip
    print(f"\n2. pipelined run(), 2 tasks: median s per epoch over {args.rounds} rounds of "
          f"{args.run_epochs} epochs (after a warm-up epoch)")  # fmt: skip
    rows = []
    for shape, m in runs.items():
        for step in (*MODES, "plain"):
            rows.append(
                {
                    "shape": shape,
                    "variant": step if step != "plain" else "plain Spark",
                    "s": f"{m[step]:.3f}",
                    "vs_plain": f"{m[step] / m['plain']:.2f}",
                    "vs_micro": f"{m[step] / m['micro-epoch']:.2f}",
                }
            )
    print_table([("shape", "shape", "<9"), ("variant", "variant", "<12"), ("s", "s/epoch", ">8"),
                 ("vs_plain", "vs plain", ">9"), ("vs_micro", "vs micro", ">9")], rows)  # fmt: skip


if __name__ == "__main__":
    main()
