"""Staged files published by a commit, with a commit log: what the Parquet sink and the keyed
exchange's writer share (DESIGN §4 rules 8 and 14).

A `StagingArea` is a directory in which writers stage files under `_staging/<job>/` (invisible
to readers) and the committer *publishes* a checkpoint's staged files under their final names
(a rename on a local disk; copy + delete on object stores), then writes one commit record per
(commit user, identifier) last, under `_commits/<user>/<group>/<identifier>.json`. Publishing
is idempotent (a file already published is not published again), so a re-commit after a crash
never duplicates. Where a staged file is published, and in which order a commit publishes its
files, is the owner's choice (`published`, `order`): the Parquet sink publishes into the table
directory, the exchange into its partitions' directories in (checkpoint, writer) order.

Commit records are grouped in directories of 1,000 identifiers (`<group>` is the first
identifier of the group, zero-padded), and the latest committed identifier of a commit user is
kept in memory after the first lookup (which lists the user's directory of groups, then only the
newest group) and moved on by the area's own commits: the work of one commit does not grow with
the job's age. Names read back from checkpoints or the directory (the commit user, data file
names) are checked before they are joined into a path (`metadata.layout`): nothing is read,
written or deleted outside the directory.

>>> import tempfile
>>> import pyarrow as pa
>>> area = StagingArea.at(tempfile.mkdtemp(), "table t")
>>> c = area.stage("job", "part-1", pa.table({"x": [1, 2]}))
>>> area.commit("user", 1, [c]); area.latest_committed("user")
1
>>> [posixpath.basename(f) for f in area.records()[0].files]
['part-1.parquet']
"""

from __future__ import annotations

import contextlib
import posixpath
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.commit_log import COMMIT_GROUP, COMMITS, GROUP_NAME, RECORD_NAME, CommitRecord
from metadata.confine import ConfinedPaths, check_confined
from metadata.errors import OutsideRootError
from metadata.format import DECODE_FAILURES, segment_checksum
from metadata.layout import name_problem, path_problem
from regional.errors import CommitError
from regional.sinks.durability import FSYNC_THREADS, StagedFiles, fsync_path
from regional.sinks.merging import (
    DiscardedParts,
    FilePart,
    commit_plan,
    kept_stem,
    merged_table,
    take_ranges,
)
from regional.sinks.table import COMMITTABLE_VERSION, check_version, part_of

__all__ = [
    "COMMITS",
    "COMMIT_GROUP",
    "STAGED",
    "STAGING",
    "CommitRecord",
    "StagedFile",
    "StagedSink",
    "StagingArea",
    "file_name",
    "open_location",
    "published_in_directory",
]

STAGING = "_staging"
STAGED = ".staged"
_LEGACY_DATA = "data"  # tables written before staging: committed files stayed in data/


class StagedFile(msgspec.Struct, frozen=True, array_like=True):
    """A committable (`regional.sinks.table.TableCommittable`): the staged `file` (relative to
    the area's directory), its rows, and (since the exchange's segments are verified) its size
    and checksum (hex; -1 and "" in committables of older versions). A part of a merged file
    (`regional.sinks.merging`) names the whole file's size and checksum, and where its `rows`
    are: from `first_row` of the file's `file_rows` (-1: the committable is the whole file).
    Then its `version` (1 in committables written before it existed)."""

    file: str
    rows: int
    size: int = -1
    checksum: str = ""
    first_row: int = 0
    file_rows: int = -1
    version: int = 1

    @property
    def part(self) -> FilePart | None:
        """Its part of a merged file, or None when it is a whole file."""
        return part_of(self)


class _Output(NamedTuple):
    """One data file a commit publishes: `staged` (relative), made from staged file `source`
    (the same file, or, for `keep` ranges, a rewrite of it without other rows) and published
    as `target`."""

    source: str
    staged: str
    target: str
    rows: int
    size: int
    checksum: str
    keep: tuple[tuple[int, int], ...] | None = None


#: The local file system (stateless: one for every directory; a writer opens it once per file).
_LOCAL = pafs.LocalFileSystem()


def open_location(path: str) -> tuple[pafs.FileSystem, str]:
    """The file system and base path of a local path or a `pyarrow.fs` URI."""
    if "://" in path:
        return pafs.FileSystem.from_uri(path)
    return _LOCAL, path.rstrip("/")


