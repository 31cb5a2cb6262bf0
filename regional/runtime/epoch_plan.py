"""Planning an epoch on the driver: which splits each unit reads, and which bounded sources
have finished. Split discovery may fail (a source's storage is unreachable): the epoch then
goes on with the splits already known, and a finished source is recognised a later epoch."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from regional.coordinator import CheckpointCoordinator, JobLayout, TriggerCheckpoint
from regional.operators import SplitEnumerator
from regional.pipeline import Pipeline
from regional.runtime.protocol import UnitWork

__all__ = ["discover_splits", "finished_sources", "plan_works"]

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
    for unit_id in range(layout.num_units):
        restore = unit_states(unit_id)
        new: list[tuple[str, int, str]] = []
        for state in restore:
            if (open_slots := per - len(state.split_states)) <= 0:
                continue  # the common case at scale: the subtask's splits are all open
            assigner = enumerators.get(state.vertex_id)
            if assigner is None:
                continue
            for _ in range(open_slots):
                split = assigner.assign(state.index)
                if split is None:
                    break
                new.append((state.vertex_id, state.index, split))
        works.append(UnitWork(cid, attempt, unit_id, restore, tuple(new)))
    return works


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
        enumerator = enumerators[vertex_id]
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
