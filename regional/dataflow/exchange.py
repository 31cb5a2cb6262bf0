"""A durable keyed exchange: per-key state across a shuffle; each side still falls back on its own.

`stream.key_by(key, partitions=N)` (or `stream.exchange(key, partitions=N)`) ends a stage. The
upstream stage's last vertex feeds an `ExchangeWriter` (a sink of its stage); the downstream
stage starts with an `ExchangeReader` of N subtasks (a source of its stage), reader subtask `q`
owning the keys with `partition_of(key, N) == q` (`regional.dataflow.partitioning`, a stable hash).

    upstream unit i:   source#i -> ... -> writer#i ──┐ segments, committed with checkpoint Y
                                                     ├──> exchange/<reader>/n<N>/p<q>/...
    downstream unit q: reader#q -> process#q -> sink#q  <──┘ read back from reader#q's cursor

* **Write.** In epoch Y, writer subtask `w` stages its records as one Parquet segment per
  partition (`exchange/<reader>/_staging/<job>/`); the segments are its committables. Once
  checkpoint Y's metadata is durable, the commit coordinator publishes them as
  `n<N>/p<q>/<Y>-<w>.parquet` (through `regional.sinks.staging.StagingArea`: the commit log,
  idempotent publish, rollback and staged-file cleaning it shares with the Parquet sink). A
  writer unit that fails Y commits nothing for Y: it falls back and writes the same records
  again later.
* **Merged per task** (DESIGN §4 rule 16). A Spark task stages its writer subtasks' records
  together (`ExchangeWriter.write_merged`): one segment per partition per task per epoch, the
  writers' rows in writer order, named after the task's lowest writer w0 (published as
  ``<Y>-<w0>``: unique, since a writer subtask runs in one task per epoch), so the layout,
  cursors, retention and repartitioning are those of unmerged segments. Each writer's
  committables name its rows of each segment (`regional.sinks.staging.StagedFile` parts): a
  writer declared fallen back after staging is cut out of the segment by the commit, and a
  restore reads only the committed writers' rows of a segment not published yet. The footer
  lists the writers and their rows (`metadata.exchange.WRITERS_KEY`) for the reader's
  watermark (`ExchangeReader.reached`), and rows of writers with different watermarks carry
  their own origin watermark (`ORIGIN_COLUMN`).
* **Read.** Reader subtask `q` reads the published segments of `n<N>/p<q>/` after its cursor
  (`metadata.exchange.Cursor`), kept in its split state: a reader that falls back re-reads from
  its last good cursor, and a segment is read exactly once per completed checkpoint chain. Data
  crosses the exchange one epoch after it was written (published at the end of epoch Y, read in
  epoch Y+1).
* **Regions.** Writer and reader are joined by a *durable* edge (`regional.graph.job_graph`): the
two
  stages are separate fallback units. A failing upstream unit never stops downstream units from
  checkpointing, and the other way round.
* **Watermarks** (DESIGN §4 rule 15). With event time, writer subtask `w` also stages, every
  epoch Y, a *watermark mark* ``(Y, w, watermark)`` (`metadata.watermarks`), published by the
  same commit after its segments as ``_watermarks/<Y>-<w>.<watermark>.wm``; each segment
  carries in its Parquet metadata the writer's watermark *before* the epoch (the records'
  origin watermark, `regional.dataflow.epoch_time`). A reader's watermark is the minimum over
  the writers of the highest mark its cursor has reached (`watermark`): a writer that fell
  back commits no mark, so it holds the downstream watermark where its committed data is.
* **Retention.** A segment is garbage once no kept checkpoint's cursor still needs it
  (`metadata.exchange.kept_by`, applied by the cleaner).
* **Rescale.** Restoring with another number of partitions repartitions the backlog the
  restored checkpoint had not read yet into the new layout (`repartition`, on the driver,
  deterministic and idempotent: one moved backlog per partition, keeping each record's origin
  watermark and, in its footer, the segment it was first published in), and keyed state moves
  by key hash.
* **Fresh start.** A job root without a checkpoint to restore has no reader cursors, so its old
  segments (of an earlier run) are deleted before the first epoch (`ExchangeWriter.reset`).

Records crossing an exchange must be Arrow rows (dicts), like records written to a sink.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import posixpath
import re
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.commit_log import CommitRecord, FileCheck
from metadata.errors import MetadataError, OutsideRootError
from metadata.exchange import (
    EXCHANGE_DIR,
    MOVED_KEY,
    MOVED_WRITER,
    WRITERS_KEY,
    Cursor,
    SegmentName,
    first_published,
    moved_from,
    moved_runs,
    segment_name,
    split_id,
    split_partition,
    writers_read,
)
from metadata.format import segment_checksum
from metadata.model import SinkRetention
from metadata.watermarks import (
    MIN_WATERMARK,
    WATERMARK_DIR,
    WatermarkMark,
    mark_name,
    mark_reached,
    parse_mark,
)
from regional.dataflow.columnar_aggregates import groupable
from regional.dataflow.event_time import reader_watermark, released_writers
from regional.dataflow.exchange_reads import confined_listing
from regional.dataflow.exchange_reads import records as committed_records
from regional.dataflow.partitioning import Placement
from regional.errors import CommitError, GraphError
from regional.sinks.base import WriteContext
from regional.sinks.merging import FilePart, kept_ranges, take_ranges
from regional.sinks.rows import conformed
from regional.sinks.staging import StagedFile, StagedSink, StagingArea
from regional.sinks.staging import file_name as _name
from regional.sources.base import ReadResult

__all__ = [
    "ORIGIN_COLUMN",
    "ORIGIN_KEY",
    "REPARTITION_USER",
    "WRITERS_KEY",
    "Backlog",
    "ExchangeReader",
    "ExchangeWriter",
    "WatermarkView",
    "exchange_path",
    "repartition",
]

#: The commit user of the records a restore writes for the segments it repartitions.
REPARTITION_USER = "_repartition"

_STAGED_NAME = re.compile(r"n(\d+)-p(\d+)-c(\d{20})-w(\d{5})-.*\.staged")
_STAGED_MARK = re.compile(r"wm-c(\d{20})-w(\d{5})-(-?\d+)-.*\.staged")
#: The Parquet metadata key of a segment's origin watermark (the writer's, before its epoch;
#: of a merged segment, the lowest of its writers').
ORIGIN_KEY = b"regional.origin_watermark"
#: The column of each row's origin watermark in a merged segment whose writers had different
#: watermarks before the epoch (readers drop it: records never carry it).
ORIGIN_COLUMN = "__regional_origin_watermark__"


class _StagedName(NamedTuple):
    """What a staged file's name says: where it is published (relative to the exchange
    directory; None: not a name the exchange stages) and its place in publish order."""

    published: str | None
    order: tuple[int, int, int]


@functools.lru_cache(maxsize=1 << 16)
def _staged_name(name: str) -> _StagedName:
    """`_StagedName` of a staged file's base name (parsed once: a commit, its published
    paths and its order all ask, per staged file)."""
    if (mark := _STAGED_MARK.fullmatch(name)) is not None:
        y, w, wm = int(mark[1]), int(mark[2]), int(mark[3])
        return _StagedName(f"{WATERMARK_DIR}/{mark_name(y, w, wm)}", (y, w, 1))
    if (m := _STAGED_NAME.fullmatch(name)) is not None:
        segment = SegmentName(int(m[3]), int(m[4]))
        published = f"n{int(m[1])}/p{int(m[2])}/{segment.file_name()}"
        return _StagedName(published, (segment.checkpoint_id, segment.writer, 0))
    return _StagedName(None, (0, 0, 0))


class WatermarkView(NamedTuple):
    """A reader subtask's watermark at a cursor, and what holds it: the writer subtasks at the
    minimum, the checkpoint of their last reached mark (None: none yet), and the writers the
    `exclude` policy released."""

    watermark: int
    holders: tuple[int, ...]
    held_since: int | None
    released: tuple[int, ...]


def exchange_path(job_path: str, reader: str) -> str:
    """The directory of exchange `reader` under a job root."""
    return f"{job_path.rstrip('/')}/{EXCHANGE_DIR}/{reader}"


class Backlog(NamedTuple):
    """What a partition holds that its reader has not consumed: committed segments (the one
    the cursor is inside counted whole), records and bytes."""

    segments: int
    records: int
    bytes: int


def _records(table: pa.Table) -> pa.Table:
    """A segment's rows without the origin column of a merged segment (`ORIGIN_COLUMN`)."""
    if ORIGIN_COLUMN in table.column_names:
        return table.drop_columns([ORIGIN_COLUMN])
    return table


