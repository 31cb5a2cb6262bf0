"""Where event-time watermarks live in a checkpoint, and how they are encoded (DESIGN §4 r. 15).

Pure: no file system. Watermarks are integers of **milliseconds since the Unix epoch**;
`MIN_WATERMARK` means "nothing known yet" and `MAX_WATERMARK` "no record will come again".

**Per split.** A source split read with event time keeps its watermark in its split state: the
split's position (`metadata.model.SplitState.position`, opaque bytes to the rest of the
metadata layer) is *wrapped* as ``MAGIC + watermark + last record's processing time + the
source's own position``. So the watermark falls back with the split's unit, moves with the
split on a rescale, and a source never sees the wrapper (`unwrap_position`).

>>> wrapped = wrap_position(b"17", SplitWatermark(1_000, 99))
>>> unwrap_position(wrapped)
(b'17', SplitWatermark(watermark=1000, last_record_ms=99))
>>> unwrap_position(b"17")  # a position written without event time
(b'17', None)

**Per exchange writer.** A writer subtask of a durable exchange commits, with the segments of
checkpoint Y, a *watermark mark* ``(Y, writer, watermark)`` named like its segments
(`mark_name`), in ``exchange/<reader>/_watermarks/``; see `regional.dataflow.exchange`.

>>> mark_name(7, 2, -5), parse_mark("00000000000000000007-00002.-5.wm")
('00000000000000000007-00002.-5.wm', WatermarkMark(checkpoint_id=7, writer=2, watermark=-5))
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from metadata.exchange import (
    EXCHANGE_DIR,
    MOVED_WRITER,
    Cursor,
    ReaderView,
    SegmentName,
    first_published,
    reader_view,
    segment_of,
    segment_path,
    split_partition,
    writers_read,
)
from metadata.model import CheckpointMetadata

if TYPE_CHECKING:
    from metadata.storage import JobStorage

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "WATERMARKS_SCHEMA",
    "WATERMARK_DIR",
    "SplitWatermark",
    "WatermarkMark",
    "format_watermark",
    "mark_kept_by",
    "mark_name",
    "mark_path_of",
    "mark_reached",
    "parse_mark",
    "reader_watermark",
    "released_writers",
    "unwrap_position",
    "watermarks_table",
    "wrap_position",
]

#: No record has been seen: nothing may be considered complete.
MIN_WATERMARK = -(2**63)
#: The input has ended: every window and event-time timer may fire.
MAX_WATERMARK = 2**63 - 1
#: Where an exchange's writers commit their watermark marks (under the exchange's directory).
WATERMARK_DIR = "_watermarks"

_MAGIC = b"\x00rwm1"  # no source position starts with a NUL byte
_HEAD = struct.Struct(">qq")
_MARK = re.compile(r"(\d{20})-(\d{5})\.(-?\d+)\.wm")


class SplitWatermark(NamedTuple):
    """A split's watermark, and when (processing time, ms) it last delivered a record (the
    idle-timeout's clock)."""

    watermark: int
    last_record_ms: int


def wrap_position(position: bytes, mark: SplitWatermark) -> bytes:
    """`position` with the split's watermark in front (see the module docstring)."""
    return _MAGIC + _HEAD.pack(*mark) + position


def unwrap_position(data: bytes) -> tuple[bytes, SplitWatermark | None]:
    """The source's position and the split's watermark (None when `data` has none)."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _HEAD.size:
        return data, None
    body = len(_MAGIC) + _HEAD.size
    return data[body:], SplitWatermark(*_HEAD.unpack(data[len(_MAGIC) : body]))


class WatermarkMark(NamedTuple):
    """Writer subtask `writer`'s watermark as committed by checkpoint `checkpoint_id`."""

    checkpoint_id: int
    writer: int
    watermark: int


def mark_name(checkpoint_id: int, writer: int, watermark: int) -> str:
    """The file name of a watermark mark (sorts like the segments of the same commit)."""
    return f"{checkpoint_id:020d}-{writer:05d}.{watermark}.wm"


def parse_mark(name: str) -> WatermarkMark | None:
    """The mark a file name names, or None for any other name."""
    m = _MARK.fullmatch(name)
    return WatermarkMark(int(m[1]), int(m[2]), int(m[3])) if m else None


