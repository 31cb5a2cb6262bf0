"""Where a durable keyed exchange keeps its segments, and how reader positions order them.

Pure, except `backlog_table` (the inspector's view), which lists the job root and reads the
footers of the segments not read yet.

A durable exchange (`regional.dataflow.exchange`) joins an upstream stage to a downstream stage of
`partitions` subtasks. Its files live in the job root, under the exchange's reader vertex:

```
exchange/<reader>/n<partitions>/p<partition>/<checkpoint:020d>-<writer:05d>.parquet
                                    committed segments (published by the commit of <checkpoint>)
exchange/<reader>/n<partitions>/p<partition>/<checkpoint:020d>-99999.parquet
                                    a moved backlog (`MOVED_WRITER`: a restore of <checkpoint>
                                    with another number of partitions wrote it)
exchange/<reader>/_staging/<job>/...staged     staged by writer subtasks, invisible to readers
exchange/<reader>/_commits/<user>/<group>/<checkpoint>.json      one record per commit
                                    (its segments, sizes and checksums: `metadata.commit_log`;
                                    readers read only recorded segments, verified first)
```

`n<partitions>` is the layout: the downstream parallelism the segments were partitioned for. A
reader subtask `q` of a stage of parallelism `n` reads split ``n<n>-p<q>``: the segments of
`n<n>/p<q>/` in name order, that is by (checkpoint, writer subtask). Its position (kept in its
split state, so a fallback re-reads from it) is a **cursor** ``(checkpoint, writer, row)``: every
segment before (checkpoint, writer) is consumed, and `row` rows of that one. One cursor per
partition is enough because segments become visible in that order: a checkpoint's segments are
published together by its commit, commits run in checkpoint order, and a commit publishes in
name order, so a reader never passes a segment that is published later.

>>> c = Cursor.decode(b"")
>>> c, c.encode()
(Cursor(checkpoint_id=0, writer=0, row=0), b'')
>>> c = Cursor(7, 2, 10); Cursor.decode(c.encode()) == c, c.encode()
(True, b'7:2:10')
>>> c.passed(SegmentName(7, 1)), c.passed(SegmentName(7, 2)), c.passed(SegmentName(8, 0))
(True, False, False)
>>> f = segment_of("exchange/by-customer/n4/p2/00000000000000000007-00001.parquet")
>>> f.reader, f.layout, f.partition, f.segment
('by-customer', 4, 2, SegmentName(checkpoint_id=7, writer=1))
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple

import pyarrow as pa

from metadata.errors import MetadataError
from metadata.model import CheckpointMetadata

if TYPE_CHECKING:
    from metadata.storage import JobStorage

__all__ = [
    "BACKLOG_SCHEMA",
    "EXCHANGE_DIR",
    "MOVED_KEY",
    "MOVED_WRITER",
    "WRITERS_KEY",
    "Cursor",
    "ExchangeFile",
    "ReaderView",
    "SegmentName",
    "backlog_table",
    "first_published",
    "kept_by",
    "moved_from",
    "moved_runs",
    "reader_view",
    "segment_name",
    "segment_of",
    "segment_path",
    "split_id",
    "split_partition",
]

#: The directory of every exchange of a job, in the job root.
EXCHANGE_DIR = "exchange"
_SEGMENT = re.compile(r"(\d{20})-(\d{5})\.parquet")
_SPLIT = re.compile(r"n([1-9]\d*)-p(\d+)")
_LAYOUT = re.compile(r"n([1-9]\d*)")
_PARTITION = re.compile(r"p(\d+)")


#: The Parquet metadata key of a merged segment's writer subtasks and their rows, in file order
#: (``<writer>:<rows>,...``; `regional.dataflow.exchange.ExchangeWriter.write_merged`).
WRITERS_KEY = b"regional.writers"


#: The writer number in the name of a *moved backlog*: the one segment per partition a restore
#: with another number of partitions writes (``<checkpoint>-99999``, after every writer
#: subtask's segment of that checkpoint: parallelism is at most 32768). New readers start at
#: ``Cursor(checkpoint, MOVED_WRITER)``.
MOVED_WRITER = 99_999
#: The Parquet metadata key of a moved backlog: the segment each run of its rows was first
#: published in, in file order (``<checkpoint>:<writer>:<rows>,...``; `moved_runs`).
MOVED_KEY = b"regional.moved_from"


def moved_runs(first_published: Sequence[SegmentName]) -> bytes:
    """`MOVED_KEY`'s value for a moved backlog whose rows were first published in
    `first_published` (one per row, in file order).

    >>> moved_runs([SegmentName(3, 0), SegmentName(3, 0), SegmentName(4, 2)])
    b'3:0:2,4:2:1'
    """
    runs = [(s, sum(1 for _ in group)) for s, group in itertools.groupby(first_published)]
    return ",".join(f"{s.checkpoint_id}:{s.writer}:{n}" for s, n in runs).encode()


def moved_from(
    metadata: Mapping[bytes, bytes] | None, num_rows: int
) -> list[tuple[SegmentName, int]] | None:
    """The runs (segment first published in, rows) of a moved backlog's rows, in file order,
    from its Parquet `metadata` (`MOVED_KEY`); None when its footer does not say, or says
    something that does not add up to its `num_rows`.

    >>> moved_from({MOVED_KEY: b"3:0:2,4:2:1"}, 3)
    [(SegmentName(checkpoint_id=3, writer=0), 2), (SegmentName(checkpoint_id=4, writer=2), 1)]
    >>> moved_from({MOVED_KEY: b"3:0:2"}, 3) is None, moved_from({}, 0) is None
    (True, True)
    """
    listed = (metadata or {}).get(MOVED_KEY)
    if listed is None:
        return None
    try:
        runs = []
        for run in listed.decode().split(","):
            checkpoint_id, writer, rows = (int(x) for x in run.split(":"))
            runs.append((SegmentName(checkpoint_id, writer), rows))
    except (ValueError, UnicodeDecodeError):
        return None
    if any(n < 0 for _, n in runs) or sum(n for _, n in runs) != num_rows:
        return None
    return runs


def first_published(metadata: Mapping[bytes, bytes] | None, num_rows: int, row: int) -> SegmentName:
    """The segment row `row` of a moved backlog was first published in (`moved_from`). When
    the footer does not say, ``SegmentName(0, 0)``: earlier than any, so a reader's watermark
    counts no mark before the moved backlog is read whole (`metadata.watermarks.mark_reached`).

    >>> first_published({MOVED_KEY: b"3:0:2,4:2:1"}, 3, 2), first_published({}, 3, 0)
    (SegmentName(checkpoint_id=4, writer=2), SegmentName(checkpoint_id=0, writer=0))
    """
    end = 0
    for segment, rows in moved_from(metadata, num_rows) or ():
        end += rows
        if row < end:
            return segment
    return SegmentName(0, 0)


def writers_read(metadata: Mapping[bytes, bytes] | None, num_rows: int, row: int) -> frozenset[int]:
    """The writer subtasks whose rows a cursor at `row` of a merged segment (its Parquet
    `metadata` and `num_rows`) has all read: a reader's watermark counts their marks of the
    segment's checkpoint (`watermark`). None when the segment lists no writers, or the list
    does not add up to its rows (it was rewritten without a writer's rows when committed):
    then the marks count only once the segment is read whole, as for an unmerged one.

    >>> writers_read({WRITERS_KEY: b"0:2,2:0,3:4"}, 6, 2), writers_read({WRITERS_KEY: b"0:2"}, 1, 2)
    (frozenset({0, 2}), frozenset())
    """
    listed = (metadata or {}).get(WRITERS_KEY)
    if listed is None or row <= 0:
        return frozenset()
    try:
        counts = [(int(w), int(n)) for w, n in (x.split(":") for x in listed.decode().split(","))]
    except (ValueError, UnicodeDecodeError):
        return frozenset()
    if sum(n for _, n in counts) != num_rows:
        return frozenset()
    done = []
    end = 0
    for writer, n in counts:
        end += n
        if end > row:
            break
        done.append(writer)
    return frozenset(done)


class SegmentName(NamedTuple):
    """A committed segment: the checkpoint whose commit published it, the writer subtask."""

    checkpoint_id: int
    writer: int

    def file_name(self) -> str:
        return f"{self.checkpoint_id:020d}-{self.writer:05d}.parquet"


class ExchangeFile(NamedTuple):
    """A committed segment file of the job root, by its parts."""

    reader: str
    layout: int
    partition: int
    segment: SegmentName


class Cursor(NamedTuple):
    """A reader's position in one partition: segments before (checkpoint, writer) consumed,
    and `row` rows of that one. `Cursor()` is the start."""

    checkpoint_id: int = 0
    writer: int = 0
    row: int = 0

    def passed(self, segment: SegmentName) -> bool:
        """True when every row of `segment` is consumed (it sorts before the cursor)."""
        return (segment.checkpoint_id, segment.writer) < (self.checkpoint_id, self.writer)

    def first_row(self, segment: SegmentName) -> int:
        """The first row of `segment` not read yet (0 unless the cursor is inside it)."""
        return self.row if (segment.checkpoint_id, segment.writer) == self[:2] else 0

    def encode(self) -> bytes:
        return b"" if self == Cursor() else f"{self[0]}:{self[1]}:{self[2]}".encode()

    @classmethod
    def decode(cls, data: bytes, *, where: str = "a reader position") -> Cursor:
        """The cursor `data` encodes (b"": the start); `MetadataError` naming `where` unless it
        is three non-negative integers joined by ':'."""
        if not data:
            return cls()
        parts = data.split(b":")
        if len(parts) == 3 and all(p.isdigit() and len(p) <= 20 for p in parts):
            return cls(*(int(p) for p in parts))
        raise MetadataError(
            f"{where} is {data[:40]!r}, not an exchange cursor (<checkpoint>:<writer>:<row>); "
            "the checkpoint holding it is damaged or was written by another tool: restore "
            "another one"
        )


def segment_name(file_name: str) -> SegmentName | None:
    """The segment a committed segment's file name names, or None for any other name."""
    m = _SEGMENT.fullmatch(file_name)
    return SegmentName(int(m[1]), int(m[2])) if m else None


def split_id(layout: int, partition: int) -> str:
    """The split a reader subtask reads: partition `partition` of layout `layout`.

    >>> split_id(4, 2)
    'n4-p2'
    """
    return f"n{layout}-p{partition}"


def split_partition(split: str) -> tuple[int, int] | None:
    """(layout, partition) of an exchange split id, or None for any other string."""
    m = _SPLIT.fullmatch(split)
    return (int(m[1]), int(m[2])) if m else None


def segment_path(reader: str, layout: int, partition: int, segment: SegmentName) -> str:
    """A committed segment's path relative to the job root."""
    return f"{EXCHANGE_DIR}/{reader}/n{layout}/p{partition}/{segment.file_name()}"


def segment_of(path: str) -> ExchangeFile | None:
    """The parts of a committed segment's path (relative to the job root), or None when
    `path` is not one (staged files, commit records, anything else)."""
    parts = path.split("/")
    if len(parts) != 5 or parts[0] != EXCHANGE_DIR:
        return None
    layout, partition, name = (
        _LAYOUT.fullmatch(parts[2]),
        _PARTITION.fullmatch(parts[3]),
        _SEGMENT.fullmatch(parts[4]),
    )
    if not (layout and partition and name):
        return None
    return ExchangeFile(
        parts[1], int(layout[1]), int(partition[1]), SegmentName(int(name[1]), int(name[2]))
    )


class ReaderView(NamedTuple):
    """What one kept checkpoint says of one exchange reader: its layout (None: the checkpoint
    has no such reader) and its cursor per partition (a partition without one is at the start)."""

    checkpoint_id: int
    layout: int | None
    cursors: dict[int, Cursor]


def reader_view(md: CheckpointMetadata, reader: str) -> ReaderView:
    """The reader `reader`'s layout and cursors in checkpoint `md`; `MetadataError` for a
    position that is not a cursor."""
    info = next((v for v in md.vertices if v.vertex_id == reader), None)
    if info is None:
        return ReaderView(md.checkpoint_id, None, {})
    cursors: dict[int, Cursor] = {}
    for s in md.subtasks_of(reader):
        wanted = split_id(info.parallelism, s.index)
        for split in s.split_states:
            if split.split_id == wanted:
                where = (
                    f"the position of split {wanted!r} of exchange reader {reader!r} in "
                    f"checkpoint {md.checkpoint_id}"
                )
                cursors[s.index] = Cursor.decode(split.position, where=where)
    return ReaderView(md.checkpoint_id, info.parallelism, cursors)


def kept_by(file: ExchangeFile, views: Iterable[ReaderView]) -> list[int]:
    """The kept checkpoints (given by their `reader_view` of `file.reader`) that still need
    segment `file`: a restore from one of them reads it. A checkpoint whose reader has the
    file's layout needs it unless its cursor for the partition passed it. A checkpoint with
    another layout (or without the reader) needs the segments committed at or after its id
    only: those a restore from it would read (a rescale repartitions its backlog into them).

    >>> from metadata.model import SplitState, SubtaskState, VertexInfo
    >>> def md(cid, position):
    ...     return CheckpointMetadata(checkpoint_id=cid, job_id="j", kind="global",
    ...         trigger_time_ms=0, completion_time_ms=0, vertices=(VertexInfo("x", 2, 128),),
    ...         subtasks=(SubtaskState("x", 0, 0, split_states=(SplitState("n2-p0", position),)),
    ...                   SubtaskState("x", 1, 1)))
    >>> views = [reader_view(md(5, b"5:0:0"), "x"), reader_view(md(6, b"4:0:3"), "x")]
    >>> kept_by(segment_of("exchange/x/n2/p0/00000000000000000004-00000.parquet"), views)
    [6]
    >>> kept_by(segment_of("exchange/x/n2/p1/00000000000000000004-00000.parquet"), views[:1])
    [5]
    >>> kept_by(segment_of("exchange/x/n4/p1/00000000000000000004-00000.parquet"), views[:1])
    []
    """
    out = []
    for view in views:
        if view.layout != file.layout:
            if file.segment.checkpoint_id >= view.checkpoint_id:
                out.append(view.checkpoint_id)
        elif not view.cursors.get(file.partition, Cursor()).passed(file.segment):
            out.append(view.checkpoint_id)
    return out


#: `regional inspect ROOT exchange`: one row per exchange partition of the newest checkpoint.
BACKLOG_SCHEMA = pa.schema(
    [
        pa.field("exchange", pa.string(), nullable=False),
        pa.field("partition", pa.int64(), nullable=False),
        pa.field("partitions", pa.int64(), nullable=False),
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("cursor", pa.string(), nullable=False),
        pa.field("segments", pa.int64(), nullable=False),
        pa.field("records", pa.int64(), nullable=False),
        pa.field("bytes", pa.int64(), nullable=False),
    ]
)


def backlog_table(storage: JobStorage, md: CheckpointMetadata) -> pa.Table:
    """Per partition of every exchange of checkpoint `md` (`BACKLOG_SCHEMA`): its reader's
    cursor there and the committed segments, records and bytes after it, i.e. what a restore
    from `md` would read. Lists `exchange/` and reads the footers of the backlog's segments."""
    import pyarrow.parquet as pq  # on first use: the rest of this module is pure

    by_partition: dict[tuple[str, int, int], list[tuple[SegmentName, str, int]]] = {}
    for f in storage.list_files():
        if (file := segment_of(f.path)) is not None:
            key = (file.reader, file.layout, file.partition)
            by_partition.setdefault(key, []).append((file.segment, f.path, f.size))
    rows = []
    for reader in sorted({r for r, _, _ in by_partition} | _readers(md)):
        view = reader_view(md, reader)
        if view.layout is None:
            continue
        for partition in range(view.layout):
            cursor = view.cursors.get(partition, Cursor())
            segments = records = size = 0
            for segment, path, length in sorted(
                by_partition.get((reader, view.layout, partition), [])
            ):
                if cursor.passed(segment):
                    continue
                data = storage.read_file(path) or b""
                rows_in = pq.read_metadata(pa.BufferReader(data)).num_rows
                records += rows_in - cursor.first_row(segment)
                segments, size = segments + 1, size + length
            rows.append(
                {
                    "exchange": reader,
                    "partition": partition,
                    "partitions": view.layout,
                    "checkpoint_id": md.checkpoint_id,
                    "cursor": cursor.encode().decode() or "start",
                    "segments": segments,
                    "records": records,
                    "bytes": size,
                }
            )
    return pa.Table.from_pylist(rows, schema=BACKLOG_SCHEMA)


def _readers(md: CheckpointMetadata) -> set[str]:
    """Vertices of `md` whose subtasks hold exchange splits."""
    return {
        s.vertex_id
        for s in md.subtasks
        if any(split_partition(x.split_id) is not None for x in s.split_states)
    }
