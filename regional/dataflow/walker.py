"""The walker: one function runs the epoch of a set of units over the compiled plan
(DESIGN §6); one unit is a pass of one.

`run_epoch(plan, units, ...)` visits the vertices of the units' shape once, in the plan's order
(`regional.dataflow.plan.Shape`): sources read (`regional.dataflow.unit_epoch.read_source`),
operators restore, run over the epoch's input and snapshot (`regional.dataflow.operators`), sinks
get their rows (`regional.dataflow.unit_epoch.sink_rows`), the dead-letter sinks last. Every
vertex-level feature is written here once, whether the epoch is one unit's or a pass's.

**A pass.** Units of one shape run together. An operator whose state is scoped by split, that
needs no unit's watermark and says it can (`Operator.one_pass`; `PlannedVertex.merges`) runs
once over all their records: a split belongs
to exactly one unit, so the units' restored states are one dict of splits and each unit's
snapshot is the splits it holds. Any other operator (state per key across splits after a keyed
exchange, windows, timers, joins) runs once per unit inside the pass, on that unit's chunks,
state and watermarks. What the
semantics keep per unit stays per unit: each unit reads its own splits from its own positions
with its own record budget, restores and snapshots its own state, and gets back its own rows
(every chunk carries its split), dead letters and counts, exactly as it would alone. Whatever a
pass cannot keep apart it refuses (`PassRefused`: a split in two units, subtask-level list state
of an operator that runs once, rows of a split no unit holds). A failure the pass can pin on one
unit (its source's read, its state's restore or snapshot, a user function raising on a record of
its splits: `regional.dataflow.failures.raised_on`) is a `UnitFailed` naming it: that unit
declines with the error it would have raised alone, and the others run again without it
(`regional.runtime.task.run_units`). Any other failure fails the pass: the units run alone. A
unit alone raises what its source or user function raised.

**Event time**: every chunk carries its origin watermark and every unit its own watermarks; a
`TimedSource` (the keyed exchange's reader) stamps each batch and tells its subtask's watermark
itself; a `WatermarkSink` (the exchange's writer) commits the subtask's watermark with its rows,
which stay inside the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from metadata.model import SubtaskState
from metadata.watermarks import MIN_WATERMARK
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.failures import as_exception, split_of_failure
from regional.dataflow.keys import exchange_chunks
from regional.dataflow.operators import Chunk
from regional.dataflow.plan import Plan, PlannedVertex, Role, Shape, compile_plan
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.state_provider import StateBytes, StateProvider, restored_state
from regional.dataflow.unit_epoch import UnitEpoch, read_source, sink_rows, start_of
from regional.sources.base import num_records

if TYPE_CHECKING:
    from regional.dataflow.pipeline import Pipeline

__all__ = [
    "PassRefused",
    "TaskUnit",
    "UnitFailed",
    "run_epoch",
    "run_task_epoch",
    "run_unit_epoch",
]

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class TaskUnit:
    """One unit of an epoch: its subtasks as restored (one per vertex), the splits the
    enumerator assigned it now (vertex, index, split), the source vertices whose input ended,
    and `state_of`, which restores its operator subtasks' states
    (`regional.dataflow.state_provider`: a provider, or a function giving a state's bytes)."""

    restore: Mapping[str, SubtaskState]
    new_splits: Sequence[tuple[str, int, str]]
    ended: Collection[str]
    state_of: StateProvider | StateBytes


class PassRefused(Exception):
    """A pass cannot keep its units apart (the message says why): run them one by one."""


class UnitFailed(Exception):
    """Unit `unit` (its index in the pass) raised `error`, as it would have alone."""

    def __init__(self, unit: int, error: Exception) -> None:
        super().__init__(f"unit {unit} of the pass: {error!r}")
        self.unit = unit
        self.error = error


def run_epoch(
    plan: Plan,
    units: Sequence[TaskUnit],
    *,
    checkpoint_id: int,
    now_ms: int = 0,
    idle_timeout_ms: int | None = None,
    exclude_after: int | None = None,
    after_sources: Callable[[], None] | None = None,
    as_pass: bool = False,
) -> list[UnitEpoch]:
    """The epoch of every unit of `units` (all of one shape), per unit what it gives alone:
    one unit alone, or with `as_pass` any number in one pass.

    `now_ms` is the processing time, `idle_timeout_ms` the default idle timeout of event-time
    splits, `exclude_after` the exchange writers' exclusion (`regional.runtime.task.TaskEnv`);
    `after_sources` is called once the sources have read (injected faults, a unit alone).
    A pass: `PassRefused` when the shape cannot share a pass or the pass cannot keep its units
    apart, `UnitFailed` for a failure of one unit's own (the others did not fail yet, but the
    pass's state is spoiled: run them again without it)."""
    if not units:  # every unit failed in earlier passes
        return []
    shape = plan.shape(units[0].restore)
    if as_pass:
        if after_sources is not None:
            raise PassRefused("units with injected faults run alone")
    elif len(units) != 1:
        raise ValueError(f"{len(units)} units alone: give one, or run them as_pass=True")
    return _Walk(plan, shape, units, checkpoint_id, now_ms, as_pass).run(
        idle_timeout_ms, exclude_after, after_sources
    )


class _Walk:
    """One epoch's walk: what it carries from vertex to vertex."""

    def __init__(
        self,
        plan: Plan,
        shape: Shape,
        units: Sequence[TaskUnit],
        checkpoint_id: int,
        now_ms: int,
        as_pass: bool,
    ) -> None:
        self.plan = plan
        self.shape = shape
        self.units = units
        self.single = not as_pass
        self.results = [UnitEpoch() for _ in units]
        # event time (`regional.dataflow.epoch_time`): the origin watermark of every chunk, and
        # each unit's watermarks by scope; None when the pipeline has no event time
        self.now_ms = now_ms
        self.times = [EpochTime(now_ms) for _ in units] if plan.timed else None
        self.owner: dict[str, int] = {}  # split -> the unit holding it (a pass)
        self.start_positions: dict[str, str] = {}  # split -> where this epoch started it
        self.source_positions: dict[tuple[str, str], str] = {}  # the same by (vertex, split)
        self.dead = (
            DeadLetters(checkpoint_id, self.start_positions, self.source_positions)
            if shape.dead_letters
            else None
        )
        self.outputs: dict[str, list[Chunk]] = {}
        self.origins: dict[str, list[int]] = {}
        self.live: list[set[str]] = [set() for _ in units]  # splits the units' sources hold
        # per unit and source vertex: its subtask watermark before / after the epoch
        self.unit_start: list[list[int]] = [[] for _ in units]
        self.unit_end: list[list[int]] = [[] for _ in units]

    def run(
        self,
        idle_timeout_ms: int | None,
        exclude_after: int | None,
        after_sources: Callable[[], None] | None,
    ) -> list[UnitEpoch]:
        # how many vertices still read each vertex's output: dropped after the last (a pass
        # holds every unit's records at once; what no one reads again need not stay alive)
        readers = dict(self.shape.readers)
        sources_done = False
        for v in self.shape.order:
            for input_id in v.inputs:
                readers[input_id] -= 1
            if v.role is Role.SOURCE:
                self.read(v, idle_timeout_ms, exclude_after)
                continue
            if not sources_done:
                sources_done = True
                if after_sources is not None:  # like user code failing on data
                    after_sources()
            if v.role is Role.OPERATOR:
                self.operate(v)
            elif v.role is Role.DEAD_LETTERS:
                self.set_aside(v)
            else:
                self.sink(v)
            for input_id in v.inputs:
                if readers[input_id] == 0:
                    self.outputs.pop(input_id, None)
        if not sources_done and after_sources is not None:  # a unit made of sources only
            after_sources()
        if self.times is not None:
            for result, time_ in zip(self.results, self.times, strict=True):
                result.late = time_.late
                result.watermark = time_.end.get(KEY_SCOPE)
        return self.results

    def merged_time(self) -> EpochTime | None:
        """What an operator that runs once over a pass's records knows of time: every unit's
        watermarks by split (a split is one unit's), none by key scope (such an operator keeps
        no state per key across splits, `PlannedVertex.merges`)."""
        if self.times is None:
            return None
        if self.single:
            return self.times[0]
        merged = EpochTime(self.now_ms)
        for time_ in self.times:
            merged.start.update(time_.start)
            merged.end.update(time_.end)
        merged.start.pop(KEY_SCOPE, None)
        merged.end.pop(KEY_SCOPE, None)
        return merged

    def _own(self, split: str, unit: int) -> None:
        if self.owner.setdefault(split, unit) != unit:
            raise PassRefused(f"split {split!r} is in two units")

    def _holder(self, split: str, what: str) -> int:
        """The unit holding `split` (a pass: `PassRefused` when none does)."""
        if self.single:
            return 0
        holder = self.owner.get(split)
        if holder is None:
            raise PassRefused(f"{what} of split {split!r}, which no unit holds")
        return holder

    def read(
        self, v: PlannedVertex, idle_timeout_ms: int | None, exclude_after: int | None
    ) -> None:
        chunks: list[Chunk] = []
        origins: list[int] = []
        for u, unit in enumerate(self.units):
            time_ = None if self.times is None else self.times[u]
            old = unit.restore[v.id]
            positions = start_of(v, old, unit.new_splits)
            if not self.single:
                for split in positions:
                    self._own(split, u)
            with self._failing(u):
                read = read_source(
                    v,
                    old.index,
                    positions,
                    budget=self.plan.read_budget(v),
                    time=time_,
                    dead=self.dead,
                    start_positions=self.start_positions,
                    source_positions=self.source_positions,
                    ended=v.id in unit.ended,
                    idle_timeout_ms=idle_timeout_ms,
                    exclude_after=exclude_after,
                )
            result = self.results[u]
            result.split_states[v.id] = read.split_states
            result.records_in += read.records_in
            if v.timed is not None:  # a keyed exchange's reader: records already counted in
                result.records_exchanged += read.records_in
            elif read.behind:
                result.behind.setdefault(v.id, {}).update(read.behind)
                if read.unread_since:
                    result.unread_since.setdefault(v.id, {}).update(read.unread_since)
            self.live[u].update(s.split_id for s in read.split_states)
            chunks += read.chunks
            if time_ is not None and read.watermarks is not None and read.origins is not None:
                origins += read.origins
                self.unit_start[u].append(read.watermarks[0])
                self.unit_end[u].append(read.watermarks[1])
                time_.start[KEY_SCOPE] = min(self.unit_start[u])
                time_.end[KEY_SCOPE] = min(self.unit_end[u])
        self.outputs[v.id] = chunks
        if self.times is not None:
            self.origins[v.id] = origins

    def operate(self, v: PlannedVertex) -> None:
        if not self.single and not v.merges:
            self.operate_per_unit(v)
            return
        operator = v.operator
        assert operator is not None
        time_ = self.merged_time()
        state = self.restored(v) if operator.stateful else None
        inputs = [
            (self.outputs.get(i, []), None if time_ is None else self.origins.get(i, []))
            for i in v.inputs
        ]
        late = time_.late if time_ is not None and self.single else 0
        out, out_origins = self._judged(operator.run_inputs, inputs, state, self.dead, time_)
        for chunks, _ in inputs:
            self._count(v.id, 0, chunks)
        self._count(v.id, 1, out)
        if time_ is not None and self.single and time_.late > late:
            self._counts(v.id, 0)[2] += time_.late - late
        self.outputs[v.id] = out
        if out_origins is not None:
            self.origins[v.id] = out_origins
        if state is not None:
            self.snapshot(v, state)

    def operate_per_unit(self, v: PlannedVertex) -> None:
        """In a pass, an operator that cannot run once over several units' records (state per
        key across splits, or it does not say it can): once per unit, on that unit's chunks
        (in their order) and its own state, as the unit alone would run it."""
        operator = v.operator
        assert operator is not None
        timed = self.times is not None
        mine: list[list[list[Chunk]]] = [[[] for _ in v.inputs] for _ in self.units]
        mine_origins: list[list[list[int]]] = [[[] for _ in v.inputs] for _ in self.units]
        for k, input_id in enumerate(v.inputs):
            origins = self.origins.get(input_id, []) if timed else []
            for n, chunk in enumerate(self.outputs.get(input_id, [])):
                holder = self._holder(chunk[0], "rows")
                mine[holder][k].append(chunk)
                if timed:
                    mine_origins[holder][k].append(origins[n])
        out: list[Chunk] = []
        out_origins: list[int] = []
        codec = self.plan.state_codec
        for u, unit in enumerate(self.units):
            result = self.results[u]
            state = None
            if operator.stateful:
                started = time.perf_counter()
                with self._failing(u):
                    state = restored_state(unit.state_of, operator, unit.restore[v.id], codec)
                result.restore_s += time.perf_counter() - started
            time_ = None if self.times is None else self.times[u]
            inputs = [
                (chunks, None if time_ is None else mine_origins[u][k])
                for k, chunks in enumerate(mine[u])
            ]
            late = time_.late if time_ is not None else 0
            produced, produced_origins = self._judged(
                operator.run_inputs, inputs, state, self.dead, time_
            )
            counts = self._counts(v.id, u)
            counts[0] += sum(num_records(b) for chunks in mine[u] for _, b in chunks)
            counts[1] += sum(num_records(b) for _, b in produced)
            if time_ is not None:
                counts[2] += time_.late - late
            out += produced
            if produced_origins is not None:
                out_origins += produced_origins
            if state is not None:
                started = time.perf_counter()
                with self._failing(u):
                    blob = operator.snapshot(state, self.live[u])
                result.encode_s += time.perf_counter() - started
                if blob is not None:
                    result.snapshots[v.id] = blob
                    result.states[v.id] = state
        self.outputs[v.id] = out
        if timed:
            self.origins[v.id] = out_origins

    def _counts(self, vertex_id: str, unit: int) -> list[int]:
        """Unit `unit`'s [in, out, late] counts of operator `vertex_id`."""
        return self.results[unit].operators.setdefault(vertex_id, [0, 0, 0])

    def _count(self, vertex_id: str, which: int, chunks: list[Chunk]) -> None:
        """Add `chunks`' records to count `which` (0: in, 1: out) of operator `vertex_id`, per
        unit holding each chunk's split (a pass; a split no unit holds is left out)."""
        if self.single:
            self._counts(vertex_id, 0)[which] += sum(num_records(b) for _, b in chunks)
            return
        for split, b in chunks:
            holder = self.owner.get(split)
            if holder is not None:
                self._counts(vertex_id, holder)[which] += num_records(b)

    def restored(self, v: PlannedVertex) -> OperatorState | None:
        """The operator's restored state: a unit's own, or in a pass every unit's, their
        splits side by side."""
        operator = v.operator
        assert operator is not None
        codec = self.plan.state_codec
        if self.single:
            unit = self.units[0]
            started = time.perf_counter()
            state = restored_state(unit.state_of, operator, unit.restore[v.id], codec)
            self.results[0].restore_s += time.perf_counter() - started
            return state
        keyed: dict[str, Any] = {}
        ttl_seen = False
        for u, unit in enumerate(self.units):
            started = time.perf_counter()
            with self._failing(u):
                mine = restored_state(unit.state_of, operator, unit.restore[v.id], codec)
            self.results[u].restore_s += time.perf_counter() - started
            assert mine is not None
            if mine.lists:
                raise PassRefused("subtask-level list state")
            for split in mine.keyed:
                self._own(split, u)
            keyed.update(mine.keyed)
            ttl_seen = ttl_seen or mine.ttl_seen
        return OperatorState(keyed, {}, operator=operator.name, codec=codec, ttl_seen=ttl_seen)

    def snapshot(self, v: PlannedVertex, state: OperatorState) -> None:
        """Each unit's snapshot of the operator's state: in a pass, the splits it holds."""
        operator = v.operator
        assert operator is not None
        if self.single:
            started = time.perf_counter()
            blob = operator.snapshot(state, self.live[0])
            self.results[0].encode_s += time.perf_counter() - started
            if blob is not None:
                self.results[0].snapshots[v.id] = blob
                self.results[0].states[v.id] = state
            return
        if state.lists:
            raise PassRefused("subtask-level list state")
        parts: list[dict[str, Any]] = [{} for _ in self.units]
        for split, slots in state.keyed.items():
            parts[self._holder(split, "state")][split] = slots
        for u, result in enumerate(self.results):
            started = time.perf_counter()
            mine = OperatorState(
                parts[u],
                {},
                operator=operator.name,
                codec=self.plan.state_codec,
                ttl_seen=state.ttl_seen,
            )
            with self._failing(u):
                blob = operator.snapshot(mine, self.live[u])
            result.encode_s += time.perf_counter() - started
            if blob is not None:
                result.snapshots[v.id] = blob
                result.states[v.id] = mine

    def set_aside(self, v: PlannedVertex) -> None:
        """The dead letters of this part of the graph, each unit's own."""
        dead = self.dead
        assert dead is not None
        if self.single:
            batch = dead.batch(self.shape.fed[v.id])
            self.results[0].sink_batches[v.id] = [batch]
            self.results[0].dead_lettered += batch.num_rows
            types = self.results[0].dead_letter_types
            for error_type in batch.column("error_type").to_pylist():
                types[error_type] = types.get(error_type, 0) + 1
            return
        letters: list[list[dict[str, Any]]] = [[] for _ in self.units]
        for row in dead.rows(self.shape.fed[v.id]):
            letters[self._holder(row["split_id"], "a dead letter")].append(row)
        for result, mine in zip(self.results, letters, strict=True):
            result.sink_batches[v.id] = [dead.batch_of(mine)]
            result.dead_lettered += len(mine)
            for row in mine:
                error_type = row["error_type"]
                result.dead_letter_types[error_type] = (
                    result.dead_letter_types.get(error_type, 0) + 1
                )

    def sink(self, v: PlannedVertex) -> None:
        """A sink subtask's rows per unit (lists of records as the operators left them, or
        with dead letters converted here); an exchange writer takes only the records it can
        place (a usable key) and commits the subtask's watermark with them."""
        mine_of: list[list[tuple[str, Chunk]]] = [[] for _ in self.units]
        for input_id in v.inputs:
            chunks = self.outputs.get(input_id, [])
            if v.key is not None:
                chunks = self._judged(exchange_chunks, chunks, v.key, v.id, self.dead)
            if self.single:
                mine_of[0] += [(input_id, c) for c in chunks]
                continue
            for chunk in chunks:
                mine_of[self._holder(chunk[0], "rows")].append((input_id, chunk))
        counted = v.marks is None  # records leaving the job
        for u, (result, chunks_of_u) in enumerate(zip(self.results, mine_of, strict=True)):
            with self._failing(u):
                batches = sink_rows(v.id, chunks_of_u, self.dead)
            result.sink_batches[v.id] = batches
            if counted:
                result.records_out += sum(num_records(b) for b in batches)
        if self.times is not None and v.marks is not None:
            for unit, result, time_ in zip(self.units, self.results, self.times, strict=True):
                held = v.marks.committed_watermark(unit.restore[v.id].committables)
                before = MIN_WATERMARK if held is None else held
                result.sink_watermarks[v.id] = (
                    before,
                    max(before, time_.end.get(KEY_SCOPE, before)),
                )

    def _judged(self, fn: Callable[..., _T], *args: Any) -> _T:
        """`fn(*args)` (an operator's run, an exchange writer's key check: user functions on
        the epoch's records). In a pass, what it raises on a record of one unit's splits
        (`raised_on`) is that unit's `UnitFailed`, even a ``SystemExit`` or
        ``KeyboardInterrupt`` a user function raised (`as_exception`); anything else
        propagates: an interrupt outside user functions, the unit timeout's alarm."""
        if self.single:
            return fn(*args)
        try:
            return fn(*args)
        except BaseException as exc:
            failed = split_of_failure(exc)
            error = as_exception(exc)
            if failed is not None and failed in self.owner and error is not None:
                raise UnitFailed(self.owner[failed], error) from exc
            raise

    def _failing(self, unit: int) -> contextlib.AbstractContextManager[None]:
        """In a pass, whatever fails inside is unit `unit`'s own failure (`UnitFailed`)."""
        return _NOTHING if self.single else _Failing(unit)


class _Failing:
    """What fails inside is unit `unit`'s own failure (`UnitFailed`), but a `PassRefused`
    (a class, not a generator: entered per unit and vertex on the hot path)."""

    __slots__ = ("unit",)

    def __init__(self, unit: int) -> None:
        self.unit = unit

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any
    ) -> None:
        if exc is None or isinstance(exc, PassRefused) or not isinstance(exc, Exception):
            return
        raise UnitFailed(self.unit, exc) from exc


