"""The task side of one checkpoint epoch: run units, snapshot them, answer ack or decline.

Runs inside a Spark task (or anywhere: nothing here imports Spark). For each unit of work the
task restores the unit's subtasks from the state the coordinator named (verified segments),
reads its sources from their positions, runs the operators, stages sink files, and snapshots:

* **sync phase** (under the unit's timeout): operator state is serialised to a local file;
* **async phase** (FLINK-37375): the task's units' snapshots go to checkpoint storage as **one
  physical state file per task** (DESIGN §4 rule 16, FLIP-306): each unit's sync phase appends
  its segments to the task's local spool file, and after the last unit the spool is uploaded
  once, read back, and every segment's checksum verified before any ack naming it is produced
  (DESIGN §4 rule 10). The file is named after the first unit attempt with state
  (`chk-<id>/u<unit>-a<attempt>-<run>.state`: every unit attempt runs in exactly one task, so
  the name is unique); its handles are segments (path, offset, length). A unit that declines
  contributes nothing; if the upload fails, every unit with a segment in it declines. A unit
  with no state is acked without a segment. With `TaskEnv.merge_state` off, each unit uploads
  its own file from a small thread pool while the task already runs its next unit (the layout
  before file merging);
* **before the task answers**: the sinks' staged files and staging directories are made durable
  together (`sync_staged`), so no ack names a file a power loss could take back.

Two knobs exist for the slow-storage benchmark, both off by default: `TaskEnv.upload_latency`
(an injected, seeded, heavy-tailed upload delay) and `TaskEnv.upload_in_sync_phase` (upload
inside the sync phase, blocking the task, as Flink did before FLINK-37375). Every ack reports
`snapshot_blocked_s`, the seconds its unit was blocked in the snapshot's synchronous step.

Every exception becomes a `Decline`, never a failed Spark task; a unit running past its timeout
is interrupted with SIGALRM (Python code only; the driver's deadline cancel covers the rest).
Answers are small typed Structs (`regional.coordinator.messages`, KB scale): state lives in files.
Injected faults (`regional.runtime.faults.UnitFaults`) come in through `TaskEnv.faults`, which
is None in production.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import signal
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

import msgspec

from metadata.layout import state_file_path
from metadata.model import StateHandle, SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Answer, Decline, UnitWork
from regional.dataflow.failures import (
    as_exception,
    failure_line,
    failure_trace,
    split_of_failure,
)
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import (
    TaskUnit,
    UnitFailed,
    run_task_epoch,
    run_unit_epoch,
)
from regional.runtime.faults import UnitFaults
from regional.sinks.base import MergingWriter, WriteContext
from regional.sinks.rows import batches_of, parts_batches
from regional.sources.base import Batch

__all__ = ["TaskEnv", "UnitTimeout", "UploadLatency", "run_units"]

log = logging.getLogger(__name__)


class UnitTimeout(BaseException):
    """The unit ran past its timeout (raised by SIGALRM inside the unit). Not an `Exception`,
    so user code and dead-lettering (`on_error="dead-letter"`) never swallow it."""


class UploadLatency(msgspec.Struct, frozen=True):
    """Injected checkpoint-storage latency (benchmarks; off unless set on `TaskEnv`): every
    state upload first waits `base` seconds, a `tail_probability` share of them `tail_factor`
    times longer. Which uploads are slow depends only on (seed, checkpoint, unit, attempt), so
    runs that differ in anything else see the same delays."""

    base: float
    tail_probability: float = 0.05
    tail_factor: float = 10.0
    seed: int = 0

    def seconds(self, checkpoint_id: int, unit_id: int, attempt: int) -> float:
        """The delay of one unit attempt's upload."""
        rng = random.Random(f"{self.seed}/{checkpoint_id}/{unit_id}/{attempt}")
        slow = rng.random() < self.tail_probability
        return self.base * (self.tail_factor if slow else 1.0)


