"""`regional run PIPELINE.py [--policy FILE] [--master URL] [--conf KEY=VALUE]...
[--checkpoint-dir DIR]`.

PIPELINE.py defines a module-level `pipeline` (a `regional.Pipeline`), and may define `faults`
(a `regional.runtime.spark.Faults`, for demos). Before the file is loaded, the checkpoint
directory is put in the environment as `REGIONAL_CHECKPOINT_DIR`, so a pipeline can place its
output next to it. The run restores automatically when the directory already holds checkpoints
of the job. One progress line per checkpoint (id, kind, units fresh/fallback, commit lag), a
summary at the end; Spark's own output goes to `<checkpoint dir>-spark.log` unless `--verbose`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys
import tempfile
from pathlib import Path

from regional.errors import GraphError
from regional.pipeline import Pipeline
from regional.policy import load_policy

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `run`."""
    parser = subparsers.add_parser(
        "run",
        help="run a pipeline on Spark with regional checkpoints",
        description="Run the module-level `pipeline` of PIPELINE.py on Spark.",
    )
    parser.add_argument("file", metavar="PIPELINE.py", type=Path, help="file defining `pipeline`")
    parser.add_argument("--policy", metavar="FILE", type=Path, help="TOML policy file")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    parser.add_argument(
        "--conf",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        type=_conf_pair,
        help="a Spark setting for the session, e.g. spark.executor.memory=512m or "
        "spark.executorEnv.AWS_ACCESS_KEY_ID=...; may be repeated",
    )
    parser.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="checkpoint root: a local directory or pyarrow.fs URI (default: the policy's "
        "checkpointing.dir, else a new temporary directory)",
    )
    parser.add_argument(
        "--max-checkpoints", type=int, default=None, help="stop after this many epochs"
    )
    parser.set_defaults(handler=run_pipeline)


def _conf_pair(text: str) -> tuple[str, str]:
    """`KEY=VALUE` of `--conf` (argparse reports a bad one as a usage error, exit 2)."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE (a Spark setting, e.g. spark.executor.memory=512m), got {text!r}"
        )
    return key.strip(), value


def _progress(report: object) -> None:
    r = report  # CheckpointReport
    fallback = ",".join(map(str, r.fallback_units)) or "-"  # type: ignore[attr-defined]
    line = (
        f"checkpoint {r.checkpoint_id:>4}  {r.kind:<8}  "  # type: ignore[attr-defined]
        f"fresh {r.fresh_units:>3}  fallback {fallback:<10}  "  # type: ignore[attr-defined]
        f"commit lag {r.commit_lag}  records {r.records_in:>7}  {r.seconds:5.2f} s"  # type: ignore[attr-defined]
    )
    if r.kind == "aborted":  # type: ignore[attr-defined]
        line += f"\n    {r.message}"  # type: ignore[attr-defined]
    print(line, flush=True)


def run_pipeline(args: argparse.Namespace) -> int:
    """Load the pipeline file and run it to the end; print progress and a summary."""
    policy = load_policy(args.policy, env=os.environ).policy
    root = args.checkpoint_dir or policy.checkpointing.dir or tempfile.mkdtemp(prefix="regional-")
    if not args.file.is_file():
        raise GraphError(f"pipeline file {args.file} does not exist; pass a Python file")
    os.environ["REGIONAL_CHECKPOINT_DIR"] = root
    namespace = runpy.run_path(str(args.file), run_name="regional_pipeline")
    pipeline = namespace.get("pipeline")
    if not isinstance(pipeline, Pipeline):
        raise GraphError(
            f"{args.file} defines no module-level `pipeline` (a regional.Pipeline); "
            "assign one, e.g. `pipeline = Pipeline('clicks')`"
        )
    from regional.runtime.session import spark_session
    from regional.runtime.spark import Faults, SparkRuntime

    log_file = None if args.verbose else f"{root.rstrip('/')}-spark.log"
    if log_file and "://" in root:
        log_file = os.path.join(tempfile.gettempdir(), "regional-spark.log")
    print(f"starting Spark ({args.master}); checkpoints under {root}", flush=True)
    spark = spark_session(
        args.master, verbose=args.verbose, log_file=log_file, extra=dict(args.conf)
    )
    plan = pipeline.regions()
    print(
        f"pipeline {pipeline.name!r}: {len(pipeline.vertices)} vertices, "
        f"{plan.num_regions} regions, {plan.num_units} fallback units",
        flush=True,
    )
    if plan.reason:
        print(f"note: {plan.reason}", flush=True)
    faults = namespace.get("faults")
    runtime = SparkRuntime(
        pipeline,
        spark,
        root=root,
        policy=policy,
        faults=faults if isinstance(faults, Faults) else None,
        progress=_progress,
    )
    summary = runtime.run(max_checkpoints=args.max_checkpoints)
    if summary.restored_from is not None:
        print(f"restored from checkpoint {summary.restored_from}")
    print(
        f"done in {summary.seconds:.1f} s: {summary.count('global')} global, "
        f"{summary.count('regional')} regional, {summary.count('aborted')} aborted checkpoints; "
        + ("job finished" if summary.finished else "job still running (stopped early)")
    )
    sys.stdout.flush()
    return 0
