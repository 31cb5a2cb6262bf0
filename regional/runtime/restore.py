"""Restore into a job root: rewrite a checkpoint's state for the pipeline (DESIGN §4 rule 12).

The imperative shell around `regional.runtime.rescale`: it reads the restored checkpoint's state
(verified segments) from wherever it lives — another job root, a moved savepoint, or this job's
own root — maps it onto the pipeline's layout, writes one state file per fallback unit into
this job's root (`chk-<id>/u<unit>-a0-<run>.state`; attempt 0 is never a task attempt) and returns
the metadata the coordinator restores from. The job's tasks then only ever read files under
its own root, whatever the source was.

The rewrite is a copy when the shape is unchanged; a vertex with other parallelism has its
operator states decoded on the driver (`regional.dataflow.state_codec`: msgpack, or signed pickle
only by
the pipeline's opt-in; an unsigned pickle is refused unread), redistributed
(`redistribute_state`) and encoded again, and its source's split enumerator reassigned.

`find_restore_point` is the orchestration the driver runs at start: resume from the job root's
latest restorable checkpoint (rewritten when the pipeline's vertices changed), or restore a given
checkpoint or savepoint (`restore_from`) in claim or no-claim mode. It returns a `RestorePoint`:
what the coordinator restores, from which id on new checkpoints are numbered, and what the
cleaner must keep.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import msgspec

from cleaner.model import RestoreBase
from metadata.exchange import MOVED_WRITER, Cursor, reader_view, split_id
from metadata.layout import METADATA_NAME, checkpoint_id_of, event_checkpoint_id, state_file_path
from metadata.model import CheckpointKind, CheckpointMetadata, SplitState, SubtaskState, UnitState
from metadata.savepoint import CheckpointSource, open_checkpoint
from metadata.storage import JobStorage
from metadata.watermarks import MIN_WATERMARK
from regional.coordinator.commit import CommitCoordinator
from regional.coordinator.layout import JobLayout
from regional.coordinator.split_enumerator import SplitEnumerator
from regional.dataflow.exchange import exchange_path, repartition
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.errors import CommitError, RestoreError
from regional.runtime.rescale import (
    RestorePlan,
    SubtaskPlan,
    VertexShape,
    plan_restore,
    redistribute_keys,
    redistribute_state,
)
from regional.sinks.base import TableRollback, TableRollbackUsers, TableStaging, WriteContext

log = logging.getLogger(__name__)

__all__ = [
    "RestorePoint",
    "clean_staged_sinks",
    "find_restore_point",
    "first_free_checkpoint_id",
    "open_restore_source",
    "reset_exchanges",
    "rewrite_for_pipeline",
    "roll_back_sinks",
    "verify_exchanges",
    "vertex_shapes",
]


class RestorePoint(msgspec.Struct, frozen=True):
    """Where a run starts: `metadata` is what the coordinator restores in `mode`; checkpoint
    ids go on from `next_checkpoint_id`; `global_until_success` says why checkpoints must stay
    global until one succeeds (rewritten state that is not kept); `restore_base` is what the
    cleaner must never delete (a no-claim restore of this job root); `location` and `notes`
    are for the user (where it came from; rescaled vertices, dropped state)."""

    checkpoint_id: int
    metadata: CheckpointMetadata
    mode: str
    next_checkpoint_id: int
    location: str
    global_until_success: str | None = None
    restore_base: RestoreBase | None = None
    notes: tuple[str, ...] = ()


def find_restore_point(
    storage: JobStorage,
    pipeline: Pipeline,
    layout: JobLayout,
    *,
    restore_from: str | None,
    mode: str,
    resume_mode: str,
    allow_dropped_state: bool = False,
    run_id: str | None = None,
    allow_fresh_start: bool = False,
) -> RestorePoint | None:
    """Where the job in `storage` starts: `restore_from` (a checkpoint or savepoint, restored
    into this empty job root in `mode`), else the root's latest restorable checkpoint (resumed
    in `resume_mode`, the policy's; its state checksums are verified first), else None (a
    fresh start). A root whose checkpoints are all damaged is refused (`RestoreError`) unless
    `allow_fresh_start`. Rewritten state files carry the driver's `run_id`."""
    if mode not in ("claim", "no-claim"):
        raise RestoreError(f"restore mode {mode!r}: use claim or no-claim")
    if restore_from is not None:
        return _restore_given(
            storage, pipeline, layout, restore_from, mode, allow_dropped_state, run_id
        )
    md = storage.find_latest_restorable(verify_checksums=True)
    if md is None:
        damaged = [f.path for f in storage.list_files() if f.path.endswith(f"/{METADATA_NAME}")]
        if damaged and not allow_fresh_start:
            raise RestoreError(
                f"job root {storage.describe('')} holds checkpoints, but none can be restored "
                f"({', '.join(damaged[-3:])}: see the warnings above, or `regional inspect ROOT "
                "validate`); starting fresh would re-process everything into the sinks. Repair "
                "or restore the damaged files, or start over on purpose with "
                "--allow-fresh-start (new checkpoint ids continue after the damaged ones)"
            )
        return None
    next_id = first_free_checkpoint_id(storage)
    where = storage.describe(f"chk-{md.checkpoint_id}")
    base = RestoreBase(md.checkpoint_id, "no-claim") if resume_mode == "no-claim" else None
    if set(md.vertices) == set(layout.vertices):
        return RestorePoint(md.checkpoint_id, md, resume_mode, next_id, where, restore_base=base)
    # another shape: the rewritten state is staged for the next checkpoint only
    restored, plan = rewrite_for_pipeline(
        storage,
        md,
        pipeline,
        layout,
        storage,
        state_checkpoint_id=next_id,
        allow_dropped_state=allow_dropped_state,
        run_id=run_id,
    )
    return RestorePoint(
        md.checkpoint_id,
        restored,
        resume_mode,
        next_id,
        where,
        global_until_success=(
            f"checkpoint {md.checkpoint_id} was restored with another parallelism; its "
            "rewritten state is kept only until a checkpoint succeeds, so checkpoints stay "
            "global until then"
        ),
        restore_base=base,
        notes=(*plan.rescaled, *plan.dropped, *plan.moved),
    )


