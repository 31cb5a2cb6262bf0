"""The task side of one checkpoint epoch: run units, snapshot them, answer ack or decline.

Runs inside a Spark task (or anywhere: nothing here imports Spark). For each unit of work the
task restores the unit's subtasks from the state the coordinator named (verified segments),
reads its sources from their positions, runs the operators, stages sink files, and snapshots:

* **sync phase** (under the unit's timeout): operator state is serialised to a local file;
* **async phase** (FLINK-37375): the task's units' snapshots go to checkpoint storage as **one
  physical state file per task** (DESIGN §4 rule 16, FLIP-306): each unit's sync phase appends
  its segments to the task's local spool file, and after the last unit the spool is uploaded
  once, read back, and every segment's checksum verified before any ack naming it is produced
  (DESIGN §4 rule 10). A unit that declines contributes nothing; if the upload fails, every
  unit with a segment in it declines. A unit with no state is acked without a segment. With
  `TaskEnv.merge_state` off, each unit uploads its own file from a small thread pool while the
  task already runs its next unit (the layout before file merging);
* **before the task answers**: the sinks' staged files and staging directories are made durable
  together (`sync_staged`), so no ack names a file a power loss could take back.

This module runs a task's units and turns what they did into answers; the parts are modules of
their own: `regional.runtime.scheduling` (passes over several units, their retries, unit
timeouts), `regional.runtime.state_reads` (reading the restored state),
`regional.runtime.state_upload` (the spool, the state files, the acks) and
`regional.runtime.sink_staging` (merged staged files, committables, durability). Spark's
attempt policy (a task Spark runs again runs none of its units) is `regional.runtime.spark`'s.

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

import functools
import os
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import msgspec

from metadata.model import SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Answer, Decline, UnitWork
from regional.dataflow.exchange_reads import task_reads
from regional.dataflow.failures import (
    as_exception,
    failure_line,
    failure_trace,
    split_of_failure,
)
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state_provider import StateBytes, StateProvider
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import run_task_epoch, run_unit_epoch
from regional.runtime.faults import UnitFaults
from regional.runtime.hot_state import HotState, HotStates, process_cache
from regional.runtime.open_epoch import RoundTimedOut, rounds
from regional.runtime.scheduling import (
    PASS_TRIES,
    Passed,
    Timeout,
    UnitTimeout,
    alarms,
    run_passes,
)
from regional.runtime.sink_staging import (
    Staged,
    discard_late,
    discard_staged,
    give_back,
    stage_merged,
    sync_staged,
    with_committables,
)
from regional.runtime.state_reads import RestoreReads, state_reader
from regional.runtime.state_upload import Spool, UnitSnapshot, UploadLatency, upload, upload_merged
from regional.runtime.state_upload import ack as unit_ack
from regional.runtime.task_env import TaskEnv
from regional.sinks.base import MergingWriter, WriteContext
from regional.sinks.rows import batches_of
from regional.sources.base import Batch

__all__ = ["PASS_TRIES", "TaskEnv", "UnitTimeout", "UploadLatency", "run_units"]

# TaskEnv lives in its own module so what the task uses (open epochs) can name it without
# importing the task; it is this module's name for it too.

_Spool = Spool  # the name tests of the spool knew it by


def _upload(env: TaskEnv, storage: JobStorage, snap: UnitSnapshot) -> Ack:
    """Async phase of one unit with a state file of its own (`regional.runtime.state_upload`)."""
    return upload(storage, snap, latency=env.upload_latency, run_id=env.run_id)


def _decline(work: UnitWork, reason: str, trace: str | None = None) -> Decline:
    return Decline(work.checkpoint_id, work.unit_id, work.attempt, reason, trace)


def _process(
    env: TaskEnv,
    storage: JobStorage,
    work: UnitWork,
    spool: Spool | None = None,
    state_of: StateProvider | StateBytes | None = None,
    merging: frozenset[str] = frozenset(),
    ran: tuple[UnitEpoch, float] | None = None,
) -> UnitSnapshot:
    """Run the unit's epoch on the record path (`regional.dataflow.walker`) unless the
    task's pass ran it (`ran`: its epoch and its share of the pass's seconds), stage its sink
    rows, and serialise its state locally (sync phase): to the task's `spool` when given
    (merged uploads), else to a local file of the unit's own. State files several of the
    task's units restore from are read once (`state_of`). The sink vertices in `merging` do not
    stage now: their rows wait in the snapshot (`sink_parts`) for the task's one merged file
    per sink. With hot state (`state_of` a `HotStates`), the snapshot holds the decoded states
    it encodes (`decoded`) and how many of the unit's subtasks restored hot state."""
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
            state_of=state_of if state_of is not None else state_reader(storage, None),
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
    snap = UnitSnapshot(
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
        records_exchanged=epoch.records_exchanged,
        operators={v: (c[0], c[1], c[2]) for v, c in epoch.operators.items()},
        dead_letter_types=dict(epoch.dead_letter_types),
        behind={v: dict(splits) for v, splits in epoch.behind.items()},
        unread_since={v: dict(splits) for v, splits in epoch.unread_since.items()},
    )
    if isinstance(state_of, HotStates):
        snap.decoded = {
            vertex_id: HotState.of(state, epoch.snapshots[vertex_id])
            for vertex_id, state in epoch.states.items()
        }
        snap.state_hits, snap.state_misses = state_of.counts(work.restore)
    return snap