def _origin_runs(table: pa.Table, start: int, rows: int, origin: int) -> list[tuple[int, int, int]]:
    """Rows `start` .. `start + rows - 1` of a segment as runs (first row, rows, origin
    watermark) of one origin each: the segment's `origin` for all of them, unless the segment
    has an origin column (a merged segment of writers with different watermarks)."""
    if ORIGIN_COLUMN not in table.column_names:
        return [(start, rows, origin)]
    column = table.column(ORIGIN_COLUMN).slice(start, rows)
    if not rows:
        return []
    # runs of equal values, nulls (the segment's origin) a value of their own, in numpy
    values = np.asarray(column.fill_null(0), dtype=np.int64)
    nulls = np.asarray(column.is_null(), dtype=bool)
    changed = np.flatnonzero((values[1:] != values[:-1]) | (nulls[1:] != nulls[:-1])) + 1
    firsts = [0, *changed.tolist()]
    ends = [*changed.tolist(), rows]
    return [
        (start + a, b - a, origin if nulls[a] else int(values[a]))
        for a, b in zip(firsts, ends, strict=True)
    ]


class _Unread(NamedTuple):
    """A segment a restore reads: from `first_row` of the file at `path` (full), published
    as `published` (relative to the exchange directory); of a merged staged segment of which
    the checkpoint holds only some parts, just the `keep` ranges ((first row, rows) each)."""

    segment: SegmentName
    first_row: int
    path: str
    published: str
    keep: tuple[tuple[int, int], ...] | None = None

    def rows(self, fs: pafs.FileSystem) -> pa.Table:
        """The rows of the segment a restore reads."""
        table = pq.read_table(self.path, filesystem=fs)
        return table.slice(self.first_row) if self.keep is None else take_ranges(table, self.keep)

    def provenance(
        self, fs: pafs.FileSystem
    ) -> tuple[list[Any], list[SegmentName], list[int | None]]:
        """The records a restore reads of this segment, and for each the segment it was first
        published in (this one; of a moved backlog, the one its footer names for the row,
        ``SegmentName(0, 0)`` when it does not say: `metadata.exchange.first_published`) and
        its origin watermark (the row's `ORIGIN_COLUMN` value, else the segment's
        `ORIGIN_KEY`; None: written without event time)."""
        table = pq.read_table(self.path, filesystem=fs)
        n = table.num_rows
        meta = table.schema.metadata or {}
        if self.segment.writer == MOVED_WRITER:
            runs = moved_from(meta, n) or [(SegmentName(0, 0), n)]
            published = [s for s, rows in runs for _ in range(rows)]
        else:
            published = [self.segment] * n
        default = int(meta[ORIGIN_KEY]) if ORIGIN_KEY in meta else None
        origins: list[int | None] = [default] * n
        if ORIGIN_COLUMN in table.column_names:
            column = table.column(ORIGIN_COLUMN).to_pylist()
            origins = [default if v is None else int(v) for v in column]
        ranges = ((self.first_row, n - self.first_row),) if self.keep is None else self.keep
        taken = [i for first, rows in ranges for i in range(first, first + rows)]
        records = _records(table).take(pa.array(taken, pa.int64())).to_pylist()
        return records, [published[i] for i in taken], [origins[i] for i in taken]


def _job_root(base: str) -> tuple[str, str]:
    """The directory an exchange at `base` (`<job root>/exchange/<reader>`) is confined to."""
    return posixpath.dirname(posixpath.dirname(base)), "job root"