def _restore_given(
    storage: JobStorage,
    pipeline: Pipeline,
    layout: JobLayout,
    path: str,
    mode: str,
    allow_dropped_state: bool,
    run_id: str | None,
) -> RestorePoint:
    """Restore the checkpoint or savepoint at `path` into the (empty) job root of `storage`."""
    source = open_restore_source(storage, path)
    md = source.metadata
    cid = md.checkpoint_id
    next_id = max(cid + 1, first_free_checkpoint_id(storage))
    claim = mode == "claim"
    restored, plan = rewrite_for_pipeline(
        source.storage,
        md,
        pipeline,
        layout,
        storage,
        state_checkpoint_id=cid if claim else next_id,
        allow_dropped_state=allow_dropped_state,
        reasons=(f"restored from {source.location} ({mode})",),
        run_id=run_id,
    )
    if claim:  # the job owns its copy: a checkpoint of its own, cleaned when subsumed
        storage.write_metadata(restored)
    notes = (*plan.rescaled, *plan.dropped, *plan.moved)
    return RestorePoint(cid, restored, mode, next_id, source.location, notes=notes)


def first_free_checkpoint_id(storage: JobStorage) -> int:
    """The first checkpoint id after every id the job root has seen: completed checkpoints,
    attempts that left files (in flight at a crash) and the event log, which is the only
    trace of an aborted attempt (its files are discarded). So ids only grow within a root
    (DESIGN §5): a run after a failed one never writes a second event or a second checkpoint
    under an id the first one used."""
    used = 0
    for f in storage.list_files():
        c = checkpoint_id_of(f.path)
        if c is None:
            c = event_checkpoint_id(f.path)
        if c is not None and c > used:
            used = c
    return used + 1


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
    run_id: str | None = None,
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
            codec = pipeline.state_codec
            op = pipeline.vertices[vertex_id].operator
            then = [
                OperatorState.from_bytes(
                    blob(states[i]),
                    operator=vertex_id,
                    codec=codec,
                    source=_describe(source, states[i], cid),
                )
                for i in sorted(states)
            ]
            if op is not None and op.scope == "key":  # after a keyed exchange: by key hash
                now = redistribute_keys(then, sizes[vertex_id])
            else:
                placement = plan.placement(pipeline.forward_sources(vertex_id), holder=vertex_id)
                now = redistribute_state(then, placement, sizes[vertex_id])
            for index, state in enumerate(now):
                blobs[vertex_id, index] = codec.encode(state.keyed, state.lists, operator=vertex_id)

    planned = {(p.vertex_id, p.index): p for p in plan.subtasks}
    exchange_notes = _move_exchanges(source, metadata, pipeline, target, planned)
    _carry_writer_marks(metadata, pipeline, layout, target, planned, run_id)
    subtasks: list[SubtaskState] = []
    for unit_id, keys in enumerate(layout.units):
        with_state = [k for k in keys if k in blobs]
        handles = {}
        if with_state:
            rel = state_file_path(state_checkpoint_id, unit_id, 0, run_id)
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
        if vertex_id in pipeline.sources and plan.assignments.get(vertex_id):
            enumerator = _enumerator(vertex_id, data)
            enumerator.reassign(plan.assignments[vertex_id])
            data = enumerator.snapshot(cid)
        coordinators[vertex_id] = data
    notes = [*reasons]
    if plan.rescaled:
        notes.append(f"state redistributed for new parallelism ({', '.join(plan.rescaled)})")
    notes += plan.dropped
    notes += exchange_notes
    plan = msgspec.structs.replace(plan, moved=tuple(exchange_notes))
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