def task_passes(
    env: TaskEnv,
    works: Sequence[UnitWork],
    state_of: StateProvider | StateBytes,
    timeout: Timeout,
    faults: UnitFaults | None,
) -> Passed:
    """`works` run in passes where they can share one (`run_passes`), with the task's time
    and event-time options (a pass runs event-time stages too); none with `env.task_pass`
    off. The units no pass ran are run one at a time by the caller."""
    if not env.task_pass:
        return Passed()
    return run_passes(
        env.pipeline,
        works,
        state_of,
        timeout,
        # looked up here (tests replace it)
        run_pass=functools.partial(
            run_task_epoch,
            now_ms=int(time.time() * 1000),
            idle_timeout_ms=env.idle_timeout_ms,
            exclude_after=env.exclude_after,
        ),
        unit_timeout=env.unit_timeout,
        faults=faults,
        tries=PASS_TRIES,
    )


def run_units(
    env: TaskEnv,
    works: Sequence[UnitWork],
    *,
    on_answer: Callable[[Answer], None] | None = None,
    until: Callable[[float], bool] | None = None,
) -> list[Answer]:
    """Run `works` one after another; return one answer per unit, in `works` order (never
    raises). Whether a runtime's task runs its units at all is the runtime's policy (Spark's:
    `regional.runtime.spark.attempt_refused`).

    With `until`, the epoch is open (continuous mode's `checkpoint_interval`,
    `regional.runtime.open_epoch`): the units read and run batch after batch, their state
    kept in memory, until `until(wait)` is true (the checkpoint's marker came; it may wait
    up to `wait` seconds for it after a batch that read nothing); then they
    snapshot, stage and answer as one epoch."""
    storage = JobStorage(env.root, env.job_id)
    answers: dict[int, Answer] = {}  # by position in `works`
    pending: list[tuple[int, UnitSnapshot, Future[Ack], float]] = []
    merged: list[tuple[int, UnitSnapshot]] = []  # units with segments in the spool, in its order
    staging: list[tuple[int, UnitSnapshot]] = []  # units with rows for the merged sink files
    spool = Spool() if env.merge_state and not env.upload_in_sync_phase else None
    read = state_reader(storage, RestoreReads(works))
    hot = (
        HotStates(process_cache(env.hot_state_bytes), env.root, env.job_id, read)
        if env.hot_state
        else None
    )
    state_of = hot if hot is not None else read
    acked: dict[int, UnitSnapshot] = {}  # the units whose states stay hot if they ack
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
            alarms(env.unit_timeout) as timeout,
            task_reads(),  # the exchange readers of this task share their commit records
        ):
            passed = (
                rounds(env, works, state_of, timeout, closed=until, passes=task_passes)
                if until is not None
                else task_passes(env, works, state_of, timeout, env.faults)
            )
            for at, work in enumerate(works):
                if at in passed.failed:  # failed in a pass (or a round), as it would alone
                    error = passed.failed[at]
                    if isinstance(error, RoundTimedOut):
                        answers[at] = _decline(work, f"timeout: {error}")
                        continue
                    answers[at] = _decline(work, failure_line(error), failure_trace(error))
                    continue
                started = time.monotonic()
                snap: UnitSnapshot | None = None
                spooled = spool.size if spool is not None else 0
                try:
                    with timeout():
                        ran = passed.epochs.pop(at, None)  # its pass's epoch, let go after
                        snap = _process(env, storage, work, spool, state_of, merging, ran)
                        inline = env.upload_in_sync_phase or not snap.seg_keys
                        if env.upload_in_sync_phase:  # the unit blocks until its upload is done
                            upload_started = time.monotonic()
                            answer = _upload(env, storage, snap)
                            blocked = answer.snapshot_blocked_s + time.monotonic() - upload_started
                            answer = msgspec.structs.replace(answer, snapshot_blocked_s=blocked)
                        elif inline:  # no state to upload: the ack needs no upload
                            answer = unit_ack(snap, {}, 0.0)
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
                    if snap.decoded:
                        acked[at] = snap
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
                    discard_staged(env.pipeline, snap.states)
            finishing = time.monotonic()
            sinks = (
                pool.submit(stage_merged, env.pipeline, [s for _, s in staging])
                if staging
                else None
            )
            for at, snap, future, started in pending:
                left = env.unit_timeout - (time.monotonic() - started)
                answers[at] = _awaited(future, left, snap, env.pipeline)
            if merged and spool is not None:
                snaps = [snap for _, snap in merged]
                acks = pool.submit(
                    upload_merged,
                    storage,
                    snaps,
                    spool,
                    latency=env.upload_latency,
                    run_id=env.run_id,
                )
                outcome = _awaited_all(acks, env.unit_timeout, snaps, env.pipeline)
                answers.update(zip((at for at, _ in merged), outcome, strict=True))
            if sinks is not None:
                left = env.unit_timeout - (time.monotonic() - finishing)
                answers.update(_staged_answers(sinks, left, staging, answers, env.pipeline))
    finally:
        if spool is not None:
            spool.close()
    ordered = sync_staged(env.pipeline, [answers[at] for at in range(len(works))])
    if hot is not None:  # a unit's states stay hot only under the handles of its ack
        for at, snap in acked.items():
            final = ordered[at]
            if isinstance(final, Ack):
                hot.keep(final.states, snap.decoded)
    if on_answer is not None:
        for a in ordered:
            on_answer(a)
    return ordered


