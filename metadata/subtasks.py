"""The per-subtask state of a checkpoint: `SubtaskState` with its `StateHandle`s and
`SplitState`s, and `SubtaskTable`, the sequence `CheckpointMetadata.subtasks` holds (DESIGN §5).

A job of 100,000 units records hundreds of thousands of subtasks per checkpoint. Format 1.5
stores them as columns (`SubtaskColumns`), and a decoded `SubtaskTable` keeps those columns: it
builds a `SubtaskState` only when one is read (indexing builds one, iterating builds all, once),
and answers the whole-table questions (handle paths, owner checkpoints, bytes of state, the
subtasks of one vertex, the units) from the columns without building any. A table made in code
from `SubtaskState`s builds its columns when it is first encoded.

The columns: `count` subtasks. `vertex_ids` and `paths` list each distinct vertex id and state
file path once, in order of first use; the `vertex` and `path` columns index them. An integer
column is one integer when every row holds it, else the rows' values packed little-endian, 1, 2,
4 or 8 bytes each (the width is the column's length over its rows). `ref` holds the owner
checkpoint's id + 1 (0: fresh state); `handles` counts each subtask's handles, and the handle
columns (`path`, `offset`, `length`, `size`, `shared`, `checksums`) hold the `handle_count`
handles of all subtasks in order. `checksums` is the checksums joined when all have one length,
else one per handle. `split_states` and `committables` map a subtask's row to its own, for the
subtasks that have any.

>>> h = StateHandle(path="chk-3/u0-1.state", offset=0, length=10, size=10, checksum=b"x" * 16)
>>> table = SubtaskTable([SubtaskState("map", 0, 0, handles=(h,)), SubtaskState("map", 1, 1, 2)])
>>> columns = table.columns()
>>> columns.vertex_ids, columns.index, columns.ref, columns.handles
(('map',), b'\\x00\\x01', b'\\x00\\x03', b'\\x01\\x00')
>>> decoded = SubtaskTable.from_columns(columns)
>>> decoded[1].ref_checkpoint_id, decoded[0] == table[0], decoded == table
(2, True, True)
>>> sorted(decoded.handle_paths()), sorted(decoded.referenced_checkpoint_ids())
(['chk-3/u0-1.state'], [2])
"""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate, chain, compress, repeat
from operator import attrgetter, eq, itemgetter, sub
from typing import Any, Literal, overload

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from metadata.errors import MetadataError
from metadata.ranges import Count, Int64

__all__ = [
    "IntColumn",
    "SplitState",
    "StateHandle",
    "SubtaskColumns",
    "SubtaskState",
    "SubtaskTable",
]


