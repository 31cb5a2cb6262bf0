"""Replaying fixed dead letters into a source vertex, exactly once (DESIGN §4 rule 25).

`regional dead-letters ROOT replay FILE --into SOURCE` writes a **batch** of fixed records
into the source vertex's replay inbox under the job root, as one new object written whole or
not at all (`metadata.storage.JobStorage.write_new_file`), never rewritten:

```
<job root>/replay/<source vertex>/<n>.jsonl   the n-th batch (000001.jsonl, ...); line 1: its
                                               manifest (batch id, who, when, which
                                               dead-letter ids); then one
                                               {"id": ..., "record": ...} per record
```

The driver reads every user source through `ReplayingSource` (`Pipeline.bind`): besides the
source's own splits it discovers one split per batch file, ``replay:<n>``, by asking for the
next number's file each epoch (a HEAD, never a LIST on the checkpoint root), and reads its
records from a position (the index of the next record) that is checkpointed with the
subtask's split state like any other split's. So a batch is read once by the running job, or
by the next run if the job is not running: a unit that falls back re-reads it from its
owner's position, a restore from the checkpoint's, and a finished batch is never read again
(the split enumerator keeps finished splits). The command refuses a batch id, or a dead-letter
id, that the job's inboxes hold already, so a record is replayed once.

>>> import tempfile
>>> from pyarrow import fs as pafs
>>> inbox = tempfile.mkdtemp()
>>> _ = open(f"{inbox}/{batch_file_name(1)}", "w").write(encode_batch(
...     BatchManifest(batch="b1", source="orders", by="me", at_ms=0, ids=("d1", "d2")),
...     [FixedRecord("d1", {"n": 1}), FixedRecord("d2", {"n": 2})]).decode())
>>> class Empty:
...     bounded = True
...     def discover(self): return []
...     def read(self, split, position, max_records): raise AssertionError
>>> src = ReplayingSource(Empty(), inbox, pafs.LocalFileSystem())
>>> src.discover()
['replay:000001']
>>> r = src.read("replay:000001", b"", 1)
>>> r.batches, r.position, r.finished
([[{'n': 1}]], b'1', False)
>>> src.read("replay:000001", r.position, 10)[1:3]
(b'2', True)
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
from pyarrow import fs as pafs

from regional.errors import UsageError
from regional.sources.base import ReadResult, Source

__all__ = [
    "MAX_BATCH_BYTES",
    "REPLAY_DIR",
    "REPLAY_SPLIT_PREFIX",
    "BatchManifest",
    "FixedRecord",
    "ReplayError",
    "ReplayingSource",
    "batch_file_name",
    "decode_batch",
    "describe_batch",
    "encode_batch",
    "inbox_path",
    "parse_fixed_records",
    "replaying",
]

#: The directory of the replay inboxes, under the job root.
REPLAY_DIR = "replay"
#: A replay batch's split id is this prefix and the batch id.
REPLAY_SPLIT_PREFIX = "replay:"
#: The largest batch file read or written (a fixed-records file is refused above it).
MAX_BATCH_BYTES = 256 * 1024 * 1024
_BATCH_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class ReplayError(UsageError):
    """A replay that cannot be done as asked: a bad fixed-records file (naming the file and
    line), an unknown source vertex, or a batch or dead-letter id already replayed."""


class FixedRecord(NamedTuple):
    """One fixed record to replay: the id of the dead letter it fixes, and the record."""

    id: str
    record: Any


class BatchManifest(msgspec.Struct, frozen=True, kw_only=True):
    """The first line of a batch file: what was replayed, into which source vertex, by whom
    (user@host) and when (ms since the epoch), and the dead-letter ids in it, in order."""

    batch: str
    source: str
    by: str
    at_ms: int
    ids: tuple[str, ...]
    from_file: str = ""


def inbox_path(job_path: str, source_vertex: str) -> str:
    """The replay inbox of `source_vertex` under the job root `job_path`."""
    return f"{job_path.rstrip('/')}/{REPLAY_DIR}/{source_vertex}"


def batch_file_name(number: int) -> str:
    """The file of an inbox's `number`-th batch (from 1): numbered, so a running job finds a
    new batch by asking for the next name, not by listing the inbox.

    >>> batch_file_name(1), batch_file_name(12)
    ('000001.jsonl', '000012.jsonl')
    """
    return f"{number:06d}.jsonl"


def _is_file(filesystem: pafs.FileSystem, path: str) -> bool:
    """Whether `path` is a file: on S3 one HEAD (`open_input_file` only HEADs until read;
    `get_file_info` follows a 404 with a LIST)."""
    try:
        with filesystem.open_input_file(path):
            return True
    except (FileNotFoundError, IsADirectoryError):
        return False


def parse_fixed_records(text: str, *, file: str) -> list[FixedRecord]:
    """The fixed records of a JSON-lines file: each line an object with the dead letter's
    ``id`` and its ``record`` (what `dead-letters export` writes, fixed by hand). Blank lines
    are skipped; a bad line or a repeated id is a `ReplayError` naming the file and line."""
    out: list[FixedRecord] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ReplayError(f"{file} line {n}: not JSON ({exc.msg}); fix the line") from None
        if not isinstance(row, dict) or "id" not in row or "record" not in row:
            raise ReplayError(
                f'{file} line {n}: a fixed record is an object with the dead letter\'s "id" '
                'and its "record" (as `regional dead-letters export` writes them)'
            )
        key = row["id"]
        if not isinstance(key, str) or not key:
            raise ReplayError(f'{file} line {n}: "id" must be a dead-letter id (a string)')
        if key in seen:
            raise ReplayError(
                f"{file} line {n}: dead letter {key} is on line {seen[key]} too; a record is "
                "replayed once: keep one of the lines"
            )
        seen[key] = n
        out.append(FixedRecord(key, row["record"]))
    if not out:
        raise ReplayError(f"{file}: no fixed record in it; nothing to replay")
    return out


def encode_batch(manifest: BatchManifest, records: Sequence[FixedRecord]) -> bytes:
    """A batch file: the manifest line, then one ``{"id", "record"}`` line per record."""
    if not _BATCH_ID.match(manifest.batch):
        raise ReplayError(
            f"replay batch id {manifest.batch!r}: use at most 100 characters of "
            "[A-Za-z0-9._-], starting with a letter or digit"
        )
    lines = [msgspec.json.encode(manifest)]
    lines += [msgspec.json.encode({"id": r.id, "record": r.record}) for r in records]
    return b"\n".join(lines) + b"\n"


def decode_batch(data: bytes, *, where: str) -> tuple[BatchManifest, list[FixedRecord]]:
    """The manifest and records of batch file `data` (read from `where`, for errors)."""
    lines = data.decode("utf-8").splitlines()
    try:
        manifest = msgspec.json.decode(lines[0], type=BatchManifest)
        rows = [json.loads(line) for line in lines[1:] if line]
    except (IndexError, msgspec.DecodeError, json.JSONDecodeError) as exc:
        raise ReplayError(
            f"replay batch {where} does not decode ({exc}); it was not written by "
            "`regional dead-letters replay`: move it out of the inbox"
        ) from None
    return manifest, [FixedRecord(r["id"], r["record"]) for r in rows]


def describe_batch(manifest: BatchManifest, *, ids_shown: int = 20) -> str:
    """One line for the event log: the batch, its source, how many records, who replayed them
    when, and their dead-letter ids (the first `ids_shown`; the batch file holds them all).

    >>> line = describe_batch(BatchManifest(batch="b-1", source="orders", by="ann@h", at_ms=0,
    ...                                     ids=("a", "b", "c")), ids_shown=2)
    >>> line.split("; ")
    ["replay batch b-1 into 'orders': 3 record(s), replayed by ann@h at 1970-01-01T00:00:00Z", \
'ids a, b and 1 more']
    """
    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(manifest.at_ms / 1000))
    ids = ", ".join(manifest.ids[:ids_shown])
    if len(manifest.ids) > ids_shown:
        ids += f" and {len(manifest.ids) - ids_shown} more"
    return (
        f"replay batch {manifest.batch} into {manifest.source!r}: {len(manifest.ids)} "
        f"record(s), replayed by {manifest.by} at {when}; ids {ids}"
    )


class ReplayingSource:
    """`source` plus the replay batches in `inbox` (a directory on `filesystem`): one split
    ``replay:<batch>`` per batch file, read by record index (position = the count read, as
    text). Everything else is `source`'s own."""

    def __init__(self, source: Source, inbox: str, filesystem: pafs.FileSystem) -> None:
        self.source = source
        self.inbox = inbox
        self.filesystem = filesystem
        self._cache: dict[str, list[Any]] = {}  # batch files are never rewritten
        self._found: list[str] = []  # the batch files found so far, in order

    def __getattr__(self, name: str) -> Any:  # endless_splits, output_schema, ...
        if name in ("source", "inbox", "filesystem", "_cache", "_found"):
            raise AttributeError(name)
        return getattr(self.source, name)

    @property
    def bounded(self) -> bool:
        return self.source.bounded

    def discover(self) -> list[str]:
        return self.source.discover() + [REPLAY_SPLIT_PREFIX + b for b in self.batches()]

    def batches(self) -> list[str]:
        """The batch files in the inbox (`batch_file_name`: numbered from 1, no gap), found by
        asking for the one after the last found: one HEAD per call on S3, never a LIST (the
        steady-state path lists nothing, DESIGN §5)."""
        while _is_file(self.filesystem, f"{self.inbox}/{batch_file_name(len(self._found) + 1)}"):
            self._found.append(batch_file_name(len(self._found) + 1)[: -len(".jsonl")])
        return list(self._found)

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        if not split_id.startswith(REPLAY_SPLIT_PREFIX):
            return self.source.read(split_id, position, max_records)
        records = self._records(split_id[len(REPLAY_SPLIT_PREFIX) :])
        start = int(position) if position else 0
        end = min(len(records), start + max(max_records, 0))
        batch = records[start:end]
        return ReadResult([batch] if batch else [], str(end).encode(), end >= len(records))

    def _records(self, batch: str) -> list[Any]:
        if batch not in self._cache:
            path = f"{self.inbox}/{batch}.jsonl"
            with self.filesystem.open_input_stream(path) as f:
                data = f.read(MAX_BATCH_BYTES + 1)
            if len(data) > MAX_BATCH_BYTES:
                raise ReplayError(f"replay batch {path} is over {MAX_BATCH_BYTES} bytes")
            self._cache[batch] = [r.record for r in decode_batch(data, where=path)[1]]
        return self._cache[batch]

    def __getstate__(self) -> dict[str, Any]:
        return {"source": self.source, "inbox": self.inbox, "filesystem": self.filesystem}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _cache={}, _found=[])


def replaying(source: Source, inbox: str, filesystem: pafs.FileSystem) -> ReplayingSource:
    """`source` reading the replay `inbox` too. A source that reads an inbox already (a
    pipeline bound to another job root before) reads this one instead, never both."""
    if isinstance(source, ReplayingSource):
        source = source.source
    return ReplayingSource(source, inbox, filesystem)
