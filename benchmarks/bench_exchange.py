"""A keyed job across a durable exchange under partial failures: regional vs global checkpoints.

One job, one failure schedule, every mode in the same run (`local[2]`):

    generator (16 splits, 16 subtasks) -> key_by(key, partitions=16) -> count per key -> Parquet

The exchange makes two stages of 16 fallback units each (units 0-15 upstream, 16-31
downstream). Every mode gets `--checkpoints` checkpoint attempts and the same schedule: each
(checkpoint, unit) pair, for all 32 units, fails with probability p (seeded; `Faults` "fail",
an exception after the unit's sources read). Modes:

* `fault-free`: regional checkpoints, no failure (the floor: what a hop costs by itself);
* `regional`: the default policy (a failing unit falls back, `max-consecutive-regional` = 10);
* `global`: the same job with ``checkpointing.region.enabled = false``: one failure aborts the
  checkpoint, every unit throws its epoch away.

`tolerable-failed-checkpoints` is 1,000,000 so that the global job runs to the end.

Each upstream split produces `--records` records per epoch (`GeneratorSource(max_per_read=)`);
readers may read `--headroom` times that per epoch, so a reader that fell back (or whose
upstream did) catches up instead of lagging for good. Record `n` of split `s` has key
``(n * 7919 + s) % keys``; the sink rows carry (split, n, key, count).

**Measured.** Checkpoints completed / triggered (`CheckpointEvent`s of the run); committed
records per second (rows listed by the sink's commit records / wall seconds of the run); the
latency of every committed record, in epochs and in seconds:

* *read*: the source logs every read (split, first and last record, wall time;
  `bench_partial_failures.log_read`). A record's read is its **first** read (a unit that falls
  back or an aborted checkpoint reads it again later: that delay is part of its latency). Epochs
  run one after another, so the read's epoch is the checkpoint with the latest trigger time at
  or before the read (`CheckpointEvent.trigger_time_ms`).
* *visible*: the sink row's commit record (`_commits/<user>/<group>/<checkpoint>.json`) names
  the checkpoint whose commit made it visible, and its mtime is when.

Latency in epochs = that checkpoint id minus the read's; in seconds = the record's mtime minus
the read time. A job without an exchange commits a record in the epoch that read it (0 epochs);
each exchange hop adds one epoch (published by the commit of Y, read in Y + 1), so the
fault-free mode measures one hop exactly and the others add what failures cost. This job has one
hop: the latency printed is per hop. Correctness is checked on the committed rows: every (split,
n) at most once, and per key the counts 1..m, each once.

    .venv/bin/python -m benchmarks.bench_exchange [--quick]

Writes benchmarks/results/exchange.json (exchange-quick.json with --quick).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import glob
import json
import os
import shutil
import statistics
import tempfile
import time
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from benchmarks.bench_partial_failures import (
    INJECTED,
    TOLERABLE,
    FirstReads,
    LoggedGenerator,
    percentile,
    schedule,
)
from benchmarks.report import RESULTS, print_table, write_results
from metadata.events import CheckpointEvent
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.faults import Faults
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

SCHEMA = pa.schema([("split", pa.int64()), ("n", pa.int64()), ("key", pa.int64())])
HOPS = 1  # exchanges between the source and the sink

#: mode -> (whether the failure schedule applies, policy overrides)
MODES: dict[str, tuple[bool, dict[str, Any]]] = {
    "fault-free": (False, {}),
    "regional": (True, {}),
    "global": (True, {"checkpointing.region.enabled": False}),
}


# --- the job --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OriginRecords:
    """Record `n` of split `split`: its origin and key ``(n * 7919 + split) % keys``."""

    keys: int

    def __call__(self, split: int, n: int) -> dict[str, int]:
        return {"split": split, "n": n, "key": (n * 7919 + split) % self.keys}


def record_key(record: dict[str, int]) -> int:
    return record["key"]


def count_per_key(ctx: Any, record: dict[str, int]) -> Any:
    """Records of this key so far (key-scoped value state), with the record's origin."""
    count = ctx.value_state("count", 0)
    count.update(count.value() + 1)
    yield {**record, "count": count.value()}


def keyed_job(name: str, args: argparse.Namespace, log: str, table: str) -> Pipeline:
    pipeline = Pipeline(name, records_per_epoch=args.records * args.headroom)
    inner = GeneratorSource(
        args.upstream, OriginRecords(args.keys), max_per_read=args.records, schema=SCHEMA
    )
    src = LoggedGenerator(args.upstream, log, inner=inner)
    (
        pipeline.source(src, parallelism=args.upstream, name="gen")
        .key_by(record_key, partitions=args.partitions, name="by-key")
        .process(count_per_key, name="count")
        .sink(ParquetSink(table), name="out")
    )
    return pipeline


