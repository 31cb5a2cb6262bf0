"""A task's units' epoch in one pass (DESIGN §6): each operator runs once over the records of
all the units a Spark task holds, instead of once per unit.

Units of one shape (the same vertices: one region's stage, repeated per split group) whose state
cannot mix run together: the pipeline has no event time, their sources read splits of their own
(no exchange reader, whose split is per subtask but whose state is per key), and every operator
says it can (`Operator.one_pass`: map, filter, flat_map, map_batches, process, apply_in_arrow
and lookup_join). Their keyed state is scoped by split, and a split belongs to exactly one unit,
so the units' restored states are one dict of splits, and each unit's snapshot is the splits it
holds. The per-unit boundaries stay where the semantics need them: each unit reads its own
splits from its own positions with its own record budget, restores and snapshots its own state,
and gets back its own rows (every chunk carries its split), dead letters and counts, exactly as
`regional.dataflow.unit_epoch.run_unit_epoch` would give them.

Whatever the pass cannot keep apart it refuses (None): a split in two units, subtask-level
list state (`ctx.list_state`), state of a split no unit holds. A failure the pass can pin on
one unit (its source's read, its state's restore or snapshot, a user function raising on a
record of its splits: `regional.dataflow.failures.raised_on`) is a `UnitFailed` naming it: that
unit declines with the error it would have raised alone, and the others run again without it
(`regional.runtime.task.run_units`). Any other failure fails the pass: the units run alone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from metadata.model import SubtaskState
from regional.dataflow.failures import as_exception, split_of_failure
from regional.dataflow.keys import exchange_chunks
from regional.dataflow.operators import Chunk
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.dataflow.state_provider import StateBytes, StateProvider, restored_state
from regional.dataflow.unit_epoch import (
    UnitEpoch,
    dead_letters_of,
    read_source,
    sink_rows,
    start_of,
    timed_source,
    vertex_order,
    watermark_sink,
)
from regional.sources.base import num_records

__all__ = ["TaskUnit", "UnitFailed", "run_task_epoch", "shares_pass"]

_T = TypeVar("_T")


@dataclasses.dataclass(frozen=True)
class TaskUnit:
    """One unit of a task's pass: its subtasks as restored (one per vertex), the splits the
    enumerator assigned it now (vertex, index, split), the source vertices whose input ended,
    and `state_of` (its operator subtasks' restored states: `regional.dataflow.state_provider`)."""

    restore: Mapping[str, SubtaskState]
    new_splits: Sequence[tuple[str, int, str]]
    ended: Collection[str]
    state_of: StateProvider | StateBytes


def shares_pass(pipeline: Pipeline, vertices: Collection[str]) -> bool:
    """Whether units made of `vertices` can run their epoch in one pass: no event time, no
    source reading a split per subtask (the keyed exchange's reader), and only operators
    whose state is scoped by split and that say so (`Operator.one_pass`)."""
    if pipeline.timed:
        return False
    for vertex_id in vertices:
        spec = pipeline.vertices[vertex_id]
        if spec.source is not None and timed_source(spec.source) is not None:
            return False
        op = spec.operator
        if op is not None and not (op.one_pass and op.scope == "split"):
            return False
    return True


class _Mixed(Exception):
    """The pass cannot keep the units apart: run them one by one."""


class UnitFailed(Exception):
    """Unit `unit` (its index in the pass) raised `error`, as it would have alone."""

    def __init__(self, unit: int, error: Exception) -> None:
        super().__init__(f"unit {unit} of the pass: {error!r}")
        self.unit = unit
        self.error = error


def run_task_epoch(
    pipeline: Pipeline,
    units: Sequence[TaskUnit],
    *,
    checkpoint_id: int,
) -> list[UnitEpoch] | None:
    """The epoch of every unit of `units` (all of one shape, `shares_pass`), in one pass:
    per unit what `run_unit_epoch` gives, or None when the pass cannot keep them apart.
    Raises `UnitFailed` for a failure of one unit's own (the others did not fail yet, but the
    pass's state is spoiled: run them again without it), or what a source or user function
    raised that no unit can be named for."""
    if not units:  # every unit failed in earlier passes
        return []
    try:
        return _run(pipeline, units, checkpoint_id)
    except _Mixed:
        return None


def _run(pipeline: Pipeline, units: Sequence[TaskUnit], checkpoint_id: int) -> list[UnitEpoch]:
    results = [UnitEpoch() for _ in units]
    owner: dict[str, int] = {}  # split -> the unit holding it

    def own(split: str, unit: int) -> None:
        if owner.setdefault(split, unit) != unit:
            raise _Mixed(f"split {split!r} is in two units")

    order = vertex_order(pipeline, units[0].restore)
    start_positions: dict[str, str] = {}
    source_positions: dict[tuple[str, str], str] = {}
    dead = dead_letters_of(pipeline, order, checkpoint_id, start_positions, source_positions)
    sources = tuple(v for v in order if pipeline.vertices[v].source is not None)
    keyed = tuple(v for v in order if pipeline.vertices[v].key is not None)
    live: list[set[str]] = [set() for _ in units]
    outputs: dict[str, list[Chunk]] = {}
    # how many vertices still read each vertex's output: dropped after the last (a pass holds
    # every unit's records at once; what no one reads again need not stay alive)
    readers = {v: sum(v in pipeline.vertices[w].inputs for w in order) for v in order}
    for vertex_id in order:
        spec = pipeline.vertices[vertex_id]
        for input_id in spec.inputs:
            readers[input_id] -= 1
        if spec.source is not None:
            chunks: list[Chunk] = []
            for u, unit in enumerate(units):
                old = unit.restore[vertex_id]
                positions = start_of(spec, old, unit.new_splits)
                for split in positions:
                    own(split, u)
                with _failing(u):
                    read = read_source(
                        spec,
                        old.index,
                        positions,
                        budget=pipeline.records_per_epoch,
                        time=None,
                        dead=dead,
                        start_positions=start_positions,
                        source_positions=source_positions,
                        ended=vertex_id in unit.ended,
                        idle_timeout_ms=None,
                        exclude_after=None,
                    )
                results[u].split_states[vertex_id] = read.split_states
                results[u].records_in += read.records_in
                live[u].update(s.split_id for s in read.split_states)
                chunks += read.chunks
            outputs[vertex_id] = chunks
            continue
        if spec.operator is not None:
            operator = spec.operator
            state: OperatorState | None = None
            if operator.stateful:
                state = _restored(pipeline, vertex_id, units, results, own)
            outputs[vertex_id], _ = _judged(
                operator.run_inputs,
                owner,
                [(outputs.get(i, []), None) for i in spec.inputs],
                state,
                dead,
                None,
            )
            if state is not None:
                _snapshot(pipeline, vertex_id, state, owner, live, results)
            _drop_read(outputs, spec.inputs, readers)
            continue
        # a sink, or the dead letters of this part of the graph
        if spec.dead_letter:
            assert dead is not None
            letters: list[list[dict[str, Any]]] = [[] for _ in units]
            for row in dead.rows((*spec.inputs, *sources, *keyed)):
                holder = owner.get(row["split_id"])
                if holder is None:
                    raise _Mixed("a dead letter names a split no unit holds")
                letters[holder].append(row)
            for result, mine in zip(results, letters, strict=True):
                result.sink_batches[vertex_id] = [dead.batch_of(mine)]
                result.dead_lettered += len(mine)
            _drop_read(outputs, spec.inputs, readers)
            continue
        mine_of: list[list[tuple[str, Chunk]]] = [[] for _ in units]
        for input_id in spec.inputs:
            chunks = outputs.get(input_id, [])
            if spec.key is not None:  # an exchange writer: records it can place
                chunks = _judged(exchange_chunks, owner, chunks, spec.key, vertex_id, dead)
            for chunk in chunks:
                holder = owner.get(chunk[0])
                if holder is None:
                    raise _Mixed(f"rows of split {chunk[0]!r}, which no unit holds")
                mine_of[holder].append((input_id, chunk))
        counted = watermark_sink(spec.sink) is None  # records leaving the job
        for u, (result, chunks_of_u) in enumerate(zip(results, mine_of, strict=True)):
            with _failing(u):
                batches = sink_rows(vertex_id, chunks_of_u, dead)
            result.sink_batches[vertex_id] = batches
            if counted:
                result.records_out += sum(num_records(b) for b in batches)
        _drop_read(outputs, spec.inputs, readers)
    return results


def _judged(fn: Callable[..., _T], owner: Mapping[str, int], *args: Any) -> _T:
    """`fn(*args)` (an operator's run, an exchange writer's key check: user functions on the
    pass's records); what it raises on a record of one unit's splits (`raised_on`) is that
    unit's `UnitFailed`, even a ``SystemExit`` or ``KeyboardInterrupt`` a user function raised
    (`as_exception`). Anything else propagates: an interrupt outside user functions, the
    unit timeout's alarm."""
    try:
        return fn(*args)
    except BaseException as exc:
        failed = split_of_failure(exc)
        error = as_exception(exc)
        if failed is not None and failed in owner and error is not None:
            raise UnitFailed(owner[failed], error) from exc
        raise


def _drop_read(
    outputs: dict[str, list[Chunk]], inputs: Sequence[str], readers: Mapping[str, int]
) -> None:
    """Forget the outputs of `inputs` that no vertex still to run reads."""
    for input_id in inputs:
        if readers[input_id] == 0:
            outputs.pop(input_id, None)


def _restored(
    pipeline: Pipeline,
    vertex_id: str,
    units: Sequence[TaskUnit],
    results: Sequence[UnitEpoch],
    own: Callable[[str, int], None],
) -> OperatorState:
    """The operator subtask states of every unit as one state: their splits side by side."""
    operator = pipeline.vertices[vertex_id].operator
    assert operator is not None
    keyed: dict[str, Any] = {}
    ttl_seen = False
    for u, unit in enumerate(units):
        started = time.perf_counter()
        with _failing(u):
            state = restored_state(
                unit.state_of, operator, unit.restore[vertex_id], pipeline.state_codec
            )
        results[u].restore_s += time.perf_counter() - started
        assert state is not None
        if state.lists:
            raise _Mixed("subtask-level list state")
        for split in state.keyed:
            own(split, u)
        keyed.update(state.keyed)
        ttl_seen = ttl_seen or state.ttl_seen
    return OperatorState(
        keyed, {}, operator=operator.name, codec=pipeline.state_codec, ttl_seen=ttl_seen
    )


def _snapshot(
    pipeline: Pipeline,
    vertex_id: str,
    state: OperatorState,
    owner: Mapping[str, int],
    live: Sequence[Collection[str]],
    results: Sequence[UnitEpoch],
) -> None:
    """Each unit's snapshot of the pass's `state`: the splits it holds."""
    operator = pipeline.vertices[vertex_id].operator
    assert operator is not None
    if state.lists:
        raise _Mixed("subtask-level list state")
    parts: list[dict[str, Any]] = [{} for _ in results]
    for split, slots in state.keyed.items():
        holder = owner.get(split)
        if holder is None:
            raise _Mixed(f"state of split {split!r}, which no unit holds")
        parts[holder][split] = slots
    for u, result in enumerate(results):
        started = time.perf_counter()
        mine = OperatorState(
            parts[u],
            {},
            operator=operator.name,
            codec=pipeline.state_codec,
            ttl_seen=state.ttl_seen,
        )
        with _failing(u):
            blob = operator.snapshot(mine, live[u])
        result.encode_s += time.perf_counter() - started
        if blob is not None:
            result.snapshots[vertex_id] = blob
            result.states[vertex_id] = mine


@contextlib.contextmanager
def _failing(unit: int) -> Iterator[None]:
    """Whatever fails inside is unit `unit`'s own failure (`UnitFailed`)."""
    try:
        yield
    except _Mixed:
        raise
    except Exception as exc:
        raise UnitFailed(unit, exc) from exc
