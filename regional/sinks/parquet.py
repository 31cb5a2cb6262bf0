"""An exactly-once Parquet table sink that every Parquet reader reads correctly (DESIGN §4 rule
8, Paimon PIP-30).

Table directory layout (a local path or any `pyarrow.fs` URI):

```
<table>/part-<job>-<run>-c<checkpoint>-<vertex>-<subtask>-u<unit>-a<attempt>-<random>.parquet
                                          committed data files, published by the commit
<table>/_staging/<job>/<same name>.staged  staged by writers, invisible to readers
<table>/_commits/<commit-user>/<group>/<identifier>.json
                                          one record per commit, written last
```

A writer stages its epoch's rows as one file under `_staging/<job>/`, named by job, driver run,
checkpoint, subtask, unit and attempt, and returns a committable naming it (kept in its subtask
state and handed over with the ack). Readers never see staged files: Spark and pyarrow skip
paths starting with `_` or `.`, and a staged file does not end in `.parquet`, so DuckDB's
``read_parquet('<table>/**/*.parquet')`` (whose `**` does enter `_staging/`) skips it too.

The commit coordinator commits a checkpoint by *publishing* its staged files into the table
directory under their final names (a rename on a local disk; copy + delete on object stores,
`pyarrow.fs.FileSystem.move`), then writing the commit record last. Publishing is idempotent: a
file already published is not published again, so a re-commit after a crash never duplicates.
Between the first publish and the record, a reader of the bare path may see part of that
checkpoint's rows (never a row twice); a restarted driver always completes the commit.
`read_table` reads exactly the files the records list.

Commit records are grouped in directories of 1,000 identifiers (`<group>` is the first
identifier of the group, zero-padded), and the latest committed identifier of a commit user is
kept in memory after the first lookup (which lists the user's directory of groups, then only the
newest group) and moved on by the sink's own commits: the work of one commit does not grow with
the job's age. Commits are idempotent per (commit user, identifier) and must come in identifier
order. Names read back from checkpoints or the table (the commit user, data file names) are
checked before they are joined into a path (`metadata.layout`): nothing is read, written or
deleted outside the table.

`read_table(path)` (also `regional.read_table`) reads only committed rows; so do
``spark.read.parquet(path)``, ``pyarrow.dataset.dataset(path, format="parquet")`` and DuckDB's
``read_parquet('<path>/**/*.parquet')``.

>>> import tempfile
>>> import pyarrow as pa
>>> sink = ParquetSink(tempfile.mkdtemp())
>>> c = sink.write([pa.record_batch({"x": [1, 2]})], checkpoint_id=1, vertex_id="out",
...                index=0, attempt=0, job_id="job", unit_id=0, run_id="r1")
>>> read_table(sink.path).num_rows
0
>>> sink.commit("job-1", 1, c); read_table(sink.path).column("x").to_pylist()
[1, 2]
>>> sink.latest_committed("job-1"), sink.latest_committed("job-2")
(1, None)
"""

from __future__ import annotations

import contextlib
import posixpath
import re
import uuid
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.format import DECODE_FAILURES
from metadata.layout import name_problem, path_problem
from metadata.model import SinkRetention
from regional.errors import CommitError
from regional.sinks.durability import StagedFiles
from regional.sinks.durability import fsync_path as _fsync

__all__ = ["COMMIT_GROUP", "ParquetSink", "committed_files", "read_table"]

_LEGACY_DATA = "data"  # tables written before staging: committed files stayed in data/
_STAGING = "_staging"
_COMMITS = "_commits"
_STAGED = ".staged"
#: Commit records per group directory of `_commits/<user>/`.
COMMIT_GROUP = 1000
_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]")


class _Committable(msgspec.Struct, frozen=True, array_like=True):
    file: str  # the staged file, relative to the table directory
    rows: int


class _CommitRecord(msgspec.Struct, frozen=True):
    commit_user: str
    identifier: int
    files: list[str]  # the published files, relative to the table directory
    rows: int
    fallback: dict[int, int] = {}  # unit -> owner checkpoint, for units that fell back