def _move_exchanges(
    source: JobStorage,
    metadata: CheckpointMetadata,
    pipeline: Pipeline,
    target: JobStorage,
    planned: dict[tuple[str, int], SubtaskPlan],
) -> list[str]:
    """Carry every keyed exchange's backlog over when its reader's parallelism changed or the
    checkpoint comes from another job root: what the checkpoint's readers had not read (and its
    writers' segments not published yet) is repartitioned into the new layout in `target`
    (`regional.dataflow.exchange.repartition`), and each new reader subtask starts at the
    checkpoint's
    id (`planned` is updated). Idempotent, so a restore that is retried writes the same."""
    notes = []
    cid = metadata.checkpoint_id
    moved = source.job_path != target.job_path or type(source.filesystem) is not type(
        target.filesystem
    )
    for reader_id, exchange in pipeline.exchanges.items():
        writer_spec, reader_spec, writer, _ = exchange
        view = reader_view(metadata, reader_id)
        if view.layout is None:
            continue  # the exchange is new in this pipeline: nothing to carry over
        if view.layout == reader_spec.parallelism and not moved:
            continue
        origin = writer.bound_to(exchange_path(source.job_path, reader_id), source.filesystem)
        if moved and not origin.exists():
            raise RestoreError(
                f"checkpoint {cid} of {source.describe('')} holds exchange {reader_id!r}, but "
                f"its segments are not at {source.describe(f'exchange/{reader_id}')}; restore "
                "a checkpoint of a job root that still holds them, or a savepoint (it carries "
                "its exchanges' backlog)"
            )
        staged = [
            c
            for s in metadata.subtasks
            if s.vertex_id == writer_spec.id and s.ref_checkpoint_id is None
            for c in s.committables
        ]
        try:
            records = repartition(
                origin, writer, view.layout, view.cursors, staged, reader_spec.parallelism, cid
            )
        except (OSError, CommitError) as exc:
            raise RestoreError(
                f"cannot carry exchange {reader_id!r} of checkpoint {cid} over: {exc}"
            ) from exc
        start = (
            SplitState(split_id(reader_spec.parallelism, 0), Cursor(cid, MOVED_WRITER).encode()),
        )
        for index in range(reader_spec.parallelism):
            key = (reader_id, index)
            split = split_id(reader_spec.parallelism, index)
            planned[key] = msgspec.structs.replace(
                planned[key], split_states=(msgspec.structs.replace(start[0], split_id=split),)
            )
        if moved:  # their segments were copied; the new root cannot publish the old staging
            for index in range(writer_spec.parallelism):
                planned[writer_spec.id, index] = msgspec.structs.replace(
                    planned[writer_spec.id, index], committables=()
                )
        notes.append(
            f"exchange {reader_id!r}: {records} record(s) not yet read moved from "
            f"{view.layout} to {reader_spec.parallelism} partitions"
        )
    return notes


