"""The commit log of a staging directory (a Parquet table, an exchange): one record per commit.

```
<dir>/_commits/<commit user>/<group>/<identifier:020d>.json   {commit_user, identifier, files,
                                                               rows, fallback, sizes, checksums}
```

`files` are the published files (relative to the directory), in publish order; `sizes` and
`checksums` (hex BLAKE2b-128, `metadata.format.segment_checksum`) are theirs, in the same order
(since format 1.6 of the exchange; empty in older records: then only existence is known). The
writer is `regional.sinks.staging.StagingArea`; the exchange reader and `regional inspect ROOT
validate` read the records here to know which segments were committed and verify each before it
is read. Records are grouped in directories of `COMMIT_GROUP` identifiers.

>>> r = CommitRecord("u", 7, ["n2/p0/a.parquet"], 3, sizes=[10], checksums=["ab"])
>>> r.expected()
{'n2/p0/a.parquet': FileCheck(identifier=7, size=10, checksum='ab')}
"""

from __future__ import annotations

import os
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import NamedTuple

import msgspec
from pyarrow import fs as pafs

from metadata.confine import confined_entries
from metadata.errors import MetadataError
from metadata.format import DECODE_FAILURES

__all__ = [
    "COMMITS",
    "COMMIT_GROUP",
    "GROUP_NAME",
    "RECORD_NAME",
    "CommitRecord",
    "FileCheck",
    "IndexedRecord",
    "RecordCache",
    "read_records",
    "record_paths",
]

COMMITS = "_commits"
#: Commit records per group directory of `_commits/<user>/`.
COMMIT_GROUP = 1000
#: The name of a commit record (and of a group directory): an identifier, zero-padded.
RECORD_NAME = re.compile(r"\d{20}\.json")
GROUP_NAME = re.compile(r"\d{20}")


class FileCheck(NamedTuple):
    """What a commit record says of one published file: its commit and, where recorded, its
    size and checksum (hex)."""

    identifier: int
    size: int | None
    checksum: str | None


class CommitRecord(msgspec.Struct, frozen=True):
    """One commit: the files it published (relative to the directory) and their rows; the
    files' sizes and checksums where the writer recorded them."""

    commit_user: str
    identifier: int
    files: list[str]
    rows: int
    fallback: dict[int, int] = {}  # unit -> owner checkpoint, for units that fell back
    sizes: list[int] = []
    checksums: list[str] = []

    def expected(self) -> dict[str, FileCheck]:
        """Each published file and what is known of it."""
        known = len(self.sizes) == len(self.files) == len(self.checksums)
        return {
            f: FileCheck(
                self.identifier,
                self.sizes[i] if known else None,
                self.checksums[i] if known else None,
            )
            for i, f in enumerate(self.files)
        }


def record_paths(fs: pafs.FileSystem, directory: str, since: int = 0) -> list[str]:
    """The paths of the commit records of `directory` (a full path) with identifier >= `since`,
    of every commit user. Only the groups that can hold such identifiers are listed. On a
    local disk nothing is listed or named through a link out of `directory`
    (`OutsideRootError`): `_commits` is resolved once, then only entries that are symbolic
    links (`metadata.confine.confined_entries`)."""
    if isinstance(fs, pafs.LocalFileSystem):
        return _local_record_paths(directory, since)

    def listing(path: str) -> list[pafs.FileInfo]:
        selector = pafs.FileSelector(path, recursive=False, allow_not_found=True)
        return list(fs.get_file_info(selector))

    def name(info: pafs.FileInfo) -> str:
        return info.path.rstrip("/").rsplit("/", 1)[-1]

    paths = []
    for user in listing(f"{directory}/{COMMITS}"):
        if user.type != pafs.FileType.Directory:
            continue
        for entry in listing(user.path):
            n = name(entry)
            if entry.type == pafs.FileType.File and RECORD_NAME.fullmatch(n):
                if int(n[:-5]) >= since:
                    paths.append(entry.path)  # a record of the older, ungrouped layout
            elif (
                entry.type == pafs.FileType.Directory
                and GROUP_NAME.fullmatch(n)
                and int(n) + COMMIT_GROUP > since
            ):
                paths += [
                    i.path
                    for i in listing(entry.path)
                    if RECORD_NAME.fullmatch(m := name(i)) and int(m[:-5]) >= since
                ]
    return paths


