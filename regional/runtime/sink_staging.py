"""What a task's units stage for their sinks: merged staged files, committables, durability.

A sink that merges (`regional.sinks.base.MergingWriter`) stages **one data file per task, sink
and epoch**: each unit's rows are a part of it (`stage_merged`), and each unit's ack gains the
committables of its parts (`with_committables`). A unit that declines gives its parts back
(`give_back`: the file goes once no unit in it commits), and the files a declined unit staged
on its own go at once (`discard_staged`, DESIGN §4 rule 8). Before the task answers, the sinks'
staged files and staging directories are made durable together (`sync_staged`), so no ack
names a file a power loss could take back.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Sequence
from concurrent.futures import Future

import msgspec

from metadata.model import SubtaskState
from regional.coordinator.messages import Ack, Answer, Decline
from regional.dataflow.failures import failure_line
from regional.dataflow.pipeline import Pipeline
from regional.runtime.state_upload import UnitSnapshot
from regional.sinks.base import MergingWriter, WriteContext
from regional.sinks.rows import parts_batches
from regional.sources.base import Batch

__all__ = [
    "Committables",
    "Staged",
    "discard_late",
    "discard_staged",
    "give_back",
    "stage_merged",
    "sync_staged",
    "with_committables",
]

#: One unit's committables of the merged sink files, by sink subtask (vertex, index).
Committables = dict[tuple[str, int], tuple[bytes, ...]]


class Staged(msgspec.Struct):
    """What staging the task's merged sink files gave: per unit (in the order staged), its
    committables by sink subtask, or the error converting its rows raised (that unit fails
    alone); and the seconds it took."""

    committables: list[Committables]
    failed: dict[int, Exception]
    seconds: float


def stage_merged(pipeline: Pipeline, snaps: Sequence[UnitSnapshot]) -> Staged:
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
    out: list[Committables] = [{} for _ in snaps]
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
            give_back(pipeline, mine)
        raise
    return Staged(out, failed, time.perf_counter() - started)


def discard_late(done: Future[Staged], pipeline: Pipeline) -> None:
    """Delete what a staging that ran out of time staged once it ends (best effort)."""
    if done.cancelled() or done.exception() is not None:
        return
    for mine in done.result().committables:
        give_back(pipeline, mine)


def give_back(pipeline: Pipeline, committables: Committables) -> None:
    """Discard one unit's parts of the merged sink files (best effort): a file goes once all
    of its parts are given back (`regional.sinks.merging.DiscardedParts`)."""
    for (vertex_id, _), c in committables.items():
        with contextlib.suppress(Exception):
            pipeline.sink_of(vertex_id).discard(c)


def with_committables(ack: Ack, committables: Committables, seconds: float) -> Ack:
    """`ack` with its sink subtasks holding `committables`, `seconds` more of processing."""
    states = tuple(
        msgspec.structs.replace(s, committables=committables[s.vertex_id, s.index])
        if (s.vertex_id, s.index) in committables
        else s
        for s in ack.states
    )
    return msgspec.structs.replace(ack, states=states, process_s=ack.process_s + seconds)


def sync_staged(pipeline: Pipeline, answers: list[Answer]) -> list[Answer]:
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


def discard_staged(pipeline: Pipeline, states: Sequence[SubtaskState]) -> None:
    """Delete the sink files a declined unit staged (DESIGN §4 rule 8); best effort."""
    for s in states:
        sink = pipeline.vertices[s.vertex_id].sink
        if s.committables and sink is not None:
            with contextlib.suppress(Exception):
                sink.discard(s.committables)