class TaskEnv(msgspec.Struct, frozen=True, dict=True):
    """What every unit of a job shares (shipped once per epoch job): where checkpoints live,
    the pipeline, the per-unit timeout (seconds), the upload pool size and the driver run (its
    id names the state files, so two drivers never write the same file).

    `upload_latency` injects slow storage; `upload_in_sync_phase` uploads inside the unit's
    sync phase instead of the async thread pool (both for benchmarks, off by default)."""

    root: str
    job_id: str
    pipeline: Any  # regional.dataflow.pipeline.Pipeline (cloudpickled with the task)
    unit_timeout: float
    upload_threads: int = 2
    upload_latency: UploadLatency | None = None
    upload_in_sync_phase: bool = False
    faults: UnitFaults | None = None  # injected unit faults (tests, demos); None in production
    #: event time: release an exchange writer that fell back this many checkpoints in a row
    #: (the `exclude` policy; None: `hold`, the default), and the default idle timeout (ms)
    exclude_after: int | None = None
    idle_timeout_ms: int | None = None
    run_id: str | None = None  # the driver run: state file names carry it (fencing)
    merge_state: bool = True  # one state file per task (DESIGN §4 rule 16); False: per unit
    #: one staged data file per task per merging sink (`regional.sinks.base.MergingWriter`)
    #: and epoch; False: one per unit (the layout before merging)
    merge_sink_files: bool = True
    #: run the operators once over the records of a task's units that can share a pass
    #: (`regional.dataflow.walker`); False: one unit at a time
    task_pass: bool = True


class _Snapshot(msgspec.Struct):
    """The sync phase's result, waiting for its upload."""

    work: UnitWork
    local_file: str | None  # the unit's own local file (per-unit uploads only)
    seg_keys: list[tuple[str, int]]  # the subtasks with a segment, in file order
    lengths: list[int]
    states: list[SubtaskState]  # in layout order, without handles yet
    records_in: int
    records_out: int
    records_late: int = 0
    watermark: int | None = None  # the unit's subtask watermark after the epoch (event time)
    serialise_s: float = 0.0  # writing the local state file (the sync part of the snapshot)
    records_dead_lettered: int = 0
    restore_s: float = 0.0  # reading and decoding operator state
    process_s: float = 0.0  # sources, operators, sink staging
    encode_s: float = 0.0  # encoding operator state (to_bytes)
    spool_offset: int = 0  # where its segments start in the task's spool file (merged uploads)
    #: what the unit's merging sinks stage after the task's last unit: (vertex, context, rows)
    sink_parts: list[tuple[str, WriteContext, list[Batch]]] = msgspec.field(default_factory=list)


def _alarm(signum: int, frame: Any) -> None:
    raise UnitTimeout


class _Timeout(Protocol):
    def __call__(self, share: float = ...) -> contextlib.AbstractContextManager[None]: ...


