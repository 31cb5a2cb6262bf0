"""Carrying out the checkpoint coordinator's decisions: one handler per decision type.

`DecisionHandlers` is what `regional.runtime.driver.JobDriver` composes to turn decisions into
effects, in order: write metadata (and a savepoint's self-contained copy), commit to sinks,
discard failed attempts, fail or finish the job; then hand the deletions the epoch made due to
the background cleaner (`regional.runtime.cleaning`). Each handler returns the coordinator's
follow-up decisions. Every write checks the job root's lease first. Storage trouble never
crashes the driver: a failed metadata write aborts the checkpoint, a commit that fails for
another reason than the table's refusal is retried at the next epoch, and discards and
cleaning are best effort (the next full scan finds what is left).
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import msgspec

from cleaner.model import RestoreBase
from metadata.events import Outcome
from metadata.exchange import reader_view
from metadata.lease import JobLease, LeaseLostError
from metadata.model import CheckpointKind, CheckpointMetadata, SinkRetention
from metadata.savepoint import write_savepoint
from metadata.storage import JobStorage
from metadata.watermarks import MIN_WATERMARK
from regional.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    Commit,
    Decision,
    DiscardAttempt,
    FailJob,
    FinishJob,
    NotifyComplete,
    NotifyFallback,
    NotifySubsumed,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.coordinator.commit import CommitCoordinator, perform_commit, sink_retention
from regional.coordinator.messages import Ack, Answer, Decline
from regional.dataflow.exchange import exchange_path
from regional.dataflow.pipeline import Pipeline
from regional.errors import CommitError, JobFailedError, RegionalError
from regional.policy import Policy
from regional.runtime.cleaning import JobCleaning
from regional.runtime.compaction import Compacted, compact
from regional.runtime.faults import Faults
from regional.runtime.stalled_inputs import StallWatch, operator_state_bytes
from regional.runtime.timing import EpochStopwatch
from regional.sinks.base import ReadInsideSink

__all__ = ["COMMIT_ATTEMPTS", "DecisionHandlers"]

#: How often the table may refuse one commit before the job fails with a `CommitError`.
COMMIT_ATTEMPTS = 3
log = logging.getLogger(__name__)


@dataclasses.dataclass
class EpochOutcome:
    """How a checkpoint ended, gathered while its decisions are carried out: the units that
    fell back or failed, why (`causes`: one line per unit) and their tracebacks, when a task
    sent one (`tracebacks`: unit -> the last `regional.dataflow.failures.TRACE_LIMIT` characters),
    and
    the records its fresh units dead-lettered."""

    outcome: Outcome
    fallback_units: tuple[int, ...] = ()
    message: str = ""
    causes: dict[int, str] = dataclasses.field(default_factory=dict)
    abort_rule: str | None = None
    tracebacks: dict[int, str] = dataclasses.field(default_factory=dict)
    records_dead_lettered: int = 0  # committed with this checkpoint (0 when aborted)
    records_late: int = 0  # judged late by the fresh units' windows (0 when aborted)
    watermark: int | None = None  # the job's: the lowest unit watermark (event time)
    watermark_unit: int | None = None  # the unit holding it
    warnings: tuple[str, ...] = ()  # what went wrong without failing it (a failed compaction)


@dataclasses.dataclass
class _Answered:
    """What the answers of one pending checkpoint said that the coordinator does not keep:
    unit -> its decline's traceback, unit -> how many records its ack dead-lettered."""

    tracebacks: dict[int, str] = dataclasses.field(default_factory=dict)
    dead_lettered: dict[int, int] = dataclasses.field(default_factory=dict)
    late: dict[int, int] = dataclasses.field(default_factory=dict)
    watermarks: dict[int, int] = dataclasses.field(default_factory=dict)
    #: unit -> its ack's per-operator counts and dead letters by error type
    operators: dict[int, dict[str, tuple[int, int, int]]] = dataclasses.field(default_factory=dict)
    dead_letter_types: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    behind: dict[int, dict[str, dict[str, int]]] = dataclasses.field(default_factory=dict)
    unread_since: dict[int, dict[str, dict[str, int]]] = dataclasses.field(default_factory=dict)


def _reads_a_split(ack: Ack) -> bool:
    """Whether `ack`'s unit holds a split: one that holds none (its source subtask's files all
    finished while the source still runs) knows no watermark (-inf) and holds nothing back,
    so the job's watermark keeps its last one rather than falling to -inf (issue 45)."""
    return any(s.split_states for s in ack.states)