def format_watermark(watermark: int | None) -> str:
    """A watermark for people: ISO-8601 UTC, or ``-inf`` / ``+inf`` / ``-``.

    >>> format_watermark(0), format_watermark(MIN_WATERMARK), format_watermark(None)
    ('1970-01-01T00:00:00.000Z', '-inf', '-')
    """
    import datetime as dt

    if watermark is None:
        return "-"
    if watermark <= MIN_WATERMARK:
        return "-inf"
    if watermark >= MAX_WATERMARK:
        return "+inf"
    try:
        t = dt.datetime.fromtimestamp(watermark / 1000, tz=dt.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{watermark} ms"
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def mark_reached(
    first: SegmentName | None,
    *,
    done: frozenset[int] = frozenset(),
    moved: SegmentName | None = None,
) -> Callable[[WatermarkMark], bool]:
    """Whether a reader of one partition has reached a mark (Y, w), i.e. read every row writer
    subtask w wrote for the partition up to epoch Y, given `first`, the first segment it has
    not read whole (None: it read everything published); `done`, the writers whose rows of
    `first` it has all read (a merged segment, `metadata.exchange.writers_read`); and, when
    `first` is a moved backlog, `moved`, the segment its first unread row was first published
    in (`metadata.exchange.first_published`; None: unknown, so nothing counts).

    Writer w's rows of epoch Y' are all in ONE segment of the partition, its task's, named
    (Y', w0) after the task's lowest writer: w0 <= w, so w's rows up to epoch Y are in
    segments <= (Y, w).

    * Plain segments: the mark counts when (Y, w) < `first`, or `first` is of checkpoint Y and
      w is in `done`. While w's segment S = (Y, w0) is unread, `first` <= S <= (Y, w), so only
      the second rule can count it, once w's rows of S are read; w's rows of earlier epochs
      are in segments before S.
    * A moved backlog M = (C, MOVED_WRITER), written by a restore of checkpoint C with another
      number of partitions, holds every row of this partition the old readers had not read,
      sorted by the segment each was first published in (`regional.dataflow.exchange.
      repartition`). The mark counts only when (Y, w) < `moved`: then every segment holding w's
      rows up to Y sorts before `moved`, so those of them in M precede the cursor (M is sorted)
      and the others were read by the old readers before C (M holds rows of checkpoints up to
      C, so Y <= C). w's rows written after C are in segments after M: their marks count by
      the first rule, once M is read whole.

    So a mark is never counted while one of its writer's rows is unread; it only may lag.

    >>> m = WatermarkMark(4, 1, 0)
    >>> mark_reached(SegmentName(5, 0))(m), mark_reached(SegmentName(4, 0))(m)
    (True, False)
    >>> mark_reached(SegmentName(4, 0), done=frozenset({1}))(m)
    True
    >>> moved = SegmentName(9, MOVED_WRITER)
    >>> [mark_reached(moved, moved=SegmentName(4, w))(m) for w in (2, 1)]
    [True, False]
    >>> mark_reached(moved)(WatermarkMark(1, 0, 0)), mark_reached(None)(m)
    (False, True)
    """
    if first is None:
        return lambda m: True
    if first.writer == MOVED_WRITER:
        bound = tuple(moved or SegmentName(0, 0))
        return lambda m: (m.checkpoint_id, m.writer) < bound
    return lambda m: (
        (m.checkpoint_id, m.writer) < tuple(first)
        or (m.checkpoint_id == first.checkpoint_id and m.writer in done)
    )


def reader_watermark(
    marks: Iterable[WatermarkMark],
    writers: int,
    reached: Callable[[WatermarkMark], bool],
    released: Iterable[int] = (),
) -> int:
    """An exchange reader's watermark: over writer subtasks ``0 .. writers-1``, the minimum of
    each writer's highest committed mark the reader has `reached` (every segment up to it
    consumed); a writer with no reached mark holds it at -inf. Writers in `released`
    (the `exclude` policy) are left out unless all are.

    >>> m = [WatermarkMark(1, 0, 50), WatermarkMark(1, 1, 70), WatermarkMark(2, 0, 90)]
    >>> reader_watermark(m, 2, lambda k: True), reader_watermark(m, 3, lambda k: True)
    (70, -9223372036854775808)
    >>> reader_watermark(m, 2, lambda k: k.checkpoint_id < 2)
    50
    """
    best: dict[int, int] = {}
    for mark in marks:
        if mark.writer < writers and reached(mark):
            best[mark.writer] = max(best.get(mark.writer, MIN_WATERMARK), mark.watermark)
    out = set(released)
    values = [best.get(w, MIN_WATERMARK) for w in range(writers) if w not in out]
    if not values:
        values = [best.get(w, MIN_WATERMARK) for w in range(writers)]
    return min(values, default=MIN_WATERMARK)


def released_writers(
    marks: Iterable[WatermarkMark], writers: int, exclude_after: int | None
) -> set[int]:
    """The writers the `exclude` policy releases: those without a mark in the last
    `exclude_after` (or more) checkpoints in which some writer committed one, i.e. that fell
    back that many checkpoints in a row. None (the default `hold`): none.

    >>> m = [WatermarkMark(c, 0, c) for c in (1, 2, 3, 4)] + [WatermarkMark(1, 1, 0)]
    >>> released_writers(m, 2, 3), released_writers(m, 2, 4), released_writers(m, 2, None)
    ({1}, set(), set())
    """
    if exclude_after is None:
        return set()
    marks = list(marks)
    checkpoints = sorted({m.checkpoint_id for m in marks})
    last: dict[int, int] = {}
    for m in marks:
        last[m.writer] = max(last.get(m.writer, 0), m.checkpoint_id)
    return {
        w
        for w in range(writers)
        if sum(1 for c in checkpoints if c > last.get(w, 0)) >= exclude_after
    }


#: `regional inspect ROOT watermarks`: per source split read with event time and per exchange
#: partition, the watermark in the newest checkpoint and what holds it back.
WATERMARKS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # "split" or "exchange"
        pa.field("vertex", pa.string(), nullable=False),
        pa.field("subtask", pa.int64(), nullable=False),
        pa.field("unit", pa.int64(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("watermark_ms", pa.int64(), nullable=False),
        pa.field("watermark", pa.string(), nullable=False),
        pa.field("held_by", pa.string(), nullable=False),
    ]
)


def _fell_back(md: CheckpointMetadata, vertex: str, index: int) -> tuple[int, int | None]:
    """(unit, owner checkpoint or None when fresh) of subtask (vertex, index) in `md`."""
    for s in md.subtasks_of(vertex):
        if s.index == index:
            return s.unit_id, s.ref_checkpoint_id
    return -1, None


def watermarks_table(
    storage: JobStorage,
    md: CheckpointMetadata,
    earlier: Sequence[CheckpointMetadata] = (),
    last_assigned: Mapping[tuple[str, int], Sequence[str]] | None = None,
) -> pa.Table:
    """The watermarks of checkpoint `md` (`WATERMARKS_SCHEMA`): one row per source split read
    with event time (its watermark, in its split state) and one per partition of every keyed
    exchange (its reader's watermark at its cursor: the minimum over the writer subtasks of
    the highest mark the cursor reached, DESIGN §4 rule 15). `held_by` names what holds it: a
    unit that fell back (and since when), or the writer subtasks at the minimum. Lists
    `exchange/` (segments and marks); reads only the footer of a merged segment a cursor is
    inside (`metadata.exchange.writers_read`). A source subtask whose splits all finished
    (a final checkpoint holds none) gets a row per split it read last with event time, from
    the newest of the `earlier` checkpoints that held it: watermark +inf, and `held_by`
    saying so with the split's last watermark. One whose splits left every earlier checkpoint
    gets a row per split in `last_assigned` ((source vertex, subtask index) -> the splits its
    enumerator gave it last; the caller passes it for a job that reads with event time), at
    +inf, `held_by` saying its last watermark is no longer recorded."""
    rows: list[dict[str, object]] = []
    cid = md.checkpoint_id

    def row(kind: str, vertex: str, index: int, unit: int, split: str, wm: int, held: str) -> None:
        rows.append(
            {
                "checkpoint_id": cid,
                "kind": kind,
                "vertex": vertex,
                "subtask": index,
                "unit": unit,
                "split": split,
                "watermark_ms": wm,
                "watermark": format_watermark(wm),
                "held_by": held,
            }
        )

    readers = {r for r in _exchange_readers(md)}
    for s in md.subtasks:
        if s.vertex_id in readers:
            continue
        for split in s.split_states:
            _, mark = unwrap_position(split.position)
            if mark is None:
                continue
            behind = (
                f"unit {s.unit_id} fell back: its state is from checkpoint {s.ref_checkpoint_id}"
                if s.ref_checkpoint_id is not None
                else ""
            )
            row("split", s.vertex_id, s.index, s.unit_id, split.split_id, mark.watermark, behind)
    idle = {
        (s.vertex_id, s.index): s.unit_id
        for s in md.subtasks
        if s.vertex_id not in readers and not s.split_states
    }
    for old in sorted(earlier, key=lambda c: -c.checkpoint_id):
        if not idle:
            break
        for s in old.subtasks:
            unit = idle.get((s.vertex_id, s.index))
            marked = [
                (split.split_id, mark)
                for split in s.split_states
                if (mark := unwrap_position(split.position)[1]) is not None
            ]
            if unit is None or not marked:
                continue
            del idle[s.vertex_id, s.index]
            for split_id, mark in marked:
                row("split", s.vertex_id, s.index, unit, split_id, MAX_WATERMARK,
                    f"finished: its last watermark was {format_watermark(mark.watermark)} "
                    f"(checkpoint {old.checkpoint_id})")  # fmt: skip
    oldest = min((c.checkpoint_id for c in earlier), default=cid)
    for (vertex, index), unit in idle.items():
        for split_id in (last_assigned or {}).get((vertex, index), ()):
            row("split", vertex, index, unit, split_id, MAX_WATERMARK,
                f"finished before checkpoint {oldest}, the oldest kept: its last watermark is "
                "no longer recorded")  # fmt: skip
    if not readers:
        return pa.Table.from_pylist(rows, schema=WATERMARKS_SCHEMA)
    segments: dict[tuple[str, int, int], list[SegmentName]] = {}
    marks: dict[str, list[WatermarkMark]] = {}
    for f in storage.list_files():
        if (file := segment_of(f.path)) is not None:
            segments.setdefault((file.reader, file.layout, file.partition), []).append(file.segment)
            continue
        parts = f.path.split("/")
        if (
            len(parts) == 4
            and parts[0] == EXCHANGE_DIR
            and parts[2] == WATERMARK_DIR
            and (m := parse_mark(parts[3])) is not None
            and m.checkpoint_id <= cid
        ):
            marks.setdefault(parts[1], []).append(m)
    parallelism = {v.vertex_id: v.parallelism for v in md.vertices}
    for reader in sorted(readers):
        view = reader_view(md, reader)
        if view.layout is None:
            continue
        writer_vertex = f"{reader}-writer"
        known = marks.get(reader, [])
        writers = parallelism.get(writer_vertex, max((m.writer for m in known), default=-1) + 1)
        for q in range(view.layout):
            cursor = view.cursors.get(q, Cursor())
            unread = [s for s in segments.get((reader, view.layout, q), []) if not cursor.passed(s)]
            first = min(unread, default=None)
            counts = _reached(storage, reader, view.layout, q, first, cursor)
            reached = [m for m in known if counts(m)]
            wm = reader_watermark(reached, writers, lambda m: True)
            best: dict[int, WatermarkMark] = {}
            for m in reached:
                if m.writer not in best or m.watermark >= best[m.writer].watermark:
                    best[m.writer] = m
            held: list[str] = []
            for w in range(writers):
                if (best[w].watermark if w in best else MIN_WATERMARK) != wm:
                    continue
                unit, owner = _fell_back(md, writer_vertex, w)
                who = f"writer {w} (unit {unit})" if unit >= 0 else f"writer {w}"
                if owner is not None:
                    held.append(f"{who}: fell back since checkpoint {owner + 1}")
                elif w not in best:
                    held.append(f"{who}: no watermark committed yet")
                else:
                    held.append(f"{who}: slowest, as of checkpoint {best[w].checkpoint_id}")
            unit, _ = _fell_back(md, reader, q)
            text = "" if wm >= MAX_WATERMARK else "; ".join(held)
            row("exchange", reader, q, unit, f"n{view.layout}-p{q}", wm, text)
    return pa.Table.from_pylist(rows, schema=WATERMARKS_SCHEMA)


def _reached(
    storage: JobStorage,
    reader: str,
    layout: int,
    partition: int,
    first: SegmentName | None,
    cursor: Cursor,
) -> Callable[[WatermarkMark], bool]:
    """`mark_reached` for a reader of `partition` at `cursor` whose first unread segment is
    `first`; reads that segment's footer only when the cursor is inside it or it is a moved
    backlog (`metadata.exchange.writers_read`, `metadata.exchange.first_published`)."""
    row = 0 if first is None else cursor.first_row(first)
    if first is None or (row <= 0 and first.writer != MOVED_WRITER):
        return mark_reached(first)
    import pyarrow.parquet as pq  # on first use, as `metadata.exchange.backlog_table`

    data = storage.read_file(segment_path(reader, layout, partition, first))
    if data is None:
        return mark_reached(first)
    footer = pq.read_metadata(pa.BufferReader(data))
    if first.writer == MOVED_WRITER:
        return mark_reached(first, moved=first_published(footer.metadata, footer.num_rows, row))
    return mark_reached(first, done=writers_read(footer.metadata, footer.num_rows, row))


def _exchange_readers(md: CheckpointMetadata) -> set[str]:
    return {
        s.vertex_id
        for s in md.subtasks
        if any(split_partition(x.split_id) is not None for x in s.split_states)
    }


def mark_path_of(path: str) -> tuple[str, WatermarkMark] | None:
    """(reader, mark) of a committed watermark mark's path (relative to the job root), or None.

    >>> mark_path_of("exchange/by-user/_watermarks/00000000000000000007-00002.-5.wm")
    ('by-user', WatermarkMark(checkpoint_id=7, writer=2, watermark=-5))
    """
    parts = path.split("/")
    if len(parts) != 4 or parts[0] != EXCHANGE_DIR or parts[2] != WATERMARK_DIR:
        return None
    mark = parse_mark(parts[3])
    return None if mark is None else (parts[1], mark)


def mark_kept_by(
    mark: WatermarkMark,
    views: Iterable[ReaderView],
    segments: Callable[[int, int], Iterable[SegmentName]],
    marks: Iterable[WatermarkMark],
) -> list[int]:
    """The kept checkpoints (their `reader_view`s of the mark's exchange) that may still need
    watermark `mark`: a restore from one of them computes a watermark from it. It is needed
    unless, in every partition of the checkpoint's layout, the checkpoint's cursor reached a
    later mark of the same writer (marks of one writer only grow: the later one supersedes
    it). `segments(layout, partition)` lists a partition's committed segments; `marks` are the
    exchange's marks. A checkpoint without the reader keeps every mark.

    >>> from metadata.exchange import Cursor, ReaderView
    >>> marks = [WatermarkMark(1, 0, 10), WatermarkMark(2, 0, 20), WatermarkMark(3, 0, 30)]
    >>> view = ReaderView(5, 1, {0: Cursor(3, 0, 0)})  # read everything before checkpoint 3
    >>> seg = lambda layout, q: [SegmentName(3, 0)]
    >>> [mark_kept_by(m, [view], seg, marks) for m in marks]
    [[], [5], [5]]
    """
    later = sorted(
        m.checkpoint_id
        for m in marks
        if m.writer == mark.writer and m.checkpoint_id > mark.checkpoint_id
    )
    out = []
    for view in views:
        if view.layout is None or not later:
            out.append(view.checkpoint_id)
            continue
        for q in range(view.layout):
            cursor = view.cursors.get(q, Cursor())
            unread = [s for s in segments(view.layout, q) if not cursor.passed(s)]
            # a moved backlog not read whole keeps every mark (its footer is not read here)
            reached = mark_reached(min(unread, default=None))
            if not reached(WatermarkMark(later[0], mark.writer, mark.watermark)):
                out.append(view.checkpoint_id)
                break
    return out