#: The local file system (stateless: one for every table; a writer opens it once per file).
_LOCAL = pafs.LocalFileSystem()


def _open(path: str) -> tuple[pafs.FileSystem, str]:
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return _LOCAL, path.rstrip("/")


def _staged_file(table: str, file: str, where: str) -> str:
    """`file` (a staged file read from a committable, `where`) if it is a staged file of the
    table (`_staging/<job>/<name>.staged`, or `data/...` of older versions); else `CommitError`
    naming the table and the value."""
    problem = path_problem(file)
    parts = file.split("/")
    if problem is None and not (
        (len(parts) == 3 and parts[0] == _STAGING and parts[2].endswith(_STAGED))
        or (len(parts) >= 2 and parts[0] == _LEGACY_DATA)
    ):
        problem = f"not a file staged under {_STAGING}/<job>/"
    if problem is not None:
        raise CommitError(
            f"table {table}: {where} names data file {file!r} ({problem}); data files are "
            f"staged under {_STAGING}/ in the table, so it was tampered with or written by "
            "another tool"
        )
    return file


def _published(staged: str) -> str:
    """The name a staged file is published under: in the table directory, ending in
    `.parquet` (a legacy `data/` file stays where it is)."""
    if staged.startswith(f"{_STAGING}/"):
        return posixpath.basename(staged)[: -len(_STAGED)] + ".parquet"
    return staged


def _committed_file(table: str, file: str, where: str) -> str:
    """`file` (read from a commit record, `where`) if it is a safe path in the table that
    readers see; else `CommitError` naming it."""
    problem = path_problem(file)
    if problem is None and file.startswith(("_", ".")):
        problem = "readers do not see it"
    if problem is not None:
        raise CommitError(
            f"table {table}: {where} names data file {file!r} ({problem}); the record was "
            "tampered with or written by another tool"
        )
    return file


#: The name of a commit record (and of a group directory): an identifier, zero-padded.
_RECORD_NAME = re.compile(r"\d{20}\.json")
_GROUP_NAME = re.compile(r"\d{20}")


def _record_paths(fs: pafs.FileSystem, root: str) -> list[tuple[str, str]]:
    """(relative name, full path) of every commit record under `root` (`_commits/`): in a
    user's group directory, or (older tables) directly in the user's directory. Other files
    are not records and are ignored."""
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    out = []
    for info in fs.get_file_info(selector):
        relative = info.path[len(root) + 1 :].split("/")
        if info.type != pafs.FileType.File or not _RECORD_NAME.fullmatch(relative[-1]):
            continue
        if len(relative) == 2 or (len(relative) == 3 and _GROUP_NAME.fullmatch(relative[1])):
            out.append(("/".join(relative), info.path))
    return out


