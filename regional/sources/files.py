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

import json
import posixpath
from typing import Any, Literal

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.errors import MetadataError, RegionalError
from metadata.layout import name_problem
from regional.sources.base import PoisonRecord, ReadResult

__all__ = ["FileSource", "FileSourceError"]

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


class FileSource:
    """Files `*.parquet` or `*.jsonl` directly under `path` (a local path or pyarrow.fs URI)."""

    def __init__(
        self,
        path: str,
        *,
        format: Literal["parquet", "jsonl"] = "parquet",
        bounded: bool = True,
        batch_size: int = 65_536,
    ) -> None:
        if format not in _SUFFIX:
            raise ValueError(f"FileSource format {format!r} is unknown; use 'parquet' or 'jsonl'")
        self.path = path
        self.format = format
        self._bounded = bounded
        self.batch_size = batch_size

    @property
    def bounded(self) -> bool:
        return self._bounded

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
        position after them, the file's rows, and the lines that are not JSON objects."""
        fs, path = self._path(split_id)
        with fs.open_input_stream(path) as f:
            data = f.read()
        try:
            table = pajson.read_json(pa.BufferReader(data))
        except pa.ArrowInvalid:  # some line is not JSON: read line by line, keep the others
            return self._jsonl_lenient(split_id, data, start, count)
        part = table.slice(start, count)
        return part, start + part.num_rows, table.num_rows, ()

    def _jsonl_lenient(
        self, split_id: str, data: bytes, start: int, count: int
    ) -> tuple[pa.Table, int, int, tuple[PoisonRecord, ...]]:
        lines = [(n, line) for n, line in enumerate(data.split(b"\n"), 1) if line.strip()]
        good: list[Any] = []
        poison: list[PoisonRecord] = []
        for i, (n, line) in enumerate(lines[start : start + count]):
            text = line.decode("utf-8", "backslashreplace")
            try:
                row = json.loads(line)
                if not isinstance(row, dict):
                    raise ValueError(f"a JSON {type(row).__name__}, not an object")
            except ValueError as exc:
                where = f"line {n} of {split_id!r} in the file source at {self.path}"
                error = FileSourceError(
                    f"{where} is not a JSON object ({exc}); fix or remove the line, or run "
                    "the pipeline with on_error='dead-letter' to set such lines aside"
                )
                poison.append(PoisonRecord(i, {"file": split_id, "line": n, "text": text}, error))
                continue
            good.append(row)
        end = min(start + count, len(lines))
        return pa.Table.from_pylist(good), end, len(lines), tuple(poison)

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
        return ReadResult(
            [b for b in batches if b.num_rows], str(end).encode(), end >= total, poison
        )