def _local_record_paths(directory: str, since: int) -> list[str]:
    """`record_paths` on a local disk."""
    root = directory.rstrip("/")

    def record(e: os.DirEntry[str]) -> bool:
        return bool(RECORD_NAME.fullmatch(e.name)) and int(e.name[:-5]) >= since and e.is_file()

    def group(e: os.DirEntry[str]) -> bool:
        return (
            bool(GROUP_NAME.fullmatch(e.name)) and int(e.name) + COMMIT_GROUP > since and e.is_dir()
        )

    paths = []
    for user in confined_entries(root, COMMITS, os.DirEntry.is_dir, what="directory"):
        under = f"{COMMITS}/{user.name}"
        for entry in confined_entries(
            root, under, lambda e: record(e) or group(e), what="directory", checked=True
        ):
            if record(entry):
                paths.append(entry.path)  # a record of the older, ungrouped layout
                continue
            paths += [
                r.path
                for r in confined_entries(
                    root, f"{under}/{entry.name}", record, what="directory", checked=True
                )
            ]
    return paths


def _read(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The bytes of the record at `path`, None when it went (rolled back or cleaned)."""
    try:
        with fs.open_input_stream(path) as f:
            return bytes(f.read())
    except FileNotFoundError:
        return None


def _decode(path: str, data: bytes) -> CommitRecord:
    try:
        return msgspec.json.decode(data, type=CommitRecord)
    except DECODE_FAILURES as exc:
        raise MetadataError(f"{path} is not a commit record ({exc})") from None


def read_records(fs: pafs.FileSystem, directory: str, since: int = 0) -> list[CommitRecord]:
    """The commit records of `directory` (a full path) with identifier >= `since`, of every
    commit user, by (identifier, user) (`record_paths`: nothing is read through a link out of
    `directory`); a record that does not decode is a `MetadataError` naming it."""
    records = [
        _decode(path, data)
        for path in record_paths(fs, directory, since)
        if (data := _read(fs, path)) is not None
    ]
    return sorted(records, key=lambda r: (r.identifier, r.commit_user))


class IndexedRecord(NamedTuple):
    """A commit record and, by directory (relative), the positions of its files there."""

    record: CommitRecord
    files_in: Mapping[str, Sequence[int]]

    @classmethod
    def of(cls, record: CommitRecord) -> IndexedRecord:
        files_in: dict[str, list[int]] = {}
        for i, file in enumerate(record.files):
            files_in.setdefault(file.rpartition("/")[0], []).append(i)
        return cls(record, files_in)

    def expected_in(self, directory: str) -> dict[str, FileCheck]:
        """What the record says of each file it published in `directory` (relative, no
        trailing slash), by file name: `CommitRecord.expected`, for one directory."""
        r = self.record
        known = len(r.sizes) == len(r.files) == len(r.checksums)
        return {
            r.files[i].rpartition("/")[2]: FileCheck(
                r.identifier, r.sizes[i] if known else None, r.checksums[i] if known else None
            )
            for i in self.files_in.get(directory, ())
        }


class RecordCache:
    """Commit records decoded once per process, not once per reader: every reader subtask of
    an exchange reads the same records, each naming the files of every partition. A record
    is kept with its bytes and reused only while the file holds exactly those bytes (read
    each time: a record rolled back and written again is decoded again), indexed by
    directory (`IndexedRecord`), so a reader picks its own files without decoding or walking
    the others. At most `capacity` records are kept (the least recently read go first)."""

    def __init__(self, capacity: int = 32) -> None:
        self.capacity = capacity
        self._kept: OrderedDict[str, tuple[bytes, IndexedRecord]] = OrderedDict()
        self._lock = threading.Lock()

    def records(self, fs: pafs.FileSystem, directory: str, since: int = 0) -> list[IndexedRecord]:
        """`read_records`, indexed, decoding only records not read before."""
        out = []
        for path in record_paths(fs, directory, since):
            data = _read(fs, path)
            if data is None:
                continue
            key = f"{type(fs).__name__}:{path}"
            with self._lock:
                kept = self._kept.get(key)
                if kept is not None and kept[0] == data:
                    self._kept.move_to_end(key)
                    out.append(kept[1])
                    continue
            indexed = IndexedRecord.of(_decode(path, data))
            with self._lock:
                self._kept[key] = (data, indexed)
                self._kept.move_to_end(key)
                while len(self._kept) > self.capacity:
                    self._kept.popitem(last=False)
            out.append(indexed)
        return sorted(out, key=lambda r: (r.record.identifier, r.record.commit_user))