def _carry_writer_marks(
    metadata: CheckpointMetadata,
    pipeline: Pipeline,
    layout: JobLayout,
    target: JobStorage,
    planned: dict[tuple[str, int], SubtaskPlan],
    run_id: str | None,
) -> None:
    """Keep every exchange writer's watermark mark through the rewrite (DESIGN §4 rule 15).

    A writer subtask learns its watermark before an epoch (its records' origin watermark) from
    the mark in the committables it restores (`ExchangeWriter.committed_watermark`). The
    rewrite keeps only fresh subtasks' committables, since a fallen-back writer's were
    committed under its owner's id; so its mark is staged again here, alone, as a
    committable of its own (an empty mark file of the restored checkpoint, in `target`'s
    exchange: publishing it again publishes nothing new, its owner's mark has the same value).
    A writer vertex of unchanged size keeps each subtask's own mark; one whose size changed
    starts every new subtask from the lowest of the old subtasks' marks, as a window
    operator's fired watermark does (its splits or keys come from any of them)."""
    cid = metadata.checkpoint_id
    old_sizes = {v.vertex_id: v.parallelism for v in metadata.vertices}
    unit_of = {key: unit for unit, keys in enumerate(layout.units) for key in keys}
    for reader_id, (writer_spec, _, writer, _) in pipeline.exchanges.items():
        old = [s for s in metadata.subtasks if s.vertex_id == writer_spec.id]
        size = sum(1 for vertex_id, _ in planned if vertex_id == writer_spec.id)
        if not old or not size:
            continue
        bound = writer.bound_to(exchange_path(target.job_path, reader_id), target.filesystem)
        marks = {s.index: bound.committed_watermark(s.committables) for s in old}
        if old_sizes.get(writer_spec.id) == size:
            carry = {
                s.index: mark
                for s in old
                if s.ref_checkpoint_id is not None and (mark := marks[s.index]) is not None
            }
        elif any(m is not None for m in marks.values()):
            lowest = min(MIN_WATERMARK if m is None else m for m in marks.values())
            carry = dict.fromkeys(range(size), lowest)
        else:
            continue  # no writer ever committed a mark: no event time
        for index, mark in carry.items():
            key = (writer_spec.id, index)
            context = WriteContext(
                job_id=target.job_id,
                run_id=run_id or "restore",
                checkpoint_id=cid,
                attempt=0,  # never a task attempt
                unit_id=unit_of[key],
                vertex_id=writer_spec.id,
                index=index,
                watermarks=(mark, mark),
            )
            staged = bound.write([], context)  # no records: the mark alone
            planned[key] = msgspec.structs.replace(
                planned[key], committables=(*planned[key].committables, *staged)
            )


def _describe(storage: JobStorage, state: SubtaskState, checkpoint_id: int) -> str:
    """The state file(s) of a subtask, for errors."""
    files = ", ".join(storage.describe(h.path) for h in state.handles)
    return f"{files} of checkpoint {checkpoint_id}"


def _enumerator(vertex_id: str, data: bytes) -> SplitEnumerator:
    enumerator = SplitEnumerator(vertex_id)
    enumerator.restore(data)
    return enumerator


def roll_back_sinks(
    pipeline: Pipeline,
    committers: Mapping[str, CommitCoordinator],
    restored_id: int,
    *,
    own_root: bool,
) -> tuple[str, ...]:
    """Sinks holding commits newer than the restored checkpoint (its newer checkpoints were
    damaged) would get that output twice. Resuming in the job's `own_root`, such a sink is
    rolled back when it can (`TableRollback`); otherwise the restore is refused
    (`RestoreError`). Every sink's (and exchange's) case is decided before any is rolled back,
    so a refused restore leaves every table as it was. Returns what was rolled back, for the
    user.

    A sink vertex's commits are its commit user's, so rolling one back never undoes another
    vertex's commits to the same table, and every vertex that needs it is rolled back. A table
    that rolls back as a whole (`TableRollbackUsers`: a snapshot) is rolled back once, for
    every commit user of the job, since the vertices sharing it (one sink object, or several
    on one location) may have committed in turns."""
    rollbacks: dict[int, tuple[TableRollback, list[tuple[str, str, str]]]] = {}
    refusals: list[str] = []
    for vertex_id, committer in committers.items():
        sink = pipeline.sink_of(vertex_id)
        user = committer.commit_user
        latest = sink.latest_committed(user)
        if latest is None or latest <= restored_id:
            continue
        what = (
            f"sink {vertex_id!r} holds commits of commit user {user!r} up to {latest}, "
            f"newer than the restored checkpoint {restored_id}"
        )
        if own_root and isinstance(sink, TableRollback):
            rollbacks.setdefault(id(sink), (sink, []))[1].append((vertex_id, user, what))
            continue
        how = (
            "they may belong to another run of the job"
            if not own_root
            else "the sink cannot roll back"
        )
        refusals.append(
            f"{what}; restoring would write their output again and {how}. Restore a "
            f"checkpoint at or after {latest}, or remove those commits from the table by hand "
            "and start again"
        )
    if refusals:
        vertices = [v for _, needing in rollbacks.values() for v, _, _ in needing]
        untouched = (
            f" (nothing was rolled back: {', '.join(map(repr, vertices))} left as they were)"
            if vertices
            else ""
        )
        raise RestoreError("; ".join(refusals) + untouched)
    users = [c.commit_user for c in committers.values()]
    undone: dict[str, list[int]] = {}  # per commit user (a user may be undone by another sink)
    for table, needing in rollbacks.values():
        if isinstance(table, TableRollbackUsers):
            for user, ids in table.rollback_users(users, restored_id).items():
                undone.setdefault(user, []).extend(ids)
        else:
            for _, user, _ in needing:
                undone.setdefault(user, []).extend(table.rollback(user, restored_id))
    notes = []
    for _, needing in rollbacks.values():
        for _vertex_id, user, what in needing:
            ids = sorted(set(undone.get(user, ())))
            done = f"commit(s) {_ids(ids)} rolled back" if ids else "rolled back"
            log.warning("%s: %s (their output is written again)", what, done)
            notes.append(f"{what}: {done}, their output is written again")
    return tuple(notes)


