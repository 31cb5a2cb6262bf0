"""The checkpoint coordinator: regional completion as a pure state machine (DESIGN §4 rules 2–12).

The runtime calls `trigger`, then `on_answers` with each dispatch's answers (or `on_ack` /
`on_decline` per unit attempt: the same decisions) and `on_tick` with the time; it carries out
the returned decisions in order: `WriteMetadata` (then `on_metadata_durable`), `Commit` (then
`on_commit_done` / `on_commit_failed`), notifications, discards, `FailJob`, `FinishJob`. One
checkpoint is in flight at a time: the next trigger waits until the previous one is aborted or
its metadata is durable.

Cost: an ack is O(its subtasks), a decline O(1), and a batch of them has no call per answer; an
`AckBatch` of usual acks is one loop step per ack and one comparison of its shape with the
layout's, with no check per subtask state (its maker described them: `AckBatch.of`); a
trigger, a tick, a completion and an abort are O(answers + fallback units) in Python (an abort
tells the operator coordinators every subtask's owner as `SubtaskOwners`, O(units behind the
latest checkpoint)), plus list and tuple copies and scans over every unit done in C
(`[x] * n`, `tuple(...)`, `itertools`): no per-unit Python loop over units that did not change.
The states a unit restarts from (`unit_states`) are built once per change of the unit's state.

About 1,100 lines, on purpose: one state machine whose events (trigger, ack, decline, tick,
durable, commit) share the per-unit owners, states and limits; the rule evaluation
(`coordinator.verdict`), the pending checkpoint (`coordinator.pending`), the limits
(`coordinator.limits`), the task messages (`coordinator.messages`) and the decisions
(`coordinator.decisions`) are already their own modules.

>>> from metadata.model import SubtaskState, VertexInfo
>>> from regional.coordinator.layout import JobLayout
>>> from regional.policy import Policy
>>> layout = JobLayout(units=tuple(((("map", u),) for u in range(4))),
...                    vertices=(VertexInfo("map", 4, 128),))
>>> c = CheckpointCoordinator(layout, Policy(), job_id="job")
>>> t = c.trigger(now_ms=0)
>>> for u in (0, 1, 2):
...     _ = c.on_ack(t.checkpoint_id, u, t.attempt, (SubtaskState("map", u, u, attempt=1),), 5)
>>> [write] = c.on_decline(t.checkpoint_id, 3, t.attempt, "ValueError: bad record", 6)
>>> write.metadata.kind.value, [s.ref_checkpoint_id for s in write.metadata.subtasks]
('regional', [None, None, None, 0])
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import chain, compress, islice, repeat
from operator import attrgetter, sub

import msgspec

from metadata.compaction import relocate_states, relocated_units, state_dirs
from metadata.errors import RegionalError
from metadata.layout import savepoint_dir
from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    ForcedGlobal,
    StateHandle,
    SubtaskState,
    UnitState,
    VertexInfo,
)
from metadata.retention import Retention, owner_refs
from metadata.unit_names import unit_name
from regional.coordinator.decisions import (
    INITIAL_STATE_ID,
    AbortCheckpoint,
    Decision,
    DiscardAttempt,
    FailJob,
    FinishJob,
    NotifyComplete,
    NotifyFallback,
    NotifySubsumed,
    Rule,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.coordinator.layout import JobLayout
from regional.coordinator.limits import Limits
from regional.coordinator.messages import Ack, AckBatch, Decline, answers_of, well_formed_shape
from regional.coordinator.metrics import CoordinatorMetrics
from regional.coordinator.operator_coordinator import (
    CommitQueue,
    OperatorCoordinator,
    RegionalCompletion,
    SubtaskOwners,
)
from regional.coordinator.pending import PendingCheckpoint
from regional.coordinator.verdict import Verdict, evaluate, failure_ratio, name_units
from regional.errors import JobFailedError
from regional.policy import Policy, format_duration, policy_fingerprint

__all__ = ["CheckpointCoordinator", "CoordinatorStateError"]


class CoordinatorStateError(RegionalError):
    """The runtime called the coordinator out of order (a bug in the runtime, not in the job)."""


class _Completion(msgspec.Struct):
    """A decided checkpoint whose metadata is being written."""

    pending: PendingCheckpoint
    metadata: CheckpointMetadata
    fallback: dict[int, str]  # unit -> cause
    fallback_states: dict[int, tuple[SubtaskState, ...]]
    committables: dict[str, tuple[bytes, ...]]  # commit vertex -> its fresh committables
    by_vertex: dict[str, dict[int, int]]  # `_per_vertex(fallback)`
    #: relocated unit -> the checkpoints other than its owner whose directories hold its state
    homes: dict[int, frozenset[int]] = {}


class CheckpointCoordinator:
    """Drives checkpoints of one job over the fallback units of `layout` under `policy`.

    `coordinators` maps a vertex id to its operator coordinator (`SplitEnumerator`,
    `CommitCoordinator`, or any `OperatorCoordinator`). `names` names a unit in messages
    and errors (`regional.graph.unit_names`: ``orders[1] (unit 1)``, the driver's
    `UnitNames.mention`); without it, `reads` gives the splits a unit reads
    (`metadata.unit_names.unit_name`: ``unit 1 (events:1)``), by default its subtasks' split
    states in the latest completed checkpoint.
    """

    def __init__(
        self,
        layout: JobLayout,
        policy: Policy,
        *,
        job_id: str,
        coordinators: Mapping[str, OperatorCoordinator] | None = None,
        reads: Callable[[int], Sequence[str]] | None = None,
        names: Callable[[int], str] | None = None,
    ) -> None:
        self._layout = layout
        self._reads = reads
        self._names = names
        self._policy = policy
        self._region = policy.checkpointing.region
        self._job_id = job_id
        self._fingerprint = policy_fingerprint(policy)
        self._ratio = failure_ratio(self._region.max_failure_ratio)
        self._coordinators: dict[str, OperatorCoordinator] = dict(coordinators or {})
        for vertex_id in self._coordinators:
            if vertex_id not in {v.vertex_id for v in layout.vertices}:
                raise CoordinatorStateError(
                    f"operator coordinator for unknown vertex {vertex_id!r}"
                )
        self._committers = {
            v: c for v, c in self._coordinators.items() if isinstance(c, CommitQueue)
        }
        n = layout.num_units
        self._n = n
        self._expected = [tuple(subtasks) for subtasks in layout.units]
        #: per unit: the `ack_shape` of its well-formed ack of attempt 1 (`AckBatch` checks)
        self._shape = list(map(well_formed_shape, range(n), repeat(1), self._expected))
        self._fresh_unit = [UnitState(u) for u in range(n)]
        self._unit_ids = tuple(range(n))  # shared: scans over units allocate no int per unit
        # per coordinated vertex: its subtask indices in unit order, each with its place (the
        # order of an abort's `SubtaskOwners`)
        placed: dict[str, dict[int, int]] = {v: {} for v in self._coordinators}
        if placed:
            for subtasks in self._expected:
                for vertex_id, index in subtasks:
                    if (order := placed.get(vertex_id)) is not None:
                        order[index] = len(order)
        self._placed = placed
        self._source_units = {
            u: {v for v, _ in layout.units[u] if v in layout.bounded_sources} for u in range(n)
        }
        # the latest completed checkpoint, per unit: its subtask states and their owner
        self._next_id = 1
        self._latest_id: int | None = None
        self._unit_states: list[tuple[SubtaskState, ...] | None] = [None] * n
        self._owner = [INITIAL_STATE_ID] * n
        #: the units whose owner is not the latest completed checkpoint (INITIAL_STATE_ID before
        #: the first), with their owner: the same as `_owner`, in O(units behind)
        self._behind: dict[int, int] = {}
        self._behind_by_vertex: dict[str, dict[int, int]] = {}  # `_per_vertex(_behind)`
        #: fallback units whose state a compaction relocated (`on_fallback_relocated`) -> the
        #: checkpoints other than their owner whose directories hold it (kept by reference)
        self._homes: dict[int, frozenset[int]] = {}
        #: per unit: `_fallback_states(unit)` once built (None: not built since it changed)
        self._restore_states: list[tuple[SubtaskState, ...] | None] = [None] * n
        self._mismatch: dict[str, str] = {}  # vertex -> why its earlier state does not fit
        self._global_until_success: str | None = None
        self._pending: PendingCheckpoint | None = None
        self._completing: _Completion | None = None
        self._finished_sources: set[str] = set()
        self._final_mode = False
        self._final_checkpoint: int | None = None
        self._finished = False
        self._failed: str | None = None
        self._retention = Retention(policy.checkpointing.num_retained)
        self.limits = Limits(self._region, policy.checkpointing.tolerable_failed_checkpoints)
        #: unit -> why it failed or fell back most recently (kept while it is behind or stuck)
        self.last_cause: dict[int, str] = {}
        self.metrics = CoordinatorMetrics()

    # --- what the runtime reads --------------------------------------------------------------

    @property
    def pending_checkpoint_id(self) -> int | None:
        """The checkpoint whose units are running, or None."""
        return self._pending.checkpoint_id if self._pending else None

    @property
    def latest_completed_id(self) -> int | None:
        return self._latest_id

    @property
    def finished_sources(self) -> frozenset[str]:
        """The bounded sources known to have read everything (`on_source_finished`)."""
        return frozenset(self._finished_sources)

    @property
    def finished(self) -> bool:
        """True once `FinishJob` was returned."""
        return self._finished

    def unit_owner(self, unit_id: int) -> int:
        """The checkpoint whose state `unit_id` restarts from (`INITIAL_STATE_ID`: none)."""
        return self._owner[unit_id]

    def unit_name(self, unit_id: int) -> str:
        """The unit in messages: by `names` (``orders[3] (unit 3)``) when given, else the unit
        and the splits it reads (``unit 3 (events:3)``, `metadata.unit_names`)."""
        if self._names is not None:
            return self._names(unit_id)
        if self._reads is not None:
            return unit_name(unit_id, self._reads(unit_id))
        states = self._unit_states[unit_id] or ()
        return unit_name(unit_id, (s.split_id for t in states for s in t.split_states))

    @property
    def stuck_units(self) -> dict[int, int]:
        """Stuck unit -> since when (driver ms): over `max-unit-fallbacks` in isolate mode."""
        return dict(self.limits.stuck)

    def unit_states(self, unit_id: int) -> tuple[SubtaskState, ...]:
        """The subtask states `unit_id` restarts from (empty for its initial state)."""
        cached = self._restore_states[unit_id]
        if cached is None:
            cached = self._restore_states[unit_id] = self._fallback_states(unit_id)
        return cached

    # --- events ------------------------------------------------------------------------------

    def trigger(self, now_ms: int, *, savepoint: bool = False) -> TriggerCheckpoint:
        """Start the next checkpoint (or a savepoint). Raises `CoordinatorStateError` while one
        is in flight, `JobFailedError` after `FailJob`."""
        if self._failed is not None:
            raise JobFailedError(f"job {self._job_id} failed: {self._failed}")
        if self._pending is not None or self._completing is not None:
            busy = self._pending or (self._completing.pending if self._completing else None)
            assert busy is not None
            raise CoordinatorStateError(
                f"cannot trigger a checkpoint while checkpoint {busy.checkpoint_id} is in flight;"
                " wait until it is aborted or its metadata is durable"
            )
        if self._finished:
            raise CoordinatorStateError(f"job {self._job_id} has finished; nothing to checkpoint")
        self.limits.note_time(now_ms)
        final = self._all_bounded_finished()
        self._final_mode |= final
        reasons: list[str] = []
        forced: list[ForcedGlobal] = []  # the same, as fields for tools
        tier1 = False
        if savepoint:
            reasons.append("savepoint: every unit is fresh")
            forced.append(ForcedGlobal.SAVEPOINT)
        if self._final_mode:
            reasons.append("every bounded source has finished: checkpoints are global")
            forced.append(ForcedGlobal.FINAL)
        if self._global_until_success:
            reasons.append(self._global_until_success)
            forced.append(ForcedGlobal.UNTIL_SUCCESS)
        if self._region.enabled and (why := self.limits.tier1_reason()):
            reasons.append(why)
            forced.append(ForcedGlobal.CONSECUTIVE_REGIONAL)
            tier1 = True
        if self._region.enabled and self._region.max_unit_fallbacks == 0:
            reasons.append("max-unit-fallbacks = 0: units may never fall back")
            forced.append(ForcedGlobal.NO_UNIT_FALLBACKS)
        must_all = bool(reasons)
        single = self._layout.num_units <= 1
        if self._region.enabled and single and not must_all:
            # rule 1: nothing can fall back on its own; a decline still aborts by rule 3b
            reasons.append("the job has a single fallback unit: its checkpoints are global")
            forced.append(ForcedGlobal.SINGLE_UNIT)
        if not self._region.enabled:
            reasons.append("regional checkpoints are disabled")
            forced.append(ForcedGlobal.REGIONAL_DISABLED)
        must_fresh = frozenset() if must_all else self.limits.units_at_limit()
        kind = (
            CheckpointKind.SAVEPOINT
            if savepoint
            else CheckpointKind.GLOBAL
            if must_all or single or not self._region.enabled
            else CheckpointKind.REGIONAL
        )
        timeout = self._policy.checkpointing.timeout
        if self._region.enabled:
            timeout = min(timeout, self._region.timeout)
        deadline = now_ms + round(timeout * 1000)
        checkpoint_id = self._next_id
        self._next_id += 1
        self._pending = PendingCheckpoint(
            checkpoint_id,
            trigger_ms=now_ms,
            num_units=self._layout.num_units,
            deadline_ms=deadline,
            kind=kind,
            must_be_fresh_all=must_all,
            must_be_fresh=must_fresh,
            regional_allowed=self._region.enabled,
            tier1=tier1,
            final=final,
            reasons=tuple(reasons),
            forced=tuple(forced),
            unit_ids=self._unit_ids,
        )
        return TriggerCheckpoint(
            checkpoint_id, kind, 1, deadline, must_fresh, tuple(reasons), final, tuple(forced)
        )

    def retry_unit(self, checkpoint_id: int, unit_id: int, now_ms: int) -> int:
        """Fence the unit's running attempt and start a new one (its ack alone counts now);
        returns the new attempt number. Only for a unit that has not answered yet. The new
        attempt gets the region timeout, never past the checkpoint's own deadline."""
        self._check_unit(unit_id)
        p = self._pending
        if p is None or p.checkpoint_id != checkpoint_id or p.answered(unit_id):
            raise CoordinatorStateError(
                f"cannot retry unit {unit_id} in checkpoint {checkpoint_id}: it is not pending "
                "or the unit already answered"
            )
        return p.retry(unit_id, min(p.deadline_ms, now_ms + round(self._region.timeout * 1000)))

    def on_ack(
        self,
        checkpoint_id: int,
        unit_id: int,
        attempt: int,
        subtasks: Sequence[SubtaskState],
        now_ms: int,
    ) -> list[Decision]:
        """Unit `unit_id`'s attempt acked with the states of all its subtasks, in the order of
        `layout.units[unit_id]`. A stale ack (fenced attempt, checkpoint not pending) is
        ignored and its files returned for discarding (rule 9)."""
        # the hot path: once per unit and checkpoint, so checks are inlined (no helper calls)
        if not 0 <= unit_id < self._n:
            self._check_unit(unit_id)
        p = self._pending
        if (
            p is None
            or p.checkpoint_id != checkpoint_id
            or ((attempt != 1 or p.retries) and p.attempt_of(unit_id) != attempt)
        ):
            return [_discard(checkpoint_id, unit_id, attempt, subtasks, committables=True)]
        if p.states[unit_id] is not None:
            return []  # a duplicate of the accepted ack
        if unit_id in p.declined:
            return [_discard(checkpoint_id, unit_id, attempt, subtasks, committables=True)]
        states = subtasks if type(subtasks) is tuple else tuple(subtasks)
        expected = self._expected[unit_id]
        ok = len(states) == len(expected)
        if ok:
            k = 0  # indexing, not zip(): zip(strict=True) costs as much as the checks
            for s in states:
                vertex_id, index = expected[k]
                k += 1  # noqa: SIM113 (enumerate allocates a tuple per subtask)
                if (
                    s.index != index
                    or s.vertex_id != vertex_id
                    or s.unit_id != unit_id
                    or s.attempt != attempt
                    or s.ref_checkpoint_id is not None
                ):
                    ok = False
                    break
        if not ok:
            problem = self._malformed(unit_id, attempt, states)
            out = [_discard(checkpoint_id, unit_id, attempt, states, committables=True)]
            return out + self._record_decline(p, unit_id, problem, now_ms)
        p.states[unit_id] = states  # PendingCheckpoint.ack, inlined
        p.outstanding -= 1
        if p.files is False:
            p.files = None
        return self._decide(p, now_ms) if p.outstanding == 0 else []

    def on_answers(
        self, answers: Sequence[Ack | Decline | AckBatch], now_ms: int
    ) -> list[Decision]:
        """A batch of unit answers (what one dispatch returned, `Dispatch.arrived`), in arrival
        order: the decisions `on_ack` and `on_decline` return for them one by one, in the same
        order (an `AckBatch` stands for its acks).

        An `AckBatch` of usual acks (first attempts of the pending checkpoint, each unit once,
        well-formed by its `shape`) is recorded with no call per ack; runs of usual answers
        (those acks and declines that do not abort at once) in one pass without a call per
        answer; the answers after the checkpoint was decided are discarded together; any other
        answer is handed to `on_ack` / `on_decline`."""
        out: list[Decision] = []
        i, n = 0, len(answers)
        while i < n:
            p = self._pending
            if p is None:  # decided or aborted: the rest is stale
                return out + self._stale_answers(answers, i, now_ms)
            a = answers[i]
            if isinstance(a, AckBatch):
                i += 1
                if self._take_batch(p, a):
                    if p.outstanding == 0:
                        out += self._decide(p, now_ms)
                else:  # its acks one by one
                    out += self.on_answers(a.acks, now_ms)
                continue
            taken = self._take_answers(p, answers, i)
            if taken > i:
                i = taken
                if p.outstanding == 0:
                    out += self._decide(p, now_ms)
                continue
            i += 1
            if isinstance(a, Ack):
                out += self.on_ack(a.checkpoint_id, a.unit, a.attempt, a.states, now_ms)
            else:
                out += self.on_decline(a.checkpoint_id, a.unit, a.attempt, a.reason, now_ms)
        return out

    def _take_batch(self, p: PendingCheckpoint, batch: AckBatch) -> bool:
        """Record the acks of `batch` in `p` if every one of them is usual (see `on_answers`),
        with no call per ack: one loop stores each ack's states unless its unit answered
        before (or twice in the batch) and gathers the layout's shape of it, then the batch's
        `shape` is compared with that; False, with nothing recorded, otherwise."""
        acks = batch.acks
        if p.retries or batch.checkpoint_id != p.checkpoint_id or not acks:
            return False
        shape, taken = self._shape, p.states
        parts: list[bytes] = []
        add = parts.append
        try:
            for a in acks:
                unit_id = a.unit
                if taken[unit_id] is not None:
                    break
                taken[unit_id] = a.states
                add(shape[unit_id])  # a negative unit id finds another unit's shape
            else:
                declined = p.declined
                if b"".join(parts) == batch.shape and not (
                    declined and not declined.keys().isdisjoint(map(_unit_of, acks))
                ):
                    p.outstanding -= len(acks)
                    if batch.files:
                        p.files = True
                    return True
        except (IndexError, TypeError):  # a unit the job lacks
            pass
        for a in islice(acks, len(parts)):  # undo
            taken[a.unit] = None
        return False

    def _take_answers(
        self, p: PendingCheckpoint, answers: Sequence[Ack | Decline | AckBatch], i: int
    ) -> int:
        """Record `answers[i:k]` in `p` and return k, the first answer that needs more than
        recording (see `on_answers`). The checks of `on_ack`, inlined: the hot path, once per
        unit and checkpoint."""
        if p.retries:
            return i  # some unit runs another attempt than 1: answer by answer
        cid = p.checkpoint_id
        n = self._n
        expected = self._expected
        taken = p.states
        declined = p.declined
        must_fresh = p.must_be_fresh
        declines_stop = p.must_be_fresh_all or not p.regional_allowed
        k = i
        acked = False
        for a in islice(answers, i, None):
            kind = type(a)
            if kind is AckBatch:
                break
            unit_id = a.unit  # type: ignore[union-attr]
            if (
                a.checkpoint_id != cid
                or a.attempt != 1  # type: ignore[union-attr]
                or not 0 <= unit_id < n
                or taken[unit_id] is not None
                or unit_id in declined
            ):
                break
            if kind is Ack:
                states = a.states  # type: ignore[union-attr]
                want = expected[unit_id]
                if type(states) is not tuple or len(states) != len(want):
                    break
                j = 0  # indexing, not zip(): zip(strict=True) costs as much as the checks
                for s in states:
                    vertex_id, index = want[j]
                    j += 1  # noqa: SIM113 (enumerate allocates a tuple per subtask)
                    if (
                        s.index != index
                        or s.vertex_id != vertex_id
                        or s.unit_id != unit_id
                        or s.attempt != 1
                        or s.ref_checkpoint_id is not None
                    ):
                        break
                else:  # well-formed (once none is outstanding, the next answer stops the run)
                    taken[unit_id] = states
                    k += 1
                    acked = True
                    continue
                break  # malformed
            if kind is not Decline or declines_stop or unit_id in must_fresh:
                break
            declined[unit_id] = f"declined: {a.reason}"  # type: ignore[union-attr]
            k += 1
        p.outstanding -= k - i
        if acked and p.files is False:
            p.files = None
        return k

    def _stale_answers(
        self, answers: Sequence[Ack | Decline | AckBatch], i: int, now_ms: int
    ) -> list[Decision]:
        """`answers[i:]` (batches as their acks) when no checkpoint is pending: what `on_ack`
        (discard the attempt) and `on_decline` (nothing) return for each, with the discards of
        attempts holding no files and no committables built in C."""
        rest = answers_of(answers[i:])
        acks: list[Ack] = [a for a in rest if type(a) is Ack]
        every = [a.unit for a in rest]
        if (
            len(acks) + sum(type(a) is Decline for a in rest) != len(rest)
            or not 0 <= min(every) <= max(every) < self._n
            or _any_files(chain.from_iterable(map(_states_of, acks)))
        ):
            out: list[Decision] = []
            for a in rest:  # one by one (also raises for a unit the job does not have)
                if isinstance(a, Ack):
                    out += self.on_ack(a.checkpoint_id, a.unit, a.attempt, a.states, now_ms)
                else:
                    out += self.on_decline(a.checkpoint_id, a.unit, a.attempt, a.reason, now_ms)
            return out
        units = map(_unit_of, acks)
        return list(map(DiscardAttempt, map(_checkpoint_of, acks), units, map(_attempt_of, acks)))

    def on_decline(
        self, checkpoint_id: int, unit_id: int, attempt: int, cause: str, now_ms: int
    ) -> list[Decision]:
        """Unit `unit_id`'s attempt declined (`cause`: e.g. the exception in user code)."""
        self._check_unit(unit_id)
        p = self._pending
        if (
            p is None
            or p.checkpoint_id != checkpoint_id
            or p.attempt_of(unit_id) != attempt
            or p.answered(unit_id)
        ):
            return []
        return self._record_decline(p, unit_id, f"declined: {cause}", now_ms)

    def on_tick(self, now_ms: int) -> list[Decision]:
        """Decline every unit past its deadline (a silent unit is a failed unit, rule 2)."""
        p = self._pending
        if p is None:
            return []
        expired = p.expired(now_ms)
        if not expired:
            return []
        cause = f"timeout: no answer after {(now_ms - p.trigger_ms) / 1000:g} s"
        if p.regional_allowed and not p.must_be_fresh_all:
            # the timeouts before the first one that aborts (a unit that must be fresh) are
            # only recorded, all at once
            fresh = p.must_be_fresh
            stop = next((k for k, u in enumerate(expired) if u in fresh), None) if fresh else None
            quiet = expired if stop is None else expired[:stop]
            p.declined.update(dict.fromkeys(quiet, cause))
            p.outstanding -= len(quiet)
            if stop is None:
                return self._decide(p, now_ms) if p.outstanding == 0 else []
            expired = expired[stop:]
        out: list[Decision] = []
        for unit_id in expired:
            out += self._record_decline(p, unit_id, cause, now_ms)
            if self._pending is not p:
                break
        return out

    def on_metadata_durable(self, checkpoint_id: int, now_ms: int) -> list[Decision]:
        """Checkpoint `checkpoint_id`'s metadata is written: it is complete. Returns the
        notifications, the commits to run and subsumed checkpoints."""
        done = self._take_completion(checkpoint_id)
        p = done.pending
        n = self._n
        fallback = done.fallback
        # the new latest state of every unit; a fallen-back unit keeps its states and owner
        states = p.states
        restore: list[tuple[SubtaskState, ...] | None] = [None] * n
        for unit_id, fb in done.fallback_states.items():
            states[unit_id] = restore[unit_id] = fb
        # the fallen-back units, ascending, with their owners (kept): lists built in C
        behind_units = sorted(fallback)
        behind_owners = list(map(self._owner.__getitem__, behind_units))
        owner = self._owner = [checkpoint_id] * n
        for unit_id, unit_owner in zip(behind_units, behind_owners, strict=True):
            owner[unit_id] = unit_owner
        self._behind = dict(zip(behind_units, behind_owners, strict=True))
        self._behind_by_vertex = per_vertex = done.by_vertex
        self._unit_states = states
        self._restore_states = restore
        self._mismatch = {}
        self._latest_id = checkpoint_id
        savepoint = p.kind is CheckpointKind.SAVEPOINT
        self.limits.completed(fallback, now_ms=now_ms, savepoint=savepoint)
        self._note_causes(fallback)
        if savepoint:
            self.metrics.savepoint_count += 1
            self._global_until_success = (
                f"savepoint {checkpoint_id} is user-owned: no unit may fall back to it"
            )
        elif fallback:
            self.metrics.regional_checkpoint_count += 1
        else:
            self.metrics.global_checkpoint_count += 1
            self._global_until_success = None
        owners = set(behind_owners)
        self.metrics.oldest_ref_checkpoint_id[checkpoint_id] = min(owners, default=None)
        if self._homes or done.homes:  # units fresh again hold no relocated state any more
            self._homes = {u: h for u, h in self._homes.items() if u in fallback}
            self._homes.update(done.homes)
        lags = map(sub, repeat(checkpoint_id), behind_owners)
        self.metrics.unit_lag = dict(zip(behind_units, lags, strict=True))
        units_fallback = dict(self._behind)
        for vertex_id, coordinator in self._coordinators.items():
            if fallback:
                info = RegionalCompletion(per_vertex.get(vertex_id, {}), units_fallback)
                coordinator.notify_regional_complete(checkpoint_id, info)
            else:
                coordinator.notify_complete(checkpoint_id)
        self._reopen_sources(fallback)
        out: list[Decision] = []
        fresh = [True] * n
        for unit_id in behind_units:
            fresh[unit_id] = False
        healthy = tuple(compress(self._unit_ids, fresh))
        out.append(NotifyComplete(checkpoint_id, healthy))
        out += map(NotifyFallback, repeat(checkpoint_id), behind_units, behind_owners)
        # a savepoint's chk-<id> is the job's own global checkpoint: retained like any other
        homes = frozenset().union(*self._homes.values()) if self._homes else frozenset()
        out += self._retain(checkpoint_id, frozenset(owners - {INITIAL_STATE_ID}) | homes)
        for vertex_id, committer in self._committers.items():
            committer.checkpoint_complete(
                checkpoint_id, done.committables.get(vertex_id, ()), fallback=units_fallback
            )
        if p.final and not fallback:
            self._final_checkpoint = checkpoint_id
        out += self._pump()
        return out + self._stuck_too_long(now_ms)

    def on_fallback_relocated(
        self, checkpoint_id: int, moved: Mapping[StateHandle, StateHandle]
    ) -> None:
        """Before writing checkpoint `checkpoint_id`'s metadata, the runtime copied fallback
        segments out of a mostly-dead file into a file of that checkpoint (`moved`: each old
        handle -> its verified copy; `metadata.compaction`) and wrote the metadata with the
        copies. The units restart from the copies from then on, with the same owner, and the
        checkpoint's directory is kept by reference while they use it. Call it before
        `on_metadata_durable`; a `moved` naming no fallback segment of the checkpoint changes
        nothing."""
        done = self._completing
        if done is None or done.metadata.checkpoint_id != checkpoint_id:
            raise CoordinatorStateError(
                f"checkpoint {checkpoint_id} is not waiting for its metadata to be written; "
                "relocate its fallback segments before `on_metadata_durable`"
            )
        homes = dict(done.homes)
        for unit_id, states in done.fallback_states.items():
            new = relocate_states(states, moved)
            if new != states:
                done.fallback_states[unit_id] = new
                homes[unit_id] = state_dirs(new) - {self._owner[unit_id]}
        done.homes = homes

    def on_metadata_failed(self, checkpoint_id: int, message: str, now_ms: int) -> list[Decision]:
        """Writing the metadata failed: the checkpoint is aborted."""
        done = self._take_completion(checkpoint_id)
        return self._abort(
            done.pending,
            Rule.METADATA_WRITE,
            f"checkpoint {checkpoint_id} aborted: writing its metadata failed: {message}",
            now_ms,
            extra_failed=tuple(done.fallback),
        )

    def on_commit_done(self, vertex_id: str, checkpoint_id: int) -> list[Decision]:
        """The `Commit` of `checkpoint_id` to sink `vertex_id` succeeded (or was skipped)."""
        self._committer(vertex_id).commit_succeeded(checkpoint_id)
        return self._pump()

    def on_commit_failed(self, vertex_id: str, checkpoint_id: int, message: str) -> list[Decision]:
        """The commit failed: it is handed out again (retry) and blocks later commits."""
        self._committer(vertex_id).commit_failed(checkpoint_id)
        self.metrics.commit_failures += 1
        return self._pump()

    def on_source_finished(self, vertex_id: str) -> None:
        """Every subtask of bounded source `vertex_id` reached the end of its input."""
        if vertex_id not in self._layout.bounded_sources:
            raise CoordinatorStateError(
                f"{vertex_id!r} is not a bounded source; bounded sources: "
                f"{', '.join(sorted(self._layout.bounded_sources)) or 'none'}"
            )
        self._finished_sources.add(vertex_id)

    def restore(
        self,
        metadata: CheckpointMetadata,
        *,
        mode: str = "claim",
        next_checkpoint_id: int | None = None,
        global_until_success: str | None = None,
    ) -> list[Decision]:
        """Start from a completed checkpoint (DESIGN rule 12). `mode` is `claim` or `no-claim`
        (checkpoints stay global until one succeeds; nothing falls back to the restored one).
        `next_checkpoint_id`: the first id not used under the job root (ids of checkpoints that
        were in flight at a crash are not reused). `global_until_success`: why checkpoints must
        stay global until one succeeds in claim mode too (e.g. the restored state was rewritten
        for another parallelism and is not kept). Returns the re-commits."""
        if self._latest_id is not None or self._pending or self._completing or self._next_id > 1:
            raise CoordinatorStateError("restore only a coordinator that has not checkpointed")
        if mode not in ("claim", "no-claim"):
            raise CoordinatorStateError(f"restore mode {mode!r}: expected claim or no-claim")
        cid = metadata.checkpoint_id
        self._latest_id = cid
        self._next_id = max(cid + 1, next_checkpoint_id or 0)
        by_unit: dict[int, dict[tuple[str, int], SubtaskState]] = {}
        for s in metadata.subtasks:
            by_unit.setdefault(s.unit_id, {})[s.vertex_id, s.index] = s
        then = {v.vertex_id: v for v in metadata.vertices}
        for v in self._layout.vertices:
            old: VertexInfo | None = then.get(v.vertex_id)
            if old != v:
                was = "absent" if old is None else f"{old.parallelism} / {old.max_parallelism}"
                self._mismatch[v.vertex_id] = (
                    f"vertex {v.vertex_id!r} had parallelism / max parallelism {was} in "
                    f"checkpoint {cid}, now {v.parallelism} / {v.max_parallelism}"
                )
        self._restore_states = [None] * self._n
        for u, keys in enumerate(self._expected):
            got = by_unit.get(u, {})
            if set(got) == set(keys):
                self._unit_states[u] = tuple(got[k] for k in keys)
                refs = {got[k].ref_checkpoint_id for k in keys}
                self._owner[u] = cid if refs == {None} else min(r for r in refs if r is not None)
            else:
                self._unit_states[u] = None
                self._owner[u] = cid
        if mode == "no-claim":
            self._global_until_success = (
                f"restored checkpoint {cid} in no-claim mode: checkpoints stay global until one "
                "succeeds"
            )
        elif global_until_success is not None:
            self._global_until_success = global_until_success
        elif metadata.kind is CheckpointKind.SAVEPOINT:
            self._global_until_success = (
                f"restored savepoint {cid} is user-owned: no unit may fall back to it"
            )
        self.last_cause = {u.unit_id: u.reason for u in metadata.fallback_units if u.reason}
        m = self._region.max_unit_fallbacks
        self.limits.streak = {
            u: min(m, cid - self._owner[u])
            for u in range(self._layout.num_units)
            if self._owner[u] != cid
        }
        self.limits.consecutive_regional = (
            metadata.consecutive_regional
            if metadata.consecutive_regional is not None
            else int(metadata.kind is CheckpointKind.REGIONAL)  # written before format 1.3
        )
        self._retention = Retention(self._policy.checkpointing.num_retained)
        self._retention.add(cid, owner_refs(metadata))
        self._homes = {u: dirs - {owner} for u, (owner, dirs) in relocated_units(metadata).items()}
        for vertex_id, data in metadata.coordinators.items():
            if vertex_id in self._coordinators:
                self._coordinators[vertex_id].restore(data)
        fell_back = {u: o for u, o in enumerate(self._owner) if o != cid}
        self._behind = dict(fell_back)
        self._behind_by_vertex = self._per_vertex(fell_back)
        for vertex_id, committer in self._committers.items():
            committables = _fresh_committables(metadata, vertex_id)
            if not committer.queued or committer.queued[-1] < cid:
                committer.checkpoint_complete(cid, committables, recommit=True, fallback=fell_back)
        return self._pump()

    # --- deciding ----------------------------------------------------------------------------

    def _record_decline(
        self, p: PendingCheckpoint, unit_id: int, cause: str, now_ms: int
    ) -> list[Decision]:
        p.decline(unit_id, cause)
        cid = p.checkpoint_id
        if p.must_be_fresh_all or unit_id in p.must_be_fresh:
            why = (
                "; ".join(p.reasons)
                if p.must_be_fresh_all
                else self.limits.unit_limit_reason(unit_id)
            )
            return self._abort(
                p,
                Rule.MUST_BE_FRESH,
                f"checkpoint {cid} aborted (rule 3a): {self.unit_name(unit_id)} had to be fresh "
                f"({why}) but failed: {cause}",
                now_ms,
            )
        if not p.regional_allowed:
            return self._abort(
                p,
                Rule.REGIONAL_DISABLED,
                f"checkpoint {cid} aborted: {self.unit_name(unit_id)} failed ({cause}) and "
                "regional checkpoints are disabled (checkpointing.region.enabled = false)",
                now_ms,
            )
        return self._decide(p, now_ms) if p.outstanding == 0 else []

    def _decide(self, p: PendingCheckpoint, now_ms: int) -> list[Decision]:
        """Every unit answered: complete (global or regional) or abort (rule 3)."""
        cid = p.checkpoint_id
        failed = p.declined
        if not failed:
            snapshots = {v: c.snapshot(cid) for v, c in self._coordinators.items()}
            return self._complete(p, now_ms, {}, snapshots, {})
        by_vertex: dict[str, dict[int, int]] = {}  # built only when rules 3 a-d pass

        def fallback_snapshots() -> dict[str, bytes] | str:
            by_vertex.update(self._per_vertex(failed))
            return self._fallback_snapshots(cid, by_vertex)

        verdict: Verdict = evaluate(
            cid,
            failed,
            num_units=self._layout.num_units,
            max_failure_ratio=self._ratio,
            must_be_fresh=lambda u: (
                "; ".join(p.reasons)
                if p.must_be_fresh_all
                else self.limits.unit_limit_reason(u)
                if u in p.must_be_fresh
                else None
            ),
            unusable=self._first_unusable,
            fallback_snapshots=fallback_snapshots,
        )
        if verdict.rule is not None:
            return self._abort(p, verdict.rule, verdict.message, now_ms)
        return self._complete(p, now_ms, dict(failed), dict(verdict.snapshots), by_vertex)

    def _first_unusable(self, units: Sequence[int]) -> tuple[int, str] | None:
        """Rule 3 d over `units`, in order: the first whose earlier state cannot be re-used now,
        with why (`_unusable`), or None; one loop with the usual case inlined."""
        if self._global_until_success is not None or self._mismatch:
            for unit_id in units:
                if (why := self._unusable(unit_id)) is not None:
                    return unit_id, why
            return None
        owners, states_of, initial = self._owner, self._unit_states, INITIAL_STATE_ID
        checks = {v: c.check_fallback for v, c in self._coordinators.items()}
        for unit_id in units:
            owner = owners[unit_id]
            if owner == initial:
                continue  # never checkpointed: its initial state is usable
            states = states_of[unit_id]
            if states is None:
                return unit_id, self._unusable(unit_id) or ""
            for s in states:
                check = checks.get(s.vertex_id)
                if check is not None and (why := check(s, owner)):
                    return unit_id, why
        return None

    def _unusable(self, unit_id: int) -> str | None:
        """Rule 3 d: why the unit's earlier state cannot be re-used now, or None."""
        owner = self._owner[unit_id]
        if owner == INITIAL_STATE_ID:
            return None  # never checkpointed: its initial state is usable
        if self._global_until_success is not None:
            return self._global_until_success
        if self._mismatch:
            for vertex_id, _ in self._expected[unit_id]:
                if vertex_id in self._mismatch:
                    return self._mismatch[vertex_id]
        states = self._unit_states[unit_id]
        if states is None:
            return (
                f"checkpoint {owner} holds no state for its subtasks "
                f"{list(self._expected[unit_id])}"
            )
        for s in states:
            coordinator = self._coordinators.get(s.vertex_id)
            if coordinator is not None and (why := coordinator.check_fallback(s, owner)):
                return why
        return None

    def _fallback_snapshots(
        self, cid: int, per_vertex: Mapping[str, Mapping[int, int]]
    ) -> dict[str, bytes] | str:
        """Rule 3 e: every coordinator's snapshot of `cid` with the subtasks in `per_vertex`
        (vertex -> index -> owner: those of the failed units) fallen back."""
        snapshots: dict[str, bytes] = {}
        for vertex_id, coordinator in self._coordinators.items():
            fallback = per_vertex.get(vertex_id)
            if not fallback:
                snapshots[vertex_id] = coordinator.snapshot(cid)
                continue
            try:
                snapshots[vertex_id] = coordinator.snapshot_for_fallback(cid, fallback)
            except Exception as exc:
                return (
                    f"the operator coordinator of {vertex_id!r} cannot produce a fallback "
                    f"snapshot for subtasks {sorted(fallback)}: {type(exc).__name__}: {exc}"
                )
        return snapshots

    def _per_vertex(self, units: Iterable[int]) -> dict[str, dict[int, int]]:
        """For the coordinated vertices: subtask index -> owner, over the subtasks of `units`."""
        out: dict[str, dict[int, int]] = {v: {} for v in self._coordinators}
        if out:
            owners, expected = self._owner, self._expected
            for unit_id in units:
                owner = owners[unit_id]
                for vertex_id, index in expected[unit_id]:
                    if (of_vertex := out.get(vertex_id)) is not None:
                        of_vertex[index] = owner
        return out

    def _complete(
        self,
        p: PendingCheckpoint,
        now_ms: int,
        fallback: dict[int, str],
        snapshots: dict[str, bytes],
        by_vertex: dict[str, dict[int, int]],
    ) -> list[Decision]:
        cid = p.checkpoint_id
        units = self._fresh_unit
        fallback_states: dict[int, tuple[SubtaskState, ...]] = {}
        reasons = p.reasons
        if fallback:
            units = list(units)
            ids = list(fallback)
            fell_back = map(UnitState, ids, map(self._owner.__getitem__, ids), fallback.values())
            for unit_id, unit in zip(ids, fell_back, strict=True):
                units[unit_id] = unit
            fallback_states = dict(zip(ids, map(self.unit_states, ids), strict=True))
            reasons = (
                *reasons,
                f"{name_units(fallback)} fell back ({len(fallback)} of "
                f"{self._layout.num_units} ≤ max-failure-ratio {float(self._ratio):g})",
            )
        every = p.states
        if fallback_states:
            every = list(every)
            for unit_id, states in fallback_states.items():
                every[unit_id] = states
        subtasks = tuple(chain.from_iterable(every))  # type: ignore[arg-type]  # no None left
        kind = CheckpointKind.REGIONAL if fallback else CheckpointKind.GLOBAL
        metadata = CheckpointMetadata(
            checkpoint_id=cid,
            job_id=self._job_id,
            kind=kind,
            trigger_time_ms=p.trigger_ms,
            completion_time_ms=now_ms,
            policy_fingerprint=self._fingerprint,
            graph_fingerprint=self._layout.graph_fingerprint,
            reasons=tuple(reasons),
            vertices=self._layout.vertices,
            units=tuple(units),
            coordinators=snapshots,
            subtasks=subtasks,
            num_retained=self._policy.checkpointing.num_retained,
            forced_global=() if fallback else p.forced,
            consecutive_regional=(
                self.limits.consecutive_regional
                if p.kind is CheckpointKind.SAVEPOINT
                else self.limits.consecutive_regional + 1
                if fallback
                else 0
            ),
        )
        savepoint = None
        if p.kind is CheckpointKind.SAVEPOINT:
            # the user's self-contained copy, and the job's own global checkpoint of it
            savepoint = msgspec.structs.replace(metadata, kind=CheckpointKind.SAVEPOINT)
            metadata = msgspec.structs.replace(
                metadata,
                reasons=(
                    *metadata.reasons,
                    f"savepoint: a self-contained copy is in {savepoint_dir(cid)}",
                ),
            )
        self._pending = None
        committables: dict[str, tuple[bytes, ...]] = (
            _committables(p.states, self._committers.keys())
            if p.files is not False
            else dict.fromkeys(self._committers, ())
        )
        self._completing = _Completion(
            p, metadata, fallback, fallback_states, committables, by_vertex
        )
        return [WriteMetadata(metadata, savepoint)]

    def _fallback_states(self, unit_id: int) -> tuple[SubtaskState, ...]:
        """The unit's latest states with owner references (rule 4: the writer, not a chain)."""
        owner = self._owner[unit_id]
        states = self._unit_states[unit_id]
        if states is None or owner == INITIAL_STATE_ID:
            return tuple(
                SubtaskState(v, i, unit_id, ref_checkpoint_id=INITIAL_STATE_ID)
                for v, i in self._expected[unit_id]
            )
        return tuple(
            s
            if s.ref_checkpoint_id is not None
            else msgspec.structs.replace(s, ref_checkpoint_id=owner)
            for s in states
        )

    def _abort(
        self,
        p: PendingCheckpoint,
        rule: Rule,
        message: str,
        now_ms: int,
        extra_failed: tuple[int, ...] = (),
    ) -> list[Decision]:
        """Abort `p`: every unit restarts from its latest completed state (`unit_states`), so
        the state and staged output of every attempt of `p` is garbage. An abort whose failed
        units are all stuck is left to `max-stuck-time` (`Limits.governed_by_stuck_time`)."""
        cid = p.checkpoint_id
        failed = tuple(sorted({*p.declined, *extra_failed}))
        causes = {u: p.declined[u] for u in failed if u in p.declined}
        self.last_cause.update(causes)
        out: list[Decision] = [AbortCheckpoint(cid, rule, message, failed, causes)]
        out += _discards(p)
        if self._coordinators:
            # every subtask restarts from its unit's owner: the latest completed checkpoint but
            # for the units behind it
            latest = INITIAL_STATE_ID if self._latest_id is None else self._latest_id
            for vertex_id, coordinator in self._coordinators.items():
                behind = self._behind_by_vertex.get(vertex_id, {})
                reset = SubtaskOwners(self._placed[vertex_id], default=latest, others=behind)
                coordinator.notify_aborted(cid, reset)
        self._reopen_sources(range(self._n))
        self._pending = None
        self._completing = None
        self.metrics.aborted_by_rule[rule] += 1
        counted = p.kind is not CheckpointKind.SAVEPOINT and not (
            self.limits.governed_by_stuck_time(failed)
        )
        failure = self.limits.aborted(failed, tier1=p.tier1, counted=counted, name=self.unit_name)
        if failure is not None:
            self._failed = failure
            out.append(FailJob(f"job {self._job_id} failed: {failure}", self.limits.at_fault()))
            return out
        return out + self._stuck_too_long(now_ms)

    def _note_causes(self, fallback: Mapping[int, str]) -> None:
        """Keep why each unit behind fell back; forget units that are fresh again."""
        if self.last_cause:
            behind = self._behind
            self.last_cause = {u: c for u, c in self.last_cause.items() if u in behind}
        self.last_cause.update(fallback)

    def stuck_message(self, unit_id: int, now_ms: int) -> str:
        """Why stuck unit `unit_id` fails the job at `now_ms` (DESIGN §4 rule 5): the unit,
        what it reads, how long, its last cause and the fix."""
        since = self.limits.stuck.get(unit_id, now_ms)
        bound = self.limits.max_stuck_ms
        owner = self._owner[unit_id]
        state = (
            "its initial state (it never completed a checkpoint)"
            if owner == INITIAL_STATE_ID
            else f"checkpoint {owner}'s state"
        )
        limit = "" if bound is None else f" (max-stuck-time = {format_duration(bound / 1000)})"
        cause = (self.last_cause.get(unit_id) or "unknown").splitlines() or ["unknown"]
        return (
            f"{self.unit_name(unit_id)} has been stuck for {_seconds(now_ms - since)}{limit}: "
            f"it fell back in the last {self.limits.streak.get(unit_id, 0)} checkpoints and "
            f"still runs on {state}; last cause: {cause[0]}; fix what makes "
            "it fail (it is retried every epoch while the healthy units keep committing), or "
            'raise checkpointing.region.max-stuck-time ("unlimited" never fails the job)'
        )

    def _stuck_too_long(self, now_ms: int) -> list[Decision]:
        """`FailJob` when a unit has been stuck longer than `max-stuck-time`, else nothing."""
        overdue = self.limits.overdue(now_ms)
        if not overdue or self._failed is not None:
            return []
        reasons = [self.stuck_message(u, now_ms) for u in overdue[:5]]
        more = f"; +{len(overdue) - 5} more stuck units" if len(overdue) > 5 else ""
        self._failed = "; ".join(reasons) + more
        return [FailJob(f"job {self._job_id} failed: {self._failed}", tuple(overdue))]

    # --- helpers ------------------------------------------------------------------------------

    def _malformed(self, unit_id: int, attempt: int, states: tuple[SubtaskState, ...]) -> str:
        """What is wrong with an ack (the hot path in `on_ack` found something)."""
        expected = self._expected[unit_id]
        if len(states) != len(expected):
            return f"malformed ack: {len(states)} subtask states for {len(expected)} subtasks"
        for s, (vertex_id, index) in zip(states, expected, strict=True):
            if (
                s.vertex_id != vertex_id
                or s.index != index
                or s.unit_id != unit_id
                or s.ref_checkpoint_id is not None
                or s.attempt != attempt
            ):
                return (
                    f"malformed ack: subtask state ({s.vertex_id!r}, {s.index}, unit "
                    f"{s.unit_id}, ref {s.ref_checkpoint_id}, attempt {s.attempt}) where "
                    f"({vertex_id!r}, {index}, unit {unit_id}, fresh, attempt {attempt}) "
                    "was expected"
                )
        return "malformed ack"

    def _take_completion(self, checkpoint_id: int) -> _Completion:
        done = self._completing
        if done is None or done.metadata.checkpoint_id != checkpoint_id:
            raise CoordinatorStateError(
                f"checkpoint {checkpoint_id} is not waiting for its metadata to be written"
            )
        self._completing = None
        return done

    def _check_unit(self, unit_id: int) -> None:
        """Refuse a unit id the layout does not have (-1 would alias the last unit)."""
        n = self._layout.num_units
        if not 0 <= unit_id < n:
            raise CoordinatorStateError(
                f"unit {unit_id} is not a unit of job {self._job_id}: its units are 0..{n - 1};"
                " the runtime answered for a unit it was not given"
            )

    def _committer(self, vertex_id: str) -> CommitQueue:
        try:
            return self._committers[vertex_id]
        except KeyError:
            raise CoordinatorStateError(f"{vertex_id!r} has no commit coordinator") from None

    def _pump(self) -> list[Decision]:
        out: list[Decision] = []
        for committer in self._committers.values():
            if (commit := committer.next_commit()) is not None:
                out.append(commit)
        final = self._final_checkpoint
        if (
            final is not None
            and not self._finished
            and all(not c.queued or c.queued[0] > final for c in self._committers.values())
        ):
            self._finished = True
            out.append(FinishJob(final))
        return out

    def _all_bounded_finished(self) -> bool:
        sources = self._layout.sources
        return bool(sources) and sources == self._layout.bounded_sources == self._finished_sources

    def _reopen_sources(self, units: Iterable[int]) -> None:
        """Units restarting from older state read their input again: sources not finished."""
        if self._finished_sources:
            for unit_id in units:
                self._finished_sources -= self._source_units[unit_id]

    def skip_to(self, next_checkpoint_id: int) -> None:
        """Number checkpoints from `next_checkpoint_id` on (a fresh start in a job root whose
        ids up to it are taken, e.g. by damaged checkpoints): ids are never reused."""
        if self._latest_id is not None or self._pending or self._completing:
            raise CoordinatorStateError("skip ids only before the first checkpoint")
        self._next_id = max(self._next_id, next_checkpoint_id)

    def _retain(self, checkpoint_id: int, refs: frozenset[int]) -> list[Decision]:
        """Keep the newest `num-retained`; subsumed(id) for ids no retained one refers to
        (`metadata.retention`, the rule the cleaner and the inspector use too)."""
        return [NotifySubsumed(c) for c in self._retention.add(checkpoint_id, refs)]


