"""The record path in one process, no Spark, no storage: what the walker costs per unit and
per record, against plain Python doing the same user work, side by side in one run.

Shapes (regions x records per region and epoch):

* `forward`: generator -> map -> filter -> Parquet sink (the rows handed to the sink, not
  written), one unit per region, each unit's epoch alone (`run_unit_epoch`) and all of them in
  one task pass (`run_task_epoch`); plain Python: the same map and filter over the same records
  in a loop, per region.
* `keyed`: generator -> map -> key_by(split-scoped).process(count per key) -> sink, the same
  two ways (the state restored from and snapshotted to bytes every epoch, as the task does).
* `exchange` (the whole job in this process, storage included): generator -> map ->
  ``key_by(key, partitions=P)`` -> process(count per key) -> Parquet table, one
  `JobDriver.epoch()` at a time over the in-process dispatcher (2 tasks, as `local[2]`): the
  task side, the exchange's segments and commits, state files, metadata; plain Python: the
  same map and running count per key over the same records.

Prints microseconds per unit and per record of each variant and the ratio to plain Python.
The issue's targets: a forward unit of 10 records <= 50 us; a keyed stage after an exchange
<= 2x plain Python at 64 x 5,000.

    .venv/bin/python -m benchmarks.bench_record_path [--shapes 1024x10,64x5000] [--epochs 5]
        [--partitions 64] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from typing import Any

from metadata.model import SplitState, SubtaskState
from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import TaskUnit, run_task_epoch, run_unit_epoch
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def record(split: int, n: int) -> dict[str, int]:
    return {"split": split, "n": n, "key": n % 7}


def doubled(r: dict[str, int]) -> dict[str, int]:
    return {**r, "n": r["n"] * 2}


def kept(r: dict[str, int]) -> bool:
    return r["n"] % 3 != 1


def counted(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {**r, "count": c.value()}


def job(kind: str, regions: int, records: int) -> Pipeline:
    p = Pipeline(f"bench-{kind}", records_per_epoch=records)
    src = p.source(
        GeneratorSource(regions, record, records_per_split=10**9),
        parallelism=regions,
        name="src",
    )
    s = src.map(doubled, name="doubled").filter(kept, name="kept")
    if kind == "keyed":
        s = s.key_by(lambda r: r["key"]).process(counted, name="count")
    s.sink(ParquetSink("/nonexistent/bench"), name="out")
    return p


def exchange_driver(work: str, regions: int, records: int, partitions: int) -> JobDriver:
    """The exchange job over the in-process dispatcher (2 tasks), started."""
    p = Pipeline("bench-exchange", records_per_epoch=records)
    src = p.source(
        GeneratorSource(regions, record, records_per_split=10**9), parallelism=regions, name="src"
    )
    (
        src.map(doubled, name="doubled")
        .filter(kept, name="kept")
        .key_by(record_key, partitions=partitions, name="by-key")
        .process(counted, name="count")
        .sink(ParquetSink(f"{work}/table"), name="out")
    )
    root = f"{work}/ckpt"
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "600 s"}}).policy
    env = TaskEnv(root, "bench", p, unit_timeout=600)
    driver = JobDriver(
        p, InProcessDispatcher(env, tasks=2), storage=JobStorage(root, "bench"), policy=policy
    )
    driver.start()
    return driver


def record_key(r: dict[str, int]) -> int:
    return r["key"]


def plain(kind: str, regions: int, records: int, epoch: int, counts: list[dict[int, int]]) -> int:
    """The same user work in plain Python: per region, its records mapped, filtered (and
    counted per key in a dict kept between epochs)."""
    out = 0
    for s in range(regions):
        rows = []
        for n in range(epoch * records, (epoch + 1) * records):
            r = doubled(record(s, n))
            if not kept(r):
                continue
            if kind == "keyed":
                c = counts[s][r["key"]] = counts[s].get(r["key"], 0) + 1
                r = {**r, "count": c}
            rows.append(r)
        out += len(rows)
    return out


class Units:
    """The units of a job from one epoch to the next: positions and state bytes carried."""

    def __init__(self, p: Pipeline, regions: int) -> None:
        self.p = p
        self.regions = regions
        self.vertices = list(p.topological_order())
        self.positions: dict[int, tuple[SplitState, ...]] = {u: () for u in range(regions)}
        self.blobs: dict[tuple[int, str], bytes] = {}
        self.checkpoint = 0

    def units(self) -> list[TaskUnit]:
        self.checkpoint += 1
        first = self.checkpoint == 1
        blobs = self.blobs

        def state_of(s: SubtaskState) -> tuple[bytes, str]:
            return blobs.get((s.index, s.vertex_id), b""), f"state of {s.vertex_id}"

        return [
            TaskUnit(
                {
                    v: SubtaskState(v, u, u, split_states=self.positions[u] if v == "src" else ())
                    for v in self.vertices
                },
                (("src", u, f"g{u}"),) if first else (),
                (),
                state_of,
            )
            for u in range(self.regions)
        ]

    def keep(self, epochs: list[UnitEpoch]) -> int:
        rows = 0
        for u, e in enumerate(epochs):
            self.positions[u] = e.split_states.get("src", ())
            self.blobs.update(((u, v), b) for v, b in e.snapshots.items())
            rows += sum(len(b) for b in e.sink_batches["out"])
        return rows


def alone(units: Units) -> int:
    epochs = [
        run_unit_epoch(
            units.p,
            u.restore,
            checkpoint_id=units.checkpoint,
            new_splits=u.new_splits,
            ended=(),
            state_of=u.state_of,
            now_ms=0,
        )
        for u in units.units()
    ]
    return units.keep(epochs)


def together(units: Units) -> int:
    epochs = run_task_epoch(units.p, units.units(), checkpoint_id=units.checkpoint + 1)
    assert epochs is not None
    return units.keep(epochs)


def measure_exchange(regions: int, records: int, partitions: int, epochs: int) -> dict[str, float]:
    """`JobDriver.epoch()` of the exchange job against plain Python, interleaved. The first
    epoch of the job only writes (its readers read from the next one on): two warm-up epochs."""
    with tempfile.TemporaryDirectory() as work:
        driver = exchange_driver(work, regions, records, partitions)
        counts: list[dict[int, int]] = [{} for _ in range(regions)]
        seconds: dict[str, list[float]] = {"epoch": [], "plain": []}
        for e in range(epochs + 2):
            for name in ("epoch", "plain") if e % 2 else ("plain", "epoch"):
                started = time.perf_counter()
                if name == "epoch":
                    driver.epoch()
                else:
                    plain("keyed", regions, records, e, counts)
                if e >= 2:
                    seconds[name].append(time.perf_counter() - started)
        driver.cleaning.close()
        driver.lease.release()
    return {k: statistics.median(v) for k, v in seconds.items()}


def measure(kind: str, regions: int, records: int, epochs: int) -> dict[str, float]:
    runs: dict[str, Callable[[int], int]] = {}
    walkers = {"alone": Units(job(kind, regions, records), regions)}
    walkers["pass"] = Units(job(kind, regions, records), regions)
    counts: list[dict[int, int]] = [{} for _ in range(regions)]
    runs["alone"] = lambda e: alone(walkers["alone"])
    runs["pass"] = lambda e: together(walkers["pass"])
    runs["plain"] = lambda e: plain(kind, regions, records, e, counts)
    seconds: dict[str, list[float]] = {k: [] for k in runs}
    rows: dict[str, int] = {}
    names = list(runs)
    for e in range(epochs + 1):  # the first epoch warms up
        for name in names[e % len(names) :] + names[: e % len(names)]:
            started = time.perf_counter()
            rows[name] = runs[name](e)
            if e:
                seconds[name].append(time.perf_counter() - started)
    assert rows["alone"] == rows["pass"] == rows["plain"], rows
    return {k: statistics.median(v) for k, v in seconds.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="1024x10,64x5000", help="REGIONSxRECORDS, comma-separated")
    ap.add_argument("--epochs", type=int, default=5, help="measured epochs (after 1 warm-up)")
    ap.add_argument("--partitions", type=int, default=64, help="the exchange's partitions")
    ap.add_argument("--quick", action="store_true", help="2 measured epochs, 256x10 and 16x2000")
    args = ap.parse_args()
    if args.quick:
        args.epochs, args.shapes, args.partitions = 2, "256x10,16x2000", 16
    print(f"{'job':8} {'shape':10} {'variant':6} {'us/unit':>9} {'us/record':>10} {'x plain':>8}")
    for kind in ("forward", "keyed"):
        for shape in args.shapes.split(","):
            regions, records = (int(x) for x in shape.split("x"))
            got = measure(kind, regions, records, args.epochs)
            for variant in ("alone", "pass", "plain"):
                s = got[variant]
                print(
                    f"{kind:8} {shape:10} {variant:6} {s / regions * 1e6:9.1f} "
                    f"{s / (regions * records) * 1e6:10.2f} {s / got['plain']:8.2f}"
                )
    for shape in args.shapes.split(","):
        regions, records = (int(x) for x in shape.split("x"))
        got = measure_exchange(regions, records, args.partitions, args.epochs)
        for variant in ("epoch", "plain"):
            s = got[variant]
            print(
                f"{'exchange':8} {shape:10} {variant:6} {s / regions * 1e6:9.1f} "
                f"{s / (regions * records) * 1e6:10.2f} {s / got['plain']:8.2f}"
            )


if __name__ == "__main__":
    main()