class _Bound:
    """The exchange directory, set by the driver (`bind`) before any task runs."""

    reader: str
    path: str
    _filesystem: pafs.FileSystem | None

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        if not getattr(self, "path", ""):
            raise GraphError(
                f"exchange {self.reader!r} is not bound to a job root; run the pipeline "
                "through JobDriver (regional run), which binds it (Pipeline.bind)"
            )
        if self._filesystem is not None:
            return self._filesystem, self.path.rstrip("/")
        if "://" in self.path:
            return pafs.FileSystem.from_uri(self.path)
        return pafs.LocalFileSystem(), self.path.rstrip("/")

    def _segments(
        self, layout: int, partition: int, *, after: Cursor | None = None
    ) -> list[tuple[SegmentName, pafs.FileInfo]]:
        """The published segments of one partition, in cursor order; with `after`, only those
        a reader at that cursor has not passed (the others are never looked at: the cleaner may
        be deleting them, and they cost a `stat` each). A segment that goes between the listing
        and its `stat` is left out: the cleaner deletes only segments every retained cursor has
        passed, and one a reader still needs is named missing from its commit record
        (`committed`). On a local disk the partition directory is resolved once (once per task
        for its parents: `regional.dataflow.exchange_reads.confined_listing`) and, of its
        segments, only symbolic links are: none leads out of the job root."""
        fs, base = self._fs()
        directory = f"{base}/n{layout}/p{partition}"
        out = []
        if isinstance(fs, pafs.LocalFileSystem):
            root, what = _job_root(base)
            rel = directory[len(root) + 1 :] if directory.startswith(root + "/") else ""
            try:
                entries = confined_listing(
                    root,
                    rel,
                    lambda e: segment_name(e.name) is not None and e.is_file(),
                    what=what,
                    describe=lambda r: f"exchange {self.reader!r}: {root}/{r}",
                )
            except OutsideRootError as exc:
                raise CommitError(str(exc)) from None
            for entry in entries:
                segment = segment_name(entry.name)
                assert segment is not None
                if after is not None and after.passed(segment):
                    continue
                try:
                    size = entry.stat().st_size
                except FileNotFoundError:
                    continue
                out.append((segment, pafs.FileInfo(entry.path, pafs.FileType.File, size=size)))
        else:
            selector = pafs.FileSelector(directory, allow_not_found=True)
            for info in fs.get_file_info(selector):
                segment = segment_name(_name(info))
                if segment is None or info.type != pafs.FileType.File:
                    continue
                if after is None or not after.passed(segment):
                    out.append((segment, info))
        return sorted(out, key=lambda t: t[0])

    def committed(
        self, layout: int, partition: int, cursor: Cursor
    ) -> list[tuple[SegmentName, pafs.FileInfo, FileCheck]]:
        """The committed segments of one partition after `cursor`, in read order, each with
        what its commit record says (DESIGN §4 rule 14): the reader knows which segments were
        committed from the writer's commit records (`metadata.commit_log`) and checks each
        exists with its recorded size. A published segment whose record is not written yet
        (a commit in progress) ends the list. `CommitError` naming the segment when one is
        missing, resized, or published without a record before recorded ones. The records
        are decoded once per process and indexed by partition, and read once per task
        (`regional.dataflow.exchange_reads`), so a reader costs what its own partition holds,
        not what every partition does."""
        fs, base = self._fs()
        here = f"n{layout}/p{partition}"
        prefix = f"{here}/"
        # the records before the listing: a commit publishes its segments before it writes
        # its record, so every segment a record read here names is listed below, while one a
        # commit in progress published meanwhile has no record and ends the list (a pipelined
        # run's readers list while the previous epoch commits)
        try:
            records = committed_records(fs, base, since=cursor.checkpoint_id)
        except (MetadataError, OutsideRootError) as exc:
            raise CommitError(f"exchange {self.reader!r}: {exc}") from None
        listed = dict(self._segments(layout, partition, after=cursor))
        expected: dict[SegmentName, FileCheck] = {}
        for record in records:
            for file, recorded in record.expected_in(here).items():
                segment = segment_name(file)
                if segment is not None and not cursor.passed(segment):
                    expected[segment] = recorded
        newest = max(expected, default=None)
        out = []
        for segment in sorted(set(listed) | set(expected)):
            where = f"exchange {self.reader!r}: segment {base}/{prefix}{segment.file_name()}"
            check, info = expected.get(segment), listed.get(segment)
            if check is None:
                if newest is not None and segment < newest:
                    raise CommitError(
                        f"{where} has no commit record, though later segments have one: no "
                        "commit of this exchange wrote it (forged, or left by another tool); "
                        "remove it"
                    )
                break  # published by a commit that has not written its record yet
            if info is None:
                raise CommitError(
                    f"{where}, committed with checkpoint {check.identifier}, is missing (it "
                    "was deleted): its records would be lost. Put the file back, or restore a "
                    "checkpoint whose readers had read it; `regional inspect ROOT validate` "
                    "lists what is missing"
                )
            if check.size is not None and info.size != check.size:
                raise CommitError(
                    f"{where} has {info.size} bytes, its commit record (checkpoint "
                    f"{check.identifier}) says {check.size}: it was truncated or replaced. Put "
                    "the committed file back, or restore a checkpoint whose readers had read it"
                )
            out.append((segment, info, check))
        return out

    def read_segment(self, info: pafs.FileInfo, check: FileCheck) -> pa.Table:
        """A committed segment's rows, after its bytes matched the recorded checksum."""
        fs, _ = self._fs()
        with fs.open_input_file(info.path) as f:
            data = f.read()
        if check.checksum is not None and segment_checksum(data).hex() != check.checksum:
            raise CommitError(
                f"exchange {self.reader!r}: segment {info.path} fails the checksum its commit "
                f"record (checkpoint {check.identifier}) holds: it was damaged or replaced. "
                "Put the committed file back, or restore a checkpoint whose readers had read it"
            )
        return pq.ParquetFile(pa.BufferReader(data)).read(use_threads=False)


