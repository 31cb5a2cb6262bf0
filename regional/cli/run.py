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
import re
import runpy
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metadata.errors import RegionalError, StorageError
from metadata.events import CheckpointEvent, Outcome
from regional.errors import GraphError, RestoreError
from regional.pipeline import Pipeline
from regional.policy import load_policy

if TYPE_CHECKING:
    from metadata.storage import JobStorage

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
    """One line per checkpoint outcome, then the abort's explanation and why each unit fell
    back or failed (one line per unit, at most 5; the tracebacks are in the event log)."""
    fallback = ",".join(map(str, r.fallback_units)) or "-"
    line = (
        f"checkpoint {r.checkpoint_id:>4}  {r.kind:<8}  "
        f"fresh {r.fresh_units:>3}  fallback {fallback:<10}  "
        f"commit lag {r.commit_lag}  records {r.records_in:>7}  {r.seconds:5.2f} s"
    )
    if r.kind == Outcome.ABORTED:
        line += f"\n    {r.message}"
    causes = r.cause_lines()
    for cause in causes[:5]:
        line += f"\n    {cause}"
    if len(causes) > 5:
        line += f"\n    +{len(causes) - 5} more (regional inspect ROOT events)"
    print(line, flush=True)


def run_pipeline(args: argparse.Namespace) -> int:
    """Load the pipeline file and run it to the end; print progress and a summary.

    Every input known before Spark starts (policy, options, pipeline file, job id, `--from`)
    is checked before it starts, so bad input exits with 2 and one line, having written
    nothing under the checkpoint root.
    """
    policy = load_policy(args.policy, env=os.environ).policy
    if args.mode and args.restore_from is None:
        raise GraphError("--mode applies to a restore: give --from PATH too")
    if args.restore_from is not None and not args.restore_from.strip():
        raise RestoreError(
            "--from is empty; give a savepoint directory (sp-<id>), a checkpoint directory "
            "(chk-<id>) or its _metadata file, local or a URI"
        )
    if args.job_id is not None:
        check_job_id(args.job_id, "--job-id")
    root = args.checkpoint_dir or policy.checkpointing.dir or tempfile.mkdtemp(prefix="regional-")
    os.environ["REGIONAL_CHECKPOINT_DIR"] = root
    namespace = load_pipeline_file(args.file)
    pipeline = namespace.get("pipeline")
    if not isinstance(pipeline, Pipeline):
        raise GraphError(
            f"{args.file} defines no module-level `pipeline` (a regional.Pipeline); "
            "assign one, e.g. `pipeline = Pipeline('clicks')`"
        )
    if args.job_id is None:
        check_job_id(pipeline.name, "the pipeline's name; pass --job-id")
    from metadata.lease import ensure_free
    from metadata.storage import JobStorage
    from regional.runtime.faults import Faults
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    storage = JobStorage(root, args.job_id or pipeline.name)
    ensure_free(storage, clock=lambda: int(time.time() * 1000))  # before Spark starts
    if args.restore_from is not None:  # bad restore input fails before Spark starts
        _check_restore_source(storage, args.restore_from)

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


#: What a job id may be made of: it becomes a directory name under the checkpoint root (and a
#: part of object-store keys), so no separators, no `..`, no spaces or shell characters.
_JOB_ID = re.compile(r"[A-Za-z0-9._-]+")


def check_job_id(job_id: str, origin: str) -> None:
    """Refuse a job id that is not a safe directory name; `origin` says where it came from.

    >>> check_job_id("clicks-2", "--job-id")
    >>> check_job_id("../x", "--job-id")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    metadata.storage.JobSelectionError: job id '../x' (--job-id) cannot name a directory ...
    """
    from metadata.storage import JobSelectionError

    if not _JOB_ID.fullmatch(job_id) or job_id in (".", ".."):
        raise JobSelectionError(
            f"job id {job_id!r} ({origin}) cannot name a directory under the checkpoint root; "
            "use letters, digits, '.', '_' and '-' (not '.' or '..' alone)"
        )


def load_pipeline_file(file: Path) -> dict[str, Any]:
    """Run PIPELINE.py and return its globals. The file is input: anything it raises (a syntax
    error, binary content, a failed import) is a `GraphError` naming the file and line."""
    if file.is_dir():
        raise GraphError(
            f"pipeline file {file} is a directory; pass a Python file that defines `pipeline`"
        )
    if not file.is_file():
        raise GraphError(f"pipeline file {file} does not exist; pass a Python file")
    try:
        return runpy.run_path(str(file), run_name="regional_pipeline")
    except RegionalError:
        raise  # the pipeline API's own errors already name the vertex or edge
    except SyntaxError as exc:  # also binary content: null bytes, not UTF-8
        where = f"{file}, line {exc.lineno}" if exc.lineno else str(file)
        raise GraphError(
            f"pipeline file {where} is not valid Python: {exc.msg}; pass a Python source file"
        ) from exc
    except Exception as exc:
        line = _line_in(file, exc)
        where = f"{file}, line {line}" if line else str(file)
        fix = (
            f"install the module for {sys.executable} or fix the import"
            if isinstance(exc, ImportError)
            else "fix the file"
        )
        raise GraphError(
            f"pipeline file {where} raised {type(exc).__name__}: {exc}; {fix}"
        ) from exc


def _line_in(file: Path, exc: BaseException) -> int | None:
    """The line of `file` that was running when `exc` was raised (its innermost frame there)."""
    target = file.resolve()
    lines = [
        frame.lineno
        for frame in traceback.extract_tb(exc.__traceback__)
        if Path(frame.filename).resolve() == target
    ]
    return lines[-1] if lines else None


def _check_restore_source(storage: JobStorage, path: str) -> None:
    """Open `--from PATH` once before Spark starts; storage that cannot be reached is bad input
    here (the path is the user's), not a failed operation."""
    from metadata.savepoint import CheckpointPathError
    from metadata.storage import JobSelectionError
    from regional.restore import open_restore_source

    try:
        open_restore_source(storage, path)
    except (JobSelectionError, CheckpointPathError):
        raise  # already bad input (exit 2) naming the path
    except StorageError as exc:
        raise RestoreError(
            f"--from cannot be reached: {exc}; check the path, the endpoint and the credentials"
        ) from exc


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
