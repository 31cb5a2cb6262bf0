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
import functools
import os
import reprlib
import signal
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from rich.console import Console

from metadata.bounded_read import byte_size, read_local_file
from metadata.errors import MetadataError, RegionalError, StorageError
from metadata.events import Outcome
from metadata.layout import JOB_ID_FORM, job_id_problem
from regional.cli import render
from regional.cli.progress import JsonProgress, LiveProgress, PlainProgress
from regional.dataflow.pipeline import Pipeline
from regional.errors import GraphError, RestoreError, UsageError
from regional.graph.unit_names import UnitNames, names_of_plan
from regional.policy import (
    Policy,
    format_duration,
    load_policy,
    parse_duration,
    parse_interval,
)

if TYPE_CHECKING:
    from metadata.storage import JobStorage
    from regional.runtime.driver import RunSummary

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
        "checkpointing.dir, else .regional/checkpoints in the pipeline file's folder, so "
        "every run of the file resumes where the last one stopped)",
    )
    parser.add_argument(
        "--interval",
        metavar="DURATION",
        type=_interval,
        help="time from one trigger to the next after an epoch that read no records, e.g. "
        "'500 ms', '10 s' (default: the policy's checkpointing.interval); epochs that read "
        "records follow each other at once. 0: never wait",
    )
    parser.add_argument(
        "--max-checkpoints",
        type=int,
        default=None,
        help=f"stop after this many epochs (1 to {MAX_EPOCHS:,})",
    )
    parser.add_argument(
        "--job-id",
        help="the job's directory under the checkpoint root (default: the pipeline's name): "
        f"{JOB_ID_FORM}",
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
        "--json",
        action="store_true",
        help="print one JSON object per checkpoint outcome (the event log's CheckpointEvent) "
        "and nothing else on stdout; other lines go to stderr",
    )
    parser.add_argument(
        "--metrics-port",
        metavar="PORT",
        type=_port,
        help="serve the job's metrics for Prometheus on http://HOST:PORT/metrics while it runs "
        "(needs regional-checkpoints[prometheus])",
    )
    parser.add_argument(
        "--metrics-host",
        metavar="HOST",
        default="127.0.0.1",
        help="address the metrics endpoint binds to (default 127.0.0.1: this machine only)",
    )
    parser.add_argument(
        "--stop-with-savepoint",
        action="store_true",
        help="end with a savepoint under <job root>/savepoints/: after --max-checkpoints, or on "
        "SIGTERM / Ctrl-C",
    )
    parser.add_argument(
        "--continuous",
        action="store_true",
        help="continuous mode (first slice): long-lived Spark tasks, one per core, keep their "
        "units and state across epochs and take each epoch's work over a driver channel "
        "(default: micro-epoch mode, one Spark job per epoch)",
    )
    parser.add_argument(
        "--checkpoint-interval",
        metavar="DURATION",
        type=_checkpoint_interval,
        help="with --continuous: a checkpoint every DURATION, e.g. '100ms'; between them the "
        "tasks read records as they arrive (default: each epoch reads one batch per unit)",
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


def _interval(text: str) -> float:
    """`--interval DURATION` in seconds, by the policy key's own rule
    (`regional.policy.parse_interval`: 0 to 365 d); argparse reports a bad one as a usage
    error, exit 2."""
    try:
        return parse_interval(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; {exc}") from exc


def _checkpoint_interval(text: str) -> float:
    """`--checkpoint-interval DURATION` in seconds: a positive duration."""
    try:
        seconds = parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; {exc}") from exc
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid; give a positive duration")
    return seconds


def _port(text: str) -> int:
    """`--metrics-port PORT`: a TCP port number, 1 to 65535."""
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port; give 1 to 65535")
    return int(text)


def default_checkpoint_root(file: Path) -> str:
    """Where `regional run FILE` keeps checkpoints without `--checkpoint-dir` or the policy's
    `checkpointing.dir`: `.regional/checkpoints` in the pipeline file's folder, so a second run
    of the same file resumes instead of writing its output again.

    >>> default_checkpoint_root(Path("/jobs/clicks.py"))
    '/jobs/.regional/checkpoints'
    """
    return str(file.absolute().parent / ".regional" / "checkpoints")


def checkpoint_root(given: str | None, policy_dir: str | None, file: Path) -> tuple[str, str]:
    """The checkpoint root of a run and where it came from (said on the first line).

    >>> checkpoint_root(None, None, Path("/jobs/clicks.py"))[0]
    '/jobs/.regional/checkpoints'
    >>> checkpoint_root("/c", "/p", Path("/jobs/clicks.py"))
    ('/c', '--checkpoint-dir')
    """
    if given:
        return given, "--checkpoint-dir"
    if policy_dir:
        return policy_dir, "the policy's checkpointing.dir"
    return (
        default_checkpoint_root(file),
        "default: the pipeline file's folder; --checkpoint-dir to change",
    )


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
    if args.checkpoint_interval is not None and not args.continuous:
        raise UsageError(
            "--checkpoint-interval applies to continuous mode: add --continuous, or drop it"
        )
    if args.job_id is not None:
        check_job_id(args.job_id, "--job-id")
    if args.max_checkpoints is not None and not 1 <= args.max_checkpoints <= MAX_EPOCHS:
        raise UsageError(
            f"--max-checkpoints {args.max_checkpoints} is out of range; give 1 to "
            f"{MAX_EPOCHS:,} epochs, or leave it out to run until the sources end"
        )
    if args.metrics_port is not None:
        check_prometheus()
    # nothing is created before the pipeline file loaded: a bad file leaves nothing behind
    root, origin = checkpoint_root(args.checkpoint_dir, policy.checkpointing.dir, args.file)
    check_checkpoint_root(root, origin)
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
    from regional.runtime.session import spark_context
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
    # with --json stdout carries the outcomes only: everything else goes to stderr
    info = sys.stderr if args.json else sys.stdout
    say = functools.partial(render.say, file=info)
    say(f"starting Spark ({args.master}); checkpoints under {root} ({origin})")
    spark = spark_context(
        args.master, verbose=args.verbose, log_file=log_file, extra=dict(args.conf)
    )
    plan = pipeline.regions()
    say(
        f"pipeline {pipeline.name!r}: {len(pipeline.vertices)} vertices, "
        f"{plan.num_regions} regions, {plan.num_units} fallback units"
    )
    if plan.reason:
        say(f"note: {plan.reason}")
    interval = run_interval(args.interval, policy)
    say(
        f"interval {format_duration(interval) if interval else '0'}: "
        + (
            "the wait after an epoch that read no records"
            if interval
            else "epochs follow each other without a wait"
        )
    )
    if args.metrics_port is not None:
        say(f"metrics for Prometheus on http://{args.metrics_host}:{args.metrics_port}/metrics")
    view = progress_view(args.json, sys.stdout, names_of_plan(plan))
    faults = namespace.get("faults")
    runtime = SparkRuntime(
        pipeline,
        spark,
        root=root,
        policy=policy,
        faults=faults if isinstance(faults, Faults) else None,
        progress=view,
        watch=view,
        interval=interval,
        job_id=args.job_id,
        restore_from=args.restore_from,
        restore_mode=args.mode,
        allow_dropped_state=args.allow_dropped_state,
        allow_fresh_start=args.allow_fresh_start,
        code_dir=str(args.file.absolute().parent),
        metrics_port=args.metrics_port,
        metrics_host=args.metrics_host,
        mode="continuous" if args.continuous else "micro-epoch",
        checkpoint_interval=args.checkpoint_interval,
    )
    stop = _on_stop_signals(runtime.request_stop, say) if args.stop_with_savepoint else {}
    try:
        # restore first, so that what it did is said when it happens, before the checkpoints
        runtime.start()
        if runtime.restored_from is not None:
            where = f" ({runtime.restored_location})" if runtime.restored_location else ""
            say(f"restored from checkpoint {runtime.restored_from}{where}")
        for note in runtime.restore_notes:
            say(f"restore: {note}")
        with view:
            summary = runtime.run(
                max_checkpoints=args.max_checkpoints,
                stop_with_savepoint=args.stop_with_savepoint,
            )
    finally:
        for signum, handler in stop.items():
            signal.signal(signum, handler)
    if summary.savepoint is not None:
        say(f"savepoint: {summary.savepoint}")
    say(run_summary_line(summary))
    return 0


#: The most epochs `--max-checkpoints` takes (a billion: more than any run could make).
MAX_EPOCHS = 1_000_000_000


def check_prometheus() -> None:
    """`--metrics-port` needs prometheus-client: refuse before Spark starts without it."""
    from regional.runtime.prometheus import MetricsPortError

    try:
        import prometheus_client  # noqa: F401
    except ImportError:
        raise MetricsPortError(
            "--metrics-port needs prometheus-client, which is not installed for "
            f"{sys.executable}: pip install 'regional-checkpoints[prometheus]', or leave "
            "--metrics-port out"
        ) from None


def check_checkpoint_root(root: str, origin: str) -> None:
    """Refuse a local checkpoint root that cannot be one, before Spark starts: a file, or a
    directory that cannot be created (a probe directory is made and removed in its nearest
    existing ancestor, so nothing is left behind). Object-store roots are checked by the
    driver.

    >>> check_checkpoint_root("/proc/x", "--checkpoint-dir")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    regional.errors.UsageError: checkpoint root /proc/x (--checkpoint-dir) cannot be created: ...
    """
    if "://" in root:
        return
    path = os.path.abspath(root)
    where = f"checkpoint root {root} ({origin})"
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{where} is a file, not a directory; give a directory")
    ancestor = path
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(
            f"{where} cannot be created: {ancestor} is a file, not a directory; give a directory"
        )
    try:
        probe = tempfile.mkdtemp(prefix=".regional-probe-", dir=ancestor)
        os.rmdir(probe)
    except OSError as exc:
        raise UsageError(
            f"{where} cannot be {'written' if ancestor == path else 'created'}: "
            f"{exc.strerror or exc} in {ancestor}; give a directory you can write"
        ) from None


def run_interval(given: float | None, policy: Policy) -> float:
    """The driver's idle wait: `--interval` when given, else the policy's
    `checkpointing.interval`.

    >>> run_interval(None, Policy()), run_interval(0.5, Policy())
    (10.0, 0.5)
    """
    return policy.checkpointing.interval if given is None else given


def progress_view(
    as_json: bool, out: TextIO, names: UnitNames | None = None
) -> PlainProgress | JsonProgress | LiveProgress:
    """`--json`: JSON lines; a terminal: the live `rich` view; else plain lines (both naming
    units by `names`)."""
    if as_json:
        return JsonProgress(out)
    if out.isatty():
        return LiveProgress(Console(file=out), names=names)
    return PlainProgress(out, names)


def run_summary_line(summary: RunSummary) -> str:
    """The last line of a run: checkpoints by kind and how the job ended."""
    return (
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


def check_job_id(job_id: str, origin: str) -> None:
    """Refuse a job id that cannot name a new job (`metadata.layout.job_id_problem`), before
    Spark starts; `origin` says where it came from. A long id is shown cut short.

    >>> check_job_id("clicks-2", "--job-id")
    >>> check_job_id("../x", "--job-id")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    metadata.storage.JobSelectionError: job id '../x' (--job-id) cannot name a directory ...
    """
    from metadata.storage import JobSelectionError

    problem = job_id_problem(job_id)
    if problem is not None:
        raise JobSelectionError(
            f"job id {reprlib.repr(job_id)} ({origin}) cannot name a directory under the "
            f"checkpoint root: {problem}; use {JOB_ID_FORM}"
        )


#: The largest pipeline file read (8 MiB): far above any hand-written or generated pipeline,
#: and a bound keeps a wrong path (`/dev/zero`, a FIFO, a data file) from being read until
#: memory runs out.
MAX_PIPELINE_FILE_BYTES = 8 * 1024 * 1024

#: `__name__` of a pipeline file while it runs: not "__main__", so a guarded demo block stays off.
_RUN_NAME = "regional_pipeline"


def load_pipeline_file(file: Path) -> dict[str, Any]:
    """Run PIPELINE.py and return its globals. The file's folder goes first on `sys.path` (and
    stays there for the run), so modules beside it import as under `python PIPELINE.py`. The
    file is input: it is read up to `MAX_PIPELINE_FILE_BYTES`, and anything it raises (a syntax
    error, binary content, a failed import, any `BaseException` subclass, `sys.exit()`) is a
    `GraphError` naming the file and line (exit 2). Only `KeyboardInterrupt` passes through: it
    is Ctrl-C as often as the file's own doing, and the CLI reports it as interrupted (130)."""
    if file.is_dir():
        raise GraphError(
            f"pipeline file {file} is a directory; pass a Python file that defines `pipeline`"
        )
    try:
        source = read_local_file(file, MAX_PIPELINE_FILE_BYTES)
    except FileNotFoundError:
        raise GraphError(f"pipeline file {file} does not exist; pass a Python file") from None
    except OSError as exc:
        raise GraphError(
            f"pipeline file {file} cannot be read: {exc.strerror or exc}; pass a Python file "
            "you can read"
        ) from None
    if source is None:
        raise GraphError(
            f"pipeline file {file} is larger than {byte_size(MAX_PIPELINE_FILE_BYTES)}, the most "
            "a pipeline file may hold; pass the Python file that defines `pipeline`"
        )
    folder = str(file.absolute().parent)
    if folder not in sys.path:  # sibling modules import as they do under `python FILE`
        sys.path.insert(0, folder)
    try:
        return _run_source(source, file)
    except RegionalError:
        raise  # the pipeline API's own errors already name the vertex or edge
    except KeyboardInterrupt:
        raise  # Ctrl-C while loading: "interrupted", exit 130 (`regional.cli.main`)
    except SystemExit as exc:  # sys.exit() while loading: not a pipeline definition
        raise GraphError(
            f"pipeline file {file} called sys.exit({exc.code!r}) while it was loaded; a "
            "pipeline file defines `pipeline` and returns, it does not exit: remove the call "
            "or guard it with `if __name__ == '__main__':`"
        ) from None
    except SyntaxError as exc:  # also binary content: null bytes, not UTF-8
        where = f"{file}, line {exc.lineno}" if exc.lineno else str(file)
        raise GraphError(
            f"pipeline file {where} is not valid Python: {exc.msg}; pass a Python source file"
        ) from exc
    except BaseException as exc:  # any exception class, also one not derived from Exception
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


def _run_source(source: bytes, file: Path) -> dict[str, Any]:
    """Run the pipeline file's `source` as `runpy.run_path` runs a script (which would read the
    file again, without a bound): as module `_RUN_NAME` with `__file__` set, in `sys.modules`
    only while it runs (so the workers get its functions by value, not by an import that would
    fail there), with `sys.argv[0]` the file. Returns its globals."""
    code = compile(source, str(file), "exec", dont_inherit=True)  # not our __future__ imports
    module = types.ModuleType(_RUN_NAME)
    module.__file__ = str(file)
    saved_module = sys.modules.get(_RUN_NAME)
    saved_argv0 = sys.argv[0] if sys.argv else None
    sys.modules[_RUN_NAME] = module
    if sys.argv:
        sys.argv[0] = str(file)
    try:
        exec(code, module.__dict__)
    finally:
        if saved_module is None:
            sys.modules.pop(_RUN_NAME, None)
        else:
            sys.modules[_RUN_NAME] = saved_module
        if saved_argv0 is not None:
            sys.argv[0] = saved_argv0
    return dict(module.__dict__)


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
    from regional.runtime.restore import open_restore_source

    try:
        open_restore_source(storage, path)
    except (JobSelectionError, CheckpointPathError):
        raise  # already bad input (exit 2) naming the path
    except MetadataError as exc:  # truncated, corrupt, of an unknown version: the user's input
        raise RestoreError(
            f"--from {path} cannot be restored: {exc}; give another checkpoint or savepoint"
        ) from exc
    except StorageError as exc:
        raise RestoreError(
            f"--from cannot be reached: {exc}; check the path, the endpoint and the credentials"
        ) from exc


def _on_stop_signals(stop: Callable[[], None], say: Callable[[str], None]) -> dict[int, Any]:
    """Make SIGTERM and SIGINT call `stop` (the run then ends with a savepoint); returns the
    handlers they replaced."""

    def handler(signum: int, frame: Any) -> None:
        say(f"got signal {signum}: stopping with a savepoint after this epoch")
        stop()

    old: dict[int, Any] = {}
    for signum in (signal.SIGTERM, signal.SIGINT):
        old[signum] = signal.signal(signum, handler)
    return old
