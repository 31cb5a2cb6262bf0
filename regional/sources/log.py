"""A partitioned append-only log source: a directory per partition, JSON-lines segment files.

```
<root>/<partition>/<segment>.jsonl     records appended while the job runs
```

Each partition is a split; new partition directories are discovered every epoch. Writers
append whole lines to a partition's segments (segments sorted by name; a new segment once the
old one is closed). The position is the segment name and the byte offset after the last record
read; a line without its trailing newline is still being written and is not read yet. The source
is unbounded: it never finishes.

>>> import os, tempfile
>>> root = tempfile.mkdtemp(); os.makedirs(f"{root}/p0")
>>> with open(f"{root}/p0/000.jsonl", "w") as f:
...     _ = f.write('{"v": 1}\\n{"v": 2}\\n{"v": 3')      # the last line is incomplete
>>> log = LogSource(root)
>>> log.discover()
['p0']
>>> r = log.read("p0", b"", 10)
>>> r.batches[0].to_pylist(), r.position, r.finished
([{'v': 1}, {'v': 2}], b'000.jsonl:18', False)
>>> with open(f"{root}/p0/000.jsonl", "a") as f:
...     _ = f.write('}\\n')
>>> log.read("p0", r.position, 10).batches[0].to_pylist()
[{'v': 3}]
"""

from __future__ import annotations

import json
import posixpath

import pyarrow as pa
from pyarrow import fs as pafs

from metadata.errors import MetadataError
from metadata.layout import name_problem
from regional.sources.base import ReadResult

__all__ = ["LogSource"]


class LogSource:
    """Partitions (directories) of JSON-lines segments under `path` (local path or URI)."""

    def __init__(self, path: str, *, suffix: str = ".jsonl") -> None:
        self.path = path
        self.suffix = suffix

    @property
    def bounded(self) -> bool:
        return False

    @property
    def endless_splits(self) -> bool:
        """A partition never finishes (`regional.sources.base.endless_splits`)."""
        return True

    def _fs(self) -> tuple[pafs.FileSystem, str]:
        if "://" in self.path:
            return pafs.FileSystem.from_uri(self.path)
        return pafs.LocalFileSystem(), self.path.rstrip("/")

    def discover(self) -> list[str]:
        fs, base = self._fs()
        infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
        return sorted(
            posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.Directory
        )

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        fs, base = self._fs()
        if (problem := name_problem(split_id)) is not None:
            raise MetadataError(
                f"split id {split_id!r} of the log source at {self.path} is not a partition "
                f"name ({problem}); split ids are restored from checkpoints, so that one was "
                "tampered with: restore another checkpoint"
            )
        directory = f"{base}/{split_id}"
        selector = pafs.FileSelector(directory, allow_not_found=True)
        segments = sorted(
            posixpath.basename(i.path)
            for i in fs.get_file_info(selector)
            if i.type == pafs.FileType.File and i.path.endswith(self.suffix)
        )
        segment, _, offset_text = position.decode().partition(":")
        offset = int(offset_text) if offset_text else 0
        rows: list[dict] = []
        for name in segments:
            if segment and name < segment:
                continue
            start = offset if name == segment else 0
            with fs.open_input_file(f"{directory}/{name}") as f:
                data = f.read_at(f.size() - start, start) if f.size() > start else b""
            consumed = 0
            for line in data.split(b"\n")[:-1]:  # the last piece has no newline yet
                if len(rows) >= max_records:
                    break
                consumed += len(line) + 1
                if line.strip():
                    rows.append(json.loads(line))
            segment, offset = name, start + consumed
            if len(rows) >= max_records:
                break
        batches = [pa.RecordBatch.from_pylist(rows)] if rows else []
        return ReadResult(batches, f"{segment}:{offset}".encode(), False)