class ExchangeReader(_Bound):
    """The downstream side: a source whose subtask `q` reads partition `q` from its cursor.

    Its splits are fixed (``n<partitions>-p<q>`` for subtask q, `metadata.exchange.split_id`)
    and never finish: the driver decides when a bounded exchange is drained (`backlog`)."""

    def __init__(self, reader: str, partitions: int, *, bounded: bool, writers: int = 1) -> None:
        self.reader = reader
        self.partitions = partitions
        self._bounded = bounded
        self.writers = writers  # the writer subtasks upstream (watermarks)
        self.path = ""
        self._filesystem = None

    def bind(self, path: str, filesystem: pafs.FileSystem | None) -> None:
        self.path = path
        self._filesystem = filesystem

    @property
    def bounded(self) -> bool:
        """True when every source upstream of the exchange is bounded."""
        return self._bounded

    def discover(self) -> list[str]:
        return []  # splits are fixed per subtask (`split_of`), never handed out

    def split_of(self, index: int) -> str:
        """The split reader subtask `index` reads."""
        return split_id(self.partitions, index)

    def _split(self, split: str) -> tuple[int, int]:
        parts = split_partition(split)
        if parts is None:
            raise CommitError(
                f"exchange {self.reader!r}: split id {split!r} is not n<partitions>-p<partition>;"
                " split ids are restored from checkpoints, so that one was tampered with: "
                "restore another checkpoint"
            )
        return parts

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        """Up to `max_records` records of the partition after `position`, and the cursor
        after them (the split never finishes)."""
        return self.read_timed(split_id, position, max_records)[0]

    def read_timed(
        self, split_id: str, position: bytes, max_records: int
    ) -> tuple[ReadResult, list[int]]:
        """`read`, and the origin watermark of each batch (its segment's, from the segment's
        Parquet metadata; -inf for segments without one: a repartitioned backlog)."""
        layout, partition = self._split(split_id)
        cursor = Cursor.decode(position, where=f"the position of exchange split {split_id!r}")
        batches: list[pa.RecordBatch] = []
        origins: list[int] = []
        budget = max_records
        for segment, info, check in self.committed(layout, partition, cursor):
            if budget <= 0:
                break
            table = self.read_segment(info, check)
            meta = table.schema.metadata or {}
            origin = int(meta[ORIGIN_KEY]) if ORIGIN_KEY in meta else MIN_WATERMARK
            start = cursor.first_row(segment)
            taken = min(budget, table.num_rows - start)
            if taken > 0:
                records = _records(table)
                for first, rows, run_origin in _origin_runs(table, start, taken, origin):
                    got = [b for b in records.slice(first, rows).to_batches() if b.num_rows]
                    batches += got
                    origins += [run_origin] * len(got)
                budget -= taken
            if start + taken >= table.num_rows:
                cursor = Cursor(segment.checkpoint_id, segment.writer + 1, 0)
            else:
                cursor = Cursor(segment.checkpoint_id, segment.writer, start + taken)
        return ReadResult(batches, cursor.encode(), False), origins

    def marks(self) -> list[WatermarkMark]:
        """Every committed watermark mark of the exchange."""
        fs, base = self._fs()
        selector = pafs.FileSelector(f"{base}/{WATERMARK_DIR}", allow_not_found=True)
        return sorted(m for i in fs.get_file_info(selector) if (m := parse_mark(_name(i))))

    def watermark(
        self,
        split_id: str,
        position: bytes,
        marks: list[WatermarkMark],
        *,
        exclude_after: int | None = None,
    ) -> WatermarkView:
        """The watermark of the reader of `split_id` at cursor `position`: the minimum over the
        writers of their highest mark in `marks` whose segments of this partition the cursor
        has all consumed (`regional.dataflow.event_time.reader_watermark`). With
        `exclude_after`, a writer that committed no mark in the last that many checkpoints in
        which others did (it fell back that often in a row) is left out: the `exclude`
        policy, which can move the watermark back once the writer commits again (the window
        operator never fires below what it fired at)."""
        layout, partition = self._split(split_id)
        cursor = Cursor.decode(position, where=f"the position of exchange split {split_id!r}")
        reached = self.reached(layout, partition, cursor)
        seen = [m for m in marks if reached(m)]
        released = released_writers(marks, self.writers, exclude_after)
        wm = reader_watermark(seen, self.writers, lambda m: True, released)
        best: dict[int, WatermarkMark] = {}
        for m in seen:
            if m.writer < self.writers and (
                m.writer not in best or m.watermark >= best[m.writer].watermark
            ):
                best[m.writer] = m
        holders = tuple(
            w
            for w in range(self.writers)
            if w not in released and (best[w].watermark if w in best else MIN_WATERMARK) == wm
        )
        since = [best[w].checkpoint_id for w in holders if w in best]
        return WatermarkView(wm, holders, min(since, default=None), tuple(sorted(released)))

    def watermarks(
        self, split_id: str, start: bytes, end: bytes, *, exclude_after: int | None = None
    ) -> tuple[int, int]:
        """The reader subtask's watermark at cursors `start` and `end` of its split, one epoch
        apart (the one after never below the one before): `regional.sources.base.TimedSource`."""
        marks = self.marks()
        before = self.watermark(split_id, start, marks, exclude_after=exclude_after).watermark
        after = self.watermark(split_id, end, marks, exclude_after=exclude_after).watermark
        return before, max(before, after)

    def reached(
        self, layout: int, partition: int, cursor: Cursor
    ) -> Callable[[WatermarkMark], bool]:
        """Whether a reader of `partition` at `cursor` has reached a mark (Y, w): it has read
        every row writer subtask w wrote for the partition up to epoch Y
        (`metadata.watermarks.mark_reached`, which proves it, also through merged segments and
        a moved backlog). Reads the footer of the first unread segment only when the cursor
        is inside it (the writers whose rows of it are read, `metadata.exchange.writers_read`)
        or it is a moved backlog (where its first unread row was first published,
        `metadata.exchange.first_published`)."""
        unread = self._segments(layout, partition, after=cursor)
        if not unread:
            return mark_reached(None)
        first, info = unread[0]
        row = cursor.first_row(first)
        if row <= 0 and first.writer != MOVED_WRITER:
            return mark_reached(first)
        fs, _ = self._fs()
        footer = pq.read_metadata(info.path, filesystem=fs)
        if first.writer == MOVED_WRITER:
            return mark_reached(first, moved=first_published(footer.metadata, footer.num_rows, row))
        return mark_reached(first, done=writers_read(footer.metadata, footer.num_rows, row))

    def backlog(self, split_id: str, position: bytes) -> Backlog:
        """What partition `split_id` holds after `position` (reads Parquet footers only)."""
        layout, partition = self._split(split_id)
        cursor = Cursor.decode(position, where=f"the position of exchange split {split_id!r}")
        fs, _ = self._fs()
        segments = records = size = 0
        for segment, info, _ in self.committed(layout, partition, cursor):
            rows = pq.read_metadata(info.path, filesystem=fs).num_rows
            rows -= cursor.first_row(segment)
            segments, records, size = segments + 1, records + rows, size + (info.size or 0)
        return Backlog(segments, records, size)