# --- a run ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Run:
    mode: str
    seconds: float
    events: list[CheckpointEvent]
    commits: list[tuple[int, float, list[str]]]  # (checkpoint id, commit time, files)
    read_log: str


def run_mode(
    spark: Any,
    mode: str,
    faults: frozenset[tuple[int, int]],
    overrides: dict[str, Any],
    args: argparse.Namespace,
    work: str,
) -> Run:
    base = f"{work}/{mode}"
    assert not os.path.exists(base), f"{base} exists: every run starts from nothing"
    log, table = f"{base}.reads", f"{base}/table"
    policy = load_policy(
        env={},
        overrides={"checkpointing.tolerable-failed-checkpoints": TOLERABLE, **overrides},
    ).policy
    runtime = SparkRuntime(
        keyed_job(mode, args, log, table),
        spark,
        root=f"{base}/ckpt",
        policy=policy,
        faults=Faults(units=dict.fromkeys(faults, "fail")),
    )
    started = time.time()
    summary = runtime.run(max_checkpoints=args.checkpoints)
    seconds = time.time() - started
    for event in summary.checkpoints:
        for unit, cause in event.causes.items():
            if INJECTED not in cause:
                raise RuntimeError(
                    f"{mode}: checkpoint {event.checkpoint_id}: unit {unit} failed without an "
                    f"injected fault: {cause}"
                )
    user = runtime.committers["out"].commit_user
    commits = []
    # records are grouped by 1,000 ids: _commits/<user>/<group>/<id>.json (regional.sinks.parquet)
    for path in glob.glob(f"{table}/_commits/{user}/*/*.json"):
        with open(path) as f:
            record = json.load(f)
        files = [f"{table}/{x}" for x in record["files"]]
        commits.append((int(record["identifier"]), os.stat(path).st_mtime, files))
    return Run(mode, seconds, summary.checkpoints, sorted(commits), log)


# --- measuring ------------------------------------------------------------------------------


def first_read_time(reads: FirstReads, split: int, n: int) -> float:
    """When record `n` of `split` was first read."""
    ranges = reads.ranges[split]
    lo, hi, t = ranges[bisect.bisect_right(ranges, (n, float("inf"), 0.0)) - 1]
    assert lo <= n < hi, f"record {n} of split {split} was committed but never read"
    return t


def measure(run: Run) -> dict[str, Any]:
    reads = FirstReads(run.read_log)
    triggers = [e.trigger_time_ms / 1000 for e in run.events]
    ids = [e.checkpoint_id for e in run.events]
    epochs: collections.Counter[int] = collections.Counter()
    seconds: list[float] = []
    seen: set[tuple[int, int]] = set()
    counts: dict[int, list[int]] = collections.defaultdict(list)
    for checkpoint, committed_at, files in run.commits:
        for file in files:
            rows = pq.read_table(file, columns=["split", "n", "key", "count"]).to_pydict()
            for split, n, key, count in zip(
                rows["split"], rows["n"], rows["key"], rows["count"], strict=True
            ):
                assert (split, n) not in seen, f"{run.mode}: record {n} of split {split} twice"
                seen.add((split, n))
                counts[key].append(count)
                read = first_read_time(reads, split, n)
                read_epoch = ids[bisect.bisect_right(triggers, read) - 1]
                epochs[checkpoint - read_epoch] += 1
                seconds.append(committed_at - read)
    for key, got in counts.items():  # exactly once: per key the counts 1..m, each once
        assert sorted(got) == list(range(1, len(got) + 1)), f"{run.mode}: key {key}: {got[:9]}"
    committed = len(seen)
    completed = sum(1 for e in run.events if e.kind in ("regional", "global"))
    by_epochs = [(float(k), v) for k, v in sorted(epochs.items())] or [(0.0, 1)]
    by_seconds = [(s, 1) for s in seconds] or [(0.0, 1)]
    return {
        "mode": run.mode,
        "triggered": len(run.events),
        "completed": completed,
        "regional": sum(1 for e in run.events if e.kind == "regional"),
        "done": f"{completed}/{len(run.events)}",
        "aborted_by_rule": dict(
            collections.Counter(str(e.abort_rule) for e in run.events if e.kind == "aborted")
        ),
        "seconds": round(run.seconds, 2),
        "epoch_s": round(run.seconds / max(1, len(run.events)), 3),
        "records_read": sum(hi - lo for rs in reads.ranges.values() for lo, hi, _ in rs),
        "records_committed": committed,
        "committed_per_s": round(committed / run.seconds, 1),
        "latency_epochs": {str(k): v for k, v in sorted(epochs.items())},
        "p50_epochs": percentile(by_epochs, 50),
        "p99_epochs": percentile(by_epochs, 99),
        "mean_epochs": round(sum(k * v for k, v in by_epochs) / sum(v for _, v in by_epochs), 2),
        "p50_s": round(percentile(by_seconds, 50), 3),
        "p99_s": round(percentile(by_seconds, 99), 3),
        "mean_s": round(statistics.fmean(seconds), 3) if seconds else 0.0,
    }


