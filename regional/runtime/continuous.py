"""Continuous mode (DESIGN §6): a `TaskDispatcher` whose Spark tasks live across epochs and
take each epoch's work over the driver channel (`regional.runtime.channel`).

Micro-epoch mode (`regional.runtime.spark.SparkDispatcher`) submits one Spark job per epoch:
its tasks start 50–95 ms after the submit and their results reach the driver 25–35 ms after
they end, and every epoch decodes state again in whichever worker Spark picks. Here the
`ContinuousDispatcher` keeps `tasks` long-lived Spark tasks running, each **its own one-task
Spark job** in its own job group. Every task connects to the driver's channel, and per epoch
the dispatcher sends each task the work of its units and waits for the answers; the task runs
today's `regional.runtime.task.run_units` and answers with the same typed answers (acks packed
per task). The coordinator and `JobDriver` are unchanged: they see a dispatcher that returns a
`Dispatch` by the deadline.

* **Open epochs** (`checkpoint_interval_s`): the work goes out flagged `open_epoch`, and the
  tasks read and run batch after batch (`regional.runtime.open_epoch`) until the dispatcher
  sends the checkpoint's `Marker`, `checkpoint_interval_s` after the epoch's round began; the
  task side waits for it between batches (`MarkerWait`). `round_trips_ms` keeps how long each
  marker took to bring every answer back. Without an interval each epoch reads one batch.
* **Notes for the events**: `take_notes` hands the driver what happened to single tasks since
  its last checkpoint event (lost, ended, cancelled, restarted), which the event's warnings say.

* **Units stay on their task** (`UnitPlacement`): placed once (the first epoch's works spread
  as `spread_over_tasks` spreads them, later units on the least loaded task), then sticky by
  unit id, so a unit's Python worker keeps its state decoded (`TaskEnv.hot_state`): every
  epoch after a unit's first in a task restores hot.
* **One Spark job per task**: a Python worker that dies (a crash, an OOM kill) fails only its
  own job; the other tasks keep running, with their state hot. `regional`'s sessions run
  with `spark.task.maxFailures=1` (DESIGN §4 rule 9), so Spark itself does not retry the task:
  the dispatcher resubmits that task's job at the next epoch (dynamic submission) and records
  it (`events`). Where Spark does retry (a cluster with `spark.task.maxFailures` > 1), the new
  attempt connects and the channel fences the old one; either way the new attempt gets work
  from the next epoch on. The epoch in which a task died returns its units unanswered with an
  error naming the task and units; the driver re-runs them alone (`isolated`), which this
  dispatcher hands to a `SparkDispatcher` (one small Spark job per unit, as micro-epoch mode
  does: they need a free core, e.g. the dead task's).
* **Deadlines**: answers that arrive after `deadline_ms` are not waited for; a task still
  busy at the deadline (a unit stuck where SIGALRM cannot break it) has its job cancelled and
  resubmitted at the next epoch, so one stuck task never holds the others up. Its late
  answers are fenced by checkpoint id.
* **Stop**: `close` sends every task `Stop` (the tasks return, their jobs end) and cuts the
  channel; a driver that goes away closes the sockets, and a task whose channel closes returns.
"""

from __future__ import annotations

import collections
import dataclasses
import gc
import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Protocol

from regional.coordinator.messages import AckBatch, Answer, UnitWork
from regional.coordinator.verdict import name_units
from regional.errors import RegionalError
from regional.runtime.channel import (
    Answers,
    ChannelClosed,
    ChannelServer,
    EpochRound,
    Marker,
    Stop,
    TaskAttempt,
    TaskChannel,
    Work,
    new_token,
)
from regional.runtime.dispatch import Dispatch, TaskDispatcher, spread_over_tasks
from regional.runtime.spark_errors import spark_failure
from regional.runtime.task import TaskEnv

if TYPE_CHECKING:
    from pyspark import SparkContext

__all__ = [
    "CONNECT_TIMEOUT_S",
    "ROUND_TRIPS_KEPT",
    "ContinuousDispatcher",
    "ContinuousEvent",
    "ContinuousStartError",
    "IsolatedRuns",
    "MarkerWait",
    "UnitPlacement",
]

