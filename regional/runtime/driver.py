"""The driver of a job, for every runtime: plans epochs, runs them through a dispatcher, and
carries out the checkpoint coordinator's decisions (DESIGN §3, §6).

`JobDriver` owns the `CheckpointCoordinator` and the operator coordinators (a `SplitEnumerator`
per source, a `CommitCoordinator` per sink). Its ports are the job storage (`JobStorage`), the
sinks (the pipeline's `TableCommitter`s), a `Clock` and a `TaskDispatcher` that runs unit work
somewhere: Spark tasks (`regional.runtime.spark.SparkDispatcher`) or a simulation
(`regional.runtime.sim`). One checkpoint id travels driver → coordinator → driver → storage / sink /
cleaner; no layer rewrites another's decision.

Per epoch: trigger, plan one `UnitWork` per fallback unit (its restore states, new splits from
the enumerators), dispatch, feed the answers to the coordinator (`feed`), re-run units lost with
a failed batch each on its own (a fenced new attempt), tick at the deadline, then carry out the
decisions in order, one handler per decision type: write metadata, commit, discard, notify,
fail or finish; hand the deletions they made due to the background cleaner
(`runtime.cleaning`: a full scan at the driver's first clean, incremental plans after, drained
when `run` or `savepoint` returns). Every outcome becomes one
`metadata.events.CheckpointEvent`, handed to `progress`, kept in the `RunSummary` and written
to the job's event log.

On the first run the job restores (`regional.runtime.restore.find_restore_point`): the root's latest
restorable checkpoint, or a given checkpoint or savepoint. Savepoints are global checkpoints
whose state is also copied, self-contained, to `savepoints/sp-<id>/`. One driver per job root:
the root's lease (`metadata.lease`) is held while the driver runs.

About 500 lines, on purpose: the loop, start and restore, the lease and the reporting of one
driver read best together; carrying out decisions is `runtime.carry_out`, planning an epoch
`runtime.epoch_plan`.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Protocol, TypedDict, Unpack

import msgspec

from metadata.errors import StorageError
from metadata.events import CheckpointEvent, DriverStart, Outcome, StuckUnit, write_event
from metadata.lease import JobLease, LeaseLostError
from metadata.storage import JobStorage
from regional.coordinator import (
    CheckpointCoordinator,
    Decision,
    JobLayout,
    TriggerCheckpoint,
)
from regional.coordinator.commit import CommitCoordinator
from regional.coordinator.messages import Ack, AckBatch, Answer, UnitWork, answers_of
from regional.coordinator.split_enumerator import SplitEnumerator
from regional.dataflow.pipeline import Pipeline
from regional.errors import (
    CheckpointAbortedError,
    JobFailedError,
    RegionalError,
    RestoreError,
)
from regional.graph.regions import RegionPlan
from regional.graph.unit_names import names_of_plan
from regional.policy import Policy
from regional.runtime.carry_out import DecisionHandlers, EpochOutcome
from regional.runtime.cleaning import JobCleaning
from regional.runtime.dispatch import Dispatch, TaskDispatcher
from regional.runtime.epoch_plan import (
    drained_exchanges,
    finished_sources,
    plan_works,
    unit_reads,
)
from regional.runtime.faults import Faults
from regional.runtime.metrics import MetricsSnapshot, checkpoint_event, metrics_snapshot
from regional.runtime.restore import (
    clean_staged_sinks,
    find_restore_point,
    first_free_checkpoint_id,
    reset_exchanges,
    roll_back_sinks,
    verify_exchanges,
)
from regional.runtime.stalled_inputs import StallWatch, watched_inputs
from regional.runtime.timing import EpochStopwatch, EpochTiming
from regional.sources.replay import (
    MAX_BATCH_BYTES,
    REPLAY_DIR,
    REPLAY_SPLIT_PREFIX,
    decode_batch,
    describe_batch,
)

__all__ = [
    "Clock",
    "DriverOptions",
    "EpochWatch",
    "JobDriver",
    "RunSummary",
    "SystemClock",
    "feed",
    "job_layout",
    "new_run_id",
]

#: How often one commit may fail before the job fails with a `CommitError`.
COMMIT_ATTEMPTS = 3
#: A lost unit is re-run alone only if this much time is left before the epoch deadline.
RETRY_MIN_MS = 1000
#: The longest single wait of an idle job: a stop request ends the wait within this time.
IDLE_SLICE_S = 0.5
#: How long the job root's lease lasts without renewal (a driver on another host that died
#: blocks a restart this long; one on this host does not block it at all).
DEFAULT_LEASE_TTL = 30.0
log = logging.getLogger(__name__)


class Clock(Protocol):
    """Wall-clock time in milliseconds, and waiting (simulations advance a fake one)."""

    def now_ms(self) -> int: ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class EpochWatch(Protocol):
    """Sees the running epoch (a live progress view): its units when it starts, then every unit
    answer as it arrives. An answer may be reported twice (live by the dispatcher, then when
    the batch returns); a watcher counts the latest attempt of each unit."""

    def epoch_started(self, checkpoint_id: int, units: Sequence[int]) -> None: ...

    def unit_answered(self, answer: Answer) -> None: ...


@dataclasses.dataclass
class RunSummary:
    """The outcome of `JobDriver.run`: one `CheckpointEvent` per epoch, and how the run ended."""

    job_id: str
    restored_from: int | None = None
    checkpoints: list[CheckpointEvent] = dataclasses.field(default_factory=list)
    finished: bool = False
    seconds: float = 0.0
    restored_location: str | None = None  # where the restored checkpoint was read from
    restore_notes: tuple[str, ...] = ()  # rescaled vertices, dropped state
    savepoint: str | None = None  # the location of the savepoint taken at the stop

    def count(self, kind: str) -> int:
        """How many epochs ended as `kind` (an `Outcome`)."""
        return sum(1 for c in self.checkpoints if c.kind == kind)


def feed(coordinator: CheckpointCoordinator, answer: Answer, now_ms: int) -> list[Decision]:
    """Hand one unit answer to the coordinator (stale attempts are fenced off there)."""
    if isinstance(answer, Ack):
        return coordinator.on_ack(
            answer.checkpoint_id, answer.unit, answer.attempt, answer.states, now_ms
        )
    return coordinator.on_decline(
        answer.checkpoint_id, answer.unit, answer.attempt, answer.reason, now_ms
    )


@dataclasses.dataclass
class _Running:
    """An epoch whose tasks were dispatched (`batch`: the dispatch, or its future on the
    dispatch thread of a pipelined `run`)."""

    trigger: TriggerCheckpoint
    trigger_ms: int
    works: list[UnitWork]
    watch: EpochStopwatch
    batch: Future[Dispatch] | Dispatch

    def dispatched(self) -> Dispatch:
        """The dispatch's answers (waiting for the dispatch thread)."""
        return self.batch.result() if isinstance(self.batch, Future) else self.batch