def _seconds(ms: int) -> str:
    """A length of time as people read it: `"42 s"`, `"15 min 3 s"`, `"2 h 5 min"`.

    >>> _seconds(4_200), _seconds(5_010), _seconds(903_000), _seconds(7_500_000)
    ('4.2 s', '5.01 s', '15 min 3 s', '2 h 5 min')
    """
    s = ms / 1000
    if s < 59.995:
        return f"{round(s, 2):g} s"
    minutes, sec = divmod(round(s), 60)
    if minutes < 60:
        return f"{minutes} min {sec} s" if sec else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def _discard(
    checkpoint_id: int,
    unit_id: int,
    attempt: int,
    states: Sequence[SubtaskState],
    *,
    committables: bool,
    whole_checkpoint: bool = False,
) -> DiscardAttempt:
    """The files and staged sink files of one discarded unit attempt. A state file may be a
    task's merged file holding other units' segments too (DESIGN §4 rule 16): unless the whole
    checkpoint is discarded (`whole_checkpoint`: an abort, every segment is garbage), only the
    files this attempt's segments fill entirely are listed; the others stay for the cleaner."""
    handles = [h for s in states for h in s.handles if not h.shared]
    if whole_checkpoint or not handles:
        files = tuple(dict.fromkeys(h.path for h in handles))
    else:
        filled: dict[str, int] = {}
        sizes: dict[str, int] = {}
        for h in dict.fromkeys(handles):
            filled[h.path] = filled.get(h.path, 0) + h.length
            sizes[h.path] = h.size
        files = tuple(path for path, n in filled.items() if n == sizes[path])
    staged: dict[str, tuple[bytes, ...]] = {}
    if committables:
        for s in states:
            if s.committables:
                staged[s.vertex_id] = staged.get(s.vertex_id, ()) + tuple(s.committables)
    return DiscardAttempt(checkpoint_id, unit_id, attempt, files, staged)


