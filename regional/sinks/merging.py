"""Sink output merging: one staged data file per Spark task per sink per epoch (DESIGN §4 rule
16, FLIP-306 at the task level).

A task runs many units (regions); with merging, a sink does not stage one file per unit but
one file per task holding the rows of every unit that finished the epoch, each unit's rows a
contiguous *part* of it (`FilePart`: first row, rows, and the file's row count). Each unit's
committables name its part, so the commit protocol stays per unit and checkpoint:

* a checkpoint commits the parts of its **fresh** units; when those parts cover the whole file
  (the usual case), the file is committed as it is;
* when a unit whose rows were staged is declared fallen back afterwards (its ack came too late,
  an upload failed), its part is not committed: the file is **rewritten without those rows**
  before the commit (`kept_ranges`, `take_ranges`), under a name derived from the kept ranges
  (`kept_stem`), so a commit retried after a crash writes the same file again and never a row
  twice;
* a staged file is deleted by `discard` only when every part of it was discarded
  (`DiscardedParts`): other units' rows in it may still commit.

These are the pure parts every merging sink shares (Parquet, Delta, Iceberg, Paimon); the
sinks own where their files go and how they commit them.

>>> import pyarrow as pa
>>> a, b = pa.record_batch({"x": [1, 2]}), pa.record_batch({"x": [3]})
>>> table, parts = merged_table([[a], [], [b]])
>>> table.num_rows, parts
(3, [FilePart(first_row=0, rows=2, file_rows=3), None, FilePart(first_row=2, rows=1, file_rows=3)])
>>> kept_ranges([parts[0], parts[2]], "f") is None  # every part commits: the file as it is
True
>>> kept = kept_ranges([parts[2]], "f"); kept
((2, 1),)
>>> take_ranges(table, kept).column("x").to_pylist(), kept_stem("part-7", kept)
([3], 'part-7-k2.1')
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import TypeVar

import msgspec
import pyarrow as pa

from regional.errors import CommitError
from regional.sinks.rows import conformed

__all__ = [
    "DiscardedParts",
    "FilePart",
    "commit_plan",
    "kept_ranges",
    "kept_stem",
    "merged_table",
    "take_ranges",
]


class FilePart(msgspec.Struct, frozen=True, array_like=True):
    """One unit's rows in a merged staged file: rows `first_row` .. `first_row + rows - 1` of
    the file's `file_rows` rows."""

    first_row: int
    rows: int
    file_rows: int


def merged_table(
    parts: Sequence[Sequence[pa.RecordBatch]],
) -> tuple[pa.Table | None, list[FilePart | None]]:
    """The rows of every part (one unit's batches each) as one table, in part order, and each
    part's place in it (None for a part without rows; the table is None when no part has
    any). Schemas are unified as `regional.sinks.rows.conformed` does (a column missing from
    a part is null, types are widened where no value changes; any other difference is the
    `SinkRowsError` naming the column and both types). The
    table's columns are one chunk each (written as such: a task's hundreds of small parts
    would otherwise become as many pages per column)."""
    kept: list[list[pa.RecordBatch]] = []
    first = 0
    spans: list[tuple[int, int] | None] = []
    for batches in parts:
        rows = [b for b in batches if b.num_rows]
        if not rows:
            spans.append(None)
            continue
        kept.append(rows)
        n = sum(b.num_rows for b in rows)
        spans.append((first, n))
        first += n
    if not kept:
        return None, [None] * len(parts)
    every = [b for rows in kept for b in rows]
    schema = every[0].schema  # schemas with metadata do not hash: compare, do not collect
    if all(b.schema.equals(schema) for b in every[1:]):  # the usual case: one call
        table = pa.Table.from_batches(every, schema=schema)
    else:  # units whose types differ: widened where no value changes, or the error
        same, refused = conformed(every, "a merged staged file")
        if refused:
            raise refused[0][1]
        table = pa.Table.from_batches(same)
    if table.num_columns and table.column(0).num_chunks > 1:
        table = table.combine_chunks()
    return table, [None if s is None else FilePart(s[0], s[1], first) for s in spans]