log = logging.getLogger(__name__)

#: How long `start` waits for every task of the long job to connect (the first import of the
#: task side in a fresh Python worker costs seconds; a cluster may still be starting executors).
CONNECT_TIMEOUT_S = 120.0
#: How long `close` waits for the tasks to return before it cancels their jobs.
STOP_TIMEOUT_S = 10.0
#: How many checkpoint round trips `ContinuousDispatcher.round_trips_ms` keeps.
ROUND_TRIPS_KEPT = 4096


class IsolatedRuns(TaskDispatcher, Protocol):
    """Where units lost with a task are re-run alone (`SparkDispatcher`: a Spark job each),
    shipped the same `env` as the long-lived tasks."""

    env: TaskEnv


class ContinuousStartError(RegionalError):
    """The long-lived tasks did not all connect to the driver's channel."""


@dataclasses.dataclass(frozen=True)
class ContinuousEvent:
    """Something the dispatcher did to keep the long job running: `kind` is one of
    ``submitted`` (a task's job started; `generation` counts its submissions), ``ended`` (it
    ended on its own: a dead worker, retries exhausted), ``cancelled`` (over the deadline, or
    at `close`), ``connected`` (an attempt passed the handshake), ``lost`` (a task's
    connection dropped with an epoch's work on it), ``restarted`` (a task's job submitted
    again after its earlier one ended or was cancelled; follows its ``submitted``)."""

    kind: str
    task: int
    message: str
    generation: int = 0
    time_ms: int = 0


class UnitPlacement:
    """Which long-lived task runs which unit (pure): placed once, then sticky by unit id.

    >>> from metadata.model import SubtaskState
    >>> def work(unit):
    ...     return UnitWork(1, 1, unit, (SubtaskState("src", unit, unit),))
    >>> p = UnitPlacement(2)
    >>> [[w.unit_id for w in t] for t in p.place([work(u) for u in range(4)])]
    [[0, 1], [2, 3]]
    >>> [[w.unit_id for w in t] for t in p.place([work(u) for u in (3, 0, 4)])]
    [[0, 4], [3]]
    """

    def __init__(self, tasks: int) -> None:
        if tasks < 1:
            raise ValueError(f"continuous mode runs at least one task, not {tasks}")
        self.tasks = tasks
        self.task_of: dict[int, int] = {}

    def place(self, works: Sequence[UnitWork]) -> list[list[UnitWork]]:
        """`works` by task, in `works` order within a task; units never seen are placed now."""
        new = [w for w in works if w.unit_id not in self.task_of]
        if new and not self.task_of:
            for task, slice_ in enumerate(spread_over_tasks(new, self.tasks)):
                self.task_of.update((w.unit_id, task) for w in slice_)
        else:
            load = [0] * self.tasks
            for task in self.task_of.values():
                load[task] += 1
            for w in new:
                task = min(range(self.tasks), key=lambda t: (load[t], t))
                self.task_of[w.unit_id] = task
                load[task] += 1
        out: list[list[UnitWork]] = [[] for _ in range(self.tasks)]
        for w in works:
            out[self.task_of[w.unit_id]].append(w)
        return out


def long_task(
    env: TaskEnv, address: tuple[str, int], token: bytes, run_id: str
) -> Callable[[Iterable[int]], Iterable[int]]:
    """The partition function of a long-lived task (its one input element is its task index):
    connect, then run every `Work` the driver sends with `run_units` and answer, until `Stop`
    or the driver goes away. An open epoch's `Work` runs until its checkpoint's `Marker`
    (`MarkerWait`). Yields how many epochs it served."""

    def run(it: Iterable[int]) -> Iterable[int]:
        from pyspark import TaskContext

        from regional.coordinator.messages import packed
        from regional.runtime.channel import ChannelClosed, Stop, TaskChannel
        from regional.runtime.task import run_units

        [task] = list(it)  # drained: a worker whose input is not drained is not reused
        gc.collect()
        gc.freeze()  # what the imports made lives as long as the worker (see `_warm_up`)
        ctx = TaskContext.get()
        attempt = ctx.attemptNumber() if ctx is not None else 0
        tid = ctx.taskAttemptId() if ctx is not None else 0
        channel = TaskChannel.connect(address, token, run_id, task, attempt, tid)
        served = 0
        stopping = False
        try:
            while not stopping:
                try:
                    message = channel.receive()
                except (ChannelClosed, OSError):
                    break  # the driver went away: end, never orphan the worker
                if isinstance(message, Stop):
                    break
                if isinstance(message, Work):
                    marker = (
                        MarkerWait(channel, run_id, message.checkpoint_id)
                        if message.open_epoch
                        else None
                    )
                    answers = packed(run_units(env, message.works, until=marker))
                    reply = Answers(
                        run_id, message.checkpoint_id, message.task_attempt_id, message.units,
                        answers,
                    )  # fmt: skip
                    try:
                        channel.send(reply)
                    except OSError:
                        break
                    served += 1
                    stopping = marker is not None and marker.stop
        finally:
            channel.close()
        return iter([served])

    return run