@contextlib.contextmanager
def _alarms(seconds: float) -> Iterator[_Timeout]:
    """For one task: installs the SIGALRM handler once (when on the main thread, as PySpark
    workers are) and yields `timeout(share=1.0)`, a context that raises `UnitTimeout` inside
    it after `share` of `seconds` (it only arms and disarms the timer: a unit pays two system
    calls)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield lambda share=1.0: contextlib.nullcontext()
        return

    @contextlib.contextmanager
    def timeout(share: float = 1.0) -> Iterator[None]:
        signal.setitimer(signal.ITIMER_REAL, seconds * share)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        yield timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def _decline(work: UnitWork, reason: str, trace: str | None = None) -> Decline:
    return Decline(work.checkpoint_id, work.unit_id, work.attempt, reason, trace)


def _process(
    env: TaskEnv,
    storage: JobStorage,
    work: UnitWork,
    spool: _Spool | None = None,
    reads: _RestoreReads | None = None,
    merging: frozenset[str] = frozenset(),
    ran: tuple[UnitEpoch, float] | None = None,
) -> _Snapshot:
    """Run the unit's epoch on the record path (`regional.dataflow.walker`) unless the
    task's pass ran it (`ran`: its epoch and its share of the pass's seconds), stage its sink
    rows, and serialise its state locally (sync phase): to the task's `spool` when given
    (merged uploads), else to a local file of the unit's own. State files several of the
    task's units restore from are read once (`reads`). The sink vertices in `merging` do not
    stage now: their rows wait in the snapshot (`sink_parts`) for the task's one merged file
    per sink."""
    pipeline: Pipeline = env.pipeline
    if ran is not None:
        epoch, seconds = ran
        started = time.perf_counter() - seconds
    else:
        faults = env.faults
        if faults is not None:
            faults.before_unit(work)
        started = time.perf_counter()
        epoch = run_unit_epoch(
            pipeline,
            {s.vertex_id: s for s in work.restore},  # a unit has one subtask per vertex
            checkpoint_id=work.checkpoint_id,
            new_splits=work.new_splits,
            ended=work.ended,
            state_of=_state_reader(storage, reads),
            now_ms=int(time.time() * 1000),
            idle_timeout_ms=env.idle_timeout_ms,
            exclude_after=env.exclude_after,
            after_sources=None if faults is None else lambda: faults.after_sources(work),
        )
    sink_parts: list[tuple[str, WriteContext, list[Batch]]] = []
    # the coordinator expects the subtasks (and we write the segments) in layout order
    ordered: list[SubtaskState] = []
    for old in work.restore:
        committables: tuple[bytes, ...] = ()
        batches = epoch.sink_batches.get(old.vertex_id)
        if batches is not None:
            context = WriteContext(
                job_id=env.job_id,
                run_id=env.run_id or "",
                checkpoint_id=work.checkpoint_id,
                attempt=work.attempt,
                unit_id=work.unit_id,
                vertex_id=old.vertex_id,
                index=old.index,
                watermarks=epoch.sink_watermarks.get(old.vertex_id),
            )
            if old.vertex_id in merging:  # staged with the task's other units, at its end
                sink_parts.append((old.vertex_id, context, batches))
            else:
                committables = pipeline.sink_of(old.vertex_id).write(
                    batches_of(batches, old.vertex_id), context
                )
        ordered.append(
            SubtaskState(
                old.vertex_id,
                old.index,
                work.unit_id,
                split_states=epoch.split_states.get(old.vertex_id, ()),
                committables=committables,
                attempt=work.attempt,
            )
        )
    seg_keys = [(s.vertex_id, s.index) for s in ordered if s.vertex_id in epoch.snapshots]
    blobs = [epoch.snapshots[vertex_id] for vertex_id, _ in seg_keys]
    local = None
    serialise_started = time.monotonic()
    processed = time.perf_counter()
    spool_offset = 0
    if blobs and spool is not None:
        spool_offset = spool.append(blobs)
    elif blobs:
        fd, local = tempfile.mkstemp(prefix=f"regional-u{work.unit_id}-", suffix=".state")
        with os.fdopen(fd, "wb") as f:
            for blob in blobs:
                f.write(blob)
    return _Snapshot(
        work,
        local,
        seg_keys,
        [len(blob) for blob in blobs],
        ordered,
        epoch.records_in,
        epoch.records_out,
        epoch.late,
        epoch.watermark,
        time.monotonic() - serialise_started,
        epoch.dead_lettered,
        epoch.restore_s,
        processed - started - epoch.restore_s - epoch.encode_s,
        epoch.encode_s,
        spool_offset,
        sink_parts,
    )


def _state_reader(
    storage: JobStorage, reads: _RestoreReads | None
) -> Callable[[SubtaskState], tuple[bytes, str]]:
    """An operator subtask's restored state bytes and where they are (for errors), read
    through the task's whole-file cache (`reads`) where several units share a file."""

    def state_of(subtask: SubtaskState) -> tuple[bytes, str]:
        data = b"".join(
            storage.read_segment(h, whole_files=reads.cache_for(h))
            if reads is not None
            else storage.read_segment(h)
            for h in subtask.handles
        )
        return data, ", ".join(storage.describe(h.path) for h in subtask.handles)

    return state_of


#: How often a task's pass runs again without a unit that failed in it (then: one by one).
PASS_TRIES = 3


@dataclasses.dataclass
class _Passed:
    """What the task's passes gave, by position in the task's works: the epochs they ran,
    each with its share of its pass's seconds, and the units that failed in one (each with
    the error it raised, as it would have alone)."""

    epochs: dict[int, tuple[UnitEpoch, float]] = dataclasses.field(default_factory=dict)
    failed: dict[int, Exception] = dataclasses.field(default_factory=dict)


