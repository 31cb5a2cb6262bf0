"""The Spark runtime: the driver loop that runs a pipeline with regional checkpoints (DESIGN §6).

Per checkpoint epoch the driver triggers the coordinator, builds one `UnitWork` per fallback
unit (the state it restores from, new splits from the split enumerators, injected faults) and
runs them as **one Spark job** in its own job group, units packed into one task per core
(research/spark.md §1: the cost is per Python task). Each task runs `regional.runtime.task
.run_units`, so user exceptions and unit timeouts come back as declines. Results reach the
driver through `collect()`, or, when the job had to be cancelled at the epoch deadline (a hang
SIGALRM could not break), through a dict accumulator that holds every finished task's answers;
units without an answer are declined by the coordinator's tick.

The driver carries out the coordinator's decisions in order: write metadata, then commit, then
notify, then clean (the cleaner's plan and executor); then it adds the epoch's outcome and the
coordinator's metrics (`metrics`) to the job's event log (`metadata.events`). On start, a root
that already holds checkpoints is restored from the latest restorable one (rewritten by
`regional.restore` when the pipeline's parallelism changed); `restore_from` restores a given
checkpoint or savepoint into an empty job root instead. `savepoint()` and
`run(stop_with_savepoint=True)` take savepoints: a global checkpoint whose state is also copied,
self-contained, to `savepoints/sp-<id>/`. `Faults` injects failures for tests and demos: a unit
failing or hanging at a checkpoint, or the driver crashing at a coordinator step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import sysconfig
import threading
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from cleaner.decisions import RestoreBase
from cleaner.run import execute, scan
from metadata.events import write_event
from metadata.layout import checkpoint_id_of
from metadata.model import CheckpointKind, CheckpointMetadata, SubtaskState
from metadata.savepoint import write_savepoint
from metadata.storage import JobStorage
from regional.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    Commit,
    Decision,
    DiscardAttempt,
    FailJob,
    FinishJob,
    JobLayout,
    NotifyComplete,
    NotifyFallback,
    NotifySubsumed,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.errors import (
    CheckpointAbortedError,
    CommitError,
    JobFailedError,
    RegionalError,
    RestoreError,
)
from regional.operators import CommitCoordinator, SplitEnumerator, perform_commit
from regional.pipeline import Pipeline
from regional.policy import Policy
from regional.restore import open_restore_source, rewrite_for_pipeline
from regional.runtime.metrics import MetricsSnapshot, checkpoint_event, metrics_snapshot
from regional.runtime.task import TaskEnv, UnitWork, run_units

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

__all__ = [
    "CRASH_STEPS",
    "CheckpointReport",
    "DriverCrash",
    "Faults",
    "RunSummary",
    "SparkRuntime",
]

#: Where `Faults.crash_at` can stop the driver: after every unit answered (before the metadata
#: write), after the metadata write, after the sink commit, in the middle of cleaning.
CRASH_STEPS = ("after-acks", "after-metadata", "after-commit", "mid-clean")
_COMMIT_RETRIES = 3
log = logging.getLogger(__name__)


class DriverCrash(RegionalError):
    """The driver stopped at an injected crash point (tests and demos)."""


@dataclasses.dataclass(frozen=True)
class Faults:
    """Injected faults, off by default. `units` maps (checkpoint id, unit id) to ``"fail"``
    (raise in the unit), ``"hang"`` (block until the unit's timeout), ``"stall"`` (a C-level
    loop the unit's timeout cannot break: the driver cancels the job at the epoch deadline) or
    ``"crash"`` (kill the Python worker, losing its Spark task); `crash_at` is (checkpoint id,
    step in `CRASH_STEPS`)."""

    units: dict[tuple[int, int], str] = dataclasses.field(default_factory=dict)
    crash_at: tuple[int, str] | None = None
    #: crash by killing the driver process (`os._exit`) instead of raising `DriverCrash`
    hard: bool = False

    def crash(self, message: str) -> None:
        """Stop the driver here: raise `DriverCrash`, or end the process at once if `hard`."""
        if self.hard:
            sys.stdout.flush()
            os._exit(70)
        raise DriverCrash(message)

    def __post_init__(self) -> None:
        for (cid, unit), what in self.units.items():
            if what not in ("fail", "hang", "stall", "crash"):
                raise ValueError(
                    f"fault {what!r} for unit {unit} at checkpoint {cid}: use fail, hang, stall "
                    "or crash"
                )
        if self.crash_at is not None and self.crash_at[1] not in CRASH_STEPS:
            raise ValueError(
                f"crash step {self.crash_at[1]!r}: use one of {', '.join(CRASH_STEPS)}"
            )


@dataclasses.dataclass(frozen=True)
class CheckpointReport:
    """What one epoch ended with, for progress displays."""

    checkpoint_id: int
    kind: str  # global, regional, savepoint or aborted
    fresh_units: int
    fallback_units: tuple[int, ...]
    commit_lag: int  # completed checkpoints not yet committed
    seconds: float
    records_in: int
    message: str = ""
    causes: dict[int, str] = dataclasses.field(default_factory=dict)  # why units fell back


@dataclasses.dataclass
class RunSummary:
    """The outcome of `SparkRuntime.run`."""

    job_id: str
    restored_from: int | None = None
    checkpoints: list[CheckpointReport] = dataclasses.field(default_factory=list)
    finished: bool = False
    seconds: float = 0.0
    restored_location: str | None = None  # where the restored checkpoint was read from
    restore_notes: tuple[str, ...] = ()  # rescaled vertices, dropped state
    savepoint: str | None = None  # the location of the savepoint taken at the stop

    def count(self, kind: str) -> int:
        return sum(1 for c in self.checkpoints if c.kind == kind)


def _now_ms() -> int:
    return int(time.time() * 1000)


class _DictParam:
    """Accumulator that merges dicts (one entry per unit answer)."""

    def zero(self, value: dict[Any, Any]) -> dict[Any, Any]:
        return {}

    def addInPlace(self, a: dict[Any, Any], b: dict[Any, Any]) -> dict[Any, Any]:
        a.update(b)
        return a


def _ship_user_code_by_value(pipeline: Pipeline) -> None:
    """Pickle the pipeline's user modules by value: Python workers may not import them (a test
    module, a script loaded from a path); installed packages are still shipped by name."""
    from pyspark import cloudpickle

    things: list[Any] = []
    for v in pipeline.vertices.values():
        things += [v.source, v.sink, v.operator]
        if v.operator is not None:
            things += [v.operator.fn, v.operator.key]
        if v.source is not None:
            things += list(vars(v.source).values())
    installed = tuple({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["stdlib"]})
    for thing in things:
        name = getattr(thing, "__module__", None) or type(thing).__module__
        module = sys.modules.get(name)
        file = getattr(module, "__file__", None)
        if module is None or file is None or name.split(".")[0] in _OURS:
            continue
        if not os.path.abspath(file).startswith(installed):
            with contextlib.suppress(ValueError):
                cloudpickle.register_pickle_by_value(module)


_OURS = frozenset({"regional", "metadata", "cleaner", "builtins", "__main__"})


def _warm_up(it: Any) -> Any:
    """Import the task side in a Python worker (the first import costs seconds)."""
    import regional.runtime.task  # noqa: F401

    return iter([sum(1 for _ in it)])


def _epoch_partition(env: TaskEnv, acc: Any) -> Callable[[Any], Any]:
    def run(it: Any) -> Any:
        from pyspark import TaskContext

        works = list(it)  # drain the input, or the worker is not reused
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        answers = run_units(env, works, spark_attempt=attempt)
        acc.add({(a["checkpoint_id"], a["unit"], a["attempt"]): a for a in answers})
        return iter(answers)

    return run


class SparkRuntime:
    """Runs `pipeline` on `spark` with checkpoints under `root` (local path or pyarrow.fs URI).

    `tasks` is how many Spark tasks an epoch packs the units into (default: one per core).
    `progress` is called with a `CheckpointReport` after every epoch.

    `restore_from` is a checkpoint or savepoint to start from (a savepoint directory, a
    `chk-<id>` directory or its `_metadata`; local or URI) instead of the job root's latest;
    the job root must hold no completed checkpoint then. `restore_mode` (default: the policy's
    `restore.mode`): ``claim`` imports the restored state into the job root as a checkpoint of
    its own (`chk-<id>/`, cleaned like any other); ``no-claim`` only stages it there for the
    first checkpoint, which must be global. The source is never modified either way.
    `allow_dropped_state` lets a restore leave behind state the pipeline cannot take (a
    vertex it no longer has, a changed max parallelism) instead of failing.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        spark: SparkSession,
        *,
        root: str,
        policy: Policy | None = None,
        job_id: str | None = None,
        faults: Faults | None = None,
        tasks: int | None = None,
        progress: Callable[[CheckpointReport], None] | None = None,
        interval: float = 0.0,
        restore_from: str | None = None,
        restore_mode: str | None = None,
        allow_dropped_state: bool = False,
    ) -> None:
        self.pipeline = pipeline
        self.spark = spark
        self.policy = policy or Policy()
        self.job_id = job_id or pipeline.name
        self.faults = faults or Faults()
        self.progress = progress
        self.interval = interval
        self.storage = JobStorage(root, self.job_id)
        self.root = root
        graph = pipeline.job_graph()
        self.plan = pipeline.regions()
        bounded = [v for v, s in pipeline.sources.items() if s.source and s.source.bounded]
        self.layout = JobLayout.from_plan(
            self.plan,
            graph.vertex_infos(),
            sources=pipeline.sources,
            bounded_sources=bounded,
            graph_fingerprint=graph.fingerprint(),
        )
        self.enumerators = {
            v: SplitEnumerator(v, s.source.discover())  # type: ignore[union-attr]
            for v, s in pipeline.sources.items()
        }
        # One commit user per job run and sink (Paimon's rule): a restore reloads it from the
        # checkpoint, while a fresh run of the same job (a new checkpoint root) gets a new one, so
        # its commits are never mistaken for the old run's and skipped.
        run = uuid.uuid4().hex[:12]
        self.committers = {
            v: CommitCoordinator(v, commit_user=f"{self.job_id}-{run}-{v}") for v in pipeline.sinks
        }
        self.coordinator = CheckpointCoordinator(
            self.layout,
            self.policy,
            job_id=self.job_id,
            coordinators={**self.enumerators, **self.committers},
        )
        cores = spark.sparkContext.defaultParallelism
        self.tasks = tasks or max(1, cores)
        region_timeout = min(
            self.policy.checkpointing.timeout, self.policy.checkpointing.region.timeout
        )
        # a packed task runs its units one after another: half the deadline per unit leaves
        # the others of a task with a hung unit time to finish before the epoch deadline
        _ship_user_code_by_value(pipeline)
        self.env = TaskEnv(root, self.job_id, pipeline, unit_timeout=region_timeout / 2)
        self._commit_failures: dict[tuple[str, int], int] = {}
        self._causes: dict[int, dict[int, str]] = {}
        self._aborts: dict[int, AbortCheckpoint] = {}  # for the event log
        self._finished = False
        self._started = False  # run() restores only the first time
        self.restore_from = restore_from
        self.restore_mode = restore_mode or self.policy.restore.mode
        if self.restore_mode not in ("claim", "no-claim"):
            raise RestoreError(f"restore mode {self.restore_mode!r}: use claim or no-claim")
        self.allow_dropped_state = allow_dropped_state
        self._restored_location: str | None = None
        self._restore_notes: tuple[str, ...] = ()
        self._restored: int | None = None
        self._savepoints: dict[int, str] = {}
        self._stop_requested = False
        self._restore_base: RestoreBase | None = None  # a no-claim restore of this job root

    # --- the loop ---------------------------------------------------------------------------

    def run(
        self, *, max_checkpoints: int | None = None, stop_with_savepoint: bool = False
    ) -> RunSummary:
        """Run until the job finishes (bounded sources), `max_checkpoints` epochs ran or
        `request_stop()` was called; with `stop_with_savepoint`, a job that has not finished
        then takes a savepoint (`RunSummary.savepoint`) and stops.

        Raises `JobFailedError` past `tolerable-failed-checkpoints`, `DriverCrash` at an
        injected crash point, `CheckpointAbortedError` when the final savepoint failed.
        """
        started = time.monotonic()
        summary = RunSummary(self.job_id)
        if self._start():
            summary.restored_from = self._restored
            summary.restored_location = self._restored_location
            summary.restore_notes = self._restore_notes
        epochs = 0
        while (
            not self._finished
            and not self._stop_requested
            and (max_checkpoints is None or epochs < max_checkpoints)
        ):
            epoch_start = time.monotonic()
            report = self._epoch()
            summary.checkpoints.append(report)
            if self.progress is not None:
                self.progress(report)
            epochs += 1
            if self.interval and not self._finished and not self._stop_requested:
                time.sleep(max(0.0, self.interval - (time.monotonic() - epoch_start)))
        self._stop_requested = False  # a later run() runs again
        if stop_with_savepoint and not self._finished:
            summary.savepoint = self._take_savepoint(summary)
        summary.finished = self._finished
        summary.seconds = time.monotonic() - started
        return summary

    def request_stop(self) -> None:
        """Stop `run` after the running epoch (safe to call from a signal handler)."""
        self._stop_requested = True

    def savepoint(self) -> str:
        """Take a savepoint now (between epochs): a global checkpoint epoch whose state is also
        copied to `savepoints/sp-<id>/`, self-contained; returns that directory's location.

        Raises `CheckpointAbortedError` when a unit failed it (the job's checkpoints are
        untouched), `CoordinatorStateError` when the job has finished.
        """
        self._start()
        return self._take_savepoint(None)

    def _take_savepoint(self, summary: RunSummary | None) -> str:
        report = self._epoch(savepoint=True)
        if summary is not None:
            summary.checkpoints.append(report)
        if self.progress is not None:
            self.progress(report)
        location = self._savepoints.get(report.checkpoint_id)
        if report.kind != CheckpointKind.SAVEPOINT.value or location is None:
            raise CheckpointAbortedError(
                f"savepoint {report.checkpoint_id} of job {self.job_id} failed: "
                f"{report.message or 'aborted'}; the job's checkpoints are intact, so a new run "
                "resumes from its latest checkpoint"
            )
        return location

    def _start(self) -> bool:
        """Warm up the Python workers; restore the first time (then returns True)."""
        sc = self.spark.sparkContext
        sc.parallelize(range(self.tasks), self.tasks).mapPartitions(_warm_up).collect()
        if self._started:
            return False
        self._restored = self._restore()
        self._started = True
        return True

    def _next_free_id(self) -> int:
        """The first checkpoint id no file under the job root uses."""
        files = self.storage.list_files()
        used = [c for f in files if (c := checkpoint_id_of(f.path)) is not None]
        return max(used, default=0) + 1

    def _restore(self) -> int | None:
        if self.restore_from is not None:
            return self._restore_from(self.restore_from)
        md = self.storage.find_latest_restorable()
        if md is None:
            return None
        next_id = self._next_free_id()
        if set(md.vertices) == set(self.layout.vertices):
            decisions = self.coordinator.restore(
                md, mode=self.policy.restore.mode, next_checkpoint_id=next_id
            )
        else:  # another shape: the rewritten state is staged for the next checkpoint only
            restored = self._rewrite(self.storage, md, next_id, ())
            decisions = self.coordinator.restore(
                restored,
                mode=self.policy.restore.mode,
                next_checkpoint_id=next_id,
                global_until_success=(
                    f"checkpoint {md.checkpoint_id} was restored with another parallelism; its "
                    "rewritten state is kept only until a checkpoint succeeds, so checkpoints "
                    "stay global until then"
                ),
            )
        self._restored_location = self.storage.describe(f"chk-{md.checkpoint_id}")
        if self.policy.restore.mode == "no-claim":  # the cleaner keeps chk-<k> for k <= base
            self._restore_base = RestoreBase(md.checkpoint_id, "no-claim")
        self._carry_out(decisions)
        self._check_sources_finished()
        return md.checkpoint_id

    def _restore_from(self, path: str) -> int:
        """Restore the checkpoint or savepoint at `path` into this (empty) job root."""
        source = open_restore_source(self.storage, path)
        md = source.metadata
        cid = md.checkpoint_id
        next_id = max(cid + 1, self._next_free_id())
        claim = self.restore_mode == "claim"
        what = f"restored from {source.location} ({self.restore_mode})"
        restored = self._rewrite(source.storage, md, cid if claim else next_id, (what,))
        if claim:  # the job owns its copy: a checkpoint of its own, cleaned when subsumed
            self.storage.write_metadata(restored)
        decisions = self.coordinator.restore(
            restored, mode=self.restore_mode, next_checkpoint_id=next_id
        )
        self._restored_location = source.location
        self._carry_out(decisions)
        self._check_sources_finished()
        return cid

    def _rewrite(
        self, source: JobStorage, md: CheckpointMetadata, state_id: int, reasons: tuple[str, ...]
    ) -> CheckpointMetadata:
        """`md`'s state mapped onto the pipeline, written under `chk-<state_id>/` here."""
        restored, plan = rewrite_for_pipeline(
            source,
            md,
            self.pipeline,
            self.layout,
            self.storage,
            state_checkpoint_id=state_id,
            allow_dropped_state=self.allow_dropped_state,
            reasons=reasons,
        )
        self._restore_notes = (*plan.rescaled, *plan.dropped)
        return restored

    def _works(self, trigger: TriggerCheckpoint) -> list[UnitWork]:
        for vertex_id, enumerator in self.enumerators.items():
            source = self.pipeline.vertices[vertex_id].source
            assert source is not None
            enumerator.discover(source.discover())
        works = []
        per = self.pipeline.splits_per_subtask
        for unit_id in range(self.layout.num_units):
            restore = self.coordinator.unit_states(unit_id)
            new: list[tuple[str, int, str]] = []
            for state in restore:
                enumerator = self.enumerators.get(state.vertex_id)
                if enumerator is None:
                    continue
                for _ in range(per - len(state.split_states)):
                    split = enumerator.assign(state.index)
                    if split is None:
                        break
                    new.append((state.vertex_id, state.index, split))
            fault = self.faults.units.get((trigger.checkpoint_id, unit_id))
            works.append(
                UnitWork(
                    trigger.checkpoint_id, trigger.attempt, unit_id, restore, tuple(new), fault
                )
            )
        return works

    def _run_job(
        self, trigger: TriggerCheckpoint, works: list[UnitWork]
    ) -> tuple[list[dict[str, Any]], str | None]:
        """One Spark job for the epoch: the answers (from collect, or from the accumulator
        after a cancel at the deadline or a failed job) and why the job failed, if it did."""
        sc = self.spark.sparkContext
        acc = sc.accumulator({}, _DictParam())  # type: ignore[arg-type]
        group = f"regional-{self.job_id}-chk{trigger.checkpoint_id}"
        box: dict[str, Any] = {}
        fn = _epoch_partition(self.env, acc)
        parts = max(1, min(self.tasks, len(works)))

        def job() -> None:
            sc.setJobGroup(group, f"checkpoint {trigger.checkpoint_id}", interruptOnCancel=True)
            try:
                box["answers"] = sc.parallelize(works, parts).mapPartitions(fn).collect()
            except Exception as exc:
                box["error"] = exc

        thread = threading.Thread(target=job, name=group, daemon=True)
        thread.start()
        thread.join(max(0.0, (trigger.deadline_ms - _now_ms()) / 1000))
        thread_cancelled = thread.is_alive()
        if thread_cancelled:
            sc.cancelJobGroup(group)
            thread.join()
        if "answers" in box:
            return list(box["answers"]), None
        answers = list(acc.value.values())
        if "error" in box and not thread_cancelled:
            first = str(box["error"]).strip().splitlines()
            return answers, f"spark job failed: {first[0][:300] if first else box['error']!r}"
        return answers, None

    def _epoch(self, *, savepoint: bool = False) -> CheckpointReport:
        t0 = time.monotonic()
        trigger_ms = _now_ms()
        trigger = self.coordinator.trigger(trigger_ms, savepoint=savepoint)
        cid = trigger.checkpoint_id
        works = self._works(trigger)
        answers, job_error = self._run_job(trigger, works)
        records_in = sum(a["records_in"] for a in answers if a["status"] == "ack")
        decisions = self._feed(answers)
        if job_error is not None:  # units lost with a failed task: each re-run alone, once
            answered = {a["unit"] for a in answers}
            lost = [w for w in works if w.unit_id not in answered]
            attempts = {w.unit_id: w.attempt for w in lost}
            retried = self._retry_alone(trigger, lost, attempts)
            for a in retried:
                if a["status"] == "ack":
                    records_in += a["records_in"]
            decisions += self._feed(retried)
            for work in lost:
                if self.coordinator.pending_checkpoint_id != cid:
                    break
                if not any(a["unit"] == work.unit_id for a in retried):
                    decisions += self.coordinator.on_decline(
                        cid, work.unit_id, attempts[work.unit_id], job_error, _now_ms()
                    )
        if self.coordinator.pending_checkpoint_id == cid:
            decisions += self.coordinator.on_tick(max(_now_ms(), trigger.deadline_ms))
        self._crash(cid, "after-acks")
        try:
            outcome = self._carry_out(decisions)
        except JobFailedError as failed:  # the job's last event says why it failed
            abort = self._aborts.get(cid)
            failed_units = abort.failed_units if abort is not None else ()
            seconds = time.monotonic() - t0
            report = CheckpointReport(
                cid, "aborted", 0, failed_units, self.commit_lag, seconds, records_in, str(failed)
            )
            self._log_event(report, trigger_ms)
            raise
        self._check_sources_finished()
        kind, fallback, message = outcome.get(cid, ("aborted", (), "no decision"))
        report = CheckpointReport(
            cid,
            kind,
            self.layout.num_units - len(fallback) if kind != "aborted" else 0,
            tuple(fallback),
            self.commit_lag,
            time.monotonic() - t0,
            records_in,
            message,
            self._causes.pop(cid, {}),
        )
        self._log_event(report, trigger_ms)
        return report

    @property
    def metrics(self) -> MetricsSnapshot:
        """The coordinator's metrics now: completions, aborts by rule, the latest checkpoint's
        `oldest_ref_checkpoint_id`, per-unit lag, commit lag."""
        return metrics_snapshot(
            self.coordinator.metrics,
            latest_completed_id=self.coordinator.latest_completed_id,
            commit_lag=self.commit_lag,
        )

    def _log_event(self, report: CheckpointReport, trigger_ms: int) -> None:
        """Write the epoch's event (`events/...json` under the job root). Best effort: a
        failed write is logged, never fails the job (checkpoints do not depend on it)."""
        abort = self._aborts.pop(report.checkpoint_id, None)
        event = checkpoint_event(
            self.job_id,
            report,
            self.metrics,
            trigger_time_ms=trigger_ms,
            time_ms=_now_ms(),
            abort_rule=abort.rule.value if abort is not None else None,
        )
        try:
            write_event(self.storage, event)
        except RegionalError as exc:
            log.warning("event of checkpoint %d not written: %s", report.checkpoint_id, exc)

    def _feed(self, answers: list[dict[str, Any]]) -> list[Decision]:
        """Hand task answers to the coordinator (stale attempts are fenced off there)."""
        decisions: list[Decision] = []
        for a in answers:
            if a["status"] == "ack":
                states = msgspec.msgpack.decode(a["states"], type=tuple[SubtaskState, ...])
                decisions += self.coordinator.on_ack(
                    a["checkpoint_id"], a["unit"], a["attempt"], states, _now_ms()
                )
            else:
                decisions += self.coordinator.on_decline(
                    a["checkpoint_id"], a["unit"], a["attempt"], a["reason"], _now_ms()
                )
        return decisions

    def _retry_alone(
        self, trigger: TriggerCheckpoint, lost: list[UnitWork], attempts: dict[int, int]
    ) -> list[dict[str, Any]]:
        """Re-run units lost with a failed Spark task, each as its own one-task job with a new
        (fenced) attempt, so a crash is confined to its own unit (research/spark.md §1.2).
        `attempts` is updated to the attempt each unit now runs as."""
        cid = trigger.checkpoint_id
        if not lost or self.coordinator.pending_checkpoint_id != cid:
            return []
        if trigger.deadline_ms - _now_ms() < 1000:
            return []  # no time left: the lost units are declined
        sc = self.spark.sparkContext
        works = [
            msgspec.structs.replace(
                w, attempt=self.coordinator.retry_unit(cid, w.unit_id, _now_ms())
            )
            for w in lost
        ]
        attempts.update((w.unit_id, w.attempt) for w in works)
        acc = sc.accumulator({}, _DictParam())  # type: ignore[arg-type]
        fn = _epoch_partition(self.env, acc)
        out: list[dict[str, Any]] = []

        def one(work: UnitWork) -> None:
            group = f"regional-{self.job_id}-chk{cid}-u{work.unit_id}-a{work.attempt}"
            sc.setJobGroup(group, f"checkpoint {cid} unit {work.unit_id}", interruptOnCancel=True)
            with contextlib.suppress(Exception):  # a failed job: the unit is declined
                out.extend(sc.parallelize([work], 1).mapPartitions(fn).collect())

        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in works]
        for t in threads:
            t.start()
        for w, t in zip(works, threads, strict=True):
            t.join(max(0.0, (trigger.deadline_ms - _now_ms()) / 1000))
            if t.is_alive():
                sc.cancelJobGroup(f"regional-{self.job_id}-chk{cid}-u{w.unit_id}-a{w.attempt}")
                t.join()
        return out

    @property
    def commit_lag(self) -> int:
        """Completed checkpoints whose output is not committed yet (the longest sink queue)."""
        return max((len(c.queued) for c in self.committers.values()), default=0)

    def handle_answer(self, answer: dict[str, Any]) -> None:
        """Feed one (possibly late) task answer to the coordinator and carry out the result."""
        if answer["status"] == "ack":
            states = msgspec.msgpack.decode(answer["states"], type=tuple[SubtaskState, ...])
            self._carry_out(
                self.coordinator.on_ack(
                    answer["checkpoint_id"], answer["unit"], answer["attempt"], states, _now_ms()
                )
            )

    # --- decisions --------------------------------------------------------------------------

    def _crash(self, checkpoint_id: int, step: str) -> None:
        if self.faults.crash_at == (checkpoint_id, step):
            self.faults.crash(f"driver crashed at checkpoint {checkpoint_id}, {step} (injected)")

    def _carry_out(self, decisions: list[Decision]) -> dict[int, tuple[str, tuple[int, ...], str]]:
        """Carry out decisions in order (new ones are appended); returns per checkpoint id
        (kind, fallback units, message)."""
        outcome: dict[int, tuple[str, tuple[int, ...], str]] = {}
        queue = list(decisions)
        clean = False
        while queue:
            d = queue.pop(0)
            if isinstance(d, WriteMetadata):
                md = d.metadata
                try:
                    self._write_metadata(md)
                except RegionalError as exc:
                    queue += self.coordinator.on_metadata_failed(
                        md.checkpoint_id, str(exc), _now_ms()
                    )
                    continue
                self._crash(md.checkpoint_id, "after-metadata")
                fallback = tuple(u.unit_id for u in md.fallback_units)
                kind = md.kind.value if isinstance(md.kind, CheckpointKind) else str(md.kind)
                outcome[md.checkpoint_id] = (kind, fallback, "; ".join(md.reasons))
                self._causes[md.checkpoint_id] = {
                    u.unit_id: u.reason or "" for u in md.fallback_units
                }
                queue += self.coordinator.on_metadata_durable(md.checkpoint_id, _now_ms())
                clean |= md.kind is CheckpointKind.SAVEPOINT  # its chk-<id> subsumes others
            elif isinstance(d, Commit):
                queue += self._commit(d)
            elif isinstance(d, AbortCheckpoint):
                outcome[d.checkpoint_id] = ("aborted", d.failed_units, d.message)
                self._aborts[d.checkpoint_id] = d
            elif isinstance(d, DiscardAttempt):
                for path in d.files:
                    self.storage.delete_file(path)
                for vertex_id, committables in d.committables.items():
                    self.pipeline.vertices[vertex_id].sink.discard(committables)
            elif isinstance(d, NotifySubsumed):
                clean = True
            elif isinstance(d, FailJob):
                raise JobFailedError(d.message)
            elif isinstance(d, FinishJob):
                self._finished = True
            elif isinstance(d, NotifyComplete | NotifyFallback):
                pass  # units restore from the coordinator's states every epoch
        if clean:
            self._clean()
        return outcome

    def _write_metadata(self, md: CheckpointMetadata) -> None:
        """Write a completed checkpoint's metadata. A savepoint is first copied, self-contained,
        to `savepoints/sp-<id>/`; its `chk-<id>` is then written as a global checkpoint of the
        job (a crash after the savepoint resumes from it; the cleaner treats it as any other)."""
        if md.kind is not CheckpointKind.SAVEPOINT:
            self.storage.write_metadata(md)
            return
        location = write_savepoint(self.storage, md)
        self._savepoints[md.checkpoint_id] = location
        reasons = (*md.reasons, f"savepoint: a self-contained copy is in {location}")
        self.storage.write_metadata(
            msgspec.structs.replace(md, kind=CheckpointKind.GLOBAL, reasons=reasons)
        )

    def _commit(self, commit: Commit) -> list[Decision]:
        sink = self.pipeline.vertices[commit.vertex_id].sink
        key = (commit.vertex_id, commit.checkpoint_id)
        try:
            perform_commit(commit, sink)
        except Exception as exc:
            self._commit_failures[key] = self._commit_failures.get(key, 0) + 1
            if self._commit_failures[key] >= _COMMIT_RETRIES:
                raise CommitError(
                    f"commit of checkpoint {commit.checkpoint_id} to sink {commit.vertex_id!r} "
                    f"failed {_COMMIT_RETRIES} times: {exc}"
                ) from exc
            return self.coordinator.on_commit_failed(
                commit.vertex_id, commit.checkpoint_id, str(exc)
            )
        self._crash(commit.checkpoint_id, "after-commit")
        return self.coordinator.on_commit_done(commit.vertex_id, commit.checkpoint_id)

    def _clean(self) -> None:
        plan = scan(
            self.storage,
            num_retained=self.policy.checkpointing.num_retained,
            restore_base=self._restore_base,
        )
        latest = self.coordinator.latest_completed_id or 0
        faults = self.faults

        def progress(p: Any) -> None:
            if faults.crash_at == (latest, "mid-clean"):
                faults.crash(f"driver crashed at checkpoint {latest}, mid-clean (injected)")

        execute(plan, self.storage, progress=progress, max_workers=1)

    def _check_sources_finished(self) -> None:
        """Tell the coordinator which bounded sources have read everything."""
        for vertex_id in self.layout.bounded_sources:
            enumerator = self.enumerators[vertex_id]
            source = self.pipeline.vertices[vertex_id].source
            assert source is not None
            enumerator.discover(source.discover())
            if enumerator.unassigned:
                continue
            parallelism = self.pipeline.vertices[vertex_id].parallelism
            states = [
                s
                for u in {self.layout.unit_of(vertex_id, i) for i in range(parallelism)}
                for s in self.coordinator.unit_states(u)
                if s.vertex_id == vertex_id
            ]
            if self.coordinator.latest_completed_id is not None and not any(
                s.split_states for s in states
            ):
                self.coordinator.on_source_finished(vertex_id)
