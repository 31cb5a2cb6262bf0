"""Storage kept while one region is stuck on fallback, on the real runtime's files.

64 regions, each a stateful chain (generator -> per-key count -> Parquet table), run on Spark
(`local[2]`) for 51 checkpoints; unit 0 fails every checkpoint from 2 to 51, so it stays on its
state of checkpoint 1 for 50 checkpoints (`max-unit-fallbacks` and `max-consecutive-regional`
are set high enough to allow it). The run keeps every checkpoint (`num-retained` = 1000), then
the cleaner's planner (`cleaner.run.scan` -> `plan_retention`) is asked what to keep with
`num-retained` = 1 and 3 and the bytes are counted on the files the runtime wrote:

* everything stored: what keeping every checkpoint back to the stuck unit's state costs (Flink's
  FLIP-600 branch, where a fallback references the previous checkpoint, keeps this chain);
* whole-checkpoint retention: the newest N checkpoints plus every checkpoint they reference,
  kept whole (`RetentionPlan.whole_checkpoint_bytes`);
* file-level retention (ours): only the files the newest N checkpoints reference
  (`RetentionPlan.kept_bytes`); the plan is then carried out (`cleaner.run.execute`) and the
  bytes left on disk are measured.

A second run with the default `num-retained` = 3, cleaning after every checkpoint as the runtime
does, reports the bytes on disk at the end.

    .venv/bin/python -m benchmarks.bench_storage_kept [--quick]

Writes benchmarks/results/storage_kept.json.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from typing import Any

from benchmarks.keyed_job import count_per_key_job
from benchmarks.report import RESULTS, write_results
from cleaner.run import execute, scan
from metadata.storage import JobStorage
from regional.policy import load_policy
from regional.runtime.session import spark_session
from regional.runtime.spark import Faults, SparkRuntime

KEYS = 1000  # distinct keys per split: each unit's state is a count per key
STUCK_UNIT = 0


def run_job(spark: Any, args: argparse.Namespace, root: str, num_retained: int) -> JobStorage:
    """Run the job with `STUCK_UNIT` failing checkpoints 2..1+stuck; return its storage."""
    pipeline = count_per_key_job(
        "storage-kept", regions=args.regions, records=args.records, keys=KEYS, table=f"{root}/table"
    )
    policy = load_policy(
        env={},
        overrides={
            "checkpointing.num-retained": num_retained,
            "checkpointing.region.max-unit-fallbacks": args.stuck + 1,
            "checkpointing.region.max-consecutive-regional": "unlimited",
        },
    ).policy
    faults = Faults(units={(c, STUCK_UNIT): "fail" for c in range(2, 2 + args.stuck)})
    runtime = SparkRuntime(pipeline, spark, root=f"{root}/ckpt", policy=policy, faults=faults)
    summary = runtime.run(max_checkpoints=1 + args.stuck)
    regional = summary.count("regional")
    assert regional == args.stuck, f"expected {args.stuck} regional checkpoints, got {regional}"
    return runtime.storage


def on_disk(storage: JobStorage) -> int:
    return sum(f.size for f in storage.list_files())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regions", type=int, default=64)
    ap.add_argument("--records", type=int, default=2000, help="records per region and epoch")
    ap.add_argument("--stuck", type=int, default=50, help="checkpoints unit 0 stays on fallback")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="16 regions, stuck for 10 checkpoints")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    if args.quick:
        args.regions, args.stuck, args.records = 16, 10, 500
    work = tempfile.mkdtemp(prefix="regional-bench-kept-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    rows: list[dict[str, Any]] = []
    try:
        storage = run_job(spark, args, f"{work}/keep-all", num_retained=1000)
        stored = on_disk(storage)
        plans = {n: scan(storage, num_retained=n) for n in (3, 1)}  # before deleting anything
        for n, plan in plans.items():  # clean down to 3, then to 1: each plan's bytes on disk
            report = execute(scan(storage, num_retained=n), storage)
            assert report.ok, report
            rows.append(
                {
                    "num_retained": n,
                    "stored_bytes": stored,
                    "whole_checkpoint_bytes": plan.whole_checkpoint_bytes,
                    "file_level_bytes": plan.kept_bytes,
                    "on_disk_after_clean": on_disk(storage),
                    "retained_ids": list(plan.retained_ids),
                }
            )
        live = run_job(spark, args, f"{work}/live", num_retained=3)
        live_bytes = on_disk(live)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    kib = 1024
    print(
        f"\n{args.regions} regions, unit {STUCK_UNIT} on fallback for {args.stuck} checkpoints "
        f"({1 + args.stuck} checkpoints), master {args.master}: KiB of checkpoint storage\n"
    )
    print(
        "num-retained  all stored  whole-checkpoint  file-level (ours)  on disk after clean  ratio"
    )
    for r in rows:
        ratio = r["whole_checkpoint_bytes"] / r["file_level_bytes"]
        print(
            f"{r['num_retained']:>12}  {r['stored_bytes'] / kib:>10,.0f}  "
            f"{r['whole_checkpoint_bytes'] / kib:>16,.0f}  {r['file_level_bytes'] / kib:>17,.0f}"
            f"  {r['on_disk_after_clean'] / kib:>19,.0f}  {ratio:>5.2f}x"
        )
    print(
        f"\nrun cleaning after every checkpoint (num-retained = 3): "
        f"{live_bytes / kib:,.0f} KiB on disk at the end"
    )
    stem = "storage_kept-quick" if args.quick else "storage_kept"
    write_results(
        f"{args.out}/{stem}.json",
        master=args.master,
        config={k: v for k, v in vars(args).items() if k != "out"},
        rows=rows,
        live_num_retained_3_bytes=live_bytes,
    )
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