def _discards(p: PendingCheckpoint) -> list[DiscardAttempt]:
    """`_discard` of every acked unit attempt of aborted `p`, in unit order; when no acked
    state holds files or committables (`p.files`, else a scan in C), all are built in C."""
    acked = list(compress(p.unit_ids, p.states))
    attempts: Iterable[int] = map(p.attempt_of, acked) if p.retries else repeat(1)
    cid = p.checkpoint_id
    if p.files is not False:
        states: list[tuple[SubtaskState, ...]] = list(filter(None, p.states))
        if p.files or _any_files(chain.from_iterable(states)):
            return [
                _discard(
                    cid, unit_id, attempt, unit_states, committables=True, whole_checkpoint=True
                )
                for unit_id, attempt, unit_states in zip(acked, attempts, states, strict=False)
            ]
    # one empty `committables` for all: an allocation per decision costs more than the rest
    return list(map(DiscardAttempt, repeat(cid), acked, attempts, repeat(()), repeat({})))


_committables_of = attrgetter("committables")
_handles_of = attrgetter("handles")
_states_of = attrgetter("states")
_checkpoint_of = attrgetter("checkpoint_id")
_attempt_of = attrgetter("attempt")
_unit_of = attrgetter("unit")


def _any_files(states: Iterable[SubtaskState]) -> bool:
    """Whether any of `states` holds a state file or a committable (two scans in C)."""
    every = states if isinstance(states, list) else list(states)
    return any(map(_handles_of, every)) or any(map(_committables_of, every))


def _committables(
    fresh: Sequence[tuple[SubtaskState, ...] | None], vertex_ids: Iterable[str]
) -> dict[str, tuple[bytes, ...]]:
    """The committables of vertices `vertex_ids` in the `fresh` (acked) states, in unit order."""
    staged: dict[str, list[bytes]] = {v: [] for v in vertex_ids}
    if staged:  # the scan for subtasks with committables runs in C
        for s in filter(_committables_of, chain.from_iterable(filter(None, fresh))):
            if s.vertex_id in staged:
                staged[s.vertex_id] += s.committables
    return {v: tuple(c) for v, c in staged.items()}


def _fresh_committables(metadata: CheckpointMetadata, vertex_id: str) -> tuple[bytes, ...]:
    out: list[bytes] = []
    for s in metadata.subtasks:
        if s.committables and s.vertex_id == vertex_id and s.ref_checkpoint_id is None:
            out += s.committables
    return tuple(out)
