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

import posixpath
from typing import Literal

import pyarrow as pa
import pyarrow.json as pajson
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.errors import MetadataError
from metadata.layout import name_problem
from regional.sources.base import ReadResult

__all__ = ["FileSource"]

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

    def _table(self, split_id: str) -> pa.Table:
        fs, base = self._fs()
        with fs.open_input_stream(f"{base.rstrip('/')}/{_file_name(split_id, self.path)}") as f:
            return pajson.read_json(f)

    def _parquet_rows(self, split_id: str, start: int, count: int) -> tuple[pa.Table, int]:
        """Rows `start .. start+count` of a Parquet file, reading only the row groups needed."""
        fs, base = self._fs()
        path = f"{base.rstrip('/')}/{_file_name(split_id, self.path)}"
        with pq.ParquetFile(path, filesystem=fs) as f:
            meta = f.metadata
            groups, first, offset = [], None, 0
            for g in range(meta.num_row_groups):
                n = meta.row_group(g).num_rows
                if offset + n > start and offset < start + count:
                    groups.append(g)
                    first = offset if first is None else first
                offset += n
            if not groups:
                return pa.table({}), meta.num_rows
            table = f.read_row_groups(groups)
        return table.slice(start - (first or 0), count), meta.num_rows

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        start = int(position) if position else 0
        if self.format == "parquet":
            part, total = self._parquet_rows(split_id, start, max_records)
        else:
            table = self._table(split_id)
            part, total = table.slice(start, max_records), table.num_rows
        end = start + part.num_rows
        batches = part.to_batches(max_chunksize=self.batch_size)
        return ReadResult([b for b in batches if b.num_rows], str(end).encode(), end >= total)