def _passes(
    env: TaskEnv,
    storage: JobStorage,
    works: Sequence[UnitWork],
    reads: _RestoreReads,
    timeout: _Timeout,
) -> _Passed:
    """Run the task's units that can share a pass (`regional.dataflow.walker`): units of
    one shape, in groups of two or more, except units with injected faults and units that fell
    back at the previous checkpoint (they are the likely ones to fail again). A unit a pass
    pins a failure on declines with it and the pass runs again without it (up to
    `PASS_TRIES` times); a pass that fails otherwise (a timeout: half a unit's) or cannot
    keep its units apart gives nothing: its units run one by one."""
    passed = _Passed()
    if not env.task_pass or len(works) < 2:
        return passed
    shapes: dict[frozenset[str], list[int]] = {}
    for at, work in enumerate(works):
        if env.faults is not None and (work.checkpoint_id, work.unit_id) in env.faults.kinds:
            continue
        if any(
            s.ref_checkpoint_id is not None and s.ref_checkpoint_id < work.checkpoint_id - 1
            for s in work.restore
        ):
            continue
        shapes.setdefault(frozenset(s.vertex_id for s in work.restore), []).append(at)
    state_of = _state_reader(storage, reads)
    for group in shapes.values():
        ats = list(group)
        for _ in range(PASS_TRIES):
            if len(ats) < 2:
                break
            checkpoint_id = works[ats[0]].checkpoint_id
            units = [
                TaskUnit(
                    {s.vertex_id: s for s in works[at].restore},
                    works[at].new_splits,
                    works[at].ended,
                    state_of,
                )
                for at in ats
            ]
            started = time.perf_counter()
            try:
                with timeout(0.5):
                    epochs = run_task_epoch(
                        env.pipeline,
                        units,
                        checkpoint_id=checkpoint_id,
                        now_ms=int(time.time() * 1000),
                        idle_timeout_ms=env.idle_timeout_ms,
                        exclude_after=env.exclude_after,
                    )
            except UnitFailed as failed:
                at = ats.pop(failed.unit)
                passed.failed[at] = failed.error
                log.info(
                    "checkpoint %d: unit %d failed in a pass over %d units (%s); the others "
                    "run again",
                    checkpoint_id,
                    works[at].unit_id,
                    len(ats) + 1,
                    failure_line(failed.error),
                )
                continue
            except (Exception, UnitTimeout) as exc:
                why = (
                    f"ran over {env.unit_timeout * 0.5:g} s, half a unit's timeout"
                    if isinstance(exc, UnitTimeout)
                    else failure_line(exc)
                )
                log.info(
                    "checkpoint %d: a pass over %d units failed (%s); running them one by one",
                    checkpoint_id,
                    len(ats),
                    why,
                )
                break
            if epochs is not None:
                share = (time.perf_counter() - started) / len(ats)
                passed.epochs.update(
                    (at, (epoch, share)) for at, epoch in zip(ats, epochs, strict=True)
                )
            break
    return passed


def _upload(env: TaskEnv, storage: JobStorage, snap: _Snapshot) -> Ack:
    """Async phase: upload the local snapshot, read it back, verify, build the ack."""
    work = snap.work
    started = time.perf_counter()
    handles: dict[tuple[str, int], StateHandle] = {}
    if snap.local_file is not None:
        try:
            if env.upload_latency is not None:
                delay = env.upload_latency.seconds(work.checkpoint_id, work.unit_id, work.attempt)
                time.sleep(delay)
            with open(snap.local_file, "rb") as f:
                data = f.read()
        finally:
            os.unlink(snap.local_file)
        segments, offset = [], 0
        for n in snap.lengths:
            segments.append(data[offset : offset + n])
            offset += n
        rel = state_file_path(work.checkpoint_id, work.unit_id, work.attempt, env.run_id)
        written = storage.write_segments(rel, segments)
        for key, handle, seg in zip(snap.seg_keys, written, segments, strict=True):
            if storage.read_segment(handle) != seg:  # verifies size and checksum too
                raise OSError(f"upload of {rel} does not read back as written")
            handles[key] = handle
    return _ack(snap, handles, time.perf_counter() - started)