def _staged_answers(
    future: Future[Staged],
    left: float,
    staging: Sequence[tuple[int, UnitSnapshot]],
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
        future.add_done_callback(lambda done: discard_late(done, pipeline))
    except Exception as exc:
        reason, trace = failure_line(exc, "staging sink files failed: "), failure_trace(exc)
    else:
        share = staged.seconds / len(staging)
        out: dict[int, Answer] = {}
        for n, ((at, snap), mine) in enumerate(zip(staging, staged.committables, strict=True)):
            answer = answers[at]
            error = staged.failed.get(n)
            if isinstance(answer, Ack) and error is None:
                out[at] = with_committables(answer, mine, share)
                continue
            give_back(pipeline, mine)
            if isinstance(answer, Ack) and error is not None:
                out[at] = _decline(snap.work, failure_line(error), failure_trace(error))
        return out
    declines: dict[int, Answer] = {}
    for at, snap in staging:
        if isinstance(answers[at], Ack):
            declines[at] = _decline(snap.work, reason, trace)
    return declines


def _awaited(future: Future[Ack], left: float, snap: UnitSnapshot, pipeline: Pipeline) -> Answer:
    """The ack of one unit's own upload, or its decline if the upload failed or ran past the
    `left` seconds of the unit's timeout."""
    return _awaited_all(future, left, [snap], pipeline)[0]


def _awaited_all(
    future: Future[Ack] | Future[list[Ack]],
    left: float,
    snaps: Sequence[UnitSnapshot],
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
        discard_staged(pipeline, s.states)
    return list(declines)
