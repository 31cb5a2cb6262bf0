"""A file source over a directory of Parquet or JSON-lines files: one split per file.

The split id is the file name; the position is the row offset in the file. The directory is
listed again every epoch (`discover`), so files added while the job runs become new splits; a
file must be complete when it appears (write it elsewhere, then move it in). With
`bounded=True` the source finishes once every file seen has been read; unbounded, it keeps
looking for new files.

>>> import os, tempfile
>>> d = tempfile.mkdtemp()
>>> with open(os.path.join(d, "a.jsonl"), "w") as f:
...     _ = f.write('{"user": "u1"}\\n{"user": "u2"}\\n{"user": "u3"}\\n')
>>> src = FileSource(d, format="jsonl")
>>> src.discover()
['a.jsonl']
>>> r = src.read("a.jsonl", b"", 2)
>>> [b.to_pylist() for b in r.batches], r.finished
([[{'user': 'u1'}, {'user': 'u2'}]], False)
>>> src.read("a.jsonl", r.position, 2).batches[0].to_pylist()
[{'user': 'u3'}]
"""

from __future__ import annotations

import copy
import posixpath
from collections.abc import Callable
from typing import Any, Literal

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.errors import MetadataError, RegionalError
from metadata.layout import name_problem
from regional.sources import json_text
from regional.sources.base import PoisonRecord, ReadResult

__all__ = ["FileSource", "FileSourceError", "RowsFit"]

_SUFFIX = {"parquet": ".parquet", "jsonl": ".jsonl"}


def _file_name(split_id: str, source: str) -> str:
    """`split_id` if it is a plain file name (`discover` lists names directly under the
    source's path); it is read back from checkpoints, so a tampered one must not lead out."""
    if (problem := name_problem(split_id)) is not None:
        raise MetadataError(
            f"split id {split_id!r} of the file source at {source} is not a file name "
            f"({problem}); split ids are restored from checkpoints, so that one was tampered "
            "with: restore another checkpoint"
        )
    return split_id


class FileSourceError(RegionalError):
    """A record of a file cannot be read (a line that is not JSON, a Parquet row group that
    does not decode); the message names the file, the line or row group, and the fix. With
    `Pipeline(on_error="dead-letter")` the record becomes a dead letter instead."""


#: A UTF-8 byte order mark, which some writers put at the start of a text file.
_BOM = b"\xef\xbb\xbf"


#: A declared schema's judgement of decoded rows: the rows that fit, as one batch, and the
#: others as (index in the rows, why) (`regional.dataflow.fitted_source`).
RowsFit = Callable[[list[dict[str, Any]]], tuple[pa.RecordBatch, list[tuple[int, Exception]]]]


def _numbered_lines(data: bytes) -> list[tuple[int, bytes]]:
    """The non-empty lines of `data` with their line numbers (from 1): the file's rows."""
    return [(n, line) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]


def _json_kind(value: Any) -> str:
    """What a decoded JSON value is, for an error: "null", "a JSON int", ..."""
    return "null" if value is None else f"a JSON {type(value).__name__}"


def _arrow_rows(rows: list[dict[str, Any]]) -> tuple[pa.Table, dict[int, str]]:
    """`rows` as one Arrow table, and the rows (by index) that cannot be in it, with why: a
    row Arrow cannot hold (an int beyond 64 bits) or whose types disagree with the rows before
    it (`a` a number there, a string here). Usually one conversion; row by row only when that
    fails."""
    try:
        return pa.Table.from_pylist(rows), {}
    except (pa.ArrowException, OverflowError, ValueError, TypeError):
        pass
    schema: pa.Schema | None = None
    unfit: dict[int, str] = {}
    for i, row in enumerate(rows):
        try:
            own = pa.RecordBatch.from_pylist([row]).schema
            schema = (
                own
                if schema is None
                else pa.unify_schemas([schema, own], promote_options="permissive")
            )
        except (pa.ArrowException, OverflowError, ValueError, TypeError) as exc:
            unfit[i] = f"{type(exc).__name__}: {exc}"
    batches = []
    for i, row in enumerate(rows):
        if i in unfit:
            continue
        try:
            batches.append(pa.RecordBatch.from_pylist([row], schema=schema))
        except (pa.ArrowException, OverflowError, ValueError, TypeError) as exc:
            unfit[i] = f"{type(exc).__name__}: {exc}"
    return (pa.Table.from_batches(batches, schema) if schema else pa.table({})), unfit


