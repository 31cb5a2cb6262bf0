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

import re
from typing import NamedTuple

import msgspec
from pyarrow import fs as pafs

from metadata.confine import check_confined
from metadata.errors import MetadataError
from metadata.format import DECODE_FAILURES

__all__ = [
    "COMMITS",
    "COMMIT_GROUP",
    "GROUP_NAME",
    "RECORD_NAME",
    "CommitRecord",
    "FileCheck",
    "read_records",
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


def read_records(fs: pafs.FileSystem, directory: str, since: int = 0) -> list[CommitRecord]:
    """The commit records of `directory` (a full path) with identifier >= `since`, of every
    commit user, by (identifier, user). Only the groups that can hold such identifiers are
    listed. On a local disk nothing is read through a link out of `directory`
    (`OutsideRootError`); a record that does not decode is a `MetadataError` naming it."""
    local = isinstance(fs, pafs.LocalFileSystem)

    def listing(path: str) -> list[pafs.FileInfo]:
        if local:
            check_confined(directory, path[len(directory) + 1 :], what="directory")
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
    records = []
    for path in paths:
        if local:
            check_confined(directory, path[len(directory) + 1 :], what="directory")
        try:
            with fs.open_input_stream(path) as f:
                data = f.read()
        except FileNotFoundError:
            continue  # rolled back or cleaned meanwhile
        try:
            records.append(msgspec.json.decode(data, type=CommitRecord))
        except DECODE_FAILURES as exc:
            raise MetadataError(f"{path} is not a commit record ({exc})") from None
    return sorted(records, key=lambda r: (r.identifier, r.commit_user))