COLUMNS = (
    ("mode", "mode", "<10"),
    ("done", "done/trig", ">9"),
    ("regional", "regional", ">8"),
    ("seconds", "seconds", ">7"),
    ("epoch_s", "s/epoch", ">7"),
    ("records_read", "read", ">7"),
    ("records_committed", "committed", ">9"),
    ("committed_per_s", "committed/s", ">11"),
    ("p50_epochs", "p50 ep", ">6"),
    ("p99_epochs", "p99 ep", ">6"),
    ("mean_epochs", "mean ep", ">7"),
    ("p50_s", "p50 s", ">6"),
    ("p99_s", "p99 s", ">6"),
    ("mean_s", "mean s", ">6"),
)

RATIOS = (
    ("completed", "checkpoints completed"),
    ("committed_per_s", "committed records/s"),
    ("mean_epochs", "mean latency (epochs)"),
    ("p50_s", "p50 latency (s)"),
    ("p99_s", "p99 latency (s)"),
    ("mean_s", "mean latency (s)"),
)


def ratios(rows: list[dict[str, Any]]) -> dict[str, float | None]:
    """regional / global for each of `RATIOS` (None where global is 0)."""
    by_mode = {r["mode"]: r for r in rows}
    regional, global_ = by_mode["regional"], by_mode["global"]
    return {
        key: round(regional[key] / global_[key], 2) if global_[key] else None for key, _ in RATIOS
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", type=int, default=16, help="upstream subtasks (splits)")
    ap.add_argument("--partitions", type=int, default=16, help="downstream subtasks")
    ap.add_argument("--records", type=int, default=200, help="records per split and epoch")
    ap.add_argument("--headroom", type=int, default=4, help="reader budget / --records")
    ap.add_argument("--keys", type=int, default=4096)
    ap.add_argument("--checkpoints", type=int, default=40)
    ap.add_argument("--p", type=float, default=0.05, help="per unit and checkpoint")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="4 x 4 units, 8 checkpoints")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    if args.quick:
        args.upstream, args.partitions, args.checkpoints, args.records = 4, 4, 8, 100
    units = args.upstream + args.partitions
    faults = schedule(args.seed, args.p, args.checkpoints, units)
    work = tempfile.mkdtemp(prefix="regional-bench-exchange-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    rows = []
    try:
        warm = argparse.Namespace(**{**vars(args), "checkpoints": 3})
        run_mode(spark, "warm-up", frozenset(), {}, warm, work)  # Python workers, unmeasured
        for mode, (failing, overrides) in MODES.items():
            run = run_mode(spark, mode, faults if failing else frozenset(), overrides, args, work)
            rows.append(measure(run))
            print_table(COLUMNS, rows[-1:])
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.upstream} upstream x {args.partitions} downstream units, p = {args.p} per unit "
        f"and checkpoint ({len(faults)} faults), {args.records} records per split and epoch, "
        f"{args.checkpoints} checkpoints, {args.keys} keys, master {args.master}, seed "
        f"{args.seed}; latency per hop ({HOPS} exchange), first read -> visible in the sink\n"
    )
    print_table(COLUMNS, rows)
    ratio = ratios(rows)
    print("\nregional / global: " + ", ".join(f"{t} {ratio[k]}" for k, t in RATIOS))
    stem = "exchange-quick" if args.quick else "exchange"
    write_results(
        f"{args.out}/{stem}.json",
        master=args.master,
        config={k: v for k, v in vars(args).items() if k != "out"},
        faults=len(faults),
        rows=rows,
        ratios_regional_over_global=ratio,
    )
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
