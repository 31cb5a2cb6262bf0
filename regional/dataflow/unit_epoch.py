"""What the walker (`regional.dataflow.walker`) does for one unit at a source and at a sink,
and what a unit's epoch gives back (`UnitEpoch`): plain arguments, no storage, no Spark, no wall
clock.

* **Sources** (`read_source`): each split of a source subtask gets a fair share of what is left
  of the epoch's record budget, so a split with a backlog never starves the others; records the
  source could not decode and records without a usable event time are dead letters (or the
  unit declines naming them); a split's watermark advances with its records and lives in its
  position (DESIGN §4 rule 15). A `TimedSource` (the keyed exchange's reader) stamps each
  batch with its origin watermark and tells its subtask's watermark itself.
* **Sinks** (`sink_rows`): the rows of each sink subtask as the operators left them, Arrow
  batches or lists of records, which the task converts for all its units at once (with dead
  letters: converted here, so a record that does not fit is set aside).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import pyarrow as pa

from metadata.model import SplitState, SubtaskState
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK, unwrap_position, wrap_position
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.event_time import SplitWatermark, advance_split, subtask_watermark
from regional.dataflow.failures import raised_on
from regional.dataflow.operators import Chunk
from regional.dataflow.plan import PlannedVertex
from regional.dataflow.state import OperatorState
from regional.sinks.rows import conformed, records_batch
from regional.sources.base import Batch, num_records

__all__ = ["SourceEpoch", "UnitEpoch", "mark_of", "read_source", "sink_rows", "start_of"]


def mark_of(mark: SplitWatermark | None) -> int:
    """A split's watermark (-inf before its first record)."""
    return MIN_WATERMARK if mark is None else mark.watermark


@dataclasses.dataclass
class SourceEpoch:
    """What reading one source subtask for an epoch gave: its chunks (and with event time
    their origin watermarks), the split states to keep, the records read, and the subtask's
    watermark before and after the epoch (event time only); `behind`: per split read, the
    records between its new position and its end, where the source says (`ReadResult`), and
    `unread_since`, when the oldest of those was appended (ms), where the source says."""

    chunks: list[Chunk]
    origins: list[int] | None
    split_states: tuple[SplitState, ...]
    records_in: int
    watermarks: tuple[int, int] | None
    behind: dict[str, int] = dataclasses.field(default_factory=dict)
    unread_since: dict[str, int] = dataclasses.field(default_factory=dict)


