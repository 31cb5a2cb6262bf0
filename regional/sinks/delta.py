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

Staging, merged files (one per task and epoch, `write_merged`), discard and the frame of a
commit are the table-sink template's (`regional.sinks.table.TableSink`). A merged file the commit
holds whole is one ``add`` action with the whole file's row count; one cut out (a unit declared
fallen back after staging) is added as ``<file>-k<kept ranges>.parquet`` (a retry writes the same
file, the marker keeps it from being added twice). The merged file is never added; one left by a
crash between the commit and its delete is in no log entry: ``DeltaTable.vacuum(full=True)``.

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

import json
import os
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from regional.errors import CommitError, SinkError
from regional.sinks.base import WriteContext
from regional.sinks.durability import fsync_path as _fsync
from regional.sinks.merging import take_ranges
from regional.sinks.table import COMMITTABLE_VERSION, Planned, TableSink, require

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
    """One staged data file, or one unit's part of a merged one (`write_merged`;
    `regional.sinks.table.TableCommittable`). `size` and `modified` are the whole file's. The
    fields after `modified` came later, with defaults: older committables still decode."""

    table: str  # the table's location when written (discard skips other tables' files)
    file: str  # name of the data file in the table directory
    rows: int
    size: int  # bytes
    modified: int  # ms since the epoch
    first_row: int = 0
    file_rows: int = -1
    version: int = 1


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
    return require("deltalake", "Delta Lake", "delta")


def _location(path: str) -> str:
    """`path` as the sink keeps it: URIs as given, local paths absolute without a trailing /."""
    return path.rstrip("/") if "://" in path else os.path.abspath(path)