def kept_ranges(parts: Iterable[FilePart], file: str) -> tuple[tuple[int, int], ...] | None:
    """The (first row, rows) ranges of merged staged file `file` that `parts` (the parts one
    commit commits) keep, in file order; None when they cover the whole file (commit it as it
    is). Parts that overlap, fall outside the file or disagree on its size are a `CommitError`
    naming the file: the committables were tampered with or come from another writer."""
    ordered = sorted(set(parts), key=lambda p: p.first_row)
    if not ordered:
        raise CommitError(f"merged staged file {file}: no part of it to commit")
    total = ordered[0].file_rows
    end = 0
    for p in ordered:
        if p.file_rows != total or p.rows <= 0 or p.first_row < end or p.first_row + p.rows > total:
            raise CommitError(
                f"merged staged file {file}: part rows {p.first_row}..{p.first_row + p.rows - 1} "
                f"of {p.file_rows} do not fit the other parts (of {total} rows); the checkpoint's "
                "committables were tampered with or written by another tool"
            )
        end = p.first_row + p.rows
    if sum(p.rows for p in ordered) == total:
        return None
    ranges: list[tuple[int, int]] = []
    for p in ordered:  # adjacent parts make one range
        if ranges and ranges[-1][0] + ranges[-1][1] == p.first_row:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + p.rows)
        else:
            ranges.append((p.first_row, p.rows))
    return tuple(ranges)


_Item = TypeVar("_Item")


def commit_plan(
    items: Iterable[_Item],
    *,
    part: Callable[[_Item], FilePart | None],
    file: Callable[[_Item], Hashable],
    describe: Callable[[_Item], str],
) -> list[tuple[_Item, tuple[tuple[int, int], ...] | None]]:
    """The files a commit of `items` (a sink's decoded committables) commits, in order: each
    whole-file item (`part` None) with None, and each merged file (`file` of its parts) once,
    at its first part's place, with None when the commit holds every part of it (commit it as
    it is), else with the ranges to keep (`kept_ranges`; `describe(item)` names the file in
    its errors).

    >>> whole, a, b = ("w", None), ("m", FilePart(0, 2, 5)), ("m", FilePart(4, 1, 5))
    >>> commit_plan([whole, a, b], part=lambda i: i[1], file=lambda i: i[0], describe=str)
    [(('w', None), None), (('m', FilePart(first_row=0, rows=2, file_rows=5)), ((0, 2), (4, 1)))]
    """
    items = list(items)
    parts: dict[Hashable, list[FilePart]] = {}
    for item in items:
        if (p := part(item)) is not None:
            parts.setdefault(file(item), []).append(p)
    planned: list[tuple[_Item, tuple[tuple[int, int], ...] | None]] = []
    for item in items:
        if part(item) is None:
            planned.append((item, None))
        elif (merged := parts.pop(file(item), None)) is not None:  # else: planned already
            planned.append((item, kept_ranges(merged, describe(item))))
    return planned


def take_ranges(table: pa.Table, ranges: Sequence[tuple[int, int]]) -> pa.Table:
    """The rows of `table` in `ranges` ((first row, rows) each), in order."""
    return pa.concat_tables([table.slice(first, rows) for first, rows in ranges])


def kept_stem(stem: str, ranges: Sequence[tuple[int, int]]) -> str:
    """The stem of the file rewritten from merged staged file `stem` keeping `ranges`: the same
    ranges always give the same name (a retried commit rewrites the same file), different ones
    a different name. Short range lists are spelled out, longer ones hashed."""
    spelled = "_".join(f"{first}.{rows}" for first, rows in ranges)
    if len(spelled) > 40:
        spelled = hashlib.blake2b(spelled.encode(), digest_size=8).hexdigest()
    return f"{stem}-k{spelled}"


class DiscardedParts:
    """Which parts of merged staged files were discarded so far (on the driver, or in a task):
    `add` says when a file's parts are all discarded, i.e. when the file may be deleted."""

    def __init__(self) -> None:
        self._rows: dict[str, set[FilePart]] = {}

    def add(self, file: str, part: FilePart) -> bool:
        """Record `part` of `file` as discarded; True once every row of the file is."""
        parts = self._rows.setdefault(file, set())
        parts.add(part)
        if sum(p.rows for p in parts) < part.file_rows:
            return False
        del self._rows[file]
        return True
