"""`regional run PIPELINE.py [--policy FILE] [--master URL] [--conf KEY=VALUE]...
[--checkpoint-dir DIR] ...`.

PIPELINE.py defines a module-level `pipeline` (a `regional.Pipeline`), and may define `faults`
(a `regional.runtime.faults.Faults`, for demos). Before the file is loaded, the checkpoint
directory is put in the environment as `REGIONAL_CHECKPOINT_DIR`, so a pipeline can place its
output next to it. The run restores automatically when the directory already holds checkpoints
of the job (with the pipeline's current parallelism); `--from PATH [--mode claim|no-claim]`
restores a given checkpoint or savepoint into an empty job root instead. With
`--stop-with-savepoint` the run ends with a savepoint: after `--max-checkpoints` epochs, or when
the process gets SIGTERM or Ctrl-C (the running epoch finishes first). The driver is this
process, so a savepoint is taken by the run itself; there is no separate command talking to it.
One progress line per checkpoint (id, kind, units fresh/fallback, commit lag), a summary at the
end; Spark's own output goes to `<checkpoint dir>-spark.log` unless `--verbose`.
"""

from __future__ import annotations

import argparse
import os
import runpy
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metadata.events import CheckpointEvent, Outcome
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
    parser.add_argument(
        "--job-id", help="the job's directory under the checkpoint root (default: pipeline name)"
    )
    parser.add_argument(
        "--from",
        dest="restore_from",
        metavar="PATH",
        help="restore this checkpoint or savepoint (a sp-<id> or chk-<id> directory, or its "
        "_metadata; local or URI) into an empty job root",
    )
    parser.add_argument(
        "--mode",
        choices=("claim", "no-claim"),
        help="with --from: claim copies the state into the job root as its own checkpoint; "
        "no-claim stages it for a first, global checkpoint only (default: the policy's "
        "restore.mode). The restored files are never modified",
    )
    parser.add_argument(
        "--allow-dropped-state",
        action="store_true",
        help="restore even if some state cannot be mapped onto the pipeline (a removed vertex, "
        "a changed max parallelism); that state is dropped",
    )
    parser.add_argument(
        "--allow-fresh-start",
        action="store_true",
        help="start from nothing when the job root holds checkpoints but none can be restored "
        "(their output may be written to the sinks again); refused without it",
    )
    parser.add_argument(
        "--stop-with-savepoint",
        action="store_true",
        help="end with a savepoint under <job root>/savepoints/: after --max-checkpoints, or on "
        "SIGTERM / Ctrl-C",
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


def _progress(r: CheckpointEvent) -> None:
    """One line per checkpoint outcome (and the abort's explanation)."""
    fallback = ",".join(map(str, r.fallback_units)) or "-"
    line = (
        f"checkpoint {r.checkpoint_id:>4}  {r.kind:<8}  "
        f"fresh {r.fresh_units:>3}  fallback {fallback:<10}  "
        f"commit lag {r.commit_lag}  records {r.records_in:>7}  {r.seconds:5.2f} s"
    )
    if r.kind == Outcome.ABORTED:
        line += f"\n    {r.message}"
    print(line, flush=True)


def run_pipeline(args: argparse.Namespace) -> int:
    """Load the pipeline file and run it to the end; print progress and a summary."""
    policy = load_policy(args.policy, env=os.environ).policy
    root = args.checkpoint_dir or policy.checkpointing.dir or tempfile.mkdtemp(prefix="regional-")
    if args.mode and not args.restore_from:
        raise GraphError("--mode applies to a restore: give --from PATH too")
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
    from metadata.lease import ensure_free
    from metadata.storage import JobStorage
    from regional.restore import open_restore_source
    from regional.runtime.faults import Faults
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    storage = JobStorage(root, args.job_id or pipeline.name)
    ensure_free(storage, clock=lambda: int(time.time() * 1000))  # before Spark starts
    if args.restore_from:  # bad restore input fails before Spark starts
        open_restore_source(storage, args.restore_from)

    log_file = None if args.verbose else f"{root.rstrip('/')}-spark.log"
    if log_file and "://" in root:
        log_file = os.path.join(tempfile.gettempdir(), "regional-spark.log")
    if log_file:  # next to a checkpoint dir that may not exist yet
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
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
        job_id=args.job_id,
        restore_from=args.restore_from,
        restore_mode=args.mode,
        allow_dropped_state=args.allow_dropped_state,
        allow_fresh_start=args.allow_fresh_start,
    )
    stop = _on_stop_signals(runtime.request_stop) if args.stop_with_savepoint else {}
    try:
        summary = runtime.run(
            max_checkpoints=args.max_checkpoints, stop_with_savepoint=args.stop_with_savepoint
        )
    finally:
        for signum, handler in stop.items():
            signal.signal(signum, handler)
    if summary.restored_from is not None:
        where = f" ({summary.restored_location})" if summary.restored_location else ""
        print(f"restored from checkpoint {summary.restored_from}{where}")
    for note in summary.restore_notes:
        print(f"restore: {note}")
    if summary.savepoint is not None:
        print(f"savepoint: {summary.savepoint}")
    print(
        f"done in {summary.seconds:.1f} s: {summary.count(Outcome.GLOBAL)} global, "
        f"{summary.count(Outcome.REGIONAL)} regional, {summary.count(Outcome.ABORTED)} aborted "
        "checkpoints"
        + (f", {n} savepoint" if (n := summary.count(Outcome.SAVEPOINT)) else "")
        + "; "
        + (
            "job finished"
            if summary.finished
            else "job stopped with a savepoint"
            if summary.savepoint
            else "job still running (stopped early)"
        )
    )
    sys.stdout.flush()
    return 0


def _on_stop_signals(stop: Callable[[], None]) -> dict[int, Any]:
    """Make SIGTERM and SIGINT call `stop` (the run then ends with a savepoint); returns the
    handlers they replaced."""

    def handler(signum: int, frame: Any) -> None:
        print(f"got signal {signum}: stopping with a savepoint after this epoch", flush=True)
        stop()

    old: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        old[signum] = signal.signal(signum, handler)
    return old