class ExchangeWriter(_Bound, StagedSink):
    """The upstream side: a sink (`regional.sinks.base.Sink`) that stages one segment per
    partition per epoch (per writer subtask, or per task with `write_merged`) and publishes them
    with the checkpoint's commit (see the module docstring). Staging, publishing and the
    commit log are a `StagingArea` shared with the Parquet sink; the exchange decides where a
    segment is published and in which order."""

    def __init__(self, reader: str, key: Callable[[Any], Any], partitions: int) -> None:
        self.reader = reader
        self.key = key
        self.partitions = partitions
        self.path = ""
        self._filesystem = None
        self._placed: Placement | None = None
        #: One at a time, in (checkpoint, writer) order: a reader never passes a segment that
        #: an interrupted commit publishes later.
        self.area = StagingArea(
            f"exchange {reader!r}",
            self._fs,
            published=self._published,
            order=self._order,
            publish_threads=1,
            make_dirs=True,
            noun="exchange",
            confine_to=_job_root,
        )

    def bind(self, path: str, filesystem: pafs.FileSystem | None) -> None:
        self.path = path
        self._filesystem = filesystem
        self.area.forget()

    # --- writer side (in tasks): regional.sinks.base.SinkWriter -----------------------------

    def partition(self, records: Iterable[Any], partitions: int) -> dict[int, list[Any]]:
        """Records grouped by the partition of their key (partition order, record order kept)."""
        out: dict[int, list[Any]] = defaultdict(list)
        key, place = self.key, self._placement(partitions).of
        for record in records:
            out[place(key(record))].append(record)
        return dict(sorted(out.items()))

    def _placement(self, partitions: int) -> Placement:
        """The writer's `Placement` among `partitions` (kept: keys recur epoch after epoch)."""
        placement = self._placed
        if placement is None or placement.partitions != partitions:
            placement = self._placed = Placement(partitions)
        return placement

    def partition_tables(
        self, parts: Sequence[Sequence[pa.RecordBatch]]
    ) -> list[dict[int, pa.Table]]:
        """Each part's records as one table per partition of their keys (partition order,
        record order kept), cut from the part's table in Arrow (one stable sort by partition,
        one take): each distinct key is hashed once (`Placement`), where `partition` would
        hash it per record, and places its records as `partition` does. The keys: a field
        key's column (`key_by("user")`; dictionary-encoded where Arrow groups as Python does,
        `columnar_aggregates.groupable`, else as Python values), or the key function called
        on each record (user work). A part whose batches differ in schema goes record by
        record (`partition`), as Python records and back."""
        out: list[dict[int, pa.Table]] = []
        for part in parts:
            schemas = {b.schema.remove_metadata() for b in part}
            if len(schemas) > 1:
                rows = [r for b in part for r in b.to_pylist()]
                out.append(
                    {
                        q: pa.Table.from_pylist(mine)
                        for q, mine in self.partition(rows, self.partitions).items()
                    }
                )
                continue
            table = pa.Table.from_batches(part, schema=schemas.pop()) if part else None
            if table is None or not table.num_rows:
                out.append({})
                continue
            out.append(_cut(table, self._placed_rows(table)))
        return out

    def _placed_rows(self, table: pa.Table) -> np.ndarray:
        """The partition of each row of `table` (int64)."""
        place = self._placement(self.partitions)
        field = getattr(self.key, "field", None)
        if isinstance(field, str) and field in table.column_names:
            column = table.column(field)
            if not groupable(column.type):  # floats, lists, ...: Python values, one column
                return place.of_keys(column.to_pylist())
            keys = pc.dictionary_encode(column, null_encoding="encode")
            keys = keys.combine_chunks() if isinstance(keys, pa.ChunkedArray) else keys
            placed = place.of_keys(keys.dictionary.to_pylist())
            return placed[np.asarray(keys.indices, dtype=np.int64)]
        key = self.key
        return place.of_keys([key(r) for r in table.to_pylist()])

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Stage this epoch's records of writer subtask `context.index`, one file per partition
        that gets records; their committables."""
        c = context
        tail = f"{c.run_id or 'run'}-a{c.attempt}-{uuid.uuid4().hex[:8]}"
        out = []
        for partition, table in self.partition_tables([batches])[0].items():
            if c.watermarks is not None:  # the records' origin watermark (event time)
                table = table.replace_schema_metadata({ORIGIN_KEY: str(c.watermarks[0])})
            out.append(
                self.area.stage(
                    c.job_id,
                    f"n{self.partitions}-p{partition}-c{c.checkpoint_id:020d}-w{c.index:05d}-"
                    f"{tail}",
                    table,
                )
            )
        if c.watermarks is not None:  # the mark, published after the segments
            stem = f"wm-c{c.checkpoint_id:020d}-w{c.index:05d}-{c.watermarks[1]}-{tail}"
            out.append(self.area.stage(c.job_id, stem, pa.table({})))
        return tuple(out)

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Stage this epoch's records of every writer subtask of one task (one part each):
        per partition ONE segment holding the partition's records of every part, in writer
        order, named after the lowest writer w0 of the parts (published as ``<Y>-<w0>``,
        unique: each writer subtask runs in one task per epoch); each part's committables
        name its rows of each segment (`StagedFile` parts), then its watermark mark, one per
        writer as without merging (`regional.sinks.base.MergingWriter`). With event time, a
        segment's footer lists its writers and their rows (`WRITERS_KEY`, for the reader's
        marks: `ExchangeReader.reached`) and its origin watermarks (`_origin`)."""
        if not parts:
            return []
        order = sorted(range(len(parts)), key=lambda i: parts[i][0].index)  # writer order
        writers = [parts[i][0].index for i in order]
        if len(set(writers)) != len(writers) or len({c.checkpoint_id for c, _ in parts}) != 1:
            raise CommitError(
                f"exchange {self.reader!r}: write_merged was given writer subtasks "
                f"{sorted(writers)} of checkpoints {sorted({c.checkpoint_id for c, _ in parts})};"
                " it merges distinct writer subtasks of one epoch; call it once per task epoch"
            )
        first = parts[order[0]][0]
        tail = f"{first.run_id or 'run'}-a{first.attempt}-{uuid.uuid4().hex[:8]}"
        present = self._merged_partitions([parts[i][1] for i in order])
        out: list[list[bytes]] = [[] for _ in parts]
        for partition in sorted(present):
            table, mine = present[partition]  # O(the writers with rows here), not O(writers)
            timed = self._origin([parts[order[k]][0] for k, _ in mine], [n for _, n in mine], table)
            if timed is not None:  # event time: which writers' rows, for the reader's marks
                counts = dict.fromkeys(range(len(order)), 0)
                counts.update(mine)
                listed = ",".join(f"{w}:{counts[k]}" for k, w in enumerate(writers))
                meta = {**(timed.schema.metadata or {}), WRITERS_KEY: listed.encode()}
                table = timed.replace_schema_metadata(meta)
            places: list[FilePart | None] = []
            start = 0
            for _, n in mine:
                places.append(FilePart(start, n, table.num_rows))
                start += n
            stem = (
                f"n{self.partitions}-p{partition}-c{first.checkpoint_id:020d}-"
                f"w{first.index:05d}-{tail}"
            )
            staged = self.area.stage_merged(first.job_id, stem, table, places)
            for (k, _), committables in zip(mine, staged, strict=True):
                out[order[k]] += committables
        for i, (c, _) in enumerate(parts):
            if c.watermarks is not None:  # the mark, published after the segment of its rows
                stem = f"wm-c{c.checkpoint_id:020d}-w{c.index:05d}-{c.watermarks[1]}-{tail}"
                out[i].append(self.area.stage(c.job_id, stem, pa.table({})))
        return [tuple(c) for c in out]

    def _merged_partitions(
        self, parts: Sequence[Sequence[pa.RecordBatch]]
    ) -> dict[int, tuple[pa.Table, list[tuple[int, int]]]]:
        """Every part's rows (parts in writer order) by partition: per partition one table of
        the rows of every part, part after part, each part's rows in order, and (part, rows)
        of each part with rows there. When every batch has one schema (the usual case), the
        parts are cut as one table: one placement, one sort, one take, however many writer
        subtasks the task ran (a part cut on its own costs a sort and a take each: most of a
        task's time at 1,024 writers of 10 records). Otherwise each part is cut on its own
        (`partition_tables`) and a partition's pieces are unified (`_one_table`)."""
        batches = [b for part in parts for b in part if b.num_rows]
        schemas = {b.schema.remove_metadata() for b in batches}
        if len(schemas) > 1:
            present: dict[int, list[tuple[int, pa.Table]]] = defaultdict(list)
            for k, g in enumerate(self.partition_tables(parts)):
                for q, rows in g.items():
                    present[q].append((k, rows))
            return {
                q: (
                    pieces[0][1]
                    if len(pieces) == 1
                    else _one_table([rows for _, rows in pieces], self.reader),
                    [(k, rows.num_rows) for k, rows in pieces],
                )
                for q, pieces in present.items()
            }
        if not batches:
            return {}
        table = pa.Table.from_batches(batches, schema=schemas.pop())
        part_of = np.repeat(
            np.arange(len(parts), dtype=np.int64),
            [sum(b.num_rows for b in part) for part in parts],
        )
        placed = self._placed_rows(table)
        order = np.argsort(placed, kind="stable")  # within a partition: part order, row order
        ordered, part_of = placed[order], part_of[order]
        taken = table.take(pa.array(order, pa.int64()))
        partitions, starts = np.unique(ordered, return_index=True)
        ends = [*starts[1:].tolist(), len(ordered)]
        out = {}
        for q, a, b in zip(partitions.tolist(), starts.tolist(), ends, strict=True):
            holders, counts = np.unique(part_of[a:b], return_counts=True)
            out[int(q)] = (
                taken.slice(a, b - a),
                list(zip(holders.tolist(), counts.tolist(), strict=True)),
            )
        return out

    @staticmethod
    def _origin(
        contexts: Sequence[WriteContext], counts: Sequence[int], table: pa.Table
    ) -> pa.Table | None:
        """`table` (a merged segment: `counts` rows of each part written in `contexts`, in
        order) with its records' origin watermarks (None without event time): the lowest of
        the parts' watermarks before the epoch in its schema metadata, and, when they differ,
        each row's own in `ORIGIN_COLUMN`, so a record is judged late against its own writer's
        watermark whichever writers shared its task (`regional.dataflow.epoch_time`)."""
        befores = [c.watermarks[0] for c in contexts if c.watermarks is not None]
        if not befores:
            return None
        if len(set(befores)) > 1:
            if ORIGIN_COLUMN in table.column_names:
                raise CommitError(
                    f"records crossing an exchange have a field {ORIGIN_COLUMN!r}, the name "
                    "of the exchange's own origin column; rename that field"
                )
            per_row = [b for b, n in zip(befores, counts, strict=True) for _ in range(n)]
            table = table.append_column(ORIGIN_COLUMN, pa.array(per_row, pa.int64()))
        return table.replace_schema_metadata({ORIGIN_KEY: str(min(befores))})

    def committed_watermark(self, committables: Iterable[bytes]) -> int | None:
        """The watermark a writer subtask's `committables` (from its restored state) commit,
        or None (no mark: the writer never ran with event time). An epoch's committables hold
        one mark; a restore into another shape may give a subtask several (the old subtasks'
        and the one it carries, `regional.runtime.restore`): the lowest counts."""
        marks = [
            int(m[3])
            for item in self.area.files(committables)
            if (m := _STAGED_MARK.fullmatch(posixpath.basename(item.file))) is not None
        ]
        return min(marks, default=None)

    # --- committer side (on the driver): besides `StagedSink`'s ----------------------------

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """`StagedSink.commit`, after checking that no two staged files of the commit would be
        published as the same segment (the parts of one merged segment name one file)."""
        committables = list(committables)
        sources: dict[str, str] = {}
        for item in self.area.files(committables):
            target = self._published(item.file)
            if sources.setdefault(target, item.file) != item.file:
                raise CommitError(
                    f"exchange {self.reader!r}: cannot commit checkpoint {identifier}: staged "
                    f"files {sources[target]} and {item.file} would both be published as "
                    f"{target} (one writer subtask staged in two tasks of one epoch); nothing "
                    f"was committed; restore checkpoint {identifier - 1} or an earlier one"
                )
        self.area.commit(commit_user, identifier, committables, fallback=fallback)

    def marker_retention(self) -> SinkRetention:
        """Commit records are kept until someone deletes them (as for a Parquet table)."""
        return SinkRetention("", "parquet", self.path)

    def _published(self, staged: str) -> str:
        """Where staged file `staged` is published, relative to the exchange directory."""
        published = _staged_name(posixpath.basename(staged)).published
        if published is None:
            raise CommitError(
                f"exchange {self.reader!r}: staged file {staged!r} is not named "
                "n<N>-p<q>-c<checkpoint>-w<writer>-...staged; it was tampered with"
            )
        return published

    def published_paths(self, committables: Iterable[bytes]) -> list[str]:
        """Where a commit of `committables` publishes their segments, relative to the job
        root (`exchange/<reader>/n<N>/p<q>/<checkpoint>-<writer>.parquet`)."""
        prefix = f"{EXCHANGE_DIR}/{self.reader}"
        published = dict.fromkeys(self._published(i.file) for i in self.area.files(committables))
        return [f"{prefix}/{p}" for p in published]  # the parts of a merged segment name it once

    def _order(self, staged: str) -> tuple[int, int, int]:
        """(checkpoint, writer, 0) for a segment, (checkpoint, writer, 1) for a watermark mark:
        a mark is published after its writer's segments of the same commit."""
        return _staged_name(posixpath.basename(staged)).order

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo commits after `identifier` (`StagingArea.rollback`), then delete every
        published segment of a later checkpoint that no record names (an interrupted commit, a
        repartitioned backlog): a restore from `identifier` must not read them."""
        undone = self.area.rollback(commit_user, identifier)
        if commit_user != REPARTITION_USER:
            self.area.rollback(REPARTITION_USER, identifier)
        fs, base = self._fs()
        for layout in self._children(base, "n"):
            for partition in self._children(f"{base}/{layout}", "p"):
                for info in self.area.listing(f"{base}/{layout}/{partition}"):
                    segment = segment_name(_name(info))
                    if segment is not None and segment.checkpoint_id > identifier:
                        with contextlib.suppress(FileNotFoundError):
                            fs.delete_file(self.area.inside(fs, info.path))
        for info in self.area.listing(f"{base}/{WATERMARK_DIR}"):
            mark = parse_mark(_name(info))
            if mark is not None and mark.checkpoint_id > identifier:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self.area.inside(fs, info.path))
        return undone

    def _children(self, directory: str, prefix: str) -> list[str]:
        return sorted(
            _name(i)
            for i in self.area.listing(directory)
            if i.type == pafs.FileType.Directory and re.fullmatch(rf"{prefix}\d+", _name(i))
        )

    def reset(self) -> int:
        """Delete every segment and commit record (a fresh start: no checkpoint holds a cursor
        into them); returns how many segments went."""
        fs, base = self._fs()
        gone = 0
        for layout in self._children(base, "n"):
            for partition in self._children(f"{base}/{layout}", "p"):
                gone += len(self.area.listing(f"{base}/{layout}/{partition}"))
            fs.delete_dir(self.area.inside(fs, f"{base}/{layout}"))
        for directory in ("_commits", WATERMARK_DIR):
            with contextlib.suppress(FileNotFoundError):
                fs.delete_dir(self.area.inside(fs, f"{base}/{directory}"))
        self.area.forget()
        return gone

    def copy_backlog(
        self,
        target: ExchangeWriter,
        layout: int,
        cursors: Mapping[int, Cursor],
        staged: Iterable[bytes],
        checkpoint_id: int,
    ) -> int:
        """Copy into `target` (a savepoint's exchange directory) what a restore from checkpoint
        `checkpoint_id` reads: per partition the published segments up to it after its cursor,
        under their own names, and its `staged` committables under the names their commit
        publishes them as. Returns the number of files copied."""
        fs, _ = self._fs()
        out_fs, out_base = target._fs()
        unread = self._unread(layout, cursors, staged, checkpoint_id)
        for u in unread:
            out_fs.create_dir(posixpath.dirname(f"{out_base}/{u.published}"), recursive=True)
            if u.keep is None:
                pafs.copy_files(u.path, f"{out_base}/{u.published}", fs, out_fs)
            else:  # the parts of a merged segment the checkpoint holds (schema metadata kept)
                pq.write_table(u.rows(fs), f"{out_base}/{u.published}", filesystem=out_fs)
        return len(unread)

    def _unread(
        self,
        layout: int,
        cursors: Mapping[int, Cursor],
        staged: Iterable[bytes],
        checkpoint_id: int,
    ) -> list[_Unread]:
        """What a restore from checkpoint `checkpoint_id` reads, in segment order: per partition
        of `layout` the published segments up to it after its cursor, and the segments of its
        `staged` committables that no commit published yet."""
        fs, base = self._fs()
        out = []
        for partition in range(layout):
            cursor = cursors.get(partition, Cursor())
            for segment, info in self._segments(layout, partition, after=cursor):
                if segment.checkpoint_id <= checkpoint_id:
                    relative = f"n{layout}/p{partition}/{segment.file_name()}"
                    out.append(_Unread(segment, cursor.first_row(segment), info.path, relative))
        files: dict[str, list[StagedFile]] = {}  # the parts of a merged segment, by its file
        for item in self.area.files(staged):
            if not _STAGED_MARK.fullmatch(posixpath.basename(item.file)):  # a mark: no records
                files.setdefault(item.file, []).append(item)
        for file, items in files.items():
            published = self._published(file)
            if fs.get_file_info(self.area.inside(fs, f"{base}/{published}")).type != (
                pafs.FileType.File
            ):
                segment = SegmentName(*self._order(file)[:2])  # else listed above
                path = self.area.inside(fs, f"{base}/{file}")
                parts = [p for i in items if (p := i.part) is not None]
                # only the parts the checkpoint holds: a unit declared fallen back after its
                # rows were staged has its rows in the file too, and writes them again later
                keep = kept_ranges(parts, file) if len(parts) == len(items) else None
                out.append(_Unread(segment, 0, path, published, keep))
        return sorted(out, key=lambda u: (u.segment, u.path))

    def bound_to(self, path: str, filesystem: pafs.FileSystem | None) -> ExchangeWriter:
        """A copy of this writer bound to another directory (the exchange of another root)."""
        other = copy.copy(self)
        other.bind(path, filesystem)
        return other

    def exists(self) -> bool:
        """True when the exchange directory exists."""
        fs, base = self._fs()
        return bool(fs.get_file_info(base).type == pafs.FileType.Directory)


def _cut(table: pa.Table, placed: np.ndarray) -> dict[int, pa.Table]:
    """`table`'s rows by partition (`placed`: each row's), in partition order, each
    partition's rows in table order; the schema kept, its metadata dropped."""
    table = table.replace_schema_metadata()
    first = int(placed[0])
    if bool((placed == first).all()):
        return {first: table}
    order = np.argsort(placed, kind="stable")
    ordered = placed[order]
    partitions, starts = np.unique(ordered, return_index=True)
    taken = table.take(pa.array(order, pa.int64()))
    ends = [*starts[1:].tolist(), len(ordered)]
    return {
        int(q): taken.slice(int(a), int(b) - int(a))
        for q, a, b in zip(partitions.tolist(), starts.tolist(), ends, strict=True)
    }