class MarkerWait:
    """`until` of an open epoch's `run_units`: True once checkpoint `checkpoint_id`'s
    `Marker` came over `channel` (waiting up to `wait` seconds for it). A `Stop` or a driver
    gone closes the epoch too (`stop`: the task returns after it answers); an older
    checkpoint's marker is ignored."""

    def __init__(self, channel: TaskChannel, run_id: str, checkpoint_id: int) -> None:
        self.channel = channel
        self.run_id = run_id
        self.checkpoint_id = checkpoint_id
        self.stop = False

    def __call__(self, wait: float) -> bool:
        until = time.monotonic() + wait
        while True:
            try:
                message = self.channel.poll(max(0.0, until - time.monotonic()))
            except (ChannelClosed, OSError):
                self.stop = True
                return True
            if message is None:
                return False
            if isinstance(message, Stop):
                self.stop = True
                return True
            if (
                isinstance(message, Marker)
                and message.run_id == self.run_id
                and message.checkpoint_id == self.checkpoint_id
            ):
                return True


@dataclasses.dataclass
class _TaskJob:
    """One long-lived task's Spark job, run from `thread`; `ended` is why it failed."""

    task: int
    generation: int
    group: str
    thread: threading.Thread
    ended: BaseException | None = None
    cancelled: bool = False

    @property
    def running(self) -> bool:
        """Its task runs (or is starting), and was not cancelled."""
        return self.thread.is_alive() and not self.cancelled


