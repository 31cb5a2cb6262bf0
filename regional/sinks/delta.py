"""An exactly-once Delta Lake sink through deltalake (delta-rs) (DESIGN §4 rule 8).

Needs the optional extra: ``pip install 'regional-checkpoints[delta]'`` (deltalake is imported only
on the driver, when a `DeltaSink` is created or commits; tasks write Parquet with pyarrow alone).
Only unpartitioned tables are supported.

Writers (in Spark tasks) write their epoch's rows as one Parquet file in the table directory,
named ``c<checkpoint>-<vertex>-<subtask>-u<unit>-a<attempt>-<run>-<random>.parquet``, and return
a committable naming it (with its size and row count). Files that no commit adds are not part of
the table: every Delta reader ignores them. Once checkpoint Y's metadata is durable the driver
commits Y's files as one Delta version of ``add`` actions carrying the transaction marker
``txn(appId = commit user, version = Y)``, after

- skipping Y if the table's marker of that commit user is Y or later. Delta keeps only the
  latest marker per app id, and a commit user's commits are strictly in checkpoint order, so
  the marker is `latest_committed` (delta-rs records the marker but does not skip on its own);
- checking that every data file exists (a Delta log naming a missing file fails every read);
- when the commit user has no marker yet, checking that none of the files is already in the table
  (the backstop should ``delta.setTransactionRetentionDuration`` have expired the marker).

The check and the commit use one table version: delta-rs refuses the commit when another writer
committed for the same commit user since (a second driver of the job), which is a `CommitError`,
never success. Appends of other writers in between are merged by delta-rs, as Delta allows.
Each version records ``regional.checkpoint-id``, ``regional.commit-user`` and
``regional.fallback-units`` (JSON: unit -> the checkpoint owning its state, for the units that
fell back in Y) in its commit info. Staged files of declined or aborted attempts are deleted.

With output merging (`write_merged`, `regional.sinks.merging`) a task writes one file for all
the units it ran in an epoch, and each unit's committable names its rows of it. A commit adds
such a file whole (one ``add`` action, the whole file's row count) when it holds every part of
it; otherwise (a unit was declared fallen back after its rows were written) it first rewrites
the kept rows as ``<file>-k<kept ranges>.parquet`` (the same name on a retry: the retry writes
the same file again and the marker keeps it from being added twice), adds that file, and then
deletes the merged file. The merged file is never added, so readers do not see it; one left
behind by a crash between the commit and the delete is not referenced by the log, which
``DeltaTable.vacuum(full=True)`` deletes once it is older than the retention.

There is no rollback: Delta's RESTORE also drops other writers' commits and does not lower the
marker, so a restore below the table's latest commit of the job refuses instead.

>>> import tempfile
>>> import pyarrow as pa
>>> sink = DeltaSink(tempfile.mkdtemp() + "/t", schema=pa.schema([("x", pa.int64())]))
>>> from regional.sinks.base import WriteContext
>>> c = sink.write([pa.record_batch({"x": [1, 2]})], WriteContext(job_id="job", run_id="r1",
...     checkpoint_id=3, attempt=0, unit_id=0, vertex_id="out", index=0))
>>> sink.read().num_rows
0
>>> sink.commit("job-1", 3, c); sink.read().column("x").to_pylist()
[1, 2]
>>> sink.latest_committed("job-1")  # the marker: every identifier up to it is committed
3
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.model import SinkRetention
from regional.errors import CommitError, SinkError
from regional.sinks.base import WriteContext
from regional.sinks.durability import fsync_path as _fsync
from regional.sinks.merging import (
    DiscardedParts,
    FilePart,
    commit_plan,
    kept_stem,
    merged_table,
    take_ranges,
)

__all__ = ["CHECKPOINT_PROPERTY", "COMMIT_USER_PROPERTY", "FALLBACK_PROPERTY", "DeltaSink"]

#: Commit info key: the checkpoint id committed by the version.
CHECKPOINT_PROPERTY = "regional.checkpoint-id"
#: Commit info key: the commit user (also the app id of the version's transaction marker).
COMMIT_USER_PROPERTY = "regional.commit-user"
#: Commit info key: JSON object unit -> owner checkpoint of the units that fell back.
FALLBACK_PROPERTY = "regional.fallback-units"

#: A data file name the sink writes and accepts: one path component, not hidden.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\.parquet")


class _Committable(msgspec.Struct, frozen=True, array_like=True, tag="delta"):
    """One staged data file, or one unit's part of a merged one (`write_merged`): `rows` from
    `first_row` of the file's `file_rows` (-1: the committable is the whole file; the part
    fields come last, with defaults, so committables of older versions still decode). `size`
    and `modified` are the whole file's."""

    table: str  # the table's location when written (discard skips other tables' files)
    file: str  # name of the data file in the table directory
    rows: int
    size: int  # bytes
    modified: int  # ms since the epoch
    first_row: int = 0
    file_rows: int = -1

    @property
    def part(self) -> FilePart | None:
        """Its part of a merged file, or None when it is a whole file."""
        return None if self.file_rows < 0 else FilePart(self.first_row, self.rows, self.file_rows)