def _one_table(pieces: Sequence[pa.Table], reader: str) -> pa.Table:
    """Several writers' rows of one partition as one table (a merged segment). Units convert
    their records on their own (each list with the union of its fields), so their columns
    may come in another order, be null-typed where one unit had only None, or be of another
    width: unified where no value changes (`regional.sinks.rows.conformed`); any other
    difference is the `SinkRowsError` naming the exchange, the column and both types."""
    first = pieces[0].schema
    if all(p.schema.equals(first) for p in pieces[1:]):  # the usual case
        return pa.concat_tables(pieces)
    same, refused = conformed([b for p in pieces for b in p.to_batches()], f"exchange {reader!r}")
    if refused:
        raise refused[0][1]
    return pa.Table.from_batches(same)


def repartition(
    origin: ExchangeWriter,
    target: ExchangeWriter,
    old_layout: int,
    cursors: Mapping[int, Cursor],
    staged: Iterable[bytes],
    new_layout: int,
    checkpoint_id: int,
) -> int:
    """Move what the readers of checkpoint `checkpoint_id` had not read into `new_layout` of
    `target`: for each partition of `old_layout` in `origin`, the published segments of
    checkpoints up to `checkpoint_id` after its cursor (`cursors`, by partition), and the
    segments of the checkpoint's `staged` committables not published yet. Writes one *moved
    backlog* ``<checkpoint_id>-99999`` per new partition (`metadata.exchange.MOVED_WRITER`;
    replaced if it exists: a retried restore writes the same files); new readers start at
    ``Cursor(checkpoint_id, MOVED_WRITER)``. Returns the number of records moved.

    Event time survives the move (DESIGN §4 rule 15): each row keeps its origin watermark
    (`ORIGIN_COLUMN`, so it is judged late exactly as without the rescale), and the rows are
    sorted by the segment each was first published in (stable: a key's records keep their
    order), which the footer lists (`metadata.exchange.MOVED_KEY`), so a new reader's
    watermark passes a writer's mark only once every moved row before it is read
    (`metadata.watermarks.mark_reached`)."""
    fs, _ = origin._fs()
    moved: list[tuple[SegmentName, int | None, Any]] = []
    for u in origin._unread(old_layout, cursors, staged, checkpoint_id):
        records, published, origins = u.provenance(fs)
        moved += zip(published, origins, records, strict=True)
    moved.sort(key=lambda m: m[0])  # stable
    grouped: dict[int, list[tuple[SegmentName, int | None, Any]]] = defaultdict(list)
    place = Placement(new_layout).of
    for m in moved:
        grouped[place(target.key(m[2]))].append(m)
    out_fs, out_base = target._fs()
    files, sizes, checksums = [], [], []
    for partition in range(new_layout):
        segment = SegmentName(checkpoint_id, MOVED_WRITER)
        relative = f"n{new_layout}/p{partition}/{segment.file_name()}"
        name = target.area.inside(out_fs, f"{out_base}/{relative}")
        out_fs.create_dir(posixpath.dirname(name), recursive=True)
        if part := grouped.get(partition):
            data = _moved_backlog(part)
            with out_fs.open_output_stream(name) as out:
                out.write(data)
            files.append(relative)
            sizes.append(data.size)
            checksums.append(segment_checksum(data).hex())
        else:
            with contextlib.suppress(FileNotFoundError):
                out_fs.delete_file(name)
    # the readers verify segments against commit records: these are committed by the restore
    target.area.write_record(
        CommitRecord(
            REPARTITION_USER, checkpoint_id, files, len(moved), sizes=sizes, checksums=checksums
        )
    )
    return len(moved)


def _moved_backlog(rows: Sequence[tuple[SegmentName, int | None, Any]]) -> pa.Buffer:
    """The Parquet bytes of one partition's moved backlog: `rows` (first published in, origin
    watermark, record), the records in order with, when any has an origin, each row's in
    `ORIGIN_COLUMN` (-inf for a row without) and the lowest in `ORIGIN_KEY`, and the segments
    they were first published in under `MOVED_KEY`."""
    table = pa.Table.from_pylist([r for _, _, r in rows])
    meta = {MOVED_KEY: moved_runs([s for s, _, _ in rows])}
    if any(o is not None for _, o, _ in rows):
        origins = [MIN_WATERMARK if o is None else o for _, o, _ in rows]
        table = table.append_column(ORIGIN_COLUMN, pa.array(origins, pa.int64()))
        meta[ORIGIN_KEY] = str(min(origins)).encode()
    sink = pa.BufferOutputStream()
    pq.write_table(table.replace_schema_metadata(meta), sink)
    return sink.getvalue()
