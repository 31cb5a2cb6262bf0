"""Restore into a job root: rewrite a checkpoint's state for the pipeline (DESIGN §4 rule 12).

The imperative shell around `regional.rescale`: it reads the restored checkpoint's state
(verified segments) from wherever it lives — another job root, a moved savepoint, or this job's
own root — maps it onto the pipeline's layout, writes one state file per fallback unit into
this job's root (`chk-<id>/u<unit>-a0.state`; attempt 0 is never a task attempt) and returns
the metadata the coordinator restores from. The job's tasks then only ever read files under
its own root, whatever the source was.

The rewrite is a copy when the shape is unchanged; a vertex with other parallelism has its
operator states unpickled on the driver, redistributed (`redistribute_state`) and pickled
again, and its source's split enumerator reassigned.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from metadata.layout import state_file_path
from metadata.model import CheckpointKind, CheckpointMetadata, SubtaskState, UnitState
from metadata.savepoint import CheckpointSource, open_checkpoint
from metadata.storage import JobStorage
from regional.coordinator.layout import JobLayout
from regional.errors import RestoreError
from regional.operators.split_enumerator import SplitEnumerator
from regional.pipeline import Pipeline
from regional.rescale import RestorePlan, VertexShape, plan_restore, redistribute_state
from regional.state import OperatorState

__all__ = ["open_restore_source", "rewrite_for_pipeline", "vertex_shapes"]


def open_restore_source(target: JobStorage, path: str) -> CheckpointSource:
    """The checkpoint or savepoint at `path`, to restore into job root `target`; refuses a
    target that already holds checkpoints (a run there resumes from them)."""
    completed = target.list_checkpoint_ids()
    if completed:
        raise RestoreError(
            f"cannot restore {path} into {target.describe('')}: that job root already holds "
            f"checkpoints (latest {completed[-1]}), and a run there resumes from them. Drop "
            "--from to resume, or restore into another job root (--checkpoint-dir or --job-id)"
        )
    return open_checkpoint(path)


def vertex_shapes(pipeline: Pipeline, layout: JobLayout) -> list[VertexShape]:
    """The pipeline's vertices as `plan_restore` sees them."""
    infos = {v.vertex_id: v for v in layout.vertices}
    shapes = []
    for spec in pipeline.vertices.values():
        info = infos[spec.id]
        shapes.append(
            VertexShape(
                spec.id,
                info.parallelism,
                info.max_parallelism,
                source=spec.source is not None,
                stateful=spec.operator is not None and spec.operator.stateful,
                sink=spec.sink is not None,
            )
        )
    return shapes


def rewrite_for_pipeline(
    source: JobStorage,
    metadata: CheckpointMetadata,
    pipeline: Pipeline,
    layout: JobLayout,
    target: JobStorage,
    *,
    state_checkpoint_id: int,
    allow_dropped_state: bool = False,
    reasons: Sequence[str] = (),
) -> tuple[CheckpointMetadata, RestorePlan]:
    """Write `metadata`'s state, mapped onto `pipeline`, into `target` under
    `chk-<state_checkpoint_id>/`; return the (global, every subtask fresh) metadata to restore
    from, with `metadata`'s id, and the plan. Raises `RestoreError` for unmappable state."""
    cid = metadata.checkpoint_id
    owners = {
        vertex_id: _enumerator(vertex_id, data).owners
        for vertex_id, data in metadata.coordinators.items()
        if vertex_id in pipeline.sources
    }
    plan = plan_restore(
        metadata,
        vertex_shapes(pipeline, layout),
        split_owners=owners,
        allow_dropped_state=allow_dropped_state,
    )
    old: dict[str, dict[int, SubtaskState]] = {}
    for s in metadata.subtasks:
        old.setdefault(s.vertex_id, {})[s.index] = s

    def blob(s: SubtaskState) -> bytes:
        return b"".join(source.read_segment(h, checkpoint_id=cid) for h in s.handles)

    blobs: dict[tuple[str, int], bytes] = {}
    sizes = {v.vertex_id: v.parallelism for v in layout.vertices}
    for vertex_id, mode in plan.state_mode.items():
        states = old.get(vertex_id, {})
        if mode == "copy":
            for index, s in states.items():
                if s.handles:
                    blobs[vertex_id, index] = blob(s)
        elif mode == "redistribute":
            then = [OperatorState.from_bytes(blob(states[i])) for i in sorted(states)]
            now = redistribute_state(then, plan.assignment, sizes[vertex_id])
            for index, state in enumerate(now):
                blobs[vertex_id, index] = state.to_bytes()

    planned = {(p.vertex_id, p.index): p for p in plan.subtasks}
    subtasks: list[SubtaskState] = []
    for unit_id, keys in enumerate(layout.units):
        with_state = [k for k in keys if k in blobs]
        handles = {}
        if with_state:
            rel = state_file_path(state_checkpoint_id, unit_id, 0)
            written = target.write_segments(rel, [blobs[k] for k in with_state])
            handles = dict(zip(with_state, written, strict=True))
        for key in keys:
            p = planned[key]
            subtasks.append(
                SubtaskState(
                    key[0],
                    key[1],
                    unit_id,
                    handles=(handles[key],) if key in handles else (),
                    split_states=p.split_states,
                    committables=p.committables,
                )
            )

    coordinators: dict[str, bytes] = {}
    for vertex_id, data in metadata.coordinators.items():
        if vertex_id not in pipeline.vertices or vertex_id in plan.reset:
            continue
        if vertex_id in pipeline.sources and plan.assignment:
            enumerator = _enumerator(vertex_id, data)
            enumerator.reassign(plan.assignment)
            data = enumerator.snapshot(cid)
        coordinators[vertex_id] = data
    notes = [*reasons]
    if plan.rescaled:
        notes.append(f"state redistributed for new parallelism ({', '.join(plan.rescaled)})")
    notes += plan.dropped
    restored = msgspec.structs.replace(
        metadata,
        job_id=target.job_id,
        kind=CheckpointKind.GLOBAL,
        graph_fingerprint=layout.graph_fingerprint,
        reasons=tuple(notes),
        vertices=layout.vertices,
        units=tuple(UnitState(u) for u in range(layout.num_units)),
        coordinators=coordinators,
        subtasks=tuple(subtasks),
    )
    return restored, plan


def _enumerator(vertex_id: str, data: bytes) -> SplitEnumerator:
    enumerator = SplitEnumerator(vertex_id)
    enumerator.restore(data)
    return enumerator