def read_source(
    spec: PlannedVertex,
    index: int,
    positions: dict[str, bytes],
    *,
    budget: int,
    time: EpochTime | None,
    dead: DeadLetters | None,
    start_positions: dict[str, str],
    source_positions: dict[tuple[str, str], str] | None = None,
    ended: bool,
    idle_timeout_ms: int | None,
    exclude_after: int | None,
) -> SourceEpoch:
    """Read source subtask `index` of `spec` from `positions` (split -> wrapped position) for
    one epoch of at most `budget` records; `start_positions` gets each split's position as
    text (dead letters name it), `source_positions` the same by (vertex, split). With `time`,
    the epoch's watermarks by scope are filled in."""
    source = spec.source
    assert source is not None
    timed = spec.timed
    et = spec.event_time
    chunks: list[Chunk] = []
    origins: list[int] = []
    kept: list[SplitState] = []
    records_in = 0
    behind: dict[str, int] = {}
    unread_since: dict[str, int] = {}
    marks_before: dict[str, SplitWatermark | None] = {}
    marks_after: dict[str, SplitWatermark | None] = {}
    marks_done: dict[str, SplitWatermark | None] = {}  # splits finished this epoch
    left = len(positions)
    for split, wrapped in positions.items():
        position, mark = unwrap_position(wrapped)
        start_positions[split] = text = position.decode("utf-8", "backslashreplace")
        if source_positions is not None:
            source_positions[spec.id, split] = text
        marks_before[split] = mark
        first = len(chunks)
        finished = False
        # a fair share of what is left (what a split leaves unused goes to the next)
        share = -(-budget // left) if budget > 0 else 0
        left -= 1
        if share > 0:
            if time is not None and timed is not None:
                result, read_origins = timed.read_timed(split, position, share)
                origins += read_origins
            else:
                result = source.read(split, position, share)
            # records the source could not decode (a source of its own may return a
            # ReadResult made before `poison` existed: a plain 3-tuple)
            for poison in getattr(result, "poison", ()):
                if dead is None:
                    raise poison.error
                dead.add(spec.id, split, poison.ordinal, poison.record, poison.error)
            for b in result.batches:
                chunks.append((split, b))
                n = num_records(b)
                budget -= n
                records_in += n
            position = result.position
            finished = result.finished
            remaining: int | None = getattr(result, "behind", None)  # a plain 3-tuple has none
            if remaining is not None:
                behind[split] = remaining
                since: int | None = getattr(result, "unread_since", None)
                if since is not None:
                    unread_since[split] = since
        if et is not None and time is not None:
            stamped = et.stamp(
                [b for _, b in chunks[first:]],
                source=spec.id,
                split=split,
                position=start_positions[split],
            )
            # a record without a usable event time never reaches a window: it is a dead
            # letter, or its unit declines naming it (DESIGN §4 rule 15)
            for at, record, error in stamped.rejected:
                if dead is None:
                    raise error
                dead.add(spec.id, split, at, record, error)
            chunks[first:] = [(split, b) for b in stamped.batches]
            mark = advance_split(mark, stamped.stamps, et.bound_ms, time.now_ms)
        if time is not None and timed is None:
            origin = mark_of(marks_before[split])
            origins += [origin] * (len(chunks) - first)
            time.start[split] = origin
            time.end[split] = MAX_WATERMARK if finished else mark_of(mark)
        if finished:
            marks_done[split] = mark
            continue
        marks_after[split] = mark
        if et is not None and mark is not None:
            position = wrap_position(position, mark)
        kept.append(SplitState(split, position))
    if time is None:
        return SourceEpoch(chunks, None, tuple(kept), records_in, None, behind, unread_since)
    idle = et.idle_timeout_ms if et is not None else None
    idle = idle_timeout_ms if idle is None else idle
    if timed is not None:
        split = timed.split_of(index)
        if ended:
            before = after = MAX_WATERMARK
        else:
            end = next(k.position for k in kept if k.split_id == split)
            before, after = timed.watermarks(
                split, positions[split], end, exclude_after=exclude_after
            )
        time.start[split], time.end[split] = before, after
        time.key_split = split
    else:
        before = subtask_watermark(marks_before, now_ms=time.now_ms, idle_timeout_ms=idle)
        after = subtask_watermark(
            # no split left: the ones that finished now bound it this epoch (a subtask
            # reading one file per epoch advances with its files)
            marks_after or marks_done,
            now_ms=time.now_ms,
            ended=ended,
            idle_timeout_ms=idle,
        )
    return SourceEpoch(
        chunks, origins, tuple(kept), records_in, (before, after), behind, unread_since
    )


@dataclasses.dataclass
class UnitEpoch:
    """What one unit's epoch produced, by vertex id: the source subtasks' split states, the
    stateful operators' snapshots, each sink subtask's rows (chunks: Arrow batches or lists of
    records, converted by the task: `regional.sinks.rows`) and (for a `WatermarkSink`)
    the watermarks it commits; the counts and the seconds spent restoring and encoding."""

    split_states: dict[str, tuple[SplitState, ...]] = dataclasses.field(default_factory=dict)
    snapshots: dict[str, bytes] = dataclasses.field(default_factory=dict)
    #: the operator states the snapshots encode, as the epoch left them (kept hot: DESIGN §6)
    states: dict[str, OperatorState] = dataclasses.field(default_factory=dict)
    sink_batches: dict[str, list[Batch]] = dataclasses.field(default_factory=dict)
    sink_watermarks: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    records_in: int = 0
    #: of `records_in`, those read from a keyed exchange (its reader: a `TimedSource`), not
    #: from the job's input
    records_exchanged: int = 0
    records_out: int = 0
    #: per operator vertex: [records in, records out, records judged late] (issue 45: the
    #: per-operator metrics), and its dead letters by error type
    operators: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    dead_letter_types: dict[str, int] = dataclasses.field(default_factory=dict)
    #: per source vertex and split read: the records behind its end (consumer lag)
    behind: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    #: of those, when the oldest unread record was appended (ms), where the source says
    unread_since: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    dead_lettered: int = 0
    late: int = 0
    watermark: int | None = None  # the unit's subtask watermark after the epoch
    restore_s: float = 0.0
    encode_s: float = 0.0


def start_of(
    spec: PlannedVertex, old: SubtaskState, new_splits: Iterable[tuple[str, int, str]]
) -> dict[str, bytes]:
    """Where source subtask `old` of `spec` reads this epoch: split -> wrapped position, its
    restored splits and the ones the enumerator assigned it now, `new_splits` (vertex, index,
    split), from their start; a `TimedSource` always reads its own split."""
    positions = {s.split_id: s.position for s in old.split_states}
    timed = spec.timed
    if timed is not None:
        positions.setdefault(timed.split_of(old.index), b"")
    for v, i, split in new_splits:
        if v == spec.id and i == old.index:
            positions.setdefault(split, b"")
    return positions


def sink_rows(
    sink: str, chunks: Iterable[tuple[str, Chunk]], dead: DeadLetters | None
) -> list[Batch]:
    """One sink subtask's rows from `chunks` ((input vertex, (split, data)) in order).

    Without dead letters, as the operators left them: the task turns lists of records into
    Arrow batches, once for all its units, and a unit whose rows do not make one table
    declines naming the field and both types (`regional.sinks.rows`); Arrow batches of
    columns that cannot be widened to one type decline it here, naming the vertex too. With
    dead letters, they are converted here, each list of records with the union of its
    records' fields (`records_batch`) and the unit's batches to one schema (`conformed`): a
    record whose field has a type the others' cannot share, and every row of a batch whose
    column cannot be widened to the others' type, become dead letters of the vertex that
    made them, naming the sink, the field and both types; the rows that fit go on."""
    where = f"sink {sink!r}"
    if dead is None:
        given = list(chunks)
        arrow = [(i, split, d) for i, (split, d) in given if isinstance(d, pa.RecordBatch)]
        _, refused = conformed([d for _, _, d in arrow], where, [repr(i) for i, _, _ in arrow])
        if refused:  # the unit declines, naming the vertex, the column and both types
            at, error = refused[0]
            raised_on(error, arrow[at][1])
            raise error
        return [d for _, (_, d) in given]
    batches: list[pa.RecordBatch] = []
    made: list[tuple[str, str, list[int] | int]] = []  # input, split, record indices or first
    seen: dict[tuple[str, str], int] = {}  # records of (input, split) before this chunk
    for input_id, (split, data) in chunks:
        base = seen.get((input_id, split), 0)
        seen[input_id, split] = base + num_records(data)
        if isinstance(data, pa.RecordBatch):
            batches.append(data)
            made.append((input_id, split, base))
            continue
        if not data:
            continue
        batch, rejected = records_batch(data, where)
        for r in rejected:
            dead.add(input_id, split, base + r.at, r.record, r.error)
        left_out = {r.at for r in rejected}
        batches.append(batch)
        made.append((input_id, split, [base + i for i in range(len(data)) if i not in left_out]))
    kept, refused_batches = conformed(batches, where, [repr(i) for i, _, _ in made])
    for at, error in refused_batches:
        input_id, split, indices = made[at]
        for n, record in enumerate(batches[at].to_pylist()):
            index = indices[n] if isinstance(indices, list) else indices + n
            dead.add(input_id, split, index, record, error)
    return list(kept)