@dataclasses.dataclass
class _Held:
    """An epoch whose commits (and what follows them) are still to carry out."""

    running: _Running
    records_in: int
    decisions: list[Decision]
    records_exchanged: int = 0


def new_run_id() -> str:
    """A new driver run's id (12 hex digits): in commit users, the lease and state file names."""
    return uuid.uuid4().hex[:12]


def job_layout(pipeline: Pipeline, plan: RegionPlan) -> JobLayout:
    """The coordinator's view of `pipeline` with its regions `plan`: units, subtasks, sources
    (bounded ones marked) and the graph fingerprint checkpoints are checked against."""
    graph = pipeline.job_graph()
    bounded = [v for v, s in pipeline.sources.items() if s.source and s.source.bounded]
    return JobLayout.from_plan(
        plan,
        graph.vertex_infos(),
        sources=pipeline.sources,
        bounded_sources=bounded,
        graph_fingerprint=graph.fingerprint(),
    )


class DriverOptions(TypedDict, total=False):
    """The options of a `JobDriver`, and of every runtime that builds one (`SparkRuntime`
    takes them as keyword arguments too), in three groups. All are optional.

    How it runs: `policy` (default `Policy()`); `faults` injected by tests and demos;
    `clock` (default the system clock; simulations pass a fake one); `interval` (seconds,
    default 0: never wait; `regional run` passes the policy's `checkpointing.interval`), the
    time from one trigger to the next after an epoch that read no records: an idle streaming
    job waits instead of spinning, while epochs that read records follow each other at once;
    `lease_ttl` (seconds per renewal of the job root's lease, default `DEFAULT_LEASE_TTL`);
    `run_id` names this driver run in the commit users, the lease and the state file names
    (default: a new random id); `metrics_port` serves the job's metrics for Prometheus on
    `metrics_host`:PORT (default 127.0.0.1) while `run` runs (`regional.runtime.prometheus`).

    Where it starts: `restore_from` is a checkpoint or savepoint to start from instead of the
    job root's latest (a savepoint directory, a `chk-<id>` directory or its `_metadata`; the
    root must hold no completed checkpoint then), restored in `restore_mode` (default: the
    policy's `restore.mode`): ``claim`` imports the restored state into the job root as a
    checkpoint of its own, ``no-claim`` only stages it there for the first checkpoint, which
    must be global; the source is never modified either way. `allow_dropped_state` lets a
    restore leave behind state the pipeline cannot take (a vertex it no longer has, a changed
    max parallelism) instead of failing; `allow_fresh_start` starts from nothing in a job root
    whose checkpoints are all damaged.

    Who watches: `progress` is called with every checkpoint outcome, `watch` sees the running
    epoch (its units, then each answer as it arrives), `observe` sees every trigger and every
    decision as it is carried out (tests, simulations).
    """

    policy: Policy | None
    faults: Faults | None
    clock: Clock | None
    interval: float
    lease_ttl: float
    run_id: str | None
    metrics_port: int | None
    metrics_host: str
    restore_from: str | None
    restore_mode: str | None
    allow_dropped_state: bool
    allow_fresh_start: bool
    progress: Callable[[CheckpointEvent], None] | None
    watch: EpochWatch | None
    observe: Callable[[Decision | TriggerCheckpoint], None] | None


