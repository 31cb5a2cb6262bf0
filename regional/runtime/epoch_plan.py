"""Planning an epoch on the driver: which splits each unit reads, and which bounded sources
have finished. Split discovery may fail (a source's storage is unreachable): the epoch then
goes on with the splits already known, and a finished source is recognised a later epoch."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

from regional.coordinator import CheckpointCoordinator, JobLayout, TriggerCheckpoint
from regional.coordinator.messages import UnitWork
from regional.coordinator.split_enumerator import SplitEnumerator
from regional.dataflow.pipeline import Pipeline
from regional.sources.base import endless_splits

__all__ = [
    "discover_splits",
    "drained_exchanges",
    "finished_sources",
    "open_split_caps",
    "plan_works",
    "unit_reads",
]

log = logging.getLogger(__name__)


def discover_splits(pipeline: Pipeline, vertex_id: str) -> list[str] | None:
    """The splits source `vertex_id` knows now; None (logged) when it cannot list them."""
    source = pipeline.vertices[vertex_id].source
    assert source is not None
    try:
        return list(source.discover())
    except Exception as exc:
        log.warning("source %r: split discovery failed: %s: %s", vertex_id, type(exc).__name__, exc)
        return None


def plan_works(
    trigger: TriggerCheckpoint,
    pipeline: Pipeline,
    layout: JobLayout,
    enumerators: Mapping[str, SplitEnumerator],
    coordinator: CheckpointCoordinator,
) -> list[UnitWork]:
    """One `UnitWork` per unit: the states it restores (the coordinator's) and the splits
    newly assigned to its source subtasks (up to `splits_per_subtask` open splits each)."""
    for vertex_id, enumerator in enumerators.items():
        if (splits := discover_splits(pipeline, vertex_id)) is not None:
            enumerator.discover(splits)
    works = []
    per = pipeline.splits_per_subtask
    cid, attempt = trigger.checkpoint_id, trigger.attempt
    unit_states = coordinator.unit_states  # built once per change of a unit's state
    ended = tuple(sorted(coordinator.finished_sources)) if pipeline.timed else ()
    caps = open_split_caps(pipeline, enumerators)
    for unit_id in range(layout.num_units):
        restore = unit_states(unit_id)
        new: list[tuple[str, int, str]] = []
        for state in restore:
            cap = caps.get(state.vertex_id, per)
            if (open_slots := cap - len(state.split_states)) <= 0:
                continue  # the common case at scale: the subtask's splits are all open
            assigner = enumerators.get(state.vertex_id)
            if assigner is None:
                continue
            for _ in range(open_slots):
                split = assigner.assign(state.index)
                if split is None:
                    break
                new.append((state.vertex_id, state.index, split))
        works.append(UnitWork(cid, attempt, unit_id, restore, tuple(new), ended))
    return works


def open_split_caps(
    pipeline: Pipeline, enumerators: Mapping[str, SplitEnumerator]
) -> dict[str, int]:
    """Per source: how many open splits a subtask may hold. `splits_per_subtask`, except for
    a source whose splits never finish while it runs (`endless_splits`: a Kafka topic's
    partitions, a log's partitions, an unbounded generator): there a subtask holding its
    share never frees a slot, so every subtask may hold ceil(known splits / parallelism) and
    every split discovered is read (8 Kafka partitions on 4 subtasks: 2 each, never 4 left
    unread). Files of an unbounded file source do finish: they wait for a free slot.

    >>> from regional.sources.generator import GeneratorSource
    >>> p = Pipeline("j")
    >>> _ = p.source(GeneratorSource(8, lambda s, n: n), parallelism=4, name="src")
    >>> open_split_caps(p, {"src": SplitEnumerator("src", [f"g{k}" for k in range(8)])})
    {'src': 2}
    """
    caps: dict[str, int] = {}
    per = pipeline.splits_per_subtask
    for vertex_id, enumerator in enumerators.items():
        spec = pipeline.vertices[vertex_id]
        if spec.source is None or not endless_splits(spec.source):
            continue
        caps[vertex_id] = max(per, -(-enumerator.num_known // spec.parallelism))
    return caps


def unit_reads(
    unit_id: int,
    layout: JobLayout,
    enumerators: Mapping[str, SplitEnumerator],
    coordinator: CheckpointCoordinator,
    assigned: Mapping[int, tuple[str, ...]] | None = None,
) -> tuple[str, ...]:
    """The splits unit `unit_id` reads, for its name (`metadata.unit_names.unit_name`): the
    open splits in the state it restarts from, else the splits it was last given
    (`assigned`: unit -> the new splits of its latest `UnitWork`; a unit that never
    checkpointed gets its splits anew every epoch) or the enumerators assign to it, sorted."""
    states = coordinator.unit_states(unit_id)
    found = {s.split_id for state in states for s in state.split_states}
    if not found and assigned:
        found.update(assigned.get(unit_id, ()))
    if not found:
        for vertex_id, enumerator in enumerators.items():
            for split, index in enumerator.owners.items():
                if layout.unit_of(vertex_id, index) == unit_id:
                    found.add(split)
    return tuple(sorted(found))


def finished_sources(
    pipeline: Pipeline,
    layout: JobLayout,
    enumerators: Mapping[str, SplitEnumerator],
    coordinator: CheckpointCoordinator,
) -> list[str]:
    """The bounded sources that have read everything: no split left to assign, and no open
    split in the state of the latest completed checkpoint."""
    done = []
    for vertex_id in sorted(layout.bounded_sources):
        enumerator = enumerators.get(vertex_id)
        if enumerator is None:
            continue  # an exchange reader: `drained_exchanges`
        splits = discover_splits(pipeline, vertex_id)
        if splits is None:
            continue  # cannot tell now: maybe next epoch
        enumerator.discover(splits)
        if enumerator.unassigned or coordinator.latest_completed_id is None:
            continue
        parallelism = pipeline.vertices[vertex_id].parallelism
        units = {layout.unit_of(vertex_id, i) for i in range(parallelism)}
        states = [s for u in units for s in coordinator.unit_states(u) if s.vertex_id == vertex_id]
        if not any(s.split_states for s in states):
            done.append(vertex_id)
    return done


def drained_exchanges(
    pipeline: Pipeline,
    layout: JobLayout,
    coordinator: CheckpointCoordinator,
    queued: Mapping[str, Sequence[int]],
) -> list[str]:
    """The bounded exchange readers that have read everything: every source upstream of the
    exchange finished, the writer's commits are all done (`queued`: sink vertex -> checkpoint
    ids waiting to commit), and no partition holds records after its reader's cursor in the
    latest completed checkpoint. Listing the segments may fail: then not now."""
    done: list[str] = []
    finished = coordinator.finished_sources
    if coordinator.latest_completed_id is None:
        return done
    for reader_id, exchange in sorted(pipeline.exchanges.items()):
        writer, reader, source = exchange.writer_spec, exchange.reader_spec, exchange.reader
        if reader_id in finished or not source.bounded:
            continue
        if queued.get(writer.id) or not all(
            s.id in finished for s in pipeline._ancestors(writer.id)
        ):
            continue
        try:
            left = 0
            for index in range(reader.parallelism):
                unit = layout.unit_of(reader_id, index)
                for state in coordinator.unit_states(unit):
                    if state.vertex_id != reader_id or state.index != index:
                        continue
                    positions = {s.split_id: s.position for s in state.split_states}
                    positions.setdefault(source.split_of(index), b"")
                    left += sum(source.backlog(k, p).records for k, p in positions.items())
        except Exception as exc:
            log.warning(
                "exchange %r: cannot list its backlog: %s: %s", reader_id, type(exc).__name__, exc
            )
            continue
        if left == 0:
            done.append(reader_id)
    return done