class ContinuousDispatcher:
    """Runs unit work in `tasks` long-lived Spark tasks on `sc` (implements
    `regional.runtime.dispatch.TaskDispatcher`; see the module doc); units lost with a task
    are re-run alone by `isolated` (`regional.runtime.spark.SparkRuntime` passes a
    `SparkDispatcher`). The channel listens on `host` (default `spark.driver.host`);
    `on_event` is told every `ContinuousEvent`."""

    #: `JobDriver.run` may dispatch from its dispatch thread while it commits (pipelined).
    background_safe = True

    def __init__(
        self,
        sc: SparkContext,
        env: TaskEnv,
        *,
        tasks: int,
        job_id: str,
        run_id: str,
        isolated: IsolatedRuns,
        host: str | None = None,
        connect_timeout_s: float = CONNECT_TIMEOUT_S,
        on_event: Callable[[ContinuousEvent], None] | None = None,
        checkpoint_interval_s: float | None = None,
    ) -> None:
        if checkpoint_interval_s is not None and not checkpoint_interval_s > 0:
            raise ValueError(
                f"continuous job {job_id}: checkpoint interval {checkpoint_interval_s!r} s; "
                "give a positive duration such as '100 ms'"
            )
        self.sc = sc
        self.checkpoint_interval_s = checkpoint_interval_s
        self._env = env
        self.tasks = tasks
        self.job_id = job_id
        self.run_id = run_id
        self.host = host or sc.getConf().get("spark.driver.host") or "127.0.0.1"
        self.connect_timeout_s = connect_timeout_s
        self.on_event = on_event
        self.placement = UnitPlacement(tasks)
        self.isolated = isolated
        self.events: list[ContinuousEvent] = []
        self._token = new_token()
        self._server: ChannelServer | None = None
        self._jobs: dict[int, _TaskJob] = {}  # each task's current job
        self._all_jobs: list[_TaskJob] = []  # with cancelled ones still ending
        self._seen: dict[int, TaskAttempt] = {}  # the attempts `connected` was told of
        self._generation = 0
        #: per open epoch, milliseconds from its marker to its last answer (the checkpoint
        #: round trip: snapshot, upload, ack), the latest `ROUND_TRIPS_KEPT`
        self.round_trips_ms: collections.deque[float] = collections.deque(maxlen=ROUND_TRIPS_KEPT)
        self._noted = 0  # the events `take_notes` handed out
        self._ever_submitted: set[int] = set()  # tasks whose job was submitted once
        self._lock = threading.Lock()  # one run (or start, close) at a time
        self._lock_events = threading.Lock()  # `events` (read by the driver's thread)

    @property
    def env(self) -> TaskEnv:
        """What the tasks run with; setting it restarts the tasks at the next epoch."""
        return self._env

    @env.setter
    def env(self, env: TaskEnv) -> None:
        self.close()
        self._env = self.isolated.env = env

    # --- the long job -----------------------------------------------------------------------

    def start(self) -> None:
        """Start every task's job and wait until every task has connected; raises
        `ContinuousStartError` naming the tasks that did not (and why that may be)."""
        with self._lock:
            self._keep_running(range(self.tasks))
            server = self._channel()
            until = time.monotonic() + self.connect_timeout_s
            with server.changed:
                while len(server.fencing.live) < self.tasks:
                    left = until - time.monotonic()
                    if left <= 0 or not any(j.thread.is_alive() for j in self._jobs.values()):
                        break
                    server.changed.wait(min(left, 0.5))
                self._note_connections(server)
                missing = sorted(set(range(self.tasks)) - set(server.fencing.live))
            if missing:
                ended = [f"task {j.task}: {j.ended}" for j in self._jobs.values() if j.ended]
                self._stop_tasks()  # the tasks that did connect give their slots back
                raise ContinuousStartError(
                    f"continuous mode: tasks {missing} of job {self.job_id} did not connect to "
                    f"the driver channel at {server.address[0]}:{server.address[1]} within "
                    f"{self.connect_timeout_s:g} s"
                    + (f" ({'; '.join(ended)})" if ended else "")
                    + ". Each task holds a core for the whole run: run at most as many tasks as "
                    "the cluster has free cores (`tasks=`), and check that executors can reach "
                    "spark.driver.host"
                )

    def _channel(self) -> ChannelServer:
        if self._server is None:
            self._server = ChannelServer(self.host, self._token, self.run_id, self.tasks)
        return self._server

    def _keep_running(self, tasks: Sequence[int] | range) -> None:
        """Submit the job of every task in `tasks` whose job is not running (again, after it
        ended: dynamic submission)."""
        server = self._channel()
        for task in tasks:
            job = self._jobs.get(task)
            if job is not None and job.running:
                continue
            if job is not None and not job.cancelled:
                why = "its job ended" if job.ended is None else self._why(job)
                self._event("ended", task, f"task {task}: {why}", job.generation)
            self._submit(task, server)

    @staticmethod
    def _why(job: _TaskJob) -> str:
        return f"its job ended: {spark_failure(str(job.ended) or repr(job.ended), [])}"

    def _submit(self, task: int, server: ChannelServer) -> None:
        self._generation += 1
        generation = self._generation
        group = f"regional-{self.job_id}-continuous-t{task}-g{generation}"
        fn = long_task(self._env, server.address, self._token, self.run_id)
        sc = self.sc
        holder: list[_TaskJob] = []

        def job() -> None:
            sc.setJobGroup(group, f"continuous task {task}", interruptOnCancel=True)
            try:
                sc.parallelize([task], 1).mapPartitions(fn).collect()
            except BaseException as exc:  # recorded: the next epoch resubmits
                holder[0].ended = exc

        thread = threading.Thread(target=job, name=group, daemon=True)
        holder.append(_TaskJob(task, generation, group, thread))
        self._jobs[task] = holder[0]
        self._all_jobs.append(holder[0])
        thread.start()
        self._event("submitted", task, f"task {task}: job {group} submitted", generation)
        if task in self._ever_submitted:
            self._event("restarted", task, f"task {task} started again ({group})", generation)
        self._ever_submitted.add(task)

    def take_notes(self) -> tuple[str, ...]:
        """What happened to single tasks since the last call that a checkpoint's event should
        say (the driver adds it to the event's warnings): a task lost with its work, a job that
        ended or was cancelled, and a task's job submitted again (a restart); the first
        submissions and connections are not news."""
        with self._lock_events:
            fresh = self.events[self._noted :]
            self._noted = len(self.events)
        return tuple(
            f"continuous mode: {e.message}"
            for e in fresh
            if e.kind in ("lost", "ended", "cancelled", "restarted")
        )

    def _event(self, kind: str, task: int, message: str, generation: int = 0) -> None:
        event = ContinuousEvent(kind, task, message, generation, int(time.time() * 1000))
        with self._lock_events:
            self.events.append(event)
        level = logging.INFO if kind in ("submitted", "connected") else logging.WARNING
        log.log(level, "continuous job %s: %s", self.job_id, message)
        if self.on_event is not None:
            self.on_event(event)

    def _cancel(self, task: int, why: str) -> None:
        """Cancel task `task`'s job and fence its attempt now (its connection is cut), so the
        next epoch resubmits the task instead of sending work to a task on its way out."""
        job = self._jobs.get(task)
        if job is None or not job.running:
            return
        job.cancelled = True
        self.sc.cancelJobGroup(job.group)
        if self._server is not None:
            self._server.fence(task)
        self._event("cancelled", task, f"task {task}: cancelled ({why})", job.generation)

    def _note_connections(self, server: ChannelServer) -> None:
        """Tell of every attempt admitted since the last look (call under `server.changed`)."""
        for task, attempt in sorted(server.fencing.live.items()):
            if self._seen.get(task) != attempt:
                self._seen[task] = attempt
                self._event("connected", task, f"{attempt.name()} connected")

    def close(self) -> None:
        """Stop every task (`Stop`; their jobs end), cancel what does not stop in
        `STOP_TIMEOUT_S`, close the channel. A later `start` or `run` starts them again."""
        with self._lock:
            self._stop_tasks()

    def _stop_tasks(self) -> None:
        server = self._server
        if server is None:
            return
        with server.changed:
            live = list(server.fencing.live.values())
        for attempt in live:
            server.send(attempt, Stop(self.run_id, "the dispatcher closed"))
        connected = {attempt.task for attempt in live}
        for task in [t for t in self._jobs if t not in connected]:  # none to tell: cancel now
            self._cancel(task, "the dispatcher closed before it connected")
        until = time.monotonic() + STOP_TIMEOUT_S
        for job in self._all_jobs:
            job.thread.join(max(0.0, until - time.monotonic()))
        for task in list(self._jobs):
            self._cancel(task, "it did not stop when the dispatcher closed")
        for job in self._all_jobs:
            job.thread.join(STOP_TIMEOUT_S)
        server.close()
        self._server = None
        self._jobs.clear()
        self._all_jobs.clear()
        self._seen.clear()

    # --- one epoch --------------------------------------------------------------------------

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        """Send each task its units' works for this epoch; the answers that arrived by
        `deadline_ms`. With `isolated` (the driver's re-run of units lost with a task), each
        unit runs as its own Spark job (`SparkDispatcher`)."""
        if not works:
            return Dispatch([])
        if isolated and self.checkpoint_interval_s is not None:
            # open epochs: a re-run alone would start a cold one-task Spark job per unit and
            # hold the checkpoint of every other unit until it ends; the lost units decline
            # now, fall back, and run again once their task is back
            return Dispatch([], f"not re-run alone in continuous mode with a checkpoint "
                            f"interval: {name_units([w.unit_id for w in works])} run again "
                            "when their task is back")  # fmt: skip
        if isolated:
            return self.isolated.run(works, deadline_ms, isolated=True)
        with self._lock:
            return self._round(works, deadline_ms)

    def _round(self, works: Sequence[UnitWork], deadline_ms: int) -> Dispatch:
        """Send each task its works as soon as it is connected (a resubmitted task connects
        during the epoch; the others do not wait for it), take the answers until every task
        answered or was lost, or the deadline; a task not connected by then lost its units.
        With a `checkpoint_interval_s` the epoch is open: every task that got work is sent
        the checkpoint's `Marker` once the interval since this round began has passed (a task
        that connects later, starting again after it died, gets its work and the marker at
        once)."""
        opened = time.time()
        by_task = self.placement.place(works)
        pending = {t: ws for t, ws in enumerate(by_task) if ws}  # not sent yet
        self._keep_running(list(pending))
        server = self._channel()
        cid = works[0].checkpoint_id
        epoch = EpochRound(self.run_id, cid)
        interval = self.checkpoint_interval_s
        close_at = None if interval is None else opened + interval
        marked: set[int] = set()  # the tasks sent the marker
        marker_at = 0.0  # when the first marker went out
        with server.changed:
            server.inbox.clear()  # earlier epochs' late answers: fenced anyway
            server.dropped.clear()
        while True:
            if pending:  # a task whose job ended since (its worker died): submit it again
                with server.changed:
                    absent = [t for t in pending if t not in server.fencing.live]
                self._keep_running(absent)
            sends: list[tuple[TaskAttempt, Work | Marker]] = []
            with server.changed:
                self._note_connections(server)
                for task in [t for t in pending if t in server.fencing.live]:
                    attempt = server.fencing.live[task]
                    work = epoch.sent(attempt, pending.pop(task), open_epoch=close_at is not None)
                    sends.append((attempt, work))
                if close_at is not None and time.time() >= close_at:
                    for task in epoch.waiting:
                        if task not in marked:
                            marked.add(task)
                            sends.append((epoch.out[task][0], Marker(self.run_id, cid)))
                            marker_at = marker_at or time.monotonic()
            for attempt, out in sends:
                why = server.send(attempt, out)
                if why is not None:
                    with server.changed:
                        epoch.lost_task(attempt, why)
            with server.changed:
                for sender, message in server.inbox:
                    if isinstance(message, Answers):
                        fenced = epoch.take(message, sender)
                        if fenced is not None:
                            log.debug("continuous job %s: fenced %s", self.job_id, fenced)
                server.inbox.clear()
                for gone in server.dropped:
                    if epoch.lost_task(gone):
                        self._event("lost", gone.task, epoch.lost[gone.task])
                server.dropped.clear()
                now = time.time()
                left = deadline_ms / 1000 - now
                if (epoch.done and not pending) or left <= 0:
                    break
                # a connection, an answer or a drop notifies; poll briefly while tasks connect
                wait = min(left, 0.05 if pending else 0.5)
                if close_at is not None and set(epoch.waiting) - marked:
                    wait = min(wait, max(0.0, close_at - now))
                if wait > 0:
                    server.changed.wait(wait)
        if marker_at and epoch.done and not epoch.lost:
            self.round_trips_ms.append((time.monotonic() - marker_at) * 1000)
        for task, ws in pending.items():
            epoch.unsent(
                task, [w.unit_id for w in ws], f"long-lived task {task} did not connect by "
                "the epoch deadline (starting, or waiting for a free slot)",
            )  # fmt: skip
        for task in epoch.waiting:  # stuck past the deadline: its job goes, the next epoch
            units = self._units_on(task, works)  # resubmits it
            self._cancel(task, f"no answer for {name_units(units)} by the epoch deadline")
        return _dispatch(epoch.arrived(), _error(epoch))

    def _units_on(self, task: int, works: Sequence[UnitWork]) -> list[int]:
        """The units of `works` that run on task `task`."""
        return [w.unit_id for w in works if self.placement.task_of.get(w.unit_id) == task]


def _error(epoch: EpochRound) -> str | None:
    """Why units went unanswered (tasks lost or not connected), or None."""
    if not epoch.lost:
        return None
    return "; ".join(epoch.lost[t] for t in sorted(epoch.lost))


def _dispatch(arrived: list[Answer | AckBatch], error: str | None) -> Dispatch:
    """`arrived` (each task's acks packed) as a `Dispatch`."""
    batches = [a for a in arrived if type(a) is AckBatch]
    answers: list[Answer] = [a for a in arrived if type(a) is not AckBatch]  # type: ignore[misc]
    return Dispatch(answers, error, batches)