class FileSource:
    """Files `*.parquet` or `*.jsonl` directly under `path` (a local path or pyarrow.fs URI).

    A JSON-lines line longer than `max_line_bytes` or nested deeper than `max_depth` levels
    is a poison record (so is one that is not UTF-8 or not a JSON object): it never reaches a
    parser, whose recursion a deep line could overflow."""

    def __init__(
        self,
        path: str,
        *,
        format: Literal["parquet", "jsonl"] = "parquet",
        bounded: bool = True,
        batch_size: int = 65_536,
        max_line_bytes: int = json_text.DEFAULT_BOUNDS.max_bytes,
        max_depth: int = json_text.DEFAULT_BOUNDS.max_depth,
    ) -> None:
        if format not in _SUFFIX:
            raise ValueError(f"FileSource format {format!r} is unknown; use 'parquet' or 'jsonl'")
        for what, value, most in (
            ("max_line_bytes", max_line_bytes, 1 << 30),
            ("max_depth", max_depth, 1000),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
                raise ValueError(
                    f"FileSource {what}={value!r} is out of range; give a whole number from 1 "
                    f"to {most:,}"
                )
        self.path = path
        self.format = format
        self._bounded = bounded
        self.batch_size = batch_size
        self._bounds = json_text.JsonBounds(max_line_bytes, max_depth)
        #: split -> its file's modification time (ms): files are complete when they appear,
        #: so each is asked once per process (`_modified_ms`)
        self._modified: dict[str, int | None] = {}
        self._fit: RowsFit | None = None

    @property
    def bounded(self) -> bool:
        return self._bounded

    def file_schema(self) -> pa.Schema | None:
        """The Arrow schema of the first Parquet file (in split order), for
        ``Pipeline.source(src, schema="infer")``; None for JSON lines (their types are
        inferred per read, so declare them) or when there is no file yet."""
        if self.format != "parquet":
            return None
        files = self.discover()
        if not files:
            return None
        fs, path = self._path(files[0])
        with fs.open_input_file(path) as f:
            return pq.read_schema(f).remove_metadata()

    def fitting(self, fit: RowsFit) -> FileSource:
        """This source, with the JSON-lines rows it has to decode line by line (their types
        disagree) handed to `fit` (`Pipeline.source(..., schema=...)`: the declared schema
        judges them): a row `fit` rejects is a poison record naming `fit`'s reason, instead
        of one whose types disagree with the rows before it."""
        fitted = copy.copy(self)
        fitted._fit = fit
        return fitted

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        return (
            pafs.FileSystem.from_uri(self.path)
            if "://" in self.path
            else (
                pafs.LocalFileSystem(),
                self.path,
            )
        )

    def discover(self) -> list[str]:
        fs, base = self._fs()
        selector = pafs.FileSelector(base, recursive=False, allow_not_found=True)
        names = (posixpath.basename(i.path) for i in fs.get_file_info(selector))
        return sorted(n for n in names if n.endswith(_SUFFIX[self.format]))

    def _path(self, split_id: str) -> tuple[pafs.FileSystem, str]:
        fs, base = self._fs()
        return fs, f"{base.rstrip('/')}/{_file_name(split_id, self.path)}"

    def _jsonl_rows(
        self, split_id: str, start: int, count: int
    ) -> tuple[pa.Table, int, int, tuple[PoisonRecord, ...]]:
        """Rows `start .. start+count` of a JSON-lines file (a row per non-empty line), the
        position after them, the file's rows, and the lines that cannot be rows (poison).

        Every line is screened before any parser sees it (`regional.sources.json_text`: its
        size, nesting depth and UTF-8, and that it is an object); pyarrow's reader then reads
        the lines that passed, so the column types are inferred over the whole file. If it
        refuses them, or makes another number of rows (two objects on one line), the range is
        read line by line instead, each line that does not decode a poison record."""
        fs, path = self._path(split_id)
        with fs.open_input_stream(path) as f:
            data = f.read()
        lines = _numbered_lines(data.removeprefix(_BOM))
        screened = [self._line_problem(line) for _, line in lines]
        good = [line for (_, line), why in zip(lines, screened, strict=True) if why is None]
        end = min(start + count, len(lines))
        poison = tuple(
            self._poison(split_id, i - start, lines[i][0], lines[i][1], why)
            for i in range(start, end)
            if (why := screened[i]) is not None
        )
        table = self._read_json(good)
        if table is None:
            rest = self._jsonl_lenient(split_id, lines[start:end], screened[start:end], start)
            return rest[0], end, len(lines), rest[1]
        before = sum(1 for why in screened[:start] if why is None)
        taken = sum(1 for why in screened[start:end] if why is None)
        return table.slice(before, taken), end, len(lines), poison

    def _line_problem(self, line: bytes) -> str | None:
        """Why `line` cannot be a row before parsing it (too long, too deep, not UTF-8, not
        an object), or None."""
        if (why := json_text.problem(line, self._bounds)) is not None:
            return why
        if line.lstrip().startswith(b"{"):
            return None
        try:  # say what it is instead (rare: only for lines that are no object)
            value = json_text.decode(line, self._bounds)
        except ValueError as exc:
            return f"not a JSON object ({exc})"
        return f"not a JSON object ({_json_kind(value)})"

    def _read_json(self, lines: list[bytes]) -> pa.Table | None:
        """The screened `lines` read by pyarrow's JSON reader (one row each), or None when it
        refuses them or does not make one row per line."""
        if not lines:
            return pa.table({})
        options = pajson.ReadOptions(block_size=max(1 << 20, self._bounds.max_bytes + 1))
        try:
            table = pajson.read_json(pa.BufferReader(b"\n".join(lines)), read_options=options)
        except pa.ArrowInvalid:
            return None
        return table if table.num_rows == len(lines) else None

    def _jsonl_lenient(
        self,
        split_id: str,
        lines: list[tuple[int, bytes]],
        screened: list[str | None],
        start: int,
    ) -> tuple[pa.Table, tuple[PoisonRecord, ...]]:
        """`lines` (the read's range from row `start`, with the problems screening found)
        decoded one by one, and the poison among them: each line that is not a JSON object or
        cannot be an Arrow row beside the others (a number beyond 64 bits, a type the rows
        before it disagree with)."""
        rows: list[Any] = []
        ordinals: list[int] = []
        poison: list[PoisonRecord] = []
        for i, ((n, line), why) in enumerate(zip(lines, screened, strict=True)):
            if why is None:
                try:
                    row = json_text.decode(line, self._bounds)
                    if not isinstance(row, dict):
                        raise ValueError(_json_kind(row))
                except ValueError as exc:  # JSONDecodeError too
                    why = f"not a JSON object ({exc})"
                else:
                    rows.append(row)
                    ordinals.append(i)
                    continue
            poison.append(self._poison(split_id, i, n, line, why))
        fit = getattr(self, "_fit", None)  # a FileSource pickled before `fitting` had none
        if fit is not None:
            fitted, rejected = fit(rows)
            table = pa.Table.from_batches([fitted])
            unfit = {at: f"not of the declared schema ({error})" for at, error in rejected}
        else:
            table, unfit = _arrow_rows(rows)
            unfit = {at: f"not an Arrow row beside the others ({why})" for at, why in unfit.items()}
        for at, why in unfit.items():
            n, line = lines[ordinals[at]]
            poison.append(self._poison(split_id, ordinals[at], n, line, why))
        poison.sort(key=lambda p: p.ordinal)
        return table, tuple(poison)

    def _poison(self, split_id: str, ordinal: int, n: int, line: bytes, why: str) -> PoisonRecord:
        """The poison record of line `n` of `split_id` (`ordinal`: its index in the read,
        `why`: what is wrong with it). Its text is the line with undecodable bytes escaped
        (``\\xff``), cut to `max_line_bytes` (then `bytes` says how long the line is)."""
        where = f"line {n} of {split_id!r} in the file source at {self.path}"
        fix = "fix or remove the line"
        if why.endswith(("bytes", "the limit")):
            fix += " (or raise the limit: FileSource(..., max_line_bytes=..., max_depth=...))"
        error = FileSourceError(
            f"{where} is {why}; {fix}, or run the pipeline with on_error='dead-letter' to set "
            "such lines aside"
        )
        keep = self._bounds.max_bytes
        record: dict[str, Any] = {
            "file": split_id,
            "line": n,
            "text": line[:keep].decode("utf-8", "backslashreplace"),
        }
        if len(line) > keep:
            record["bytes"] = len(line)
        return PoisonRecord(ordinal, record, error)

    def _parquet_rows(
        self, split_id: str, start: int, count: int
    ) -> tuple[pa.Table, int, int, tuple[PoisonRecord, ...]]:
        """Rows `start .. start+count` of a Parquet file, reading only the row groups needed
        (their page checksums verified where the writer wrote them), the position after
        them, the file's rows, and the row groups that do not decode (a bad group is skipped
        whole, so the position may move past `start+count` to its end)."""
        fs, path = self._path(split_id)
        parts: list[pa.Table] = []
        poison: list[PoisonRecord] = []
        end = start
        with pq.ParquetFile(path, filesystem=fs, page_checksum_verification=True) as f:
            meta = f.metadata
            offset = 0
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                lo, hi = max(start, offset), min(start + count, offset + n)
                if lo < hi:
                    try:
                        parts.append(f.read_row_group(g).slice(lo - offset, hi - lo))
                        end = hi
                    except (OSError, pa.ArrowException) as exc:
                        where = (
                            f"row group {g} (rows {offset}..{offset + n - 1}) of {split_id!r} "
                            f"in the file source at {self.path}"
                        )
                        error = FileSourceError(
                            f"{where} does not decode ({type(exc).__name__}: {exc}); replace "
                            "the file, or run the pipeline with on_error='dead-letter' to set "
                            "such row groups aside"
                        )
                        record = {"file": split_id, "row_group": g, "rows": [offset, offset + n]}
                        poison.append(PoisonRecord(lo - start, record, error))
                        end = offset + n
                offset += n
            total = meta.num_rows
        table = pa.concat_tables(parts) if parts else pa.table({})
        return table, end, total, tuple(poison)

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        start = int(position) if position else 0
        rows = self._parquet_rows if self.format == "parquet" else self._jsonl_rows
        part, end, total, poison = rows(split_id, start, max_records)
        batches = part.to_batches(max_chunksize=self.batch_size) if part.num_columns else []
        behind = max(total - end, 0)
        return ReadResult(
            [b for b in batches if b.num_rows],
            str(end).encode(),
            end >= total,
            poison,
            behind,
            self._modified_ms(split_id) if behind else None,
        )

    def _modified_ms(self, split_id: str) -> int | None:
        """When the file was last written (ms; None when the store does not say): its unread
        rows were all written by then, so the consumer lag in time shown from it
        (`ReadResult.unread_since`) is at most their true age. One stat (a HEAD on an object
        store) per file and process, the first time it is read with rows left: a file is
        complete when it appears, so its time never changes."""
        known = self.__dict__.setdefault("_modified", {})  # one pickled before it had none
        if split_id not in known:
            fs, path = self._path(split_id)
            mtime = fs.get_file_info(path).mtime
            known[split_id] = None if mtime is None else int(mtime.timestamp() * 1000)
        return known[split_id]