class _Added(NamedTuple):
    """One data file a commit adds: `file` (in the table directory), made from the data file
    `source` the committables name (the same file, or, for `keep` ranges, a rewrite of it
    without the rows of parts not in the commit), with its rows, size (-1 until rewritten)
    and modification time (ms)."""

    source: str
    file: str
    rows: int
    size: int
    modified: int
    keep: tuple[tuple[int, int], ...] | None = None


_TXN_RETENTION = "delta.setTransactionRetentionDuration"
_INTERVAL_UNITS = {
    "nanosecond": 1e-6,
    "microsecond": 1e-3,
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}


def _interval_ms(text: str) -> int | None:
    """A Delta interval property (`interval 2 days`) in milliseconds; None if it is not one.

    >>> _interval_ms("interval 1 second"), _interval_ms("interval 2 days"), _interval_ms("2d")
    (1000, 172800000, None)
    """
    match = re.fullmatch(r"\s*interval\s+(\d+)\s+([a-z]+?)s?\s*", text.lower())
    if match is None or match[2] not in _INTERVAL_UNITS:
        return None
    return round(int(match[1]) * _INTERVAL_UNITS[match[2]])


def _require_deltalake() -> Any:
    try:
        import deltalake
    except ImportError as exc:
        raise SinkError(
            f"the Delta Lake sink needs the deltalake package ({exc}): "
            "pip install 'regional-checkpoints[delta]'"
        ) from exc
    return deltalake


def _location(path: str) -> str:
    """`path` as the sink keeps it: URIs as given, local paths absolute without a trailing /."""
    return path.rstrip("/") if "://" in path else os.path.abspath(path)