class DecisionHandlers:
    """Carries out the coordinator's decisions for one driver (`JobDriver.decisions`).

    Its collaborators are given; its own state is what the decisions leave behind: each
    checkpoint's `outcomes` until the driver records them, the commits `deferred` to the next
    epoch, the `savepoints` written, whether the job `finished`, and the records dead-lettered
    by completed checkpoints. `now` is the driver's clock (ms); `seen` sees every decision as it
    is carried out."""

    def __init__(
        self,
        *,
        pipeline: Pipeline,
        storage: JobStorage,
        policy: Policy,
        coordinator: CheckpointCoordinator,
        committers: dict[str, CommitCoordinator],
        lease: JobLease,
        faults: Faults,
        cleaning: JobCleaning,
        stopwatch: EpochStopwatch,
        now: Callable[[], int],
        seen: Callable[[Decision | TriggerCheckpoint], None],
    ) -> None:
        self.pipeline = pipeline
        self.storage = storage
        self.job_id = storage.job_id
        self.policy = policy
        self.coordinator = coordinator
        self.committers = committers
        self.lease = lease
        self.faults = faults
        self.cleaning = cleaning
        self.stopwatch = stopwatch
        self._now = now
        self._seen = seen
        self.commit_failures: dict[tuple[str, int], int] = {}  # (sink, checkpoint) -> refusals
        self.deferred: list[Decision] = []  # commits to retry at the next epoch
        self.outcomes: dict[int, EpochOutcome] = {}
        self.savepoints: dict[int, str] = {}
        #: the checkpoint the job was restored from and how (set by the driver's restore)
        self.restore_base: RestoreBase | None = None
        self.finished = False
        #: records dead-lettered by completed checkpoints since the driver started
        self.records_dead_lettered = 0
        #: records judged late by completed checkpoints since the driver started (event time)
        self.records_late = 0
        #: per operator vertex: records in, out and judged late by the units fresh in
        #: completed checkpoints since the driver started; dead letters by error type
        self.operator_records: dict[str, list[int]] = {}
        self.dead_letter_types: dict[str, int] = {}
        #: the stalled-input rule (`runtime.stalled_inputs`), set by the driver of a pipeline
        #: with event time; its stalls become warnings of the checkpoint that finds them
        self.stall_watch: StallWatch | None = None
        #: consumer lag: per source vertex and split, the records behind its end as the
        #: latest completed checkpoint's fresh units read it (a fallback's stays as it was)
        self.records_behind: dict[str, dict[str, int]] = {}
        #: of those splits, when their oldest unread record was appended (ms), where the
        #: source said (`ReadResult.unread_since`): the consumer lag in time at any moment
        self.unread_since: dict[str, dict[str, int]] = {}
        #: unit -> its watermark as of the latest completed checkpoint it was fresh in (a unit
        #: that fell back keeps the one its owner checkpoint holds)
        self.unit_watermarks: dict[int, int] = {}
        #: checkpoint id -> what its answers said beyond the coordinator's view (until the
        #: checkpoint's outcome)
        self._answered: dict[int, _Answered] = {}

    def note_answers(self, answers: Sequence[Answer]) -> None:
        """Keep the tracebacks of declines and the dead-letter counts of acks for the
        checkpoint's event (the coordinator only sees each decline's one-line reason)."""
        answered = self._answered
        cid: int | None = None
        tracebacks: dict[int, str] = {}
        dead_lettered: dict[int, int] = {}
        for a in answers:
            if a.checkpoint_id != cid:  # once per run of answers of one checkpoint
                cid = a.checkpoint_id
                for old in [c for c in answered if c < cid]:
                    del answered[old]  # a checkpoint that ended without an outcome
                seen = answered.setdefault(cid, _Answered())
                tracebacks, dead_lettered = seen.tracebacks, seen.dead_lettered
            if isinstance(a, Decline):
                if dead_lettered:
                    dead_lettered.pop(a.unit, None)
                answered[cid].operators.pop(a.unit, None)
                answered[cid].dead_letter_types.pop(a.unit, None)
                answered[cid].behind.pop(a.unit, None)
                answered[cid].unread_since.pop(a.unit, None)
                if a.trace:
                    tracebacks[a.unit] = a.trace
            else:
                if tracebacks:
                    tracebacks.pop(a.unit, None)
                if a.records_dead_lettered:
                    dead_lettered[a.unit] = a.records_dead_lettered
                elif dead_lettered:  # only units that dead-lettered are kept
                    dead_lettered.pop(a.unit, None)
                if a.operators or a.dead_letter_types or a.behind:
                    seen = answered[cid]
                    seen.operators[a.unit] = a.operators
                    seen.dead_letter_types[a.unit] = a.dead_letter_types
                    seen.behind[a.unit] = a.behind
                    seen.unread_since[a.unit] = a.unread_since
                if a.watermark is not None:  # event time: the unit's watermark and late count
                    seen = answered[cid]
                    if a.watermark != MIN_WATERMARK or _reads_a_split(a):
                        seen.watermarks[a.unit] = a.watermark
                    seen.late[a.unit] = a.records_late

    def _note_behind(
        self, behind: Mapping[str, Mapping[str, int]], since: Mapping[str, Mapping[str, int]]
    ) -> None:
        """Keep a fresh unit's consumer lag per split: its records behind, and when the oldest
        of them was appended where its source said (else forgotten: an older time no longer
        holds)."""
        for vertex_id, splits in behind.items():
            self.records_behind.setdefault(vertex_id, {}).update(splits)
            known = since.get(vertex_id, {})
            times = self.unread_since.setdefault(vertex_id, {})
            for split in splits:
                if split in known:
                    times[split] = known[split]
                else:
                    times.pop(split, None)

    def _outcome_of(
        self, outcome: Outcome, fallback_units: tuple[int, ...], message: str, **kw: Any
    ) -> EpochOutcome:
        """The outcome of the pending checkpoint with what its answers said: the tracebacks of
        the units in `fallback_units`; the dead letters of the others (none if aborted)."""
        cid = kw.pop("checkpoint_id")
        seen = self._answered.pop(cid, None) or _Answered()
        dead = 0
        if outcome is not Outcome.ABORTED and seen.dead_lettered:
            fell_back = frozenset(fallback_units)  # 100,000 units: never a tuple scan per unit
            dead = sum(n for u, n in seen.dead_lettered.items() if u not in fell_back)
            self.records_dead_lettered += dead
        if outcome is not Outcome.ABORTED and (
            seen.operators or seen.dead_letter_types or seen.behind
        ):
            fell_back = frozenset(fallback_units)
            for u, sources in seen.behind.items():
                if u not in fell_back:
                    self._note_behind(sources, seen.unread_since.get(u, {}))
            for u, counts in seen.operators.items():
                if u not in fell_back:
                    for vertex_id, numbers in counts.items():
                        total = self.operator_records.setdefault(vertex_id, [0, 0, 0])
                        for k, n in enumerate(numbers):
                            total[k] += n
            for u, types in seen.dead_letter_types.items():
                if u not in fell_back:
                    for error_type, n in types.items():
                        self.dead_letter_types[error_type] = (
                            self.dead_letter_types.get(error_type, 0) + n
                        )
        late, low, holder = 0, None, None
        if outcome is not Outcome.ABORTED and seen.watermarks:
            fell_back = frozenset(fallback_units)
            late = sum(n for u, n in seen.late.items() if u not in fell_back)
            self.records_late += late
            self.unit_watermarks.update(
                (u, w) for u, w in seen.watermarks.items() if u not in fell_back
            )
        if self.unit_watermarks and outcome is not Outcome.ABORTED:
            # the job's watermark: the lowest over every unit, fallen-back ones included with
            # the watermark of their owner's state (over the fresh units alone it would jump
            # up while a unit that is behind falls back, and down when it is fresh again)
            low, holder = min((w, u) for u, w in self.unit_watermarks.items())
        return EpochOutcome(
            outcome,
            fallback_units,
            message,
            tracebacks={u: seen.tracebacks[u] for u in fallback_units if u in seen.tracebacks},
            records_dead_lettered=dead,
            records_late=late,
            watermark=low,
            watermark_unit=holder,
            **kw,
        )

    @functools.cached_property
    def _handlers(self) -> dict[type, Callable[[Any], list[Decision]]]:
        return {
            WriteMetadata: self._write_metadata,
            Commit: self._commit,
            AbortCheckpoint: self._aborted,
            DiscardAttempt: self._discard,
            NotifySubsumed: self._subsumed,
            FailJob: self._fail,
            FinishJob: self._finish,
            NotifyComplete: self._notified,
            NotifyFallback: self._notified,
        }

    #: the epoch part (`regional.runtime.timing.PARTS`) each decision type's handler counts as
    _PARTS: ClassVar[dict[type, str]] = {
        WriteMetadata: "metadata",
        Commit: "commit",
        DiscardAttempt: "discard",
    }

    @functools.cached_property
    def _sink_retention(self) -> tuple[SinkRetention, ...]:
        """The sinks' table retention, read once per driver (`TableRetention`)."""
        return sink_retention({v: s.sink for v, s in self.pipeline.sinks.items()})

    def carry_out(self, decisions: list[Decision], *, hold_commits: bool = False) -> list[Decision]:
        """Carry out decisions in order; the follow-ups of each are carried out after the ones
        already queued. Then hands the deletions they made due to the cleaner.

        With `hold_commits`, stops at the first `Commit` and returns it with every decision
        queued after it, not carried out (a pipelined `run` carries them out while the next
        epoch's tasks run); otherwise returns []."""
        self.deferred = []
        queue = collections.deque(decisions)
        while queue:
            if hold_commits and isinstance(queue[0], Commit):
                break
            d = queue.popleft()
            self._seen(d)
            part = self._PARTS.get(type(d))
            if part is None:
                queue += self._handlers[type(d)](d)
            else:
                with self.stopwatch.part(part):
                    queue += self._handlers[type(d)](d)
        with self.stopwatch.part("clean"):
            self._clean()
        return list(queue)

    def _write_metadata(self, d: WriteMetadata) -> list[Decision]:
        """Write a completed checkpoint's metadata; the checkpoint is complete once it is
        durable. A savepoint is first copied, self-contained, to `savepoints/sp-<id>/`; the
        job's own `chk-<id>` of it follows, as the coordinator wrote it (a crash after the
        savepoint resumes from it; the cleaner treats it as any other). A regional checkpoint
        first copies its fallback units' segments out of mostly-dead files
        (`checkpointing.file-merging.min-live-share`, `runtime.compaction`)."""
        md = d.metadata
        if self._sink_retention:  # for `regional inspect ROOT validate` (format 1.4)
            md = msgspec.structs.replace(md, sinks=self._sink_retention)
        cid = md.checkpoint_id
        compacted = Compacted(md)
        try:
            self.lease.check()  # never write without the lease (an expired one aborts)
            if d.savepoint is not None:
                self.savepoints[cid] = write_savepoint(
                    self.storage, d.savepoint, before_metadata=self._exchange_backlog(d.savepoint)
                )
            else:
                compacted = self._compact(md)
                md = compacted.metadata
            self.storage.write_metadata(md)
        except LeaseLostError:
            raise
        except RegionalError as exc:
            if compacted.path is not None:  # the copy is garbage now (else: the cleaner's)
                with contextlib.suppress(Exception):
                    self.storage.delete_file(compacted.path)
            return self.coordinator.on_metadata_failed(cid, str(exc), self._now())
        if compacted.moved:
            self.coordinator.on_fallback_relocated(cid, compacted.moved)
        self.faults.crash_point(cid, "after-metadata")
        self.cleaning.completed(md)
        outcome = self._outcome_of(
            Outcome.SAVEPOINT if d.savepoint is not None else Outcome(md.kind.value),
            tuple(u.unit_id for u in md.fallback_units),
            "; ".join(md.reasons),
            causes={u.unit_id: u.reason or "" for u in md.fallback_units},
            checkpoint_id=cid,
            warnings=(compacted.warning,) if compacted.warning else (),
        )
        watch = self.stall_watch
        if watch is not None and self.unit_watermarks:
            sizes = operator_state_bytes(md, watch.inputs)
            stalls = watch.observe(cid, sizes, self.unit_watermarks)
            if stalls:
                warnings = outcome.warnings + tuple(s.message() for s in stalls)
                outcome = dataclasses.replace(outcome, warnings=warnings)
        self.outcomes[cid] = outcome
        return self.coordinator.on_metadata_durable(cid, self._now())

    def _compact(self, md: CheckpointMetadata) -> Compacted:
        """Copy `md`'s fallback segments out of files it references less than
        `min-live-share` of (`runtime.compaction.compact`: never raises for storage trouble)."""
        share = self.policy.checkpointing.file_merging.min_live_share
        if share <= 0 or md.kind != CheckpointKind.REGIONAL:
            return Compacted(md)
        done = compact(self.storage, md, min_live_share=share, run_id=self.lease.run_id)
        if done.moved:
            log.info(
                "checkpoint %d: copied %d bytes of units %s out of %s into %s",
                md.checkpoint_id,
                done.bytes_copied,
                ", ".join(map(str, done.units)),
                ", ".join(f.path for f in done.files),
                done.path,
            )
        return done

    def _commit(self, commit: Commit) -> list[Decision]:
        """Commit to the sink idempotently. A failed commit is retried and blocks later ones:
        a refusal by the table (`CommitError`: missing data files, out of order) fails the job
        after `COMMIT_ATTEMPTS`; any other failure (storage unreachable, no lease) is retried
        at the next epoch, as long as it takes."""
        sink = self.pipeline.sink_of(commit.vertex_id)
        key = (commit.vertex_id, commit.checkpoint_id)
        try:
            self.lease.check()
            perform_commit(commit, sink)
        except LeaseLostError:
            raise
        except CommitError as exc:
            self.commit_failures[key] = self.commit_failures.get(key, 0) + 1
            if self.commit_failures[key] >= COMMIT_ATTEMPTS:
                raise CommitError(
                    f"commit of checkpoint {commit.checkpoint_id} to sink {commit.vertex_id!r} "
                    f"failed {COMMIT_ATTEMPTS} times: {exc}"
                ) from exc
            return self.coordinator.on_commit_failed(
                commit.vertex_id, commit.checkpoint_id, str(exc)
            )
        except Exception as exc:
            log.warning(
                "commit of checkpoint %d to sink %r failed (%s: %s); retrying next epoch",
                commit.checkpoint_id,
                commit.vertex_id,
                type(exc).__name__,
                exc,
            )
            self.deferred += self.coordinator.on_commit_failed(
                commit.vertex_id, commit.checkpoint_id, str(exc)
            )
            return []
        self.commit_failures.pop(key, None)
        if isinstance(sink, ReadInsideSink):  # its segments are garbage once all are read
            self.cleaning.segments_published(sink.published_paths(commit.committables))
        follow = self.coordinator.on_commit_done(commit.vertex_id, commit.checkpoint_id)
        if not any(commit.checkpoint_id in c.queued for c in self.committers.values()):
            # every sink has committed the checkpoint: "after-commit" means after all of them
            self.faults.crash_point(commit.checkpoint_id, "after-commit")
        return follow

    def _aborted(self, d: AbortCheckpoint) -> list[Decision]:
        self.outcomes[d.checkpoint_id] = self._outcome_of(
            Outcome.ABORTED,
            d.failed_units,
            d.message,
            causes=dict(d.causes),
            abort_rule=d.rule.value,
            checkpoint_id=d.checkpoint_id,
        )
        return []

    def _discard(self, d: DiscardAttempt) -> list[Decision]:
        """Delete a failed or fenced attempt's state files and staged sink files. Best effort:
        what is left (storage unreachable) is garbage the cleaner finds."""
        try:
            for path in d.files:
                self.storage.delete_file(path)
            for vertex_id, committables in d.committables.items():
                self.pipeline.sink_of(vertex_id).discard(committables)
        except Exception as exc:
            log.warning("files of checkpoint %d left for the cleaner: %s", d.checkpoint_id, exc)
        return []

    def _exchange_backlog(self, md: CheckpointMetadata) -> Callable[[JobStorage], None] | None:
        """What copies the unread backlog of every keyed exchange into a savepoint, so that it
        restores anywhere (`regional.dataflow.exchange.ExchangeWriter.copy_backlog`)."""
        exchanges = self.pipeline.exchanges
        if not exchanges:
            return None

        def copy(target: JobStorage) -> None:
            for reader_id, exchange in exchanges.items():
                writer, writer_spec = exchange.writer, exchange.writer_spec
                view = reader_view(md, reader_id)
                if view.layout is None:
                    continue
                staged = [
                    c for s in md.subtasks if s.vertex_id == writer_spec.id for c in s.committables
                ]
                there = writer.bound_to(
                    exchange_path(target.job_path, reader_id), target.filesystem
                )
                writer.copy_backlog(there, view.layout, view.cursors, staged, md.checkpoint_id)

        return copy

    def _subsumed(self, d: NotifySubsumed) -> list[Decision]:
        return []  # the cleaner applies the same retention rule to the metadata it is given

    def _fail(self, d: FailJob) -> list[Decision]:
        raise JobFailedError(d.message)

    def _finish(self, d: FinishJob) -> list[Decision]:
        self.finished = True
        return []

    def _notified(self, d: NotifyComplete | NotifyFallback) -> list[Decision]:
        return []  # units restore from the coordinator's states every epoch

    def _clean(self) -> None:
        """Hand the deletions due to the background cleaner (the driver's first clean scans
        the root in full). An injected `mid-clean` crash waits for the cleaner, so the driver
        stops there, mid-way through the deletions, as a real one would."""
        latest = self.coordinator.latest_completed_id or 0

        def progress(_: object) -> None:
            self.faults.crash_point(latest, "mid-clean")

        self.cleaning.clean(self.restore_base, progress)
        if self.faults.crash_at == (latest, "mid-clean"):
            self.cleaning.drain()