class DeltaSink(TableSink[_Committable]):
    """The unpartitioned Delta table at `path` (a local path or a URI deltalake and pyarrow.fs
    both understand, e.g. ``s3://bucket/t`` with credentials in the environment).

    With `schema` the table is created if missing (with `configuration`, its Delta table
    properties); otherwise it must exist. `storage_options` go to deltalake.
    """

    committable = _Committable
    kind = "delta"
    shipped = ("path", "storage_options", "schema")  # no table object

    def __init__(
        self,
        path: str,
        *,
        schema: pa.Schema | None = None,
        configuration: Mapping[str, str] | None = None,
        storage_options: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        self.path = _location(path)
        self.storage_options = dict(storage_options or {})
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

    def _forget(self) -> None:
        super()._forget()
        self._table_object: Any = None

    def __repr__(self) -> str:
        return f"DeltaSink({self.path!r})"

    # --- the table: regional.sinks.table.TableSink's hooks -------------------------------------

    @property
    def describe(self) -> str:
        return f"Delta table {self.path}"

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

    def _in_fs(self, path: str) -> str:
        """A full path (``<table path>/<file>``) as the table's file system names it."""
        return f"{self._filesystem()[1]}{path[len(self.path) :]}"

    def _other_table(self, committable: _Committable) -> str | None:
        return None if committable.table == self.path else committable.table

    def _schema(self) -> pa.Schema:
        return self.schema

    def _name(self, committable: _Committable) -> str:
        return committable.file

    def _path(self, name: str) -> str:
        return f"{self.path}/{name}"

    def _checked(self, committable: _Committable) -> _Committable:
        if not _FILE_NAME.fullmatch(committable.file):
            raise CommitError(
                f"Delta table {self.path}: a committable names file {committable.file!r}, "
                "which is not a data file name in the table directory (it would escape the "
                "table or hide in it); refusing it: the checkpoint's committables are damaged"
            )
        return committable

    def _exist(self, paths: Sequence[str]) -> list[bool]:
        if not paths:
            return []
        fs, _ = self._filesystem()
        infos = fs.get_file_info([self._in_fs(p) for p in paths])
        return [i.type == pafs.FileType.File for i in infos]

    def _delete(self, paths: Sequence[str]) -> None:
        fs, _ = self._filesystem()
        for path in paths:
            try:
                fs.delete_file(self._in_fs(path))
            except FileNotFoundError:
                continue

    @property
    def location(self) -> str:
        return self.path

    def _retention(self) -> tuple[str, int | None]:
        """`delta.setTransactionRetentionDuration` if set (else None: markers kept forever)."""
        text = self._table().metadata().configuration.get(_TXN_RETENTION)
        return _TXN_RETENTION, _interval_ms(text) if text else None

    # --- writer side (in tasks) -------------------------------------------------------------

    def _stage(self, rows: pa.Table, context: WriteContext) -> list[_Committable]:
        """Write `rows` as a new Parquet file in the table directory named after `context`,
        durable on return on a local disk."""
        vertex = re.sub(r"[^A-Za-z0-9_-]", "_", context.vertex_id)
        run = re.sub(r"[^A-Za-z0-9_-]", "_", context.run_id)
        name = (
            f"c{context.checkpoint_id}-{vertex}-{context.index}-u{context.unit_id}-"
            f"a{context.attempt}-{run}-"
            f"{uuid.uuid4().hex[:12]}.parquet"
        )
        fs, base = self._filesystem()
        fs.create_dir(base, recursive=True)
        size, modified = self._write_at(fs, base, name, rows)
        return [
            _Committable(
                self.path, name, rows.num_rows, size, modified, version=COMMITTABLE_VERSION
            )
        ]

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

    # --- committer side (on the driver) -----------------------------------------------------

    def _latest_before_commit(self, commit_user: str) -> int | None:
        """The marker in the table version `latest_committed` last read: the version the
        commit is made on, so a commit of the same commit user since then makes delta-rs
        refuse (a `CommitError`)."""
        version: int | None = self._table().transaction_version(commit_user)
        return version

    def _publish(
        self,
        commit_user: str,
        identifier: int,
        plan: Sequence[Planned[_Committable]],
        latest: int | None,
        fallback: str,
    ) -> None:
        """Add the data files of `plan` as one Delta version with the transaction marker
        (`commit_user`, `identifier`), recording the checkpoint and the fallback units in its
        commit info; a commit user without a marker first checks that none is in the table."""
        from deltalake.exceptions import CommitFailedError
        from deltalake.transaction import AddAction, CommitProperties, Transaction

        table = self._table()
        version = table.version()
        if latest is None and (present := self._in_table(plan)):
            raise CommitError(
                f"Delta table {self.path}: cannot commit checkpoint {identifier}: data file(s) "
                f"{', '.join(present[:5])} are already in the table but commit user "
                f"{commit_user!r} has no transaction marker (did "
                "delta.setTransactionRetentionDuration expire it?); nothing was committed, "
                "committing again would duplicate their rows"
            )
        actions = [
            AddAction(file, size, {}, modified, True, json.dumps({"numRecords": rows}))
            for file, rows, size, modified in (self._added(x) for x in plan)
        ]
        properties = CommitProperties(
            custom_metadata={
                CHECKPOINT_PROPERTY: str(identifier),
                COMMIT_USER_PROPERTY: commit_user,
                FALLBACK_PROPERTY: fallback,
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

    def _added(self, planned: Planned[_Committable]) -> tuple[str, int, int, int]:
        """The data file `planned` adds: (name, rows, size, ms time). A cut-out is written
        from its merged file (replacing one an interrupted try left: same rows, same name),
        or, when the merged file is gone, taken as it is."""
        c, keep, kept = planned.item, planned.keep, planned.kept
        if keep is None or kept is None:
            return c.file, c.rows if c.file_rows < 0 else c.file_rows, c.size, c.modified
        fs, base = self._filesystem()
        rows = sum(n for _, n in keep)
        if planned.gone:
            info = fs.get_file_info(f"{base}/{kept}")
            mtime = info.mtime_ns // 1_000_000 if info.mtime_ns else time.time_ns() // 1_000_000
            return kept, rows, int(info.size or 0), mtime
        table = take_ranges(pq.read_table(f"{base}/{c.file}", filesystem=fs), keep)
        return kept, rows, *self._write_at(fs, base, kept, table)

    def _in_table(self, plan: Sequence[Planned[_Committable]]) -> list[str]:
        names = {x.item.file for x in plan} | {x.kept for x in plan if x.kept is not None}
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

    # --- reading ----------------------------------------------------------------------------

    def read(self) -> pa.Table:
        """Every committed row of the table (deltalake's own reader)."""
        table = self._table()
        table.update_incremental()
        return table.to_pyarrow_table()