class DeltaSink:
    """The unpartitioned Delta table at `path` (a local path or a URI deltalake and pyarrow.fs
    both understand, e.g. ``s3://bucket/t`` with credentials in the environment).

    With `schema` the table is created if missing (with `configuration`, its Delta table
    properties); otherwise it must exist. `storage_options` go to deltalake.
    """

    def __init__(
        self,
        path: str,
        *,
        schema: pa.Schema | None = None,
        configuration: Mapping[str, str] | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        self.path = _location(path)
        self.storage_options = dict(storage_options or {})
        self._table_object: Any = None
        self._discarded = DiscardedParts()  # parts of merged files discarded so far
        deltalake = _require_deltalake()
        if schema is not None:
            deltalake.DeltaTable.create(
                self.path,
                schema,
                mode="ignore",
                configuration=dict(configuration or {}),
                storage_options=self.storage_options or None,
            )
        table = self._table()
        if partitions := table.metadata().partition_columns:
            raise SinkError(
                f"Delta table {self.path} is partitioned by {partitions}: only unpartitioned "
                "tables are supported; write to an unpartitioned table"
            )
        self.schema = pa.schema(table.schema().to_arrow())

    def __getstate__(self) -> dict[str, Any]:
        """Ship only the configuration and the table's columns to tasks (no table object)."""
        return {"path": self.path, "storage_options": self.storage_options, "schema": self.schema}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table_object = None
        self._discarded = DiscardedParts()

    def __repr__(self) -> str:
        return f"DeltaSink({self.path!r})"

    # --- the table --------------------------------------------------------------------------

    def _table(self) -> Any:
        if self._table_object is None:
            deltalake = _require_deltalake()
            try:
                self._table_object = deltalake.DeltaTable(
                    self.path, storage_options=self.storage_options or None
                )
            except deltalake.exceptions.TableNotFoundError as exc:
                raise SinkError(
                    f"Delta table {self.path} does not exist: create it, or pass schema= to "
                    "DeltaSink to create it"
                ) from exc
        return self._table_object

    def _filesystem(self) -> tuple[pafs.FileSystem, str]:
        if "://" in self.path:
            return pafs.FileSystem.from_uri(self.path)
        return pafs.LocalFileSystem(), self.path

    def _fit(self, batches: Sequence[pa.RecordBatch]) -> pa.Table:
        """`batches` as one table of the Delta table's columns, in its order and types."""
        names = self.schema.names
        out = []
        for batch in batches:
            missing = [n for n in names if n not in batch.schema.names]
            extra = [n for n in batch.schema.names if n not in names]
            if missing or extra:
                raise SinkError(
                    f"records for Delta table {self.path} do not fit its columns {names}: "
                    f"missing {missing or 'none'}, unknown {extra or 'none'}; map the records "
                    "to the table's columns before the sink"
                )
            try:
                out.append(pa.Table.from_batches([batch]).select(names).cast(self.schema))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SinkError(
                    f"records for Delta table {self.path} do not convert to its schema "
                    f"({self.schema}): {exc}"
                ) from exc
        return pa.concat_tables(out)

    def _own(self, committables: Iterable[bytes]) -> list[_Committable]:
        """The committables of this table, decoded; those of other sinks are skipped."""
        own = []
        for raw in committables:
            try:
                c = msgspec.msgpack.decode(raw, type=_Committable)
            except msgspec.DecodeError:  # another sink's format
                continue
            if c.table == self.path:
                own.append(c)
        return own

    def _decode(self, committables: Iterable[bytes]) -> list[_Committable]:
        """Every committable decoded; refuses one of another table or with an unsafe name."""
        out = []
        for raw in committables:
            try:
                c = msgspec.msgpack.decode(raw, type=_Committable)
            except msgspec.DecodeError as exc:
                raise CommitError(
                    f"Delta table {self.path}: a committable is not a Delta sink's ({exc}); was "
                    "the sink of this vertex changed since the checkpoint was taken?"
                ) from exc
            if c.table != self.path:
                raise CommitError(
                    f"Delta table {self.path}: a committable names file {c.file!r} of another "
                    f"table ({c.table}); was the sink's path changed since the checkpoint was "
                    "taken? Restore with the original path"
                )
            out.append(self._checked(c))
        return out

    def _checked(self, c: _Committable) -> _Committable:
        if not _FILE_NAME.fullmatch(c.file):
            raise CommitError(
                f"Delta table {self.path}: a committable names file {c.file!r}, which is not a "
                "data file name in the table directory (it would escape the table or hide in "
                "it); refusing it: the checkpoint's committables are damaged"
            )
        return c

    # --- writer side (in tasks) -------------------------------------------------------------

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Write `batches` as one Parquet file in the table directory; its committable (none
        if there are no rows). Nothing is visible until the driver commits it."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return ()
        table = self._fit(batches)
        name, size, modified = self._write_file(table, context)
        return (
            msgspec.msgpack.encode(_Committable(self.path, name, table.num_rows, size, modified)),
        )

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Write the rows of every part (the units of one task and epoch) as one Parquet file in
        the table directory, named after the first part; per part, its committable naming its
        rows of the file (none for a part without rows; `regional.sinks.base.MergingWriter`).
        The commit adds the file whole, or a rewrite of it without the rows of parts it does
        not hold."""
        if not parts:
            return []
        fitted = [
            self._fit(rows).to_batches() if (rows := [b for b in batches if b.num_rows]) else []
            for _, batches in parts
        ]
        table, places = merged_table(fitted)
        if table is None:
            return [() for _ in parts]
        name, size, modified = self._write_file(table, parts[0][0])
        return [
            ()
            if p is None
            else (
                msgspec.msgpack.encode(
                    _Committable(self.path, name, p.rows, size, modified, p.first_row, p.file_rows)
                ),
            )
            for p in places
        ]

    def _write_file(self, table: pa.Table, context: WriteContext) -> tuple[str, int, int]:
        """Write `table` as a new Parquet file in the table directory named after `context`,
        durable on return on a local disk: its name, size and modification time (ms)."""
        vertex = re.sub(r"[^A-Za-z0-9_-]", "_", context.vertex_id)
        run = re.sub(r"[^A-Za-z0-9_-]", "_", context.run_id)
        name = (
            f"c{context.checkpoint_id}-{vertex}-{context.index}-u{context.unit_id}-"
            f"a{context.attempt}-{run}-"
            f"{uuid.uuid4().hex[:12]}.parquet"
        )
        fs, base = self._filesystem()
        fs.create_dir(base, recursive=True)
        return name, *self._write_at(fs, base, name, table)

    @staticmethod
    def _write_at(fs: pafs.FileSystem, base: str, name: str, table: pa.Table) -> tuple[int, int]:
        """Write `table` as `base/name` (replacing a file there), fsynced with its directory on
        a local disk (durable before it is acknowledged or committed): its size and ms time."""
        pq.write_table(table, f"{base}/{name}", filesystem=fs)
        if isinstance(fs, pafs.LocalFileSystem):
            _fsync(f"{base}/{name}")
            _fsync(base)
        size = fs.get_file_info(f"{base}/{name}").size
        return int(size or 0), time.time_ns() // 1_000_000

    def sync_staged(self) -> None:
        """Nothing to do: `write` fsyncs each data file and its directory on a local disk
        before it returns (`regional.sinks.base.SinkWriter.sync_staged`)."""

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Add the files behind `committables` as one Delta version with the transaction marker
        (`commit_user`, `identifier`), recording the checkpoint and the fallback units (unit ->
        owner checkpoint) in its commit info.

        Uses the table version `latest_committed` last read: a commit of the same commit
        user since then makes delta-rs refuse, and that is a `CommitError`.
        """
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        table = self._table()
        version = table.version()
        latest = table.transaction_version(commit_user)
        if latest is not None and identifier <= latest:
            raise CommitError(
                f"Delta table {self.path}: commit {identifier} of user {commit_user!r} is not "
                f"after its latest commit {latest}; commits must be in checkpoint order"
            )
        added = self._plan(self._decode(committables))
        where = self._where(added)
        if missing := [
            f"{self.path}/{a.source}"
            for a, (s, r) in zip(added, where, strict=True)
            if not (s or r)
        ]:
            raise CommitError(
                f"Delta table {self.path}: cannot commit checkpoint {identifier}: data file(s) "
                f"{', '.join(missing[:5])} are missing (were they deleted?); nothing was "
                "committed; restore from a newer checkpoint or restore the files"
            )
        if latest is None and (present := self._in_table(added)):
            raise CommitError(
                f"Delta table {self.path}: cannot commit checkpoint {identifier}: data file(s) "
                f"{', '.join(present[:5])} are already in the table but commit user "
                f"{commit_user!r} has no transaction marker (did "
                "delta.setTransactionRetentionDuration expire it?); nothing was committed, "
                "committing again would duplicate their rows"
            )
        added = [
            self._rewrite(a, source_here) if a.keep is not None else a
            for a, (source_here, _) in zip(added, where, strict=True)
        ]
        actions = [
            AddAction(a.file, a.size, {}, a.modified, True, json.dumps({"numRecords": a.rows}))
            for a in added
        ]
        properties = CommitProperties(
            custom_metadata={
                CHECKPOINT_PROPERTY: str(identifier),
                COMMIT_USER_PROPERTY: commit_user,
                FALLBACK_PROPERTY: json.dumps(
                    {str(u): o for u, o in sorted((fallback or {}).items())},
                    separators=(",", ":"),
                ),
            },
            app_transactions=[
                Transaction(commit_user, identifier, last_updated=time.time_ns() // 1_000_000)
            ],
        )
        try:
            table.create_write_transaction(
                actions, mode="append", schema=table.schema(), commit_properties=properties
            )
        except CommitFailedError as exc:
            self._table_object = None  # read the table afresh for the retry
            raise CommitError(
                f"Delta table {self.path}: checkpoint {identifier} of commit user "
                f"{commit_user!r} was not committed: the table changed after version {version} "
                f"in a way that conflicts with it ({exc}); is another driver of this job "
                "running? The commit is retried and skipped if the other writer committed it"
            ) from exc
        table.update_incremental()
        fs, base = self._filesystem()
        for a in added:  # the merged files rewritten without other units' rows: no longer needed
            if a.keep is not None:
                with contextlib.suppress(FileNotFoundError):
                    fs.delete_file(f"{base}/{a.source}")

    def _plan(self, items: Sequence[_Committable]) -> list[_Added]:
        """The data files a commit of `items` adds, in order: a whole data file each, and one per
        merged data file (at its first part's place): whole, with the file's rows, when the
        commit holds every part of it, else a rewrite keeping the committed parts' rows
        (`regional.sinks.merging.kept_ranges`), named by the kept ranges (`kept_stem`) so a
        retried commit rewrites the same file."""
        added: list[_Added] = []
        for c, keep in commit_plan(
            items,
            part=lambda c: c.part,
            file=lambda c: c.file,
            describe=lambda c: f"Delta table {self.path}: {c.file}",
        ):
            if keep is None:
                rows = c.rows if c.part is None else c.file_rows
                added.append(_Added(c.file, c.file, rows, c.size, c.modified))
                continue
            name = f"{kept_stem(c.file.removesuffix('.parquet'), keep)}.parquet"
            added.append(_Added(c.file, name, sum(n for _, n in keep), -1, -1, keep))
        return added

    def _where(self, added: Sequence[_Added]) -> list[tuple[bool, bool]]:
        """For each planned file: (the data file its committables name exists, its rewrite
        exists). The rewrite is looked up only where the named file is gone (deleted after a
        commit that rewrote it: a retry)."""
        if not added:
            return []
        fs, base = self._filesystem()
        infos = fs.get_file_info([f"{base}/{a.source}" for a in added])
        here = [i.type == pafs.FileType.File for i in infos]
        gone = [a.file for a, h in zip(added, here, strict=True) if not h and a.keep is not None]
        infos = fs.get_file_info([f"{base}/{f}" for f in gone]) if gone else []
        rewritten = {f for f, i in zip(gone, infos, strict=True) if i.type == pafs.FileType.File}
        return [(h, a.file in rewritten) for a, h in zip(added, here, strict=True)]

    def _rewrite(self, added: _Added, source_here: bool) -> _Added:
        """Write the kept rows of `added`'s merged source file as its data file (replacing one
        an interrupted try left: same rows, same name), or, when the source is gone, take the
        rewrite that is there; `added` with the file's size and time."""
        fs, base = self._filesystem()
        if not source_here:
            info = fs.get_file_info(f"{base}/{added.file}")
            mtime = info.mtime_ns // 1_000_000 if info.mtime_ns else time.time_ns() // 1_000_000
            return added._replace(size=int(info.size or 0), modified=mtime)
        assert added.keep is not None
        rows = take_ranges(pq.read_table(f"{base}/{added.source}", filesystem=fs), added.keep)
        size, modified = self._write_at(fs, base, added.file, rows)
        return added._replace(size=size, modified=modified)

    def _in_table(self, added: Sequence[_Added]) -> list[str]:
        names = {a.file for a in added} | {a.source for a in added}
        paths = self._table().get_add_actions().column("path").to_pylist()
        return [f"{self.path}/{p}" for p in paths if p in names]

    def latest_committed(self, commit_user: str) -> int | None:
        """`commit_user`'s transaction marker in the table's latest version (Delta keeps only
        the latest marker per app id; a commit user commits in identifier order, so every
        smaller identifier was committed or had nothing to commit)."""
        table = self._table()
        table.update_incremental()
        version: int | None = table.transaction_version(commit_user)
        return version

    def data_files(self, committables: Iterable[bytes]) -> list[str]:
        """Paths of the data files behind `committables` (a merged file once)."""
        return list(dict.fromkeys(f"{self.path}/{c.file}" for c in self._decode(committables)))

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The data files behind `committables` that are gone (a merged file partly committed
        counts as there while its rewrite is)."""
        added = self._plan(self._decode(committables))
        where = self._where(added)
        return [
            f"{self.path}/{a.source}"
            for a, (s, r) in zip(added, where, strict=True)
            if not (s or r)
        ]

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete the files of a declined or aborted attempt (already gone is fine). A merged
        file is deleted once all of its parts were discarded through this sink object (the
        other units' rows in it may still commit).

        Committables of other sinks and tables (the runtime may hand a unit's committables to
        every sink) are skipped; a name that would escape the table is refused (nothing is
        deleted).
        """
        own = [self._checked(c) for c in self._own(committables)]
        fs, base = self._filesystem()
        for c in own:
            if (part := c.part) is not None and not self._discarded.add(c.file, part):
                continue
            with contextlib.suppress(FileNotFoundError):
                fs.delete_file(f"{base}/{c.file}")

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return sum(c.rows for c in self._own(committables))

    def marker_retention(self) -> SinkRetention:
        """How long the table keeps a commit user's marker (`regional.sinks.base.TableRetention`):
        `delta.setTransactionRetentionDuration` if set (else None: kept forever)."""
        configuration = self._table().metadata().configuration
        text = configuration.get(_TXN_RETENTION)
        return SinkRetention(
            "", "delta", self.path, _TXN_RETENTION, _interval_ms(text) if text else None
        )

    # --- reading ----------------------------------------------------------------------------

    def read(self) -> pa.Table:
        """Every committed row of the table (deltalake's own reader)."""
        table = self._table()
        table.update_incremental()
        return table.to_pyarrow_table()