def file_name(info: pafs.FileInfo) -> str:
    """The last component of a listed file's path."""
    return posixpath.basename(info.path)


class StagingArea:
    """Staged files and the commit log of one directory.

    `describe` names the directory in errors (``table /data/t``, ``exchange 'orders'``) and
    `noun` says what it is (``table``, ``exchange``);
    `location` gives its file system and base path when asked (an exchange is bound late);
    `published(staged)` is the name (relative to the directory) a staged file is published
    under; `order(staged)` sorts a commit's files into publish order (None: as given);
    `publish_threads` > 1 publishes that many at once on object stores (a copy + delete each);
    a local disk always renames one at a time (1,024 renames from 8 threads took 25-33 ms,
    one at a time 7-8 ms).
    """

    def __init__(
        self,
        describe: str,
        location: Callable[[], tuple[pafs.FileSystem, str]],
        *,
        published: Callable[[str], str],
        order: Callable[[str], tuple[int, ...]] | None = None,
        publish_threads: int = 8,
        make_dirs: bool = False,
        noun: str = "table",
        confine_to: Callable[[str], tuple[str, str]] | None = None,
    ) -> None:
        self.describe = describe
        self.noun = noun
        self.location = location
        self.published = published
        self.order = order
        self.publish_threads = publish_threads
        self.make_dirs = make_dirs
        self.confine_to = confine_to
        self._latest: dict[str, int | None] = {}  # commit user -> latest identifier, once read
        self._staged = StagedFiles()  # local staged files not durable yet (`sync`)
        self._discarded = DiscardedParts()  # parts of merged staged files discarded so far
        #: The committables `files` decoded last, and what it gave (frozen StagedFiles).
        self._files_memo: tuple[tuple[bytes, ...], tuple[StagedFile, ...]] | None = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled without the memo of `files` (an area shipped to a task)."""
        return {**self.__dict__, "_files_memo": None}

    @classmethod
    def at(cls, path: str, describe: str) -> StagingArea:
        """An area at a local path or URI whose files are published into the directory itself
        as ``<stem>.parquet`` (the Parquet sink's layout)."""
        return cls(describe, lambda: open_location(path), published=published_in_directory)

    def inside(self, fs: pafs.FileSystem, full: str) -> str:
        """`full` (a path under the directory), refused (`CommitError` naming the link) when on
        a local disk it resolves outside the directory through a symbolic link: the one
        confinement rule of job roots (`metadata.confine`). `confine_to(base)` widens the
        directory (the exchange: its job root) and names it."""
        if not isinstance(fs, pafs.LocalFileSystem):
            return full
        base = self.location()[1]
        root, what = self.confine_to(base) if self.confine_to else (base, self.noun)
        rel = full[len(root) + 1 :] if full.startswith(root + "/") else ""
        try:
            check_confined(root, rel, what=what, describe=lambda _: f"{self.describe}: {full}")
        except OutsideRootError as exc:
            raise CommitError(str(exc)) from None
        return full

    def _inside_each(self, fs: pafs.FileSystem) -> Callable[[str], str]:
        """`inside` for the many paths of one commit: each directory resolved once
        (`metadata.confine.ConfinedPaths`), the same paths refused with the same errors."""
        if not isinstance(fs, pafs.LocalFileSystem):
            return lambda full: full
        base = self.location()[1]
        root, what = self.confine_to(base) if self.confine_to else (base, self.noun)
        paths = ConfinedPaths(root, what=what)

        def inside(full: str) -> str:
            rel = full[len(root) + 1 :] if full.startswith(root + "/") else ""
            try:
                paths.check(rel, describe=lambda _: f"{self.describe}: {full}")
            except OutsideRootError as exc:
                raise CommitError(str(exc)) from None
            return full

        return inside

    def forget(self) -> None:
        """Drop what is kept in memory (the directory moved: `ExchangeWriter.bind`)."""
        self._latest = {}

    # --- writer side (in tasks) -------------------------------------------------------------

    def stage(self, job_id: str, stem: str, table: pa.Table) -> bytes:
        """Write `table` as `_staging/<job_id>/<stem>.staged`; its committable."""
        name, size, checksum = self._write_staged(job_id, stem, table)
        staged = StagedFile(name, table.num_rows, size, checksum, version=COMMITTABLE_VERSION)
        return msgspec.msgpack.encode(staged)

    def stage_parts(
        self, job_id: str, stem: str, parts: Sequence[Sequence[pa.RecordBatch]]
    ) -> list[tuple[bytes, ...]]:
        """Write the rows of every part (one unit's batches each) as one merged staged file
        `_staging/<job_id>/<stem>.staged` (`regional.sinks.merging`); per part, its
        committables (none for a part without rows)."""
        table, places = merged_table(parts)
        return self.stage_merged(job_id, stem, table, places)

    def stage_merged(
        self, job_id: str, stem: str, table: pa.Table | None, places: Sequence[FilePart | None]
    ) -> list[tuple[bytes, ...]]:
        """Write `table` (made by `regional.sinks.merging.merged_table`, perhaps with schema
        metadata added) as merged staged file `_staging/<job_id>/<stem>.staged`; per place (a
        part's rows in it, None for a part without rows), its committables."""
        if table is None:
            return [() for _ in places]
        name, size, checksum = self._write_staged(job_id, stem, table)
        return [
            ()
            if p is None
            else (
                msgspec.msgpack.encode(
                    StagedFile(
                        name,
                        p.rows,
                        size,
                        checksum,
                        p.first_row,
                        p.file_rows,
                        COMMITTABLE_VERSION,
                    )
                ),
            )
            for p in places
        ]

    def _write_staged(self, job_id: str, stem: str, table: pa.Table) -> tuple[str, int, str]:
        """Write `table` as `_staging/<job_id>/<stem>.staged`: its name, size and checksum."""
        if (problem := name_problem(job_id)) is not None:
            raise CommitError(
                f"{self.describe}: job id {job_id!r} cannot name a directory under "
                f"{STAGING}/ ({problem}); use a job id without slashes"
            )
        name = f"{STAGING}/{job_id}/{stem}{STAGED}"
        fs, base = self.location()
        staging = f"{base}/{STAGING}/{job_id}"
        self.inside(fs, f"{base}/{name}")
        fs.create_dir(staging, recursive=True)
        local = isinstance(fs, pafs.LocalFileSystem)
        if local:  # durable before it is acknowledged: `sync`, before the task answers
            self._staged.directory(staging)
        size, checksum = self._write(fs, f"{base}/{name}", table)
        if local:
            self._staged.file(f"{base}/{name}")
        return name, size, checksum

    @staticmethod
    def _write(fs: pafs.FileSystem, path: str, table: pa.Table) -> tuple[int, str]:
        """Write `table` as a Parquet file at `path`: its size and checksum (hex)."""
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink)
        data = sink.getvalue()
        with fs.open_output_stream(path) as out:
            out.write(data)
        return data.size, segment_checksum(data).hex()

    def sync(self) -> None:
        """Make the files staged here, and their directories' entries, durable
        (`regional.sinks.durability.StagedFiles`). Nothing to do on object stores."""
        self._staged.sync()

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete staged files of a declined or aborted attempt (already gone is fine);
        committables of other formats are skipped. A merged file is deleted once all of its
        parts were discarded (through this area): other units' rows in it may still commit."""
        fs, base = self.location()
        for c in committables:
            try:
                [item] = self.files([c])
            except CommitError:  # another sink's format, or a name out of the directory
                continue
            part = item.part
            if part is not None and not self._discarded.add(item.file, part):
                continue
            if item.file.startswith(f"{STAGING}/"):  # never a published file
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self.inside(fs, f"{base}/{item.file}"))

    # --- committer side (on the driver) -----------------------------------------------------

    def files(self, committables: Iterable[bytes]) -> list[StagedFile]:
        """The committables, decoded, each naming a staged file (`CommitError` otherwise: they
        come from checkpoint state), in publish order."""
        given = tuple(committables)
        memo = self._files_memo  # a commit, its published paths: the same committables
        if memo is not None and memo[0] == given:
            return list(memo[1])
        items = []
        for c in given:
            try:
                item = msgspec.msgpack.decode(c, type=StagedFile)
            except DECODE_FAILURES as exc:
                raise CommitError(
                    f"{self.describe}: a committable does not decode ({exc}); the checkpoint "
                    "holding it is damaged"
                ) from None
            check_version(item, self.describe)
            self._check_staged(item.file)
            items.append(item)
        if self.order is not None:
            order = self.order
            items.sort(key=lambda i: (order(i.file), i.file))
        self._files_memo = (given, tuple(items))
        return items

    def _check_staged(self, file: str) -> None:
        """`CommitError` unless `file` (read from a committable) is a staged file of the
        directory (`_staging/<job>/<name>.staged`, or `data/...` of older versions)."""
        problem = path_problem(file)
        parts = file.split("/")
        if problem is None and not (
            (len(parts) == 3 and parts[0] == STAGING and parts[2].endswith(STAGED))
            or (len(parts) >= 2 and parts[0] == _LEGACY_DATA)
        ):
            problem = f"not a file staged under {STAGING}/<job>/"
        if problem is not None:
            raise CommitError(
                f"{self.describe}: a committable names data file {file!r} ({problem}); data "
                f"files are staged under {STAGING}/ in the {self.noun}, so it was tampered with "
                "or written by another tool"
            )

    def _outputs(self, items: Sequence[StagedFile]) -> list[_Output]:
        """The data files a commit of `items` publishes, in order: a whole staged file each,
        and one per merged staged file (its first part's place), whole when the commit holds
        every part of it, else rewritten keeping the committed parts' rows
        (`regional.sinks.merging.kept_ranges`)."""
        outputs: list[_Output] = []
        for i, keep in commit_plan(
            items, part=lambda i: i.part, file=lambda i: i.file, describe=lambda i: i.file
        ):
            if keep is None:
                rows = i.rows if i.part is None else i.file_rows
                target = self.published(i.file)
                outputs.append(_Output(i.file, i.file, target, rows, i.size, i.checksum))
                continue
            stem = posixpath.basename(i.file)[: -len(STAGED)]
            staged = f"{posixpath.dirname(i.file)}/{kept_stem(stem, keep)}{STAGED}"
            rows = sum(n for _, n in keep)
            outputs.append(_Output(i.file, staged, self.published(staged), rows, -1, "", keep))
        return outputs

    def _where(
        self, outputs: Sequence[_Output], inside: Callable[[str], str] | None = None
    ) -> list[tuple[bool, bool]]:
        """For each output: (its source staged file exists, its published file exists). One
        call for the sources; the published name is looked up only where the source is gone
        (a commit retried after a crash), so a usual commit asks once per file."""
        fs, base = self.location()
        if not outputs:
            return []
        inside = inside or self._inside_each(fs)
        infos = fs.get_file_info([inside(f"{base}/{o.source}") for o in outputs])
        staged = [i.type == pafs.FileType.File for i in infos]
        gone = [o.target for o, here in zip(outputs, staged, strict=True) if not here]
        infos = fs.get_file_info([inside(f"{base}/{t}") for t in gone]) if gone else []
        published = {t for t, i in zip(gone, infos, strict=True) if i.type == pafs.FileType.File}
        return [(here, o.target in published) for o, here in zip(outputs, staged, strict=True)]

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The staged files behind `committables` that are neither staged nor published."""
        outputs = self._outputs(self.files(committables))
        where = self._where(outputs)
        return [o.source for o, (s, p) in zip(outputs, where, strict=True) if not (s or p)]

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold."""
        return sum(c.rows for c in self.files(committables))

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Publish the files behind `committables` and write the commit record (with
        `fallback`: unit -> owner checkpoint) last. Files published by an earlier, interrupted
        try of the same commit are not published again. A merged staged file of which the
        commit holds only some parts is rewritten with just their rows first (under a name the
        kept rows decide), and deleted after the record."""
        latest = self.latest_committed(commit_user)
        if latest is not None and identifier <= latest:
            raise CommitError(
                f"{self.describe}: commit {identifier} of user {commit_user!r} is not after its "
                f"latest commit {latest}; commits must be in checkpoint order"
            )
        fs, base = self.location()
        inside = self._inside_each(fs)
        outputs = self._outputs(self.files(committables))
        where = self._where(outputs, inside)
        if missing := [o.source for o, (s, p) in zip(outputs, where, strict=True) if not (s or p)]:
            raise CommitError(
                f"{self.describe}: cannot commit checkpoint {identifier}: data file(s) "
                f"{', '.join(missing[:5])} are missing (were they deleted?); nothing was "
                "committed; restore from a newer checkpoint or restore the files"
            )
        local = isinstance(fs, pafs.LocalFileSystem)
        outputs = [
            self._rewrite(fs, o, staged) if o.keep is not None else o
            for o, (staged, _) in zip(outputs, where, strict=True)
        ]
        moves = [
            (inside(f"{base}/{o.staged}"), inside(f"{base}/{o.target}"))
            for o, (staged, _) in zip(outputs, where, strict=True)
            if staged and o.staged != o.target  # else published already
        ]
        if self.make_dirs:  # each directory once, not once per file
            for directory in dict.fromkeys(posixpath.dirname(t) for _, t in moves):
                fs.create_dir(directory, recursive=True)
        if self.publish_threads > 1 and len(moves) > 1 and not local:
            threads = min(self.publish_threads, len(moves))
            with ThreadPoolExecutor(threads, thread_name_prefix="publish") as pool:
                list(pool.map(lambda move: self._publish(fs, *move), moves))  # re-raises
        else:
            for staged_path, target_path in moves:
                self._publish(fs, staged_path, target_path)
        if local and outputs:  # the renames durable, one fsync per directory (threads merge
            # their journal commits: an exchange publishes into one directory per partition)
            directories = [
                f"{base}/{d}".rstrip("/")
                for d in dict.fromkeys(posixpath.dirname(o.target) for o in outputs)
            ]
            if len(directories) > 1:
                threads = min(FSYNC_THREADS, len(directories))
                with ThreadPoolExecutor(threads, thread_name_prefix="fsync") as pool:
                    list(pool.map(fsync_path, directories))  # re-raises
            else:
                for directory in directories:
                    fsync_path(directory)
        known = all(o.size >= 0 and o.checksum for o in outputs)
        record = CommitRecord(
            commit_user,
            identifier,
            [o.target for o in outputs],
            sum(o.rows for o in outputs),
            dict(fallback or {}),
            sizes=[o.size for o in outputs] if known else [],
            checksums=[o.checksum for o in outputs] if known else [],
        )
        self.write_record(record)
        self._latest[commit_user] = identifier
        for o in outputs:  # the merged files rewritten without other units' rows
            if o.keep is not None:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self.inside(fs, f"{base}/{o.source}"))

    def _rewrite(self, fs: pafs.FileSystem, output: _Output, source_here: bool) -> _Output:
        """Write the kept rows of `output`'s merged source file as its staged file (fsynced on
        a local disk), or, when the source is gone (published by an interrupted try), read
        the published file's size and checksum; `output` with them."""
        base = self.location()[1]
        if not source_here:
            with fs.open_input_stream(self.inside(fs, f"{base}/{output.target}")) as f:
                data = f.read()
            return output._replace(size=len(data), checksum=segment_checksum(data).hex())
        assert output.keep is not None
        table = pq.read_table(self.inside(fs, f"{base}/{output.source}"), filesystem=fs)
        path = self.inside(fs, f"{base}/{output.staged}")
        size, checksum = self._write(fs, path, take_ranges(table, output.keep))
        if isinstance(fs, pafs.LocalFileSystem):
            fsync_path(path)
        return output._replace(size=size, checksum=checksum)

    def write_record(self, record: CommitRecord) -> None:
        """Write `record` as its commit user's record of its identifier, atomically (replacing
        one there: a retried restore writes the same record)."""
        fs, base = self.location()
        final = self.inside(fs, self._record_path(base, record.commit_user, record.identifier))
        fs.create_dir(posixpath.dirname(final), recursive=True)
        data = msgspec.json.encode(record)
        if isinstance(fs, pafs.LocalFileSystem):
            tmp = f"{final}.tmp-{uuid.uuid4().hex}"
            with fs.open_output_stream(tmp) as out:
                out.write(data)
            fsync_path(tmp)
            fs.move(tmp, final)  # atomic rename on a local disk
            fsync_path(posixpath.dirname(final))
        else:
            with fs.open_output_stream(final) as out:  # one PUT on object stores
                out.write(data)

    def _publish(self, fs: pafs.FileSystem, staged: str, target: str) -> None:
        fs.move(staged, target)  # its directory exists (`commit` made each once)

    def _record_path(self, base: str, commit_user: str, identifier: int) -> str:
        group = identifier // COMMIT_GROUP * COMMIT_GROUP
        return f"{self._user_dir(base, commit_user)}/{group:020d}/{identifier:020d}.json"

    def _user_dir(self, base: str, commit_user: str) -> str:
        """`<dir>/_commits/<commit user>`; the user (read from a checkpoint) must be a plain
        name, or commits would be written outside the directory."""
        problem = name_problem(commit_user)
        if problem is not None:
            raise CommitError(
                f"{self.describe}: commit user {commit_user!r} cannot name a directory "
                f"under {COMMITS}/ ({problem}); nothing was committed"
            )
        return f"{base}/{COMMITS}/{commit_user}"

    def latest_committed(self, commit_user: str) -> int | None:
        """The highest identifier `commit_user` committed (every lower one is committed or had
        nothing to commit), or None. Read once per commit user, then kept up to date by this
        area's own commits and rollbacks."""
        if commit_user not in self._latest:
            self._latest[commit_user] = self._read_latest(commit_user)
        return self._latest[commit_user]

    def listing(self, directory: str) -> list[pafs.FileInfo]:
        """The entries of `directory` (a full path; none when it does not exist)."""
        fs, _ = self.location()
        self.inside(fs, directory)
        selector = pafs.FileSelector(directory, recursive=False, allow_not_found=True)
        return fs.get_file_info(selector)

    def _read_latest(self, commit_user: str) -> int | None:
        """The newest record of `commit_user`: the user's directory lists its groups (and the
        records of older versions); only the newest group holding a record is listed."""
        base = self.location()[1]
        entries = self.listing(self._user_dir(base, commit_user))
        legacy = [int(n[:-5]) for i in entries if RECORD_NAME.fullmatch(n := file_name(i))]
        groups = sorted(
            (
                i.path
                for i in entries
                if i.type == pafs.FileType.Directory and GROUP_NAME.fullmatch(file_name(i))
            ),
            reverse=True,
        )
        for group in groups:
            ids = [
                int(n[:-5]) for i in self.listing(group) if RECORD_NAME.fullmatch(n := file_name(i))
            ]
            if ids:
                return max([*ids, *legacy])
        return max(legacy, default=None)

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]:
        """Delete the staged files of job `job_id` that no committable in `keep` names (they
        are from lost attempts or lost runs); returns them (relative to the directory). Called
        when a driver starts, before any task of its run; other jobs' files are never touched.
        A committable of a newer version is a `CommitError` (what it names is not known), and
        nothing is deleted."""
        if name_problem(job_id) is not None:
            return []
        kept: set[str] = set()
        for c in keep:
            with contextlib.suppress(*DECODE_FAILURES):  # not this area's: names none of it
                kept.add(
                    check_version(msgspec.msgpack.decode(c, type=StagedFile), self.describe).file
                )
        fs, base = self.location()
        deleted = []
        for info in self.listing(f"{base}/{STAGING}/{job_id}"):
            name = f"{STAGING}/{job_id}/{file_name(info)}"
            if info.type == pafs.FileType.File and name not in kept:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self.inside(fs, info.path))
                deleted.append(name)
        return sorted(deleted)

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo `commit_user`'s commits after `identifier`, newest first; returns the
        identifiers undone. Each commit's published files are deleted before its record, so
        a crash leaves the log a prefix of itself and the next start finishes the rollback."""
        fs, base = self.location()
        user_dir = self._user_dir(base, commit_user)
        records: dict[int, str] = {}
        for info in self.listing(user_dir):
            name = file_name(info)
            if info.type == pafs.FileType.File and RECORD_NAME.fullmatch(name):
                records[int(name[:-5])] = info.path
            elif (
                info.type == pafs.FileType.Directory
                and GROUP_NAME.fullmatch(name)
                and int(name) + COMMIT_GROUP > identifier
            ):
                for i in self.listing(info.path):
                    if RECORD_NAME.fullmatch(n := file_name(i)):
                        records[int(n[:-5])] = i.path
        undone = sorted(i for i in records if i > identifier)
        for i in reversed(undone):
            record = self._read_record(
                fs,
                records[i],
                f"cannot roll back commit {i} of user {commit_user!r}: {records[i]}",
                "delete it and that commit's data files by hand",
            )
            for file in record.files:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(self.inside(fs, f"{base}/{file}"))
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(self.inside(fs, records[i]))
        self._latest.pop(commit_user, None)
        return undone

    def check_committed(self, file: str, where: str) -> str:
        """`file` (read from a commit record, `where`) if it is a safe path in the directory
        that readers see; else `CommitError` naming it."""
        problem = path_problem(file)
        if problem is None and file.startswith(("_", ".")):
            problem = "readers do not see it"
        if problem is not None:
            raise CommitError(
                f"{self.describe}: {where} names data file {file!r} ({problem}); the record was "
                "tampered with or written by another tool"
            )
        return file

    def records(self) -> list[CommitRecord]:
        """Every commit record, by commit user and identifier. A file named like one that
        does not decode as one is a `CommitError` naming it; other files are ignored."""
        fs, base = self.location()
        root = self.inside(fs, f"{base}/{COMMITS}")
        selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
        out = []
        for info in fs.get_file_info(selector):
            relative = info.path[len(root) + 1 :].split("/")
            if info.type != pafs.FileType.File or not RECORD_NAME.fullmatch(relative[-1]):
                continue
            if not (
                len(relative) == 2 or (len(relative) == 3 and GROUP_NAME.fullmatch(relative[1]))
            ):
                continue
            out.append(
                self._read_record(
                    fs,
                    info.path,
                    f"{COMMITS}/{'/'.join(relative)}",
                    f"move it out of the {self.noun} to drop that commit",
                )
            )
        return sorted(out, key=lambda r: (r.commit_user, r.identifier))

    def _read_record(self, fs: pafs.FileSystem, path: str, what: str, fix: str) -> CommitRecord:
        """The commit record at `path`, every file it names checked (`check_committed`); one
        that does not decode is a `CommitError`: "`what` is not a commit record (why); restore
        it from a backup, or `fix`"."""
        with fs.open_input_stream(self.inside(fs, path)) as f:
            data = f.read()
        try:
            record = msgspec.json.decode(data, type=CommitRecord)
        except DECODE_FAILURES as exc:
            raise CommitError(
                f"{self.describe}: {what} is not a commit record ({exc}); restore it from a "
                f"backup, or {fix}"
            ) from None
        for file in record.files:
            self.check_committed(file, f"commit record {path}")
        return record


