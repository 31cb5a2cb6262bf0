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

    .venv/bin/python benchmarks/storage_kept.py [--quick]

Writes benchmarks/results/storage_kept.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
from typing import Any

# benchmarks/metadata.py (another benchmark) would shadow the `metadata` package
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

from cleaner.run import execute, scan  # noqa: E402
from metadata.storage import JobStorage  # noqa: E402
from regional.pipeline import Pipeline  # noqa: E402
from regional.policy import load_policy  # noqa: E402
from regional.runtime.session import spark_session  # noqa: E402
from regional.runtime.spark import Faults, SparkRuntime  # noqa: E402
from regional.sinks.parquet import ParquetSink  # noqa: E402
from regional.sources.generator import GeneratorSource  # noqa: E402

RESULTS = os.path.join(_HERE, "results")
KEYS = 1000  # distinct keys per split: each unit's state is a count per key
STUCK_UNIT = 0


def count_per_key(ctx: Any, record: dict[str, int]) -> Any:
    n = ctx.value_state("n", 0)
    n.update(n.value() + 1)
    yield {"key": record["key"], "n": n.value()}


def make_record(split: int, n: int) -> dict[str, int]:
    return {"key": (n * 7919 + split) % KEYS, "n": n}


def record_key(record: dict[str, int]) -> int:
    return record["key"]


def run_job(spark: Any, args: argparse.Namespace, root: str, num_retained: int) -> JobStorage:
    """Run the job with `STUCK_UNIT` failing checkpoints 2..1+stuck; return its storage."""
    pipeline = Pipeline("storage-kept", records_per_epoch=args.records)
    src = pipeline.source(GeneratorSource(args.regions, make_record), parallelism=args.regions)
    src.key_by(record_key).process(count_per_key, name="count").sink(
        ParquetSink(f"{root}/table"), name="out"
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
    rows = []
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
    os.makedirs(args.out, exist_ok=True)
    stem = "storage_kept-quick" if args.quick else "storage_kept"
    with open(f"{args.out}/{stem}.json", "w") as f:
        json.dump(
            {
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "master": args.master,
                },
                "config": {k: v for k, v in vars(args).items() if k != "out"},
                "rows": rows,
                "live_num_retained_3_bytes": live_bytes,
            },
            f,
            indent=1,
        )
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