def verify_exchanges(pipeline: Pipeline, restored: CheckpointMetadata) -> None:
    """Before the first epoch of a resumed job: every keyed exchange's committed segments
    after the restored readers' cursors exist with their recorded sizes
    (`ExchangeReader.committed`); `RestoreError` naming the first that does not (a deleted or
    truncated segment would otherwise be data lost or a reader that never gets past it)."""
    for reader_id, exchange in pipeline.exchanges.items():
        reader = exchange.reader
        view = reader_view(restored, reader_id)
        if view.layout != reader.partitions:
            continue  # repartitioned by this restore: its records were just written
        for partition in range(reader.partitions):
            try:
                reader.committed(view.layout, partition, view.cursors.get(partition, Cursor()))
            except CommitError as exc:
                raise RestoreError(
                    f"cannot resume from checkpoint {restored.checkpoint_id}: {exc}"
                ) from None


def reset_exchanges(pipeline: Pipeline) -> tuple[str, ...]:
    """A fresh start: no checkpoint holds a cursor into the exchanges' old segments (an earlier
    run's), so they are deleted before the first epoch; a note per exchange that had some."""
    notes = []
    for reader_id, exchange in pipeline.exchanges.items():
        if gone := exchange.writer.reset():
            notes.append(f"exchange {reader_id!r}: deleted {gone} segment(s) of an earlier run")
            log.warning("%s", notes[-1])
    return tuple(notes)


def clean_staged_sinks(
    pipeline: Pipeline,
    committers: Mapping[str, CommitCoordinator],
    job_id: str,
    restored: CheckpointMetadata | None,
) -> tuple[str, ...]:
    """At a driver's start, before any task runs: every table whose writers stage files
    (`TableStaging`) deletes job `job_id`'s staged files that nothing of the job still names:
    neither a subtask of the `restored` checkpoint nor a pending re-commit of any commit
    coordinator (none on a fresh start). They are from lost attempts or a lost run.

    Cleaning is per table, not per sink vertex: several vertices may write one table (the
    dead-letter sink of every part of the graph, one sink object given to two `.sink()`
    calls, two sink objects on one location), and one vertex's staged files are no lost
    attempt of another's. So each table is handed every committable of the job and keeps the
    ones that name its files (a table skips other tables' committables, as `discard` does):
    the files it keeps are found by their names inside it, however its path was spelled.
    Each sink object cleans once. Best effort (what is left waits for the next start);
    returns a note per table that deleted files, naming its sink vertices."""
    keep = [
        c for committer in committers.values() for p in committer.pending for c in p.committables
    ]
    if restored is not None:
        keep += [c for s in restored.subtasks for c in s.committables]
    tables: dict[int, tuple[TableStaging, list[str]]] = {}
    for vertex_id in committers:
        sink = pipeline.sink_of(vertex_id)
        if isinstance(sink, TableStaging):
            tables.setdefault(id(sink), (sink, []))[1].append(vertex_id)
    notes: list[str] = []
    for table, vertices in tables.values():
        names = ", ".join(map(repr, vertices))
        try:
            deleted = table.clean_staged(job_id, keep)
        except CommitError:  # a link out of the table (or bad names): refuse to start
            raise
        except Exception as exc:  # storage trouble: the next start tries again
            log.warning("sink %s: staged files of lost attempts left: %s", names, exc)
            continue
        if deleted:
            notes.append(f"sink {names}: deleted {len(deleted)} staged file(s) of lost attempts")
            log.info("%s", notes[-1])
    return tuple(notes)


def _ids(ids: Sequence[int]) -> str:
    """`3`, `3, 4` or `3..9` for messages."""
    if len(ids) > 2 and ids[-1] - ids[0] == len(ids) - 1:
        return f"{ids[0]}..{ids[-1]}"
    return ", ".join(map(str, ids))