class StateHandle(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One segment of a state file.

    `path` is relative to the job root. Several handles may name the same physical file at
    different offsets (one file per unit attempt, one segment per subtask); `size` is the size of
    the whole physical file, `length` the size of this segment. `checksum` is the BLAKE2b-128
    digest of the segment's bytes. `shared` marks files under `shared/` that several checkpoints
    may reference (incremental state).
    """

    path: str
    offset: Count
    length: Count
    size: Count
    checksum: bytes
    shared: bool = False


class SplitState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A source split owned by a subtask and its position (opaque to the metadata layer)."""

    split_id: str
    position: bytes


class SubtaskState(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """The state of one subtask `(vertex_id, index)` in a checkpoint.

    `ref_checkpoint_id` is `None` when the state is fresh, else the owner checkpoint's id.
    `attempt` is the attempt number of the region task that wrote the state (DESIGN §4 rule 9).
    `committables` are sink committables kept in writer state (PIP-30), opaque bytes.
    """

    vertex_id: str
    index: Count
    unit_id: Count
    ref_checkpoint_id: Int64 | None = None
    handles: tuple[StateHandle, ...] = ()
    split_states: tuple[SplitState, ...] = ()
    committables: tuple[bytes, ...] = ()
    attempt: Count = 0

    @property
    def is_fallback(self) -> bool:
        """True when this state was re-used from an earlier (owner) checkpoint."""
        return self.ref_checkpoint_id is not None

    @property
    def state_bytes(self) -> int:
        """Bytes of state this subtask holds (sum of its segment lengths)."""
        return sum(h.length for h in self.handles)


#: An integer column: one value every row holds, or the rows' values packed little-endian.
IntColumn = Count | bytes


class SubtaskColumns(msgspec.Struct, frozen=True, omit_defaults=True):
    """The subtasks of a checkpoint as columns: how format 1.5 stores them (module docstring).

    Decoded columns are checked by `metadata.format` before any row is read from them.
    """

    count: Count = 0
    vertex_ids: tuple[str, ...] = ()
    vertex: IntColumn = 0
    index: IntColumn = 0
    unit_id: IntColumn = 0
    ref: IntColumn = 0
    attempt: IntColumn = 0
    handles: IntColumn = 0
    handle_count: Count = 0
    paths: tuple[str, ...] = ()
    path: IntColumn = 0
    offset: IntColumn = 0
    length: IntColumn = 0
    size: IntColumn = 0
    shared: IntColumn = 0
    checksums: bytes | tuple[bytes, ...] = b""
    split_states: dict[Count, tuple[SplitState, ...]] = {}
    committables: dict[Count, tuple[bytes, ...]] = {}


#: The columns with one row per subtask, and those with one row per handle.
SUBTASK_COLUMNS = ("vertex", "index", "unit_id", "ref", "attempt", "handles")
HANDLE_COLUMNS = ("path", "offset", "length", "size", "shared")

_LITTLE = sys.byteorder == "little"
#: The `array` type code of each packed width.
_CODES: dict[int, Literal["B", "H", "I", "L", "Q"]] = {
    1: "B",
    2: "H",
    4: "I" if array("I").itemsize == 4 else "L",
    8: "Q",
}
_U64 = 2**64 - 1
#: Below this many rows a column is packed and checked in Python: Arrow's per-call cost (tens of
#: µs) would outweigh the work, and most checkpoints are small.
ARROW_FROM_ROWS = 512  # measured: the two cost the same at about 500 rows
#: The Arrow type of each packed width.
ARROW_TYPES = {1: pa.uint8(), 2: pa.uint16(), 4: pa.uint32(), 8: pa.uint64()}
_INT64_MAX = 2**63 - 1


def column_width(column: IntColumn, rows: int, name: str) -> int:
    """The bytes per row of a packed column (0 for one value every row holds).

    Raises `ValueError` naming the column when its length fits no width: the file is damaged.

    >>> column_width(b"\\x00\\x01\\x00\\x02", 2, "index"), column_width(7, 2, "index")
    (2, 0)
    >>> column_width(b"\\x00\\x01\\x00", 2, "index")
    Traceback (most recent call last):
    ...
    ValueError: subtask column `index` holds 3 bytes for 2 rows, not 1, 2, 4 or 8 bytes each
    """
    if isinstance(column, int) or not (rows or column):
        return 0
    width = len(column) // rows if rows else 0
    if width not in _CODES or width * rows != len(column):
        raise ValueError(
            f"subtask column `{name}` holds {len(column)} bytes for {rows} rows, not 1, 2, 4 "
            "or 8 bytes each"
        )
    return width


def _pack(values: tuple[int, ...], name: str) -> IntColumn:
    """`values` as an integer column: one value, or packed in the narrowest width."""
    n = len(values)
    if not n:
        return 0
    first = values[0]
    if values.count(first) == n and 0 <= first <= _INT64_MAX:
        return int(first)  # a bool column holds 0 or 1
    try:
        wide = array(_CODES[8], values)  # refuses negative and wider than 64-bit values
    except OverflowError:
        wrong = next(v for v in values if not 0 <= v <= _U64)
        raise MetadataError(
            f"subtask column `{name}` cannot hold {wrong}: a checkpoint records no negative or "
            "wider than 64-bit counts, ids or sizes; fix the writer"
        ) from None
    if n < ARROW_FROM_ROWS:  # a few calls into Arrow would cost more than the work
        width = _width_of(max(wide))
        packed = array(_CODES[width], values)
    else:
        column = pa.Array.from_buffers(pa.uint64(), n, [None, pa.py_buffer(wide)])
        width = _width_of(pc.max(column).as_py())
        narrow = column.cast(ARROW_TYPES[width]).buffers()[1].to_pybytes()[: n * width]
        packed = array(_CODES[width], narrow)
    if not _LITTLE:
        packed.byteswap()
    return packed.tobytes()


def _width_of(largest: int) -> int:
    return next(w for w in _CODES if largest >> (8 * w) == 0 or w == 8)


def _unpack(column: IntColumn, rows: int, name: str) -> Sequence[int]:
    """The rows' values of an integer column."""
    width = column_width(column, rows, name)
    if isinstance(column, int):
        return (column,) * rows
    if not width:
        return ()
    if _LITTLE:
        return memoryview(column).cast(_CODES[width])
    values = array(_CODES[width], column)
    values.byteswap()
    return values


def _positions(names: tuple[str, ...]) -> dict[str, int]:
    return {name: i for i, name in enumerate(names)}


def _columns_of(rows: tuple[SubtaskState, ...]) -> SubtaskColumns:
    """The columns of `rows` (the encoder's side: one C-level pass per field)."""
    if not rows:
        return SubtaskColumns()

    def field(name: str, of: tuple[msgspec.Struct, ...] = rows) -> tuple[Any, ...]:
        return tuple(map(attrgetter(name), of))

    n = len(rows)
    vertex = field("vertex_id")
    vertex_ids = tuple(dict.fromkeys(vertex))
    ref = field("ref_checkpoint_id")
    owners = {r: 0 if r is None else r + 1 for r in set(ref)}
    if (wrong := min((r for r in owners if r is not None), default=0)) < 0:
        raise MetadataError(
            f"subtask column `ref` cannot hold {wrong}: owner checkpoint ids are not negative; "
            "fix the writer"
        )
    handles = field("handles")
    counts = tuple(map(len, handles))
    flat = tuple(chain.from_iterable(handles))
    path = field("path", flat)
    paths = tuple(dict.fromkeys(path))
    checksum = field("checksum", flat)
    widths = tuple(map(len, checksum))
    splits, committables = field("split_states"), field("committables")
    return SubtaskColumns(
        count=n,
        vertex_ids=vertex_ids,
        vertex=_pack(tuple(map(_positions(vertex_ids).__getitem__, vertex)), "vertex"),
        index=_pack(field("index"), "index"),
        unit_id=_pack(field("unit_id"), "unit_id"),
        ref=_pack(tuple(map(owners.__getitem__, ref)), "ref"),
        attempt=_pack(field("attempt"), "attempt"),
        handles=_pack(counts, "handles"),
        handle_count=len(flat),
        paths=paths,
        path=_pack(tuple(map(_positions(paths).__getitem__, path)), "path"),
        offset=_pack(field("offset", flat), "offset"),
        length=_pack(field("length", flat), "length"),
        size=_pack(field("size", flat), "size"),
        shared=_pack(field("shared", flat), "shared"),  # bools pack as 0 and 1
        checksums=b"".join(checksum)
        if widths.count(widths[0] if widths else 0) == len(widths)
        else checksum,
        split_states={i: splits[i] for i in compress(range(n), splits)},
        committables={i: committables[i] for i in compress(range(n), committables)},
    )


class SubtaskTable(Sequence[SubtaskState]):
    """The subtasks of a checkpoint: rows (`SubtaskState`), columns (`SubtaskColumns`) or both,
    each built from the other on first need. Compares equal to a table or tuple of the same
    subtasks."""

    __slots__ = ("_columns", "_ends", "_rows", "_views", "is_columnar")

    def __init__(self, rows: Iterable[SubtaskState] = ()) -> None:
        self._rows: tuple[SubtaskState, ...] | None = tuple(rows)
        self._columns: SubtaskColumns | None = None
        self._views: dict[str, Sequence[int]] = {}
        self._ends: Sequence[int] | None = None
        #: Made from columns (a decoded file), not from rows.
        self.is_columnar = False

    @classmethod
    def from_columns(cls, columns: SubtaskColumns) -> SubtaskTable:
        """A table reading `columns`. Raises `ValueError` naming the column whose shape does
        not fit (a packed length, the checksums, a row that does not exist); the values are
        `metadata.format`'s to check."""
        n, nh = columns.count, columns.handle_count
        for name in SUBTASK_COLUMNS:
            column_width(getattr(columns, name), n, name)
        for name in HANDLE_COLUMNS:
            column_width(getattr(columns, name), nh, name)
        sums = columns.checksums
        if isinstance(sums, bytes) and (len(sums) % nh if nh else sums):
            raise ValueError(
                f"subtask column `checksums` holds {len(sums)} bytes for {nh} handles, not "
                "one length each"
            )
        if isinstance(sums, tuple) and len(sums) != nh:
            raise ValueError(f"subtask column `checksums` holds {len(sums)} of {nh} handles")
        for name in ("split_states", "committables"):
            rows = getattr(columns, name)
            if rows and max(rows) >= n:
                raise ValueError(f"subtask column `{name}` names row {max(rows)} of {n} subtasks")
        table = cls()
        table._rows, table._columns, table.is_columnar = None, columns, True
        return table

    def columns(self) -> SubtaskColumns:
        """The table as columns (built from the rows once)."""
        if self._columns is None:
            assert self._rows is not None
            self._columns = _columns_of(self._rows)
        return self._columns

    def column(self, name: str) -> Sequence[int]:
        """The values of integer column `name` (one per subtask or per handle)."""
        view = self._views.get(name)
        if view is None:
            c = self.columns()
            rows = c.handle_count if name in HANDLE_COLUMNS else c.count
            view = self._views[name] = _unpack(getattr(c, name), rows, name)
        return view

    def arrow(self, name: str) -> pa.Array | int:
        """Integer column `name` as an Arrow array over its packed bytes (no copy), or the one
        value every row holds (also 0 for no rows): for whole-column checks in C."""
        c = self.columns()
        column = getattr(c, name)
        if isinstance(column, int):
            return column
        rows = c.handle_count if name in HANDLE_COLUMNS else c.count
        width = column_width(column, rows, name)
        if not width:
            return 0
        if not _LITTLE:  # Arrow reads native byte order
            return pa.array(self.column(name), pa.uint64())
        return pa.Array.from_buffers(ARROW_TYPES[width], rows, [None, pa.py_buffer(column)])

    # -- the sequence ------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._rows) if self._rows is not None else self.columns().count

    @overload
    def __getitem__(self, i: int) -> SubtaskState: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[SubtaskState, ...]: ...
    def __getitem__(self, i: int | slice) -> SubtaskState | tuple[SubtaskState, ...]:
        if self._rows is not None or isinstance(i, slice):
            return self.rows()[i]
        n = self.columns().count
        if not -n <= i < n:
            raise IndexError(f"subtask {i} of {n}")
        return self._build((i % n,))[0]

    def __iter__(self) -> Iterator[SubtaskState]:
        return iter(self.rows())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SubtaskTable):
            if self._columns is not None and self._columns == other._columns:
                return True
            return self.rows() == other.rows()
        if isinstance(other, tuple):
            return self.rows() == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.rows())

    def __repr__(self) -> str:
        return f"SubtaskTable({self.rows()!r})"

    def __reduce__(self) -> tuple[object, ...]:
        if self._rows is not None:
            return (SubtaskTable, (self._rows,))
        return (SubtaskTable.from_columns, (self._columns,))

    # -- the whole table, from the columns -------------------------------------------------

    def handle_paths(self) -> frozenset[str]:
        """The state file paths the subtasks' handles name."""
        if self._columns is None:
            return frozenset(h.path for s in self.rows() for h in s.handles)
        return frozenset(self._columns.paths)

    def referenced_checkpoint_ids(self) -> frozenset[int]:
        """The owner checkpoints of the fallback subtasks."""
        if self._columns is None:
            refs = {s.ref_checkpoint_id for s in self.rows()}
            return frozenset(refs - {None})  # type: ignore[arg-type]
        return frozenset(r - 1 for r in set(self.column("ref")) if r)

    def state_bytes(self) -> int:
        """Bytes of state the handles hold (fresh and fallback)."""
        if self._columns is None:
            return sum(s.state_bytes for s in self.rows())
        return sum(self.column("length"))

    def unit_ids(self, *, fallback: bool | None = None) -> frozenset[int]:
        """The units of the subtasks (only those with fallback or only those with fresh state
        when `fallback` is given)."""
        if self._columns is None:
            return frozenset(
                s.unit_id for s in self.rows() if fallback is None or s.is_fallback is fallback
            )
        units = self.column("unit_id")
        if fallback is None:
            return frozenset(units)
        refs = self.column("ref")
        if fallback:
            return frozenset(compress(units, refs))
        return frozenset(compress(units, map(eq, refs, repeat(0))))

    def fallback_count(self) -> int:
        """How many subtasks re-use an earlier checkpoint's state."""
        if self._columns is None:
            return sum(s.is_fallback for s in self.rows())
        return sum(map(bool, self.column("ref")))

    def fresh_segment_bytes(self) -> tuple[dict[str, int], dict[str, int]]:
        """(bytes of the fresh subtasks' segments per state file path, each such file's
        physical size): what this checkpoint's own files hold that it references itself
        (`metadata.liveness`). From the columns, grouped in Arrow (no per-handle Python)."""
        c = self.columns()
        if c.handle_count == 0:
            return {}, {}
        n = c.handle_count

        def full(name: str) -> pa.Array:
            a = self.arrow(name)
            return pa.array(repeat(a, n), pa.uint64()) if isinstance(a, int) else a

        table = pa.table({"path": full("path"), "length": full("length"), "size": full("size")})
        refs = self.column("ref")
        if any(refs):  # leave out the fallback subtasks' handles
            per_handle = chain.from_iterable(map(repeat, refs, self.column("handles")))
            table = table.filter(pa.array(map(eq, per_handle, repeat(0)), pa.bool_()))
        grouped = table.group_by("path").aggregate([("length", "sum"), ("size", "max")])
        paths = [c.paths[k] for k in grouped.column("path").to_pylist()]
        return (
            dict(zip(paths, grouped.column("length_sum").to_pylist(), strict=True)),
            dict(zip(paths, grouped.column("size_max").to_pylist(), strict=True)),
        )

    def fallback_subtasks(self) -> tuple[SubtaskState, ...]:
        """The subtasks that re-use an earlier checkpoint's state, in table order."""
        if self._columns is None:
            return tuple(s for s in self.rows() if s.ref_checkpoint_id is not None)
        refs = self.column("ref")
        if not any(refs):
            return ()
        chosen = tuple(compress(range(self.columns().count), refs))
        if self._rows is not None:
            return tuple(map(self._rows.__getitem__, chosen))
        return self._build(chosen)

    def of_vertex(self, vertex_id: str) -> tuple[SubtaskState, ...]:
        """The subtasks of vertex `vertex_id`, in table order."""
        c = self.columns()
        if vertex_id not in c.vertex_ids:
            return ()
        k = c.vertex_ids.index(vertex_id)
        chosen = compress(range(c.count), map(eq, self.column("vertex"), repeat(k)))
        if self._rows is not None:
            return tuple(map(self._rows.__getitem__, chosen))
        return self._build(tuple(chosen))

    # -- rows from columns -----------------------------------------------------------------

    def rows(self) -> tuple[SubtaskState, ...]:
        """Every subtask as a `SubtaskState` (built from the columns once)."""
        if self._rows is None:
            self._rows = self._build(range(self.columns().count))
        return self._rows

    def _handle_ends(self) -> Sequence[int]:
        """Per subtask, the end of its handles in the handle columns."""
        if self._ends is None:
            c = self.columns()
            if isinstance(c.handles, int):
                k = c.handles
                self._ends = range(k, k * c.count + 1, k) if k else (0,) * c.count
            else:
                self._ends = tuple(accumulate(self.column("handles")))
        return self._ends

    def _checksums(self, chosen: Sequence[int] | None) -> Sequence[bytes]:
        """The checksums of the handles `chosen` (None: all)."""
        c = self.columns()
        sums, nh = c.checksums, c.handle_count
        if isinstance(sums, tuple):
            return sums if chosen is None else tuple(map(sums.__getitem__, chosen))
        width = len(sums) // nh if nh else 0
        if not width:
            return (b"",) * (nh if chosen is None else len(chosen))
        if chosen is None:
            return tuple(map(itemgetter(0), struct.iter_unpack(f"{width}s", sums)))
        return tuple(sums[j * width : (j + 1) * width] for j in chosen)

    def _build(self, chosen: Sequence[int]) -> tuple[SubtaskState, ...]:
        """The subtasks at rows `chosen` (ascending), built column by column in C-level
        passes rather than row by row."""
        c = self.columns()
        column = self.column
        every = len(chosen) == c.count

        def pick(values: Sequence[Any]) -> Sequence[Any]:
            return values if every else tuple(map(values.__getitem__, chosen))

        counts = pick(column("handles"))
        handle_rows: Sequence[int] | None = None
        if not every:
            ends = pick(self._handle_ends())
            handle_rows = tuple(chain.from_iterable(map(range, map(sub, ends, counts), ends)))

        def pick_handles(values: Sequence[Any]) -> Sequence[Any]:
            return values if handle_rows is None else tuple(map(values.__getitem__, handle_rows))

        handles = tuple(
            map(
                StateHandle,
                map(c.paths.__getitem__, pick_handles(column("path"))),
                pick_handles(column("offset")),
                pick_handles(column("length")),
                pick_handles(column("size")),
                self._checksums(handle_rows),
                map(bool, pick_handles(column("shared"))),
            )
        )
        n = len(chosen)
        grouped: Iterable[tuple[StateHandle, ...]]
        if isinstance(c.handles, int) and c.handles == 1:
            grouped = zip(handles)
        elif isinstance(c.handles, int) and c.handles == 0:
            grouped = repeat((), n)
        else:
            stops = tuple(accumulate(counts))
            grouped = map(handles.__getitem__, map(slice, map(sub, stops, counts), stops))
        ref = pick(column("ref"))
        owners = {r: r - 1 if r else None for r in set(ref)}
        return tuple(
            map(
                SubtaskState,
                map(c.vertex_ids.__getitem__, pick(column("vertex"))),
                pick(column("index")),
                pick(column("unit_id")),
                map(owners.__getitem__, ref),
                grouped,
                map(c.split_states.get, chosen, repeat(())),
                map(c.committables.get, chosen, repeat(())),
                pick(column("attempt")),
            )
        )
