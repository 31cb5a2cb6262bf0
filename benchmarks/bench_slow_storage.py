"""Slow checkpoint storage (FLINK-37375) on real Spark: uploading state inside the synchronous
snapshot step versus the asynchronous phase.

64 regions, each a stateful chain (generator -> per-key count -> Parquet table), packed into
one Spark task per core as always. Every state upload first waits an injected, seeded,
heavy-tailed latency (`regional.runtime.task.UploadLatency`: `--base` seconds, 5% of uploads
10x longer; the same uploads are slow in every mode). Modes:

* `sync`: the unit uploads and verifies its state inside its sync phase
  (`TaskEnv.upload_in_sync_phase`): the task waits for each upload before its next unit;
* `async, N threads`: the default: the sync phase only writes a local file; N upload threads
  upload it while the task runs its next units (`TaskEnv.upload_threads`).

Reported per mode: how long a unit is blocked in the snapshot's sync step (mean and p99, from
the `snapshot_blocked_s` of every ack), the checkpoint (epoch) duration (median, p99) and the
committed throughput. The first checkpoint (worker start-up) is left out.

    .venv/bin/python -m benchmarks.bench_slow_storage [--quick]

Writes benchmarks/results/slow_storage.json.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from benchmarks.keyed_job import count_per_key_job
from benchmarks.report import RESULTS, print_table, write_results
from regional.coordinator.messages import Ack, AckBatch, Answer
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.runtime.task import UploadLatency
from regional.sinks.parquet import read_table

KEYS = 200  # distinct keys per split: the per-unit state is a count per key


class AnswerLog(SparkRuntime):
    """The runtime, keeping every task answer it hands to the coordinator (benchmark only)."""

    answers: list[Answer]

    def _feed(
        self, answers: Sequence[Answer], arrived: Sequence[Answer | AckBatch] | None = None
    ) -> Any:
        self.answers.extend(answers)
        return super()._feed(answers, arrived)


def run_mode(
    spark: Any, name: str, args: argparse.Namespace, work: str, **env: Any
) -> dict[str, Any]:
    base = f"{work}/{name.replace(' ', '-').replace(',', '')}"
    pipeline = count_per_key_job(
        "slow-storage", regions=args.regions, records=args.records, keys=KEYS, table=f"{base}/table"
    )
    runtime = AnswerLog(pipeline, spark, root=f"{base}/ckpt")
    runtime.answers = []
    runtime.env = msgspec.structs.replace(runtime.env, **env)  # the benchmark's knobs
    summary = runtime.run(max_checkpoints=args.checkpoints + 1)
    measured = summary.checkpoints[1:]  # the first one pays for Python worker start-up
    acks = [
        a
        for a in runtime.answers
        if isinstance(a, Ack) and a.checkpoint_id > summary.checkpoints[0].checkpoint_id
    ]
    blocked = np.array([a.snapshot_blocked_s for a in acks])
    seconds = [c.seconds for c in measured]
    kinds = {c.kind for c in measured}
    committed = read_table(f"{base}/table").num_rows
    first = summary.checkpoints[0].records_in
    return {
        "mode": name,
        "checkpoints": len(measured),
        "kinds": sorted(kinds),
        "blocked_mean_ms": round(float(blocked.mean()) * 1000, 1),
        "blocked_p99_ms": round(float(np.percentile(blocked, 99)) * 1000, 1),
        "blocked_total_s": round(float(blocked.sum()), 2),
        "checkpoint_median_s": round(statistics.median(seconds), 3),
        "checkpoint_p99_s": round(float(np.percentile(seconds, 99)), 3),
        "committed_per_s": round((committed - first) / sum(seconds), 1),
    }


COLUMNS = (
    ("mode", "mode", "<18"),
    ("blocked_mean_ms", "blocked mean ms", ">15"),
    ("blocked_p99_ms", "blocked p99 ms", ">14"),
    ("checkpoint_median_s", "checkpoint p50 s", ">16"),
    ("checkpoint_p99_s", "checkpoint p99 s", ">16"),
    ("committed_per_s", "committed/s", ">11"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regions", type=int, default=64)
    ap.add_argument("--records", type=int, default=500, help="records per region and epoch")
    ap.add_argument("--checkpoints", type=int, default=20)
    ap.add_argument("--base", type=float, default=0.02, help="upload latency, seconds")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="16 regions, 5 checkpoints")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    if args.quick:
        args.regions, args.checkpoints, args.records = 16, 5, 100
    latency = UploadLatency(args.base, tail_probability=0.05, tail_factor=10.0, seed=args.seed)
    work = tempfile.mkdtemp(prefix="regional-bench-storage-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    modes: list[tuple[str, dict[str, Any]]] = [
        ("no latency, async", {}),
        ("sync", {"upload_latency": latency, "upload_in_sync_phase": True}),
        ("async, 2 threads", {"upload_latency": latency, "upload_threads": 2}),
        ("async, 8 threads", {"upload_latency": latency, "upload_threads": 8}),
    ]
    rows = []
    try:
        for name, env in modes:
            rows.append(run_mode(spark, name, args, work, **env))
            print_table(COLUMNS, rows[-1:])
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.regions} regions packed into {args.master}'s tasks, {args.records} records per "
        f"region and epoch, {args.checkpoints} checkpoints per mode; upload latency "
        f"{args.base * 1000:g} ms, 5% of uploads x10 (seed {args.seed})\n"
    )
    print_table(COLUMNS, rows)
    stem = "slow_storage-quick" if args.quick else "slow_storage"
    config = {k: v for k, v in vars(args).items() if k != "out"}
    write_results(f"{args.out}/{stem}.json", master=args.master, config=config, rows=rows)
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
