"""An exactly-once Parquet table sink (DESIGN §4 rule 8, Paimon PIP-30).

Table directory layout (a local path or any `pyarrow.fs` URI):

```
<table>/data/c<checkpoint>-<vertex>-<index>-a<attempt>.parquet   staged by writers
<table>/_commits/<commit-user>/<identifier>.json                one object per commit
```

A writer stages its epoch's rows as one data file named by checkpoint, subtask and attempt, and
returns a committable naming it (kept in its subtask state and handed over with the ack). The
commit coordinator commits a checkpoint's committables by writing one commit object listing
their files; only files listed by a commit object are part of the table, so staged files of
declined or aborted attempts are invisible (and `discard` deletes them). Commits are idempotent
per (commit user, identifier) and must come in identifier order. Names read back from
checkpoints or the table (the commit user, data file names) are checked before they are joined
into a path (`metadata.layout`): nothing is read, written or deleted outside the table.

`read_table(path)` (also `regional.read_table`) reads only committed rows; from Spark use
``spark.read.parquet(*committed_files(path))``.

>>> import tempfile
>>> import pyarrow as pa
>>> sink = ParquetSink(tempfile.mkdtemp())
>>> c = sink.write([pa.record_batch({"x": [1, 2]})], checkpoint_id=1, vertex_id="out",
...                index=0, attempt=0)
>>> read_table(sink.path).num_rows
0
>>> sink.commit("job-1", 1, c); read_table(sink.path).column("x").to_pylist()
[1, 2]
>>> sink.committed_identifiers("job-1")
frozenset({1})
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.layout import name_problem, path_problem
from regional.errors import CommitError

__all__ = ["ParquetSink", "committed_files", "read_table"]

_DATA = "data"
_COMMITS = "_commits"


class _Committable(msgspec.Struct, frozen=True, array_like=True):
    file: str  # relative to the table directory
    rows: int


class _CommitRecord(msgspec.Struct, frozen=True):
    commit_user: str
    identifier: int
    files: list[str]
    rows: int
    fallback: dict[int, int] = {}  # unit -> owner checkpoint, for units that fell back


def _open(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return pafs.LocalFileSystem(), path.rstrip("/")


def _fsync(path: str) -> None:
    """Make a local file (or a directory's entries) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _data_file(table: str, file: str, where: str) -> str:
    """`file` (a data file name read from a committable or a commit record, `where`) if it
    is a path under the table's `data/`; else `CommitError` naming the table and the value."""
    problem = path_problem(file)
    if problem is None and not file.startswith(f"{_DATA}/"):
        problem = f"not under {_DATA}/"
    if problem is not None:
        raise CommitError(
            f"table {table}: {where} names data file {file!r} ({problem}); data files are "
            f"staged under {_DATA}/ in the table, so it was tampered with or written by "
            "another tool"
        )
    return file


#: The name of a commit record: its identifier, zero-padded (see `ParquetSink._record_path`).
_RECORD_NAME = re.compile(r"\d{20}\.json")


def _commit_records(path: str) -> list[_CommitRecord]:
    """The table's commit records. Other files under `_commits/` (not named like a record, or
    not directly in a commit user's directory) are not records and are ignored; a file named
    like one that does not decode as one is a `CommitError` naming it."""
    fs, base = _open(path)
    root = f"{base}/{_COMMITS}"
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    out = []
    for info in fs.get_file_info(selector):
        relative = info.path[len(root) + 1 :].split("/")
        if info.type != pafs.FileType.File or len(relative) != 2:
            continue
        if not _RECORD_NAME.fullmatch(relative[1]):
            continue
        with fs.open_input_stream(info.path) as f:
            data = f.read()
        try:
            record = msgspec.json.decode(data, type=_CommitRecord)
        except (msgspec.DecodeError, ValueError, OverflowError, RecursionError) as exc:
            raise CommitError(
                f"table {path}: {_COMMITS}/{'/'.join(relative)} is not a commit record ({exc}); "
                "restore it from a backup, or move it out of the table to drop that commit"
            ) from None
        for file in record.files:
            _data_file(path, file, f"commit record {info.path}")
        out.append(record)
    return sorted(out, key=lambda r: (r.commit_user, r.identifier))


def _committed(path: str) -> tuple[pafs.FileSystem, str, list[str]]:
    """The table's file system and base path and its committed data files (relative), in commit
    order. A committed file that is gone is a `CommitError` naming the commit and the file."""
    fs, base = _open(path)
    listed = [(r, f) for r in _commit_records(path) for f in r.files]
    infos = fs.get_file_info([f"{base}/{f}" for _, f in listed]) if listed else []
    lost = [(r, f) for (r, f), i in zip(listed, infos, strict=True) if i.type != pafs.FileType.File]
    if lost:
        shown = "; ".join(
            f"commit {r.identifier} of user {r.commit_user!r} lost {f}" for r, f in lost[:3]
        )
        more = f" (and {len(lost) - 3} more)" if len(lost) > 3 else ""
        raise CommitError(
            f"table {path}: {shown}{more}; restore the data files from a backup (the commit "
            "records say which rows the table holds, so without them it cannot be read whole)"
        )
    return fs, base, [f for _, f in listed]


def committed_files(path: str) -> list[str]:
    """Full paths (or URIs) of the committed data files of the table at `path`."""
    prefix = path.rstrip("/") if "://" not in path else path.split("?")[0].rstrip("/")
    return [f"{prefix}/{f}" for f in _committed(path)[2]]


def read_table(path: str) -> pa.Table:
    """Every committed row of the Parquet table at `path`, in commit order."""
    fs, base, committed = _committed(path)
    files = [f"{base}/{f}" for f in committed]
    if not files:
        return pa.table({})
    return pa.concat_tables(
        [pq.read_table(f, filesystem=fs) for f in files], promote_options="default"
    )


class ParquetSink:
    """A Parquet table at `path`: writers stage files, the commit coordinator commits them."""

    def __init__(self, path: str) -> None:
        self.path = path

    # --- writer side (in tasks) -------------------------------------------------------------

    def write(
        self,
        batches: Sequence[pa.RecordBatch],
        *,
        checkpoint_id: int,
        vertex_id: str,
        index: int,
        attempt: int,
    ) -> tuple[bytes, ...]:
        """Stage `batches` as one data file; its committable (none if there are no rows)."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return ()
        table = (
            pa.Table.from_batches(batches)
            if len(batches) == 1
            else pa.concat_tables(
                [pa.Table.from_batches([b]) for b in batches], promote_options="default"
            )
        )
        name = f"{_DATA}/c{checkpoint_id}-{vertex_id}-{index}-a{attempt}-{uuid.uuid4().hex[:8]}"
        fs, base = _open(self.path)
        fs.create_dir(f"{base}/{_DATA}", recursive=True)
        pq.write_table(table, f"{base}/{name}.parquet", filesystem=fs)
        if isinstance(fs, pafs.LocalFileSystem):  # durable before it is acknowledged
            _fsync(f"{base}/{name}.parquet")
            _fsync(f"{base}/{_DATA}")
        return (msgspec.msgpack.encode(_Committable(f"{name}.parquet", table.num_rows)),)

    # --- committer side (on the driver): regional.operators.TableCommitter -------------------

    def _record_path(self, base: str, commit_user: str, identifier: int) -> str:
        return f"{self._user_dir(base, commit_user)}/{identifier:020d}.json"

    def _user_dir(self, base: str, commit_user: str) -> str:
        """`<table>/_commits/<commit user>`; the user (read from a checkpoint) must be a
        plain name, or commits would be written outside the table."""
        problem = name_problem(commit_user)
        if problem is not None:
            raise CommitError(
                f"table {self.path}: commit user {commit_user!r} cannot name a directory "
                f"under {_COMMITS}/ ({problem}); nothing was committed"
            )
        return f"{base}/{_COMMITS}/{commit_user}"

    def _files(self, committables: Iterable[bytes]) -> list[_Committable]:
        """The committables, decoded, each naming a data file under `data/` (`CommitError`
        otherwise: they come from checkpoint state)."""
        items = []
        for c in committables:
            try:
                item = msgspec.msgpack.decode(c, type=_Committable)
            except (msgspec.DecodeError, ValueError, OverflowError, RecursionError) as exc:
                raise CommitError(
                    f"table {self.path}: a committable does not decode ({exc}); the checkpoint "
                    "holding it is damaged"
                ) from None
            _data_file(self.path, item.file, "a committable")
            items.append(item)
        return items

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Make the files behind `committables` part of the table, atomically, as one commit;
        the commit object also records `fallback` (unit -> owner checkpoint)."""
        done = self.committed_identifiers(commit_user)
        if done and identifier <= max(done):
            raise CommitError(
                f"table {self.path}: commit {identifier} of user {commit_user!r} is not after its "
                f"latest commit {max(done)}; commits must be in checkpoint order"
            )
        items = self._files(committables)
        record = _CommitRecord(
            commit_user,
            identifier,
            [i.file for i in items],
            sum(i.rows for i in items),
            dict(fallback or {}),
        )
        fs, base = _open(self.path)
        final = self._record_path(base, commit_user, identifier)
        fs.create_dir(posixpath.dirname(final), recursive=True)
        data = msgspec.json.encode(record)
        if isinstance(fs, pafs.LocalFileSystem):
            tmp = f"{final}.tmp-{uuid.uuid4().hex}"
            with fs.open_output_stream(tmp) as out:
                out.write(data)
            _fsync(tmp)
            fs.move(tmp, final)  # atomic rename on a local disk
            _fsync(posixpath.dirname(final))
        else:
            with fs.open_output_stream(final) as out:  # one PUT on object stores
                out.write(data)

    def committed_identifiers(self, commit_user: str) -> frozenset[int]:
        fs, base = _open(self.path)
        selector = pafs.FileSelector(
            self._user_dir(base, commit_user), recursive=False, allow_not_found=True
        )
        names = (posixpath.basename(i.path) for i in fs.get_file_info(selector))
        return frozenset(int(n[:-5]) for n in names if _RECORD_NAME.fullmatch(n))

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        fs, base = _open(self.path)
        files = [c.file for c in self._files(committables)]
        infos = fs.get_file_info([f"{base}/{f}" for f in files])
        return [f for f, i in zip(files, infos, strict=True) if i.type != pafs.FileType.File]

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete staged files of a declined or aborted attempt (already gone is fine);
        committables of other sinks' formats are skipped."""
        fs, base = _open(self.path)
        for c in committables:
            try:
                [item] = self._files([c])
            except CommitError:  # another sink's format, or a name out of the table: skipped
                continue
            file = item.file
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(f"{base}/{file}")

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return sum(c.rows for c in self._files(committables))

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo `commit_user`'s commits after `identifier` (newest first, so a crash leaves the
        log a prefix of itself); returns the identifiers undone. Their rows leave the table;
        their data files stay, unreferenced. `regional.operators.TableRollback`."""
        fs, base = _open(self.path)
        undone = sorted(i for i in self.committed_identifiers(commit_user) if i > identifier)
        for i in reversed(undone):
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(self._record_path(base, commit_user, i))
        return undone