class JobDriver:
    """Runs `pipeline` through `dispatcher` (the runtime: where unit work runs) with
    checkpoints in `storage`, configured by `DriverOptions`.

    One driver per job root: `start` takes the root's lease (`metadata.lease`) or raises
    `LeaseHeldError`; metadata writes, commits and cleaning check it first, and a driver that
    lost it stops with `LeaseLostError`. `run` and `savepoint` release it when they return or
    raise.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        dispatcher: TaskDispatcher,
        *,
        storage: JobStorage,
        **options: Unpack[DriverOptions],
    ) -> None:
        self.pipeline, self.dispatcher, self.storage = pipeline, dispatcher, storage
        self.job_id = storage.job_id
        # how it runs
        self.policy = options.get("policy") or Policy()
        self.faults = options.get("faults") or Faults()
        self.clock: Clock = options.get("clock") or SystemClock()
        self.interval = options.get("interval", 0.0)
        self.run_id = options.get("run_id") or new_run_id()
        self.metrics_port = options.get("metrics_port")
        self.metrics_host = options.get("metrics_host", "127.0.0.1")
        # where it starts
        self.restore_from = options.get("restore_from")
        self.restore_mode = options.get("restore_mode") or self.policy.restore.mode
        if self.restore_mode not in ("claim", "no-claim"):
            raise RestoreError(f"restore mode {self.restore_mode!r}: use claim or no-claim")
        self.allow_dropped_state = options.get("allow_dropped_state", False)
        self.allow_fresh_start = options.get("allow_fresh_start", False)
        # who watches
        self.progress = options.get("progress")
        self.watch = options.get("watch")
        self._observe = options.get("observe")

        self.plan = pipeline.regions()
        self.layout = job_layout(pipeline, self.plan)
        pipeline.bind(storage.job_path, storage.filesystem)  # exchanges live in the job root
        ttl_ms = round(options.get("lease_ttl", DEFAULT_LEASE_TTL) * 1000)
        self.lease = JobLease(storage, self.run_id, ttl_ms=ttl_ms, clock=self.clock.now_ms)
        self.enumerators = {
            v: SplitEnumerator(v, s.source.discover())  # type: ignore[union-attr]
            for v, s in pipeline.sources.items()
            if s.exchange_from is None  # an exchange reader's splits are fixed per subtask
        }
        # One commit user per job run and sink (Paimon's rule): a restore reloads it from the
        # checkpoint, while a fresh run of the same job (a new checkpoint root) gets a new one,
        # so its commits are never mistaken for the old run's and skipped.
        self.committers = {
            v: CommitCoordinator(v, commit_user=f"{self.job_id}-{self.run_id}-{v}")
            for v in pipeline.sinks
        }
        coordinator = CheckpointCoordinator(
            self.layout,
            self.policy,
            job_id=self.job_id,
            coordinators={**self.enumerators, **self.committers},
            reads=self.unit_reads,
            names=names_of_plan(self.plan).mention,
        )
        self.cleaning = JobCleaning(
            storage, self.lease, num_retained=self.policy.checkpointing.num_retained
        )
        self._stopwatch = EpochStopwatch()
        self.decisions = DecisionHandlers(
            pipeline=pipeline,
            storage=storage,
            policy=self.policy,
            coordinator=coordinator,
            committers=self.committers,
            lease=self.lease,
            faults=self.faults,
            cleaning=self.cleaning,
            stopwatch=self._stopwatch,
            now=self.now_ms,
            seen=self._seen,
        )
        if pipeline.timed:  # an input whose watermark stalls while state grows: a warning
            self.decisions.stall_watch = StallWatch(
                watched_inputs(pipeline, self.plan), self.policy.event_time.stall_after
            )
        self.last_timing: EpochTiming | None = None  # where the latest epoch's time went
        self._started = False
        self._replays_seen: set[tuple[str, str]] = set()  # replay batches in the event log
        self._stop_requested = False
        self.restored_from: int | None = None
        self.restored_location: str | None = None
        self.restore_notes: tuple[str, ...] = ()
        self.last_event: CheckpointEvent | None = None  # the latest outcome (metrics endpoint)
        self.records_in_total = 0  # records read by acked units since the driver started
        self._assigned: dict[int, tuple[str, ...]] = {}  # unit -> its latest new splits
        self._published = self.metrics  # what the metrics endpoint serves (`published_metrics`)

    # --- the loop ---------------------------------------------------------------------------

    @property
    def coordinator(self) -> CheckpointCoordinator:
        """The checkpoint coordinator, held once: by the handlers of its decisions."""
        return self.decisions.coordinator

    @coordinator.setter
    def coordinator(self, coordinator: CheckpointCoordinator) -> None:
        self.decisions.coordinator = coordinator

    @property
    def finished(self) -> bool:
        """True once the job ended: every bounded source read and its output committed."""
        return self.decisions.finished

    def run(
        self, *, max_checkpoints: int | None = None, stop_with_savepoint: bool = False
    ) -> RunSummary:
        """Run until the job finishes (bounded sources), `max_checkpoints` epochs ran or
        `request_stop()` was called; with `stop_with_savepoint`, a job that has not finished
        then takes a savepoint (`RunSummary.savepoint`) and stops.

        Raises `JobFailedError` past `tolerable-failed-checkpoints`, `DriverCrash` at an
        injected crash point, `CheckpointAbortedError` when the final savepoint failed, and
        `MetricsPortError` when `metrics_port` cannot be served.
        """
        if self.metrics_port is None:
            return self._run(max_checkpoints, stop_with_savepoint)
        from regional.runtime.prometheus import serve_metrics

        names = names_of_plan(self.plan).labels
        with serve_metrics(self, port=self.metrics_port, host=self.metrics_host, names=names):
            return self._run(max_checkpoints, stop_with_savepoint)

    def _run(self, max_checkpoints: int | None, stop_with_savepoint: bool) -> RunSummary:
        started = self.clock.now_ms()
        summary = RunSummary(self.job_id)
        try:
            if self.start():
                summary.restored_from = self.restored_from
                summary.restored_location = self.restored_location
                summary.restore_notes = self.restore_notes
            self._run_epochs(summary, max_checkpoints)
            self._stop_requested = False  # a later run() runs again
            if stop_with_savepoint and not self.decisions.finished:
                summary.savepoint = self._take_savepoint(summary)
            self.cleaning.drain()
        finally:
            self.cleaning.close()
            self.lease.release()
        summary.finished = self.decisions.finished
        summary.seconds = (self.clock.now_ms() - started) / 1000
        return summary

    def _run_epochs(self, summary: RunSummary, max_checkpoints: int | None) -> None:
        """`run`'s loop, pipelined where `_pipelines` allows (DESIGN §6): an epoch that read
        records and is not final holds its commits, the next epoch's tasks start, and the held
        commits run meanwhile on this thread, strictly in order and before the next epoch's
        answers are fed. A crash anywhere leaves what an unpipelined run leaves: the held
        checkpoint's metadata is durable (a restore re-commits it), the next one's files are
        staged only. The dispatch thread is joined before this returns or raises."""
        pool = ThreadPoolExecutor(1, thread_name_prefix="dispatch") if self._pipelines() else None
        started = 0
        held: _Held | None = None
        try:
            while (
                not self.decisions.finished
                and not self._stop_requested
                and (max_checkpoints is None or started < max_checkpoints)
            ):
                running = self._begin(savepoint=False, pool=pool if held is not None else None)
                started += 1
                if held is not None:
                    try:
                        summary.checkpoints.append(self._finish_held(held))
                    except BaseException:
                        self._abandon(running)
                        raise
                    held = None
                batch = running.dispatched()
                last = max_checkpoints is not None and started >= max_checkpoints
                out = self._conclude(
                    running,
                    batch,
                    hold_commits=pool is not None
                    and not last
                    and not running.trigger.final
                    and not self._draining(),
                )
                if isinstance(out, _Held):
                    if out.records_in + out.records_exchanged > 0 and not self._stop_requested:
                        held = out
                        continue
                    out = self._finish_held(out)
                summary.checkpoints.append(out)
                if out.records_in + out.records_exchanged == 0 and not last:
                    self._idle_until(out.trigger_time_ms + round(self.interval * 1000))
            if held is not None:
                summary.checkpoints.append(self._finish_held(held))
        finally:
            if pool is not None:
                pool.shutdown(wait=True)

    def _draining(self) -> bool:
        """Whether every source read from outside the job has finished, so that what is left
        is draining the keyed exchanges: such an epoch commits before the next one starts, so
        that the checkpoint after the one that reads an exchange's last records can be the
        final one (held, it would be known drained one epoch later: DESIGN §6)."""
        exchanges = self.pipeline.exchanges
        if not exchanges:
            return False
        finished = self.coordinator.finished_sources
        outside = [v for v in self.pipeline.sources if v not in exchanges]
        return bool(outside) and finished.issuperset(outside)

    def _idle_until(self, next_trigger_ms: int) -> None:
        """Wait for the next trigger after an epoch that read nothing (unless the job finished
        or a stop was requested meanwhile: a stop ends the wait within `IDLE_SLICE_S`)."""
        while not self.decisions.finished and not self._stop_requested:
            left = (next_trigger_ms - self.clock.now_ms()) / 1000
            if left <= 0:
                return
            self.clock.sleep(min(left, IDLE_SLICE_S))

    def request_stop(self) -> None:
        """Stop `run` after the running epoch (safe to call from a signal handler)."""
        self._stop_requested = True

    def savepoint(self) -> str:
        """Take a savepoint now (between epochs): a global checkpoint whose state is also
        copied to `savepoints/sp-<id>/`, self-contained; returns that directory's location.

        Raises `CheckpointAbortedError` when a unit failed it (the job's checkpoints are
        untouched), `CoordinatorStateError` when the job has finished.
        """
        try:
            self.start()
            location = self._take_savepoint(None)
            self.cleaning.drain()
            return location
        finally:
            self.cleaning.close()
            self.lease.release()

    def _take_savepoint(self, summary: RunSummary | None) -> str:
        event = self.epoch(savepoint=True)
        if summary is not None:
            summary.checkpoints.append(event)
        location = self.decisions.savepoints.get(event.checkpoint_id)
        if event.kind != Outcome.SAVEPOINT or location is None:
            raise CheckpointAbortedError(
                f"savepoint {event.checkpoint_id} of job {self.job_id} failed: "
                f"{event.message or 'aborted'}; the job's checkpoints are intact, so a new run "
                "resumes from its latest checkpoint"
            )
        return location

    def start(self) -> bool:
        """Take the job root's lease, prepare the dispatcher's workers, and restore the first
        time (then returns True). Raises `LeaseHeldError` while another driver runs the job;
        gives the lease back when anything else here fails."""
        self.lease.acquire()
        try:
            if isinstance(self.clock, SystemClock):
                self.lease.keep_renewed()  # epochs may outlast the TTL
            self.dispatcher.start()
            if not self._started:
                self._restore()
                self._replays_seen = self._replay_splits()  # those restored were recorded
                self._started = True
                self._published = self.metrics  # after the restore: its checkpoint, no outcome yet
                return True
            return False
        except BaseException:
            self.lease.release()
            raise

    def _restore(self) -> None:
        """Restore where `find_restore_point` says, or number checkpoints after any ids the
        root already uses."""
        point = find_restore_point(
            self.storage,
            self.pipeline,
            self.layout,
            restore_from=self.restore_from,
            mode=self.restore_mode,
            resume_mode=self.policy.restore.mode,
            allow_dropped_state=self.allow_dropped_state,
            run_id=self.run_id,
            allow_fresh_start=self.allow_fresh_start,
        )
        if point is None:
            self.coordinator.skip_to(first_free_checkpoint_id(self.storage))
            self.restore_notes = reset_exchanges(self.pipeline)
            clean_staged_sinks(self.pipeline, self.committers, self.job_id, None)
            return
        decisions = self.coordinator.restore(
            point.metadata,
            mode=point.mode,
            next_checkpoint_id=point.next_checkpoint_id,
            global_until_success=point.global_until_success,
        )
        self.lease.check()  # the rollback below writes to the sinks: fenced like any write
        self.decisions.restore_base = point.restore_base
        self.restored_from = point.checkpoint_id
        self.restored_location = point.location
        self.restore_notes = point.notes + roll_back_sinks(
            self.pipeline,
            self.committers,
            point.metadata.checkpoint_id,
            own_root=self.restore_from is None,
        )
        self.restore_notes += clean_staged_sinks(
            self.pipeline, self.committers, self.job_id, point.metadata
        )
        self.decisions.carry_out(decisions)
        verify_exchanges(self.pipeline, point.metadata)
        self._check_sources_finished()

    def epoch(self, *, savepoint: bool = False) -> CheckpointEvent:
        """Run one checkpoint epoch (a savepoint with `savepoint`) and return its outcome, once
        its metadata is written and its output committed."""
        running = self._begin(savepoint=savepoint)
        held = self._conclude(running, running.dispatched(), hold_commits=False)
        assert isinstance(held, CheckpointEvent)
        return held

    def _begin(self, *, savepoint: bool, pool: ThreadPoolExecutor | None = None) -> _Running:
        """Trigger a checkpoint, plan its units' work and start dispatching it: in `pool` (a
        pipelined `run`: the previous epoch's commits run meanwhile on this thread) or, without
        one, right here."""
        self._hold_lease()
        self._stopwatch = self.decisions.stopwatch = watch = EpochStopwatch()
        trigger_ms = self.clock.now_ms()
        trigger = self.coordinator.trigger(trigger_ms, savepoint=savepoint)
        self._seen(trigger)
        with watch.part("plan"):
            works = self._works(trigger)
        if self.watch is not None:
            self.watch.epoch_started(trigger.checkpoint_id, [w.unit_id for w in works])

        def dispatch() -> Dispatch:
            with watch.part("dispatch"):
                return self.dispatcher.run(works, trigger.deadline_ms)

        batch: Future[Dispatch] | Dispatch = dispatch() if pool is None else pool.submit(dispatch)
        return _Running(trigger, trigger_ms, works, watch, batch)

    def _conclude(
        self, running: _Running, batch: Dispatch, *, hold_commits: bool
    ) -> CheckpointEvent | _Held:
        """Feed the epoch's answers to the coordinator and carry out its decisions; returns the
        epoch's event, or with `hold_commits` the commits (and what follows them) still to
        carry out, when there are any (`_finish_held`)."""
        trigger, works, watch = running.trigger, running.works, running.watch
        cid = trigger.checkpoint_id
        arrived = batch.arrived()
        answers = answers_of(arrived) if batch.batches else list(batch.answers)
        with watch.part("feed"):
            decisions = self._feed(answers, arrived)
        if batch.error is not None:  # units lost with a failed batch: each re-run alone, once
            answered = {a.unit for a in answers}
            lost = [w for w in works if w.unit_id not in answered]
            attempts = {w.unit_id: w.attempt for w in lost}
            retried = self._retry_alone(trigger, lost, attempts)
            answers += retried
            decisions += self._feed(retried)
            again = {a.unit for a in retried}
            for work in lost:
                if self.coordinator.pending_checkpoint_id != cid:
                    break
                if work.unit_id not in again:
                    decisions += self.coordinator.on_decline(
                        cid, work.unit_id, attempts[work.unit_id], batch.error, self.clock.now_ms()
                    )
        watch.add_tasks(answers)
        if self.coordinator.pending_checkpoint_id == cid:
            decisions += self.coordinator.on_tick(max(self.clock.now_ms(), trigger.deadline_ms))
        acks = [a for a in answers if isinstance(a, Ack)]
        # the job's input only: a keyed exchange's reads are counted apart (issue 45)
        exchanged = sum(a.records_exchanged for a in acks)
        records_in = sum(a.records_in for a in acks) - exchanged
        self.faults.crash_point(cid, "after-acks")
        try:
            held = self.decisions.carry_out(
                self.decisions.deferred + decisions, hold_commits=hold_commits
            )
        except JobFailedError as failed:  # the job's last event says why it failed
            self._record(cid, records_in, running.trigger_ms, str(failed), exchanged)
            raise
        self._check_sources_finished()
        if held:
            return _Held(running, records_in, held, exchanged)
        return self._record(cid, records_in, running.trigger_ms, exchanged=exchanged)

    def _finish_held(self, held: _Held) -> CheckpointEvent:
        """Carry out an epoch's held commits and what follows them (in order, as `epoch` would
        have), then record its event; the next epoch's stopwatch is put back afterwards."""
        cid, trigger_ms = held.running.trigger.checkpoint_id, held.running.trigger_ms
        following = self._stopwatch
        self._stopwatch = self.decisions.stopwatch = held.running.watch
        try:
            try:
                self.decisions.carry_out(held.decisions)
            except JobFailedError as failed:
                self._record(cid, held.records_in, trigger_ms, str(failed), held.records_exchanged)
                raise
            if self.coordinator.pending_checkpoint_id is None:  # never under a running epoch
                self._check_sources_finished()
            return self._record(cid, held.records_in, trigger_ms, exchanged=held.records_exchanged)
        finally:
            self._stopwatch = self.decisions.stopwatch = following

    def _abandon(self, running: _Running) -> None:
        """The run stops on an exception while `running`'s tasks run (its previous epoch's held
        commits raised): wait for them and delete what they wrote, as an abort would (best
        effort, and only while the lease is held), so the stopped run leaves what an unpipelined
        one leaves and its checkpoint id stays free. A hard crash leaves the files; the next
        run then skips that id, as for any checkpoint in flight at a crash."""
        try:
            batch = running.dispatched()
        except Exception:
            return
        if not self.lease.held:
            return  # fenced: never write or delete without the lease
        files: dict[str, None] = {}
        staged: dict[str, list[bytes]] = {}
        for answer in answers_of(batch.arrived()):
            if isinstance(answer, Ack):
                for s in answer.states:
                    files.update(dict.fromkeys(h.path for h in s.handles if not h.shared))
                    if s.committables:
                        staged.setdefault(s.vertex_id, []).extend(s.committables)
        try:
            for path in files:
                self.storage.delete_file(path)
            for vertex_id, committables in staged.items():
                self.pipeline.sink_of(vertex_id).discard(tuple(committables))
        except Exception as exc:
            cid = running.trigger.checkpoint_id
            log.warning("files of checkpoint %d left for the cleaner: %s", cid, exc)

    def _pipelines(self) -> bool:
        """Whether `run` may start an epoch's tasks while the previous epoch's commits run: the
        dispatcher says it can run on another thread (Spark). A keyed exchange's readers then
        read what is committed when they list it (a commit in progress ends the list: DESIGN
        §4 rule 14), so they may read the previous epoch's segments one epoch later."""
        return bool(getattr(self.dispatcher, "background_safe", False))

    def _hold_lease(self) -> None:
        """Keep the lease at the start of an epoch. After a lapse (storage was unreachable while
        the lease should have been renewed) take it again, unless another driver wrote
        checkpoints meanwhile: then, and when another driver holds it, `LeaseLostError` stops
        this one. While storage stays unreachable the epoch runs anyway: its writes are fenced,
        so it aborts and the job goes on when storage returns."""
        lapsed = not self.lease.held
        try:
            self.lease.ensure()
            if lapsed and max(self.storage.list_checkpoint_ids(), default=0) > (
                self.coordinator.latest_completed_id or 0
            ):
                self.lease.release()
                raise LeaseLostError(
                    f"driver {self.run_id} found checkpoints of another driver in "
                    f"{self.storage.describe('')} after its lease lapsed; it stops without "
                    "writing: start the job again to resume from them"
                )
        except LeaseLostError:
            raise
        except StorageError as exc:
            log.warning("job %s: cannot renew the lease of its root: %s", self.job_id, exc)

    def handle_answer(self, answer: Answer) -> None:
        """Feed one (possibly late) unit answer to the coordinator and carry out the result."""
        self.decisions.carry_out(feed(self.coordinator, answer, self.clock.now_ms()))

    # --- reporting --------------------------------------------------------------------------

    @property
    def metrics(self) -> MetricsSnapshot:
        """The job's metrics now: completions, aborts by rule, the latest checkpoint's
        `oldest_ref_checkpoint_id`, per-unit lag, commit lag, records read, stuck units."""
        return self.metrics_at(self.clock.now_ms())

    def metrics_at(self, now_ms: int) -> MetricsSnapshot:
        """`metrics` with the consumer lag in time as of `now_ms` (a checkpoint outcome's
        time, so its event and the metrics published with it agree)."""
        watch = self.decisions.stall_watch
        return metrics_snapshot(
            self.coordinator.metrics,
            latest_completed_id=self.coordinator.latest_completed_id,
            commit_lag=self.commit_lag,
            records_dead_lettered=self.decisions.records_dead_lettered,
            records_late=self.decisions.records_late,
            job_id=self.job_id,
            records_in=self.records_in_total,
            stuck_units=self.stuck_units(),
            event_time=self.pipeline.timed,
            last_event=self.last_event,
            operator_records=self.decisions.operator_records,
            dead_letter_types=self.decisions.dead_letter_types,
            stalled_inputs=() if watch is None else watch.stalled,
            records_behind=self.decisions.records_behind,
            unread_since=self.decisions.unread_since,
            now_ms=now_ms,
        )

    def published_metrics(self) -> MetricsSnapshot:
        """The job's metrics as of its latest epoch (or its start): a frozen snapshot published
        once per outcome, which readers on other threads (the metrics endpoint,
        `runtime.prometheus`) read instead of the driver's live state."""
        return self._published

    def now_ms(self) -> int:
        """The driver's clock (`Clock.now_ms`)."""
        return self.clock.now_ms()

    @property
    def commit_lag(self) -> int:
        """Completed checkpoints whose output is not committed yet (the longest sink queue)."""
        return max((len(c.queued) for c in self.committers.values()), default=0)

    def _record(
        self,
        cid: int,
        records_in: int,
        trigger_ms: int,
        failed: str | None = None,
        exchanged: int = 0,
    ) -> CheckpointEvent:
        """The epoch's outcome: reported to `progress` and written to the event log (best
        effort: a failed write is logged, never fails the job)."""
        o = self.decisions.outcomes.pop(cid, None)
        o = o or EpochOutcome(Outcome.ABORTED, message="no decision")
        completed = o.outcome is not Outcome.ABORTED
        stuck = self.stuck_units()
        shown = {*o.fallback_units, *o.causes}
        reads = {u: self.unit_reads(u) for u in sorted(shown)[:100]}
        reads.update((s.unit_id, s.splits) for s in stuck)
        now = self.clock.now_ms()
        event = checkpoint_event(
            self.job_id,
            cid,
            o.outcome,
            self.metrics_at(now),
            trigger_time_ms=trigger_ms,
            time_ms=now,
            fresh_units=self.layout.num_units - len(o.fallback_units) if completed else 0,
            fallback_units=o.fallback_units,
            causes=o.causes,
            tracebacks=o.tracebacks,
            records_dead_lettered=o.records_dead_lettered,
            records_late=o.records_late,
            watermark=(o.watermark, o.watermark_unit),
            abort_rule=o.abort_rule,
            message=failed or o.message,
            records_in=records_in,
            records_exchanged=exchanged,
            stuck=stuck,
            unit_reads={u: r for u, r in reads.items() if r},
            warnings=o.warnings + self._dispatcher_notes(),
            started=self._how_started() if self.last_event is None else None,
        )
        event = msgspec.structs.replace(event, replays=self._new_replays())
        self.records_in_total += records_in
        self.last_event = event
        self._published = self.metrics_at(now)
        try:
            with self._stopwatch.part("event"):
                self.lease.check()  # fenced: a driver that lost the lease writes no event
                self.cleaning.event_written(write_event(self.storage, event))
        except LeaseLostError:
            raise
        except (RegionalError, OSError) as exc:
            log.warning("event of checkpoint %d not written: %s", cid, exc)
        self.last_timing = self._stopwatch.timing(cid)
        if self.progress is not None:
            self.progress(event)
        return event

    def _replay_splits(self) -> set[tuple[str, str]]:
        """(source vertex, split) of every replay batch the split enumerators handed out."""
        return {
            (v, s)
            for v, e in self.enumerators.items()
            for s in e.owners
            if s.startswith(REPLAY_SPLIT_PREFIX)
        }

    def _new_replays(self) -> tuple[str, ...]:
        """One line per replay batch handed out to a subtask since the last event (the job
        began to read it; DESIGN §4 rule 25), from its manifest; best effort, as the event."""
        new = sorted(self._replay_splits() - self._replays_seen)
        self._replays_seen.update(new)
        lines = []
        for vertex, split in new:
            rel = f"{REPLAY_DIR}/{vertex}/{split[len(REPLAY_SPLIT_PREFIX) :]}.jsonl"
            try:
                data = self.storage.read_file(rel, limit=MAX_BATCH_BYTES) or b""
                lines.append(describe_batch(decode_batch(data, where=rel)[0]))
            except (RegionalError, OSError, UnicodeDecodeError) as exc:
                lines.append(f"replay batch {split} into {vertex!r} (manifest unread: {exc})")
        return tuple(lines)

    def _dispatcher_notes(self) -> tuple[str, ...]:
        """What the dispatcher says happened to its workers since the last event (continuous
        mode: a single task lost, restarted or cancelled); nothing for the others."""
        take = getattr(self.dispatcher, "take_notes", None)
        return tuple(take()) if take is not None else ()

    def _how_started(self) -> DriverStart:
        """What this driver's first event records of its start: the checkpoint it restored,
        from where, and what the restore changed (the report's driver restarts)."""
        return DriverStart(
            restored_from=self.restored_from,
            location=self.restored_location or "",
            notes=self.restore_notes,
        )

    def unit_reads(self, unit_id: int) -> tuple[str, ...]:
        """The splits `unit_id` reads (its name: `metadata.unit_names.unit_name`)."""
        return unit_reads(unit_id, self.layout, self.enumerators, self.coordinator, self._assigned)

    def stuck_units(self) -> tuple[StuckUnit, ...]:
        """The units stuck now (DESIGN §4 rule 5), each with what it reads and why. Its
        `fallbacks` is its lag (checkpoint ids since its owner: `inspect lag`, the events'
        `unit_lag`, the metric), not the limit's streak, which a restore restarts at
        max-unit-fallbacks and which skips aborted attempts (issue 45)."""
        c = self.coordinator
        lag = c.metrics.unit_lag
        return tuple(
            StuckUnit(
                unit_id=u,
                splits=self.unit_reads(u),
                since_ms=since,
                owner_checkpoint_id=c.unit_owner(u),
                fallbacks=lag.get(u, c.limits.streak.get(u, 0)),
                cause=(c.last_cause.get(u, "").splitlines() or [""])[0],
            )
            for u, since in sorted(c.stuck_units.items())
        )

    def _seen(self, thing: Decision | TriggerCheckpoint) -> None:
        if self._observe is not None:
            self._observe(thing)

    # --- planning and dispatching -----------------------------------------------------------

    def _works(self, trigger: TriggerCheckpoint) -> list[UnitWork]:
        works = plan_works(trigger, self.pipeline, self.layout, self.enumerators, self.coordinator)
        for w in works:
            if w.new_splits:  # what a unit that never checkpointed reads: its name
                self._assigned[w.unit_id] = tuple(split for _, _, split in w.new_splits)
        return works

    def _feed(
        self, answers: Sequence[Answer], arrived: Sequence[Answer | AckBatch] | None = None
    ) -> list[Decision]:
        """Hand a dispatch's answers to the coordinator as one batch (`on_answers`): `arrived`
        as the dispatcher returned them (`Dispatch.arrived`, default `answers`), `answers` the
        same with every `AckBatch` replaced by its acks."""
        self.decisions.note_answers(answers)
        if self.watch is not None:
            for a in answers:
                self.watch.unit_answered(a)
        return self.coordinator.on_answers(
            answers if arrived is None else arrived, self.clock.now_ms()
        )

    def _retry_alone(
        self, trigger: TriggerCheckpoint, lost: list[UnitWork], attempts: dict[int, int]
    ) -> list[Answer]:
        """Re-run units lost with a failed batch, each on its own with a new (fenced) attempt,
        so a crash is confined to its own unit (research/spark.md §1.2). `attempts` is updated
        to the attempt each unit now runs as."""
        cid = trigger.checkpoint_id
        if not lost or self.coordinator.pending_checkpoint_id != cid:
            return []
        if trigger.deadline_ms - self.clock.now_ms() < RETRY_MIN_MS:
            return []  # no time left: the lost units are declined
        works = [
            msgspec.structs.replace(
                w, attempt=self.coordinator.retry_unit(cid, w.unit_id, self.clock.now_ms())
            )
            for w in lost
        ]
        attempts.update((w.unit_id, w.attempt) for w in works)
        return answers_of(self.dispatcher.run(works, trigger.deadline_ms, isolated=True).arrived())

    def _check_sources_finished(self) -> None:
        """Tell the coordinator which bounded sources have read everything."""
        for vertex_id in finished_sources(
            self.pipeline, self.layout, self.enumerators, self.coordinator
        ):
            self.coordinator.on_source_finished(vertex_id)
        if self.pipeline.exchanges:
            queued = {v: c.queued for v, c in self.committers.items()}
            for reader in drained_exchanges(self.pipeline, self.layout, self.coordinator, queued):
                self.coordinator.on_source_finished(reader)