def _commit_records(path: str) -> list[_CommitRecord]:
    """The table's commit records, by commit user and identifier. A file named like one that
    does not decode as one is a `CommitError` naming it."""
    fs, base = _open(path)
    root = f"{base}/{_COMMITS}"
    out = []
    for relative, full in _record_paths(fs, root):
        with fs.open_input_stream(full) as f:
            data = f.read()
        try:
            record = msgspec.json.decode(data, type=_CommitRecord)
        except DECODE_FAILURES as exc:
            raise CommitError(
                f"table {path}: {_COMMITS}/{relative} is not a commit record ({exc}); "
                "restore it from a backup, or move it out of the table to drop that commit"
            ) from None
        for file in record.files:
            _committed_file(path, file, f"commit record {full}")
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
    """A Parquet table at `path`: writers stage files, the commit coordinator publishes them.

    `filesystem` overrides the file system `path` implies (then `path` is a path in it)."""

    #: Files a commit publishes at once on an object store (a copy + delete each: a round
    #: trip); a local disk renames one at a time (renames across directories take one lock of
    #: the file system: 1,024 renames from 8 threads took 25-33 ms, one at a time 7-8 ms).
    #: Readers of the bare path see a commit's files in any order anyway.
    publish_threads = 8

    def __init__(self, path: str, *, filesystem: pafs.FileSystem | None = None) -> None:
        self.path = path
        self._filesystem = filesystem
        self._latest: dict[str, int | None] = {}  # commit user -> latest identifier, once read
        self._staged = StagedFiles()  # local staged files not durable yet (`sync_staged`)

    def _open(self) -> tuple[pafs.FileSystem, str]:
        if self._filesystem is not None:
            return self._filesystem, self.path.rstrip("/")
        return _open(self.path)

    # --- writer side (in tasks) -------------------------------------------------------------

    def write(
        self,
        batches: Sequence[pa.RecordBatch],
        *,
        checkpoint_id: int,
        vertex_id: str,
        index: int,
        attempt: int,
        job_id: str,
        unit_id: int,
        run_id: str,
    ) -> tuple[bytes, ...]:
        """Stage `batches` as one file under `_staging/<job_id>/`; its committable (none if
        there are no rows)."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return ()
        if (problem := name_problem(job_id)) is not None:
            raise CommitError(
                f"table {self.path}: job id {job_id!r} cannot name a directory under "
                f"{_STAGING}/ ({problem}); use a job id without slashes"
            )
        table = (
            pa.Table.from_batches(batches)
            if len(batches) == 1
            else pa.concat_tables(
                [pa.Table.from_batches([b]) for b in batches], promote_options="default"
            )
        )
        stem = _UNSAFE.sub(  # `part-` first: a job id may start with `_` or `.`
            "_",
            f"part-{job_id}-{run_id}-c{checkpoint_id}-{vertex_id}-{index}-u{unit_id}-"
            f"a{attempt}-{uuid.uuid4().hex[:8]}",
        )
        name = f"{_STAGING}/{job_id}/{stem}{_STAGED}"
        fs, base = self._open()
        staging = f"{base}/{_STAGING}/{job_id}"
        fs.create_dir(staging, recursive=True)
        local = isinstance(fs, pafs.LocalFileSystem)
        if local:  # durable before it is acknowledged: `sync_staged`, before the task answers
            self._staged.directory(staging)
        pq.write_table(table, f"{base}/{name}", filesystem=fs)
        if local:
            self._staged.file(f"{base}/{name}")
        return (msgspec.msgpack.encode(_Committable(name, table.num_rows)),)

    def sync_staged(self) -> None:
        """Make the files this writer staged, and their directories' entries, durable: the
        task calls it once, before it hands over the acks naming those files
        (`regional.sinks.durability.StagedFiles`: one `syncfs` per file system on Linux, else an
        fsync per file). Nothing to do on object stores."""
        self._staged.sync()

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def _published(self, staged: str) -> str:
        """The name (relative to the table) a staged file is published under."""
        return _published(staged)

    def _publish(self, fs: pafs.FileSystem, staged: str, target: str) -> None:
        """Move a staged file to its published name (full paths)."""
        fs.move(staged, target)

    def _record_path(self, base: str, commit_user: str, identifier: int) -> str:
        group = identifier // COMMIT_GROUP * COMMIT_GROUP
        return f"{self._user_dir(base, commit_user)}/{group:020d}/{identifier:020d}.json"

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
        """The committables, decoded, each naming a staged file (`CommitError` otherwise:
        they come from checkpoint state)."""
        items = []
        for c in committables:
            try:
                item = msgspec.msgpack.decode(c, type=_Committable)
            except DECODE_FAILURES as exc:
                raise CommitError(
                    f"table {self.path}: a committable does not decode ({exc}); the checkpoint "
                    "holding it is damaged"
                ) from None
            _staged_file(self.path, item.file, "a committable")
            items.append(item)
        return items

    def _where(self, items: Sequence[_Committable]) -> list[tuple[bool, bool]]:
        """For each item: (its staged file exists, its published file exists). One call for
        the staged files; the published name is looked up only where the staged file is gone
        (a commit retried after a crash), so a usual commit asks once per file."""
        fs, base = self._open()
        if not items:
            return []
        infos = fs.get_file_info([f"{base}/{i.file}" for i in items])
        staged = [i.type == pafs.FileType.File for i in infos]
        gone = [i.file for i, here in zip(items, staged, strict=True) if not here]
        infos = fs.get_file_info([f"{base}/{self._published(f)}" for f in gone]) if gone else []
        published = {f for f, i in zip(gone, infos, strict=True) if i.type == pafs.FileType.File}
        return [(here, i.file in published) for i, here in zip(items, staged, strict=True)]

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Publish the files behind `committables` into the table and write the commit record
        (with `fallback`: unit -> owner checkpoint) last. Files published by an earlier,
        interrupted try of the same commit are not published again."""
        latest = self.latest_committed(commit_user)
        if latest is not None and identifier <= latest:
            raise CommitError(
                f"table {self.path}: commit {identifier} of user {commit_user!r} is not after its "
                f"latest commit {latest}; commits must be in checkpoint order"
            )
        items = self._files(committables)
        where = self._where(items)
        if missing := [i.file for i, (s, p) in zip(items, where, strict=True) if not (s or p)]:
            raise CommitError(
                f"table {self.path}: cannot commit checkpoint {identifier}: data file(s) "
                f"{', '.join(missing[:5])} are missing (were they deleted?); nothing was "
                "committed; restore from a newer checkpoint or restore the files"
            )
        fs, base = self._open()
        local = isinstance(fs, pafs.LocalFileSystem)
        targets = [self._published(i.file) for i in items]
        moves = [
            (f"{base}/{item.file}", f"{base}/{target}")
            for item, target, (staged, _) in zip(items, targets, where, strict=True)
            if staged and item.file != target  # else published already
        ]
        if self.publish_threads > 1 and len(moves) > 1 and not local:
            threads = min(self.publish_threads, len(moves))
            with ThreadPoolExecutor(threads, thread_name_prefix="publish") as pool:
                list(pool.map(lambda move: self._publish(fs, *move), moves))  # re-raises
        else:
            for staged_path, target_path in moves:
                self._publish(fs, staged_path, target_path)
        if local and items:
            for directory in sorted({posixpath.dirname(t) for t in targets}):
                _fsync(f"{base}/{directory}".rstrip("/"))
        record = _CommitRecord(
            commit_user,
            identifier,
            targets,
            sum(i.rows for i in items),
            dict(fallback or {}),
        )
        final = self._record_path(base, commit_user, identifier)
        fs.create_dir(posixpath.dirname(final), recursive=True)
        data = msgspec.json.encode(record)
        if local:
            tmp = f"{final}.tmp-{uuid.uuid4().hex}"
            with fs.open_output_stream(tmp) as out:
                out.write(data)
            _fsync(tmp)
            fs.move(tmp, final)  # atomic rename on a local disk
            _fsync(posixpath.dirname(final))
        else:
            with fs.open_output_stream(final) as out:  # one PUT on object stores
                out.write(data)
        self._latest[commit_user] = identifier

    def latest_committed(self, commit_user: str) -> int | None:
        """The highest identifier `commit_user` committed (every lower one is committed or had
        nothing to commit), or None. Read from the table once per sink and commit user, then
        kept up to date by this sink's own commits and rollbacks."""
        if commit_user not in self._latest:
            self._latest[commit_user] = self._read_latest(commit_user)
        return self._latest[commit_user]

    def _listing(self, directory: str) -> list[pafs.FileInfo]:
        fs, _ = self._open()
        selector = pafs.FileSelector(directory, recursive=False, allow_not_found=True)
        return fs.get_file_info(selector)

    def _read_latest(self, commit_user: str) -> int | None:
        """The newest record of `commit_user`: the user's directory lists its groups (and the
        records of older versions); only the newest group holding a record is listed."""
        base = self._open()[1]
        entries = self._listing(self._user_dir(base, commit_user))
        legacy = [int(n[:-5]) for i in entries if _RECORD_NAME.fullmatch(n := _name(i))]
        groups = sorted(
            (
                i.path
                for i in entries
                if i.type == pafs.FileType.Directory and _GROUP_NAME.fullmatch(_name(i))
            ),
            reverse=True,
        )
        for group in groups:
            ids = [
                int(n[:-5]) for i in self._listing(group) if _RECORD_NAME.fullmatch(n := _name(i))
            ]
            if ids:
                return max([*ids, *legacy])
        return max(legacy, default=None)

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The staged files behind `committables` that are neither staged nor published."""
        items = self._files(committables)
        return [i.file for i, (s, p) in zip(items, self._where(items), strict=True) if not (s or p)]

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete staged files of a declined or aborted attempt (already gone is fine);
        committables of other sinks' formats are skipped."""
        fs, base = self._open()
        for c in committables:
            try:
                [item] = self._files([c])
            except CommitError:  # another sink's format, or a name out of the table: skipped
                continue
            if item.file.startswith(f"{_STAGING}/"):  # never a published file
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(f"{base}/{item.file}")

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]:
        """Delete the staged files of job `job_id` that no committable in `keep` names (they
        are from lost attempts or lost runs); returns them (relative to the table). Called when
        a driver starts, before any task of its run; other jobs' files are never touched."""
        if name_problem(job_id) is not None:
            return []
        kept: set[str] = set()
        for c in keep:
            with contextlib.suppress(CommitError):
                kept.update(i.file for i in self._files([c]))
        fs, base = self._open()
        deleted = []
        for info in self._listing(f"{base}/{_STAGING}/{job_id}"):
            name = f"{_STAGING}/{job_id}/{_name(info)}"
            if info.type == pafs.FileType.File and name not in kept:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(info.path)
                deleted.append(name)
        return sorted(deleted)

    def marker_retention(self) -> SinkRetention:
        """Commit records are kept until someone deletes them: no retention to warn about
        (`regional.sinks.base.TableRetention`)."""
        return SinkRetention("", "parquet", self.path)

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return sum(c.rows for c in self._files(committables))

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo `commit_user`'s commits after `identifier`, newest first; returns the
        identifiers undone. Each commit's published files are deleted before its record, so
        a crash leaves the log a prefix of itself and the next start finishes the rollback.
        `regional.sinks.base.TableRollback`."""
        fs, base = self._open()
        user_dir = self._user_dir(base, commit_user)
        records: dict[int, str] = {}
        for info in self._listing(user_dir):
            name = _name(info)
            if info.type == pafs.FileType.File and _RECORD_NAME.fullmatch(name):
                records[int(name[:-5])] = info.path
            elif (
                info.type == pafs.FileType.Directory
                and _GROUP_NAME.fullmatch(name)
                and int(name) + COMMIT_GROUP > identifier
            ):
                for i in self._listing(info.path):
                    if _RECORD_NAME.fullmatch(n := _name(i)):
                        records[int(n[:-5])] = i.path
        undone = sorted(i for i in records if i > identifier)
        for i in reversed(undone):
            with fs.open_input_stream(records[i]) as f:
                data = f.read()
            try:
                record = msgspec.json.decode(data, type=_CommitRecord)
            except DECODE_FAILURES as exc:
                raise CommitError(
                    f"table {self.path}: cannot roll back commit {i} of user {commit_user!r}: "
                    f"{records[i]} is not a commit record ({exc}); restore it from a backup, or "
                    "delete it and that commit's data files by hand"
                ) from None
            for file in record.files:
                _committed_file(self.path, file, f"commit record {records[i]}")
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(f"{base}/{file}")
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(records[i])
        self._latest.pop(commit_user, None)
        return undone


def _name(info: pafs.FileInfo) -> str:
    return posixpath.basename(info.path)