_NOTHING = contextlib.nullcontext()


def run_task_epoch(
    pipeline: Pipeline,
    units: Sequence[TaskUnit],
    *,
    checkpoint_id: int,
    now_ms: int = 0,
    idle_timeout_ms: int | None = None,
    exclude_after: int | None = None,
) -> list[UnitEpoch] | None:
    """The epoch of every unit of `units` (all of one shape) in one pass, or None when the
    pass cannot keep them apart (`run_epoch`'s `PassRefused`)."""
    try:
        return run_epoch(
            compile_plan(pipeline),
            units,
            checkpoint_id=checkpoint_id,
            now_ms=now_ms,
            idle_timeout_ms=idle_timeout_ms,
            exclude_after=exclude_after,
            as_pass=True,
        )
    except PassRefused:
        return None


def run_unit_epoch(
    pipeline: Pipeline,
    restore: Mapping[str, SubtaskState],
    *,
    checkpoint_id: int,
    new_splits: Iterable[tuple[str, int, str]],
    ended: Collection[str],
    state_of: StateProvider | StateBytes,
    now_ms: int,
    idle_timeout_ms: int | None = None,
    exclude_after: int | None = None,
    after_sources: Callable[[], None] | None = None,
) -> UnitEpoch:
    """The epoch of one unit (a pass of one, `run_epoch`). Raises what a source or user
    function raised (the unit declines) unless dead letters take it."""
    unit = TaskUnit(restore, tuple(new_splits), ended, state_of)
    return run_epoch(
        compile_plan(pipeline),
        [unit],
        checkpoint_id=checkpoint_id,
        now_ms=now_ms,
        idle_timeout_ms=idle_timeout_ms,
        exclude_after=exclude_after,
        after_sources=after_sources,
    )[0]