class _RestoreReads:
    """The state files several units of a task restore from (a merged file of the task that ran
    them last epoch): each is read whole once and its segments sliced from memory, so a task
    makes one read per physical file, not one per unit (on an object store: requests scale with
    tasks, not regions)."""

    def __init__(self, works: Sequence[UnitWork]) -> None:
        uses: dict[str, int] = {}
        for w in works:
            for s in w.restore:
                for h in s.handles:
                    uses[h.path] = uses.get(h.path, 0) + 1
        self._shared = {path for path, n in uses.items() if n > 1}
        self._files: dict[str, bytes] = {}

    def cache_for(self, handle: StateHandle) -> dict[str, bytes] | None:
        """The whole-file cache to read `handle` through, or None to read its segment alone."""
        return self._files if handle.path in self._shared else None


class _Spool:
    """The task's local spool file (merged uploads): each unit's sync phase appends its
    segments; a unit that declines is cut off again (`truncate`), so it contributes nothing."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="regional-task-", suffix=".state")
        self._file = os.fdopen(fd, "w+b")
        self.size = 0
        self._at_end = True  # the file's position is `size` (a seek would flush the buffer)

    def append(self, blobs: Sequence[bytes]) -> int:
        """Append `blobs` back to back; returns the offset of the first."""
        offset = self.size
        if not self._at_end:
            self._file.seek(offset)
        self._at_end = False  # until every blob is written
        for blob in blobs:
            self._file.write(blob)
        self.size = offset + sum(len(b) for b in blobs)
        self._at_end = True
        return offset

    def truncate(self, size: int) -> None:
        """Cut the spool back to `size` bytes (a unit that declined after, or while, appending)."""
        self._file.truncate(size)
        self.size = size
        self._at_end = False

    def read(self) -> bytes:
        self._at_end = False
        self._file.flush()
        self._file.seek(0)
        return self._file.read(self.size)

    def close(self) -> None:
        self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def _upload_merged(
    env: TaskEnv, storage: JobStorage, snaps: Sequence[_Snapshot], spool: _Spool
) -> list[Ack]:
    """Async phase of a task with merged uploads: upload the spool as one physical state file
    (`snaps` are the units with segments in it, in spool order), read it back, verify, and
    build one ack per unit whose handles are segments of that file. Each ack's `upload_s` is
    its share of the one upload (the shares add up to the upload's seconds)."""
    started = time.perf_counter()
    first = snaps[0].work
    if env.upload_latency is not None:
        time.sleep(env.upload_latency.seconds(first.checkpoint_id, first.unit_id, first.attempt))
    data = spool.read()
    segments: list[bytes] = []
    for snap in snaps:
        offset = snap.spool_offset
        for n in snap.lengths:
            segments.append(data[offset : offset + n])
            offset += n
    rel = state_file_path(first.checkpoint_id, first.unit_id, first.attempt, env.run_id)
    written = iter(storage.write_segments(rel, segments))
    if storage.read_file(rel) != b"".join(segments):  # one read for every unit's segments
        raise OSError(f"upload of {rel} does not read back as written")
    share = (time.perf_counter() - started) / len(snaps)
    return [_ack(snap, {key: next(written) for key in snap.seg_keys}, share) for snap in snaps]


def _ack(snap: _Snapshot, handles: dict[tuple[str, int], StateHandle], upload_s: float) -> Ack:
    """The ack of `snap`, its subtasks holding `handles` (their uploaded segments)."""
    work = snap.work
    states = [
        msgspec.structs.replace(s, handles=(handles[s.vertex_id, s.index],))
        if (s.vertex_id, s.index) in handles
        else s
        for s in snap.states
    ]
    return Ack(
        work.checkpoint_id,
        work.unit_id,
        work.attempt,
        tuple(states),
        records_in=snap.records_in,
        records_out=snap.records_out,
        snapshot_blocked_s=snap.serialise_s,
        records_dead_lettered=snap.records_dead_lettered,
        restore_s=snap.restore_s,
        process_s=snap.process_s,
        snapshot_s=snap.encode_s + snap.serialise_s,
        upload_s=upload_s,
        records_late=snap.records_late,
        watermark=snap.watermark,
    )


def run_units(
    env: TaskEnv,
    works: Sequence[UnitWork],
    *,
    spark_attempt: int = 0,
    on_answer: Callable[[Answer], None] | None = None,
) -> list[Answer]:
    """Run `works` one after another; return one answer per unit, in `works` order (never
    raises).

    `spark_attempt` > 0 means Spark re-ran a failed task: every unit declines, so a region is
    never re-run behind the coordinator's back (DESIGN §4 rule 9).
    """
    if spark_attempt > 0:
        return [
            _decline(w, f"spark task attempt {spark_attempt} refused: units run once per attempt")
            for w in works
        ]
    storage = JobStorage(env.root, env.job_id)
    answers: dict[int, Answer] = {}  # by position in `works`
    pending: list[tuple[int, _Snapshot, Future[Ack], float]] = []
    merged: list[tuple[int, _Snapshot]] = []  # units with segments in the spool, in its order
    staging: list[tuple[int, _Snapshot]] = []  # units with rows for the merged sink files
    spool = _Spool() if env.merge_state and not env.upload_in_sync_phase else None
    reads = _RestoreReads(works)
    merging = (
        frozenset(
            v for v, spec in env.pipeline.sinks.items() if isinstance(spec.sink, MergingWriter)
        )
        if env.merge_sink_files
        else frozenset()
    )
    try:
        with (
            ThreadPoolExecutor(max(1, env.upload_threads), thread_name_prefix="upload") as pool,
            _alarms(env.unit_timeout) as timeout,
        ):
            passed = _passes(env, storage, works, reads, timeout)
            for at, work in enumerate(works):
                if at in passed.failed:  # failed in a pass, as it would have alone
                    error = passed.failed[at]
                    answers[at] = _decline(work, failure_line(error), failure_trace(error))
                    continue
                started = time.monotonic()
                snap: _Snapshot | None = None
                spooled = spool.size if spool is not None else 0
                try:
                    with timeout():
                        snap = _process(
                            env, storage, work, spool, reads, merging, passed.epochs.get(at)
                        )
                        inline = env.upload_in_sync_phase or not snap.seg_keys
                        if env.upload_in_sync_phase:  # the unit blocks until its upload is done
                            upload_started = time.monotonic()
                            answer = _upload(env, storage, snap)
                            blocked = answer.snapshot_blocked_s + time.monotonic() - upload_started
                            answer = msgspec.structs.replace(answer, snapshot_blocked_s=blocked)
                        elif inline:  # no state to upload: the ack needs no upload
                            answer = _ack(snap, {}, 0.0)
                except UnitTimeout:
                    answers[at] = _decline(work, f"timeout: unit ran over {env.unit_timeout:g} s")
                except Exception as exc:
                    prefix = "upload failed: " if snap is not None else ""
                    answers[at] = _decline(work, failure_line(exc, prefix), failure_trace(exc))
                except BaseException as exc:
                    failed_on = as_exception(exc)  # SystemExit of a user function: its unit's
                    if split_of_failure(exc) is None or failed_on is None:  # not on a record
                        raise
                    answers[at] = _decline(work, failure_line(failed_on), failure_trace(failed_on))
                else:
                    if snap.sink_parts:
                        staging.append((at, snap))
                    if inline:
                        answers[at] = answer
                    elif spool is not None:
                        merged.append((at, snap))
                    else:
                        future = pool.submit(_upload, env, storage, snap)
                        pending.append((at, snap, future, started))
                    continue
                if spool is not None:  # a declined unit contributes nothing to the task's file
                    spool.truncate(spooled)
                if snap is not None:  # the sync-phase upload failed or ran out of time
                    _discard_staged(env.pipeline, snap.states)
            finishing = time.monotonic()
            sinks = (
                pool.submit(_stage_merged, env.pipeline, [s for _, s in staging])
                if staging
                else None
            )
            for at, snap, future, started in pending:
                left = env.unit_timeout - (time.monotonic() - started)
                answers[at] = _awaited(future, left, snap, env.pipeline)
            if merged and spool is not None:
                snaps = [snap for _, snap in merged]
                acks = pool.submit(_upload_merged, env, storage, snaps, spool)
                outcome = _awaited_all(acks, env.unit_timeout, snaps, env.pipeline)
                answers.update(zip((at for at, _ in merged), outcome, strict=True))
            if sinks is not None:
                left = env.unit_timeout - (time.monotonic() - finishing)
                answers.update(_staged_answers(sinks, left, staging, answers, env.pipeline))
    finally:
        if spool is not None:
            spool.close()
    ordered = _sync_staged(env.pipeline, [answers[at] for at in range(len(works))])
    if on_answer is not None:
        for a in ordered:
            on_answer(a)
    return ordered


_Committables = dict[tuple[str, int], tuple[bytes, ...]]


class _Staged(msgspec.Struct):
    """What staging the task's merged sink files gave: per unit (in the order staged), its
    committables by sink subtask, or the error converting its rows raised (that unit fails
    alone); and the seconds it took."""

    committables: list[_Committables]
    failed: dict[int, Exception]
    seconds: float


def _stage_merged(pipeline: Pipeline, snaps: Sequence[_Snapshot]) -> _Staged:
    """Stage the rows every unit of `snaps` left for the merging sinks: one file per sink
    (`MergingWriter.write_merged`), every unit's rows a part of it, their lists of records
    turned into Arrow batches together (`regional.sinks.rows.parts_batches`). A unit whose
    rows do not convert is left out of every file. If a sink fails, what the others staged is
    deleted before the error propagates."""
    started = time.perf_counter()
    by_vertex: dict[str, list[tuple[int, WriteContext, list[Batch]]]] = {}
    for at, snap in enumerate(snaps):
        for vertex_id, context, batches in snap.sink_parts:
            by_vertex.setdefault(vertex_id, []).append((at, context, batches))
    out: list[_Committables] = [{} for _ in snaps]
    failed: dict[int, Exception] = {}
    converted = {
        vertex_id: parts_batches([b for _, _, b in parts], vertex_id)
        for vertex_id, parts in by_vertex.items()
    }
    for vertex_id, parts in by_vertex.items():
        for (at, _, _), result in zip(parts, converted[vertex_id], strict=True):
            if isinstance(result, Exception):
                failed.setdefault(at, result)
    try:
        for vertex_id, parts in by_vertex.items():
            sink = pipeline.sink_of(vertex_id)
            assert isinstance(sink, MergingWriter)
            kept = [
                (at, context, result)
                for (at, context, _), result in zip(parts, converted[vertex_id], strict=True)
                if at not in failed and not isinstance(result, Exception)
            ]
            if not kept:
                continue
            written = sink.write_merged([(c, b) for _, c, b in kept])
            for (at, context, _), committables in zip(kept, written, strict=True):
                out[at][vertex_id, context.index] = committables
    except BaseException:
        for mine in out:
            _give_back(pipeline, mine)
        raise
    return _Staged(out, failed, time.perf_counter() - started)


def _staged_answers(
    future: Future[_Staged],
    left: float,
    staging: Sequence[tuple[int, _Snapshot]],
    answers: Mapping[int, Answer],
    pipeline: Pipeline,
) -> dict[int, Answer]:
    """The answers of the units in `staging` (by position) once their merged sink files are
    staged: an ack gains its committables (and its share of the staging seconds in
    `process_s`); a unit whose rows did not convert declines with that error; a unit that
    declined meanwhile gives its parts back (`discard`: the file goes once no unit in it
    commits). If staging failed or ran past `left` seconds, every unit with rows in it
    declines."""
    try:
        staged = future.result(timeout=max(left, 0.001))
    except TimeoutError:
        reason, trace = "timeout: staging the sink files did not finish in time", None
        # what it stages after all is nobody's: deleted when it ends (the task waits for it)
        future.add_done_callback(lambda done: _discard_late(done, pipeline))
    except Exception as exc:
        reason, trace = failure_line(exc, "staging sink files failed: "), failure_trace(exc)
    else:
        share = staged.seconds / len(staging)
        out: dict[int, Answer] = {}
        for n, ((at, snap), mine) in enumerate(zip(staging, staged.committables, strict=True)):
            answer = answers[at]
            error = staged.failed.get(n)
            if isinstance(answer, Ack) and error is None:
                out[at] = _with_committables(answer, mine, share)
                continue
            _give_back(pipeline, mine)
            if isinstance(answer, Ack) and error is not None:
                out[at] = _decline(snap.work, failure_line(error), failure_trace(error))
        return out
    declines: dict[int, Answer] = {}
    for at, snap in staging:
        if isinstance(answers[at], Ack):
            declines[at] = _decline(snap.work, reason, trace)
    return declines


def _discard_late(done: Future[_Staged], pipeline: Pipeline) -> None:
    """Delete what a staging that ran out of time staged once it ends (best effort)."""
    if done.cancelled() or done.exception() is not None:
        return
    for mine in done.result().committables:
        _give_back(pipeline, mine)


def _give_back(pipeline: Pipeline, committables: _Committables) -> None:
    """Discard one unit's parts of the merged sink files (best effort): a file goes once all
    of its parts are given back (`regional.sinks.merging.DiscardedParts`)."""
    for (vertex_id, _), c in committables.items():
        with contextlib.suppress(Exception):
            pipeline.sink_of(vertex_id).discard(c)


def _with_committables(ack: Ack, committables: _Committables, seconds: float) -> Ack:
    """`ack` with its sink subtasks holding `committables`, `seconds` more of processing."""
    states = tuple(
        msgspec.structs.replace(s, committables=committables[s.vertex_id, s.index])
        if (s.vertex_id, s.index) in committables
        else s
        for s in ack.states
    )
    return msgspec.structs.replace(ack, states=states, process_s=ack.process_s + seconds)


def _awaited(future: Future[Ack], left: float, snap: _Snapshot, pipeline: Pipeline) -> Answer:
    """The ack of one unit's own upload, or its decline if the upload failed or ran past the
    `left` seconds of the unit's timeout."""
    return _awaited_all(future, left, [snap], pipeline)[0]


def _awaited_all(
    future: Future[Ack] | Future[list[Ack]],
    left: float,
    snaps: Sequence[_Snapshot],
    pipeline: Pipeline,
) -> list[Answer]:
    """The acks of an upload (one unit's, or the task's merged file's), or a decline for each
    of `snaps` if it failed or did not finish within `left` seconds; the staged sink files of
    declined units are deleted."""
    try:
        result = future.result(timeout=max(left, 0.001))
        return [result] if isinstance(result, Ack) else list(result)
    except TimeoutError:
        declines = [_decline(s.work, "timeout: upload did not finish in time") for s in snaps]
    except Exception as exc:
        reason, trace = failure_line(exc, "upload failed: "), failure_trace(exc)
        declines = [_decline(s.work, reason, trace) for s in snaps]
    for s in snaps:
        _discard_staged(pipeline, s.states)
    return list(declines)


def _sync_staged(pipeline: Pipeline, answers: list[Answer]) -> list[Answer]:
    """Make the sinks' staging directories durable once per task (`sync_staged`), before any
    ack naming a staged file leaves the task; if that fails, such acks become declines."""
    try:
        for spec in pipeline.sinks.values():
            if spec.sink is not None:
                spec.sink.sync_staged()
    except OSError as exc:
        reason = failure_line(exc, "staged sink files not durable: ")
        return [
            _decline_ack(a, reason) if isinstance(a, Ack) and _stages(a) else a for a in answers
        ]
    return answers


def _stages(ack: Ack) -> bool:
    return any(s.committables for s in ack.states)


def _decline_ack(ack: Ack, reason: str) -> Decline:
    return Decline(ack.checkpoint_id, ack.unit, ack.attempt, reason)


def _discard_staged(pipeline: Pipeline, states: Sequence[SubtaskState]) -> None:
    """Delete the sink files a declined unit staged (DESIGN §4 rule 8); best effort."""
    for s in states:
        sink = pipeline.vertices[s.vertex_id].sink
        if s.committables and sink is not None:
            with contextlib.suppress(Exception):
                sink.discard(s.committables)