class StagedSink:
    """The parts of the sink contract (`regional.sinks.base.Sink`) that a sink staging files in
    a `StagingArea` (its `area`) delegates to it: `sync_staged` and `discard` in tasks, the
    committer side on the driver. The Parquet sink and the keyed exchange's writer are such
    sinks; each adds how it writes, where it publishes, and how it rolls back."""

    area: StagingArea

    def sync_staged(self) -> None:
        """Make the files this writer staged durable (`StagingArea.sync`)."""
        self.area.sync()

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete staged files of a declined or aborted attempt (`StagingArea.discard`)."""
        self.area.discard(committables)

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Publish the files behind `committables` and write the commit record last
        (`StagingArea.commit`)."""
        self.area.commit(commit_user, identifier, committables, fallback=fallback)

    def latest_committed(self, commit_user: str) -> int | None:
        """The highest identifier `commit_user` committed, or None."""
        return self.area.latest_committed(commit_user)

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The staged files behind `committables` that are neither staged nor published."""
        return self.area.missing_files(committables)

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]:
        """Delete job `job_id`'s staged files that no committable in `keep` names
        (`regional.sinks.base.TableStaging`)."""
        return self.area.clean_staged(job_id, keep)

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return self.area.rows_of(committables)


def published_in_directory(staged: str) -> str:
    """The Parquet sink's published name of a staged file: in the directory itself, ending in
    `.parquet` (a legacy `data/` file stays where it is)."""
    if staged.startswith(f"{STAGING}/"):
        return posixpath.basename(staged)[: -len(STAGED)] + ".parquet"
    return staged
