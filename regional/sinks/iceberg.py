"""An exactly-once Apache Iceberg sink through pyiceberg (DESIGN §4 rule 8, Flink's Iceberg sink).

Needs the optional extra: ``pip install 'regional-checkpoints[iceberg]'`` (pyiceberg is imported
only when an `IcebergSink` is created or used). The catalog is a pyiceberg `SqlCatalog` on a SQLite
file next to the warehouse by default (nothing to start), or any pyiceberg catalog from its
properties. Only unpartitioned tables are supported.

Written on the table-sink template (`regional.sinks.table.TableSink`: staging, merged parts,
discard, the commit's frame); what is Iceberg's own is long on purpose: the commit's guarantees
(the ancestry walk, the duplicate-file backstop, rollback only over our own snapshots) depend on
each other and are argued below.

Writers (in Spark tasks) write their epoch's rows as one Parquet data file under the table's data
location, named by sink subtask, checkpoint and attempt, and return one committable naming it.
They read the table's schema and location from its metadata file, never from the catalog. Once
checkpoint Y's metadata is durable the driver appends Y's data files to the table as one snapshot
(`Transaction.add_files`, a fast append) whose summary records

- ``regional.job-id``, ``regional.commit-user`` and ``regional.checkpoint-id`` (Y), and
- ``regional.fallback-units`` (JSON: unit -> the checkpoint owning its state, for the units that
  fell back in Y, whose output since then is not in this snapshot).

What a commit user committed is read by walking the ancestors of the table's current snapshot
(as Flink's Iceberg sink finds ``flink.max-committed-checkpoint-id``); the walk is remembered, so
a commit reads only the snapshots added since the last one. A commit that meets a concurrent
commit is refused (`CommitError`) instead of being re-based by pyiceberg, so the retry re-reads
what is committed first. `rollback` moves the table back to the snapshot before the commit user's
commits after a checkpoint, only when no other writer committed since.

The duplicate-file backstop (for when the commit-identifier check is fooled: the same files
committed under another commit user, or a snapshot whose commit user was lost) costs the same at
every commit however old the table is, unlike pyiceberg's ``check_duplicate_files``, which reads
every manifest of the current snapshot (one per append). It rests on the file names:

1. `write` names every file ``<sink>-<subtask>-c<Y>-a<attempt>-<12 hex>.parquet`` and the commit
   of checkpoint Y receives only files written for Y (the fresh subtasks of Y's metadata); `commit`
   enforces it, refusing a file not so named, or named for another checkpoint. So every file this
   sink ever committed was added by a snapshot whose summary names the checkpoint in its name.
2. Hence a file of checkpoint Y can already be in the table only as an entry ADDED by an ancestor
   snapshot whose summary names checkpoint Y (any commit user, or none). The cached ancestry walk
   indexes those snapshots by checkpoint; the backstop reads only the manifests such a snapshot
   added itself (``added_snapshot_id``): none for a checkpoint committed for the first time, one
   per earlier commit of the same checkpoint id (by other runs) otherwise.
3. That misses a snapshot that was expired (its summary is gone). Age- or count-based expiry
   removes the oldest first, and commits of one user are in checkpoint order, so an expired
   commit of Y by this user implies none of the user's commits are left: only then, and only
   when the table held data files before its oldest kept snapshot (from that snapshot's summary
   totals), is the whole current snapshot checked (pyiceberg's check): a commit user's first
   commit into a table with expired history (at most once per driver).

With output merging (`write_merged`) a task writes one data file for all the units it ran in
an epoch; a commit appends it whole (pyiceberg reads its metrics from the footer), or, when it
holds only some units' parts, the template's cut-out ``<file>-k<kept ranges>.parquet`` (still
named for checkpoint Y, so the backstop above covers it). The merged file is in no manifest; one
left by a crash between the commit and its delete is an orphan file, which Iceberg's orphan-file
removal (e.g. Spark's ``remove_orphan_files``) deletes.

Not checked: files of ours added to the table by another writer without our summary (e.g. a
hand-run ``add_files`` over the data directory), and a file added by a snapshot expired out of
age order (expiry by snapshot id).

>>> job_of("clicks-0123456789ab-out")
'clicks'
>>> job_of("hand-made-user")
'hand-made-user'
"""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from regional.errors import CommitError, RestoreError, SinkError
from regional.sinks.base import WriteContext
from regional.sinks.merging import take_ranges
from regional.sinks.table import COMMITTABLE_VERSION, Planned, TableSink, require

__all__ = [
    "CHECKPOINT_PROPERTY",
    "COMMIT_USER_PROPERTY",
    "FALLBACK_PROPERTY",
    "JOB_PROPERTY",
    "IcebergSink",
    "catalog_of",
    "job_of",
]

#: The table property that bounds snapshot age for expiry (Iceberg's own name).
_MAX_SNAPSHOT_AGE = "history.expire.max-snapshot-age-ms"

#: Snapshot summary property: the job whose run committed the snapshot.
JOB_PROPERTY = "regional.job-id"
#: Snapshot summary property: the commit user (`<job>-<run id>-<sink>`) of the snapshot.
COMMIT_USER_PROPERTY = "regional.commit-user"
#: Snapshot summary property: the checkpoint id committed by the snapshot.
CHECKPOINT_PROPERTY = "regional.checkpoint-id"
#: Snapshot summary property: JSON object unit -> owner checkpoint of the units that fell back.
FALLBACK_PROPERTY = "regional.fallback-units"

_RUN = re.compile(r"^(?P<job>.+)-[0-9a-f]{12}-.+$")  # the driver's commit user, see driver.py
# the name `IcebergSink.write` gives a data file (the location provider may put directories first)
# (and the commit a rewrite of a merged one: `-k<kept ranges>` after it, `regional.sinks.merging`)
_FILE = re.compile(
    r"^[A-Za-z0-9_.-]+-\d+-c(?P<checkpoint>\d+)-a\d+-[0-9a-f]{12}(?:-k[0-9a-f._]+)?\.parquet$"
)
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def job_of(commit_user: str) -> str:
    """The job id in a commit user made by the driver (`<job>-<12 hex run id>-<sink>`); any
    other commit user is returned whole."""
    match = _RUN.match(commit_user)
    return match["job"] if match else commit_user


def _checkpoint_of(file: str) -> int | None:
    """The checkpoint in the name `write` gives a data file; None for any other name.

    >>> _checkpoint_of("data/ab12/out-3-c42-a0-0123456789ab.parquet")
    42
    >>> _checkpoint_of("data/out-3-c42-a0-0123456789ab-k0.2_5.3.parquet")  # a rewrite
    42
    >>> _checkpoint_of("data/00000-0-5f1e.parquet") is None
    True
    """
    match = _FILE.match(file.rsplit("/", 1)[-1])
    return int(match["checkpoint"]) if match else None


class _Committable(msgspec.Struct, frozen=True, array_like=True):
    """One data file, or one unit's part of a merged one (`write_merged`;
    `regional.sinks.table.TableCommittable`). The fields after `rows` came later, with
    defaults: older committables still decode."""

    table_uuid: str  # the table written (discard skips other tables' files)
    file: str  # relative to the table's data location
    rows: int
    first_row: int = 0
    file_rows: int = -1
    version: int = 1


def _mark(snapshot: Any) -> tuple[str | None, int | None]:
    """(commit user, checkpoint id) recorded by a snapshot, or (None, None) if not ours."""
    summary = snapshot.summary
    user = summary.get(COMMIT_USER_PROPERTY) if summary is not None else None
    checkpoint = summary.get(CHECKPOINT_PROPERTY) if summary is not None else None
    if user is None or checkpoint is None:
        return None, None
    return user, int(checkpoint)


def _checkpoint_mark(snapshot: Any) -> int | None:
    """The checkpoint id a snapshot's summary names (whatever its commit user), or None."""
    checkpoint = snapshot.summary.get(CHECKPOINT_PROPERTY) if snapshot.summary else None
    return int(checkpoint) if checkpoint is not None and checkpoint.isdigit() else None


def _added_files(io: Any, snapshot: Any) -> set[str]:
    """Locations of the data files `snapshot` added: the ADDED entries of the data manifests it
    wrote itself (one for a fast append), never the manifests it inherited."""
    from pyiceberg.manifest import ManifestContent, ManifestEntryStatus

    return {
        entry.data_file.file_path
        for manifest in snapshot.manifests(io)
        if manifest.content == ManifestContent.DATA
        and manifest.added_snapshot_id == snapshot.snapshot_id
        for entry in manifest.fetch_manifest_entry(io, discard_deleted=False)
        if entry.status == ManifestEntryStatus.ADDED and entry.snapshot_id == snapshot.snapshot_id
    }


def catalog_of(
    warehouse: str, table: str, catalog_properties: Mapping[str, str] | None
) -> dict[str, str]:
    """The properties of the catalog of `table`: `catalog_properties` with `warehouse` added
    (unless given), or by default a SQLite `SqlCatalog` on ``<warehouse>/catalog.db`` (a local
    warehouse only: `SinkError` otherwise).

    >>> catalog_of("/w", "db.t", None)["uri"], catalog_of("s3://b/w", "db.t", {"type": "rest"})
    ('sqlite:////w/catalog.db', {'warehouse': 's3://b/w', 'type': 'rest'})
    """
    if catalog_properties is not None:
        return {"warehouse": warehouse, **catalog_properties}
    if "://" in warehouse and not warehouse.startswith("file://"):
        raise SinkError(
            f"Iceberg table {table!r}: the default SQLite catalog needs a local warehouse "
            f"directory, not {warehouse}; pass catalog_properties= for a catalog that serves "
            "object stores (e.g. a REST catalog)"
        )
    local = os.path.abspath(warehouse.removeprefix("file://"))
    return {"type": "sql", "uri": f"sqlite:///{local}/catalog.db", "warehouse": f"file://{local}"}


class IcebergSink(TableSink[_Committable]):
    """The unpartitioned Iceberg table `table` ("namespace.table").

    By default the catalog is a pyiceberg `SqlCatalog` on ``<warehouse>/catalog.db`` with the
    tables under `warehouse` (a local directory). With `catalog_properties` the catalog is
    ``pyiceberg.catalog.load_catalog(catalog_name, **catalog_properties)`` (REST, Glue, Hive, SQL
    on a server...; `warehouse` is added as the ``warehouse`` property if not given). With
    `schema` the namespace and table are created if missing (with `table_properties`);
    otherwise the table must exist.
    """

    committable = _Committable
    kind = "iceberg"
    #: writers read the table from its metadata file, never from the catalog: no SQLite or
    #: catalog service from executors
    shipped = (
        "warehouse",
        "table_name",
        "catalog_name",
        "catalog_properties",
        "_metadata_location",
    )

    def __init__(
        self,
        warehouse: str,
        table: str,
        *,
        schema: pa.Schema | None = None,
        table_properties: Mapping[str, str] | None = None,
        catalog_properties: Mapping[str, str] | None = None,
        catalog_name: str = "regional",
    ) -> None:
        super().__init__()
        if "." not in table.strip("."):
            raise SinkError(f"Iceberg table {table!r}: expected 'namespace.table'")
        self.warehouse = warehouse
        self.table_name = table
        self.catalog_name = catalog_name
        self.catalog_properties = catalog_of(warehouse, table, catalog_properties)
        if catalog_properties is None:
            os.makedirs(self.catalog_properties["warehouse"].removeprefix("file://"), exist_ok=True)
        self._metadata_location: str | None = None  # what tasks read the table from
        require("pyiceberg.catalog", "Iceberg", "iceberg")
        if schema is not None:
            catalog = self._catalog()
            catalog.create_namespace_if_not_exists(table.rsplit(".", 1)[0])
            catalog.create_table_if_not_exists(
                table, schema=schema, properties=dict(table_properties or {})
            )
        self._check_unpartitioned(self._refreshed())

    def __getstate__(self) -> dict[str, Any]:
        """Ship only the configuration and the table's metadata file to tasks (writers read the
        table from it, never from the catalog: no SQLite or catalog service from executors)."""
        if self._table_object is not None:
            self._metadata_location = self._table_object.metadata_location
        return super().__getstate__()

    def _forget(self) -> None:
        super()._forget()
        self._catalog_object: Any = None
        self._table_object: Any = None
        self._head: int | None = None  # `_identifiers` describe the ancestors of this snapshot
        self._identifiers: dict[str, set[int]] = {}
        self._snapshots_of: dict[int, list[int]] = {}  # checkpoint -> ancestors marked with it
        self.snapshots_read = 0  # snapshots walked so far (to measure the cache)

    def __repr__(self) -> str:
        return f"IcebergSink({self.warehouse!r}, {self.table_name!r})"

    # --- the table --------------------------------------------------------------------------

    def _catalog(self) -> Any:
        if self._catalog_object is None:
            from pyiceberg.catalog import load_catalog

            self._catalog_object = load_catalog(self.catalog_name, **self.catalog_properties)
        return self._catalog_object

    def _refreshed(self) -> Any:
        """The table as the catalog has it now."""
        from pyiceberg.exceptions import NoSuchTableError

        if self._table_object is None:
            try:
                self._table_object = self._catalog().load_table(self.table_name)
            except NoSuchTableError as exc:
                raise SinkError(
                    f"Iceberg table {self.table_name!r} does not exist in the catalog of "
                    f"{self.warehouse}: create it, or pass schema= to IcebergSink to create it"
                ) from exc
        else:
            self._table_object.refresh()
        return self._table_object

    def _writer_table(self) -> Any:
        """The table for writing data files: read from its metadata file in a task."""
        if self._table_object is None:
            if self._metadata_location is None:
                return self._refreshed()
            from pyiceberg.table import StaticTable

            self._table_object = StaticTable.from_metadata(
                self._metadata_location, properties=self.catalog_properties
            )
        return self._table_object

    def _table(self) -> Any:
        return self._table_object if self._table_object is not None else self._refreshed()

    def _check_unpartitioned(self, table: Any) -> None:
        if not table.spec().is_unpartitioned():
            raise SinkError(
                f"Iceberg table {self.table_name!r} in {self.warehouse}: only unpartitioned "
                f"tables are supported; it is partitioned by {table.spec()}"
            )

    def _data_path(self, table: Any) -> str:
        return str(table.location_provider().data_path).rstrip("/")

    # --- regional.sinks.table.TableSink's hooks ------------------------------------------------

    @property
    def describe(self) -> str:
        return f"Iceberg table {self.table_name!r}"

    def _other_table(self, committable: _Committable) -> str | None:
        mine = self._table().metadata.table_uuid.hex
        return None if committable.table_uuid == mine else f"uuid {committable.table_uuid}"

    def _schema(self) -> pa.Schema:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        return schema_to_pyarrow(self._writer_table().schema())

    def _name(self, committable: _Committable) -> str:
        return committable.file

    def _path(self, name: str) -> str:
        """The full location of data file `name` (relative to the data location, from a
        committable); a name that would leave the table's data location is refused."""
        data_path = self._data_path(self._table())
        if "\\" in name or ":" in name or {"", ".", ".."} & {*name.split("/")}:
            raise CommitError(
                f"Iceberg table {self.table_name!r}: committable names data file {name!r}, "
                f"which is outside the table's data location {data_path}; "
                "refusing it (is the checkpoint metadata from another table or tampered with?)"
            )
        return f"{data_path}/{name}"

    def _exist(self, paths: Sequence[str]) -> list[bool]:
        io = self._table().io
        return [bool(io.new_input(p).exists()) for p in paths]

    def _delete(self, paths: Sequence[str]) -> None:
        io = self._table().io
        for path in paths:
            if io.new_input(path).exists():
                io.delete(path)

    @property
    def location(self) -> str:
        return f"{self.warehouse} {self.table_name}"

    def _retention(self) -> tuple[str, int | None]:
        """The table's `history.expire.max-snapshot-age-ms` if set on it (what snapshot expiry
        by Spark, Flink or Java Iceberg uses when given no age; pyiceberg expires only when
        asked), else None. Our commit markers are snapshot summaries, so an expired snapshot
        takes its marker with it."""
        text = self._table().properties.get(_MAX_SNAPSHOT_AGE)
        return _MAX_SNAPSHOT_AGE, int(text) if text is not None and text.strip().isdigit() else None

    # --- writer side (in tasks) -------------------------------------------------------------

    def _stage(self, rows: pa.Table, context: WriteContext) -> list[_Committable]:
        """Write `rows` as a new Parquet data file (with the table's field ids) under the data
        location, named after `context` (the name the duplicate-file backstop relies on)."""
        table = self._writer_table()
        name = (
            f"{_UNSAFE.sub('_', context.vertex_id)}-{context.index}-c{context.checkpoint_id}-"
            f"a{context.attempt}-"
            f"{uuid.uuid4().hex[:12]}.parquet"
        )
        location = table.location_provider().new_data_location(name)
        data_path = self._data_path(table)
        if not location.startswith(data_path + "/"):
            raise SinkError(
                f"Iceberg table {self.table_name!r}: data file {location} is not under the data "
                f"location {data_path}"
            )
        output = table.io.new_output(location)
        try:
            with output.create(overwrite=False) as out:
                pq.write_table(rows, out)
        except BaseException:
            table.io.delete(location)
            raise
        file = location[len(data_path) + 1 :]
        uuid_hex = table.metadata.table_uuid.hex
        return [_Committable(uuid_hex, file, rows.num_rows, version=COMMITTABLE_VERSION)]

    def sync_staged(self) -> None:
        """Nothing is synced here (`regional.sinks.base.SinkWriter.sync_staged`): data files go
        through the table's FileIO, durable on close on object stores; on a local disk they
        are not fsynced, so a power loss can lose a staged file (its commit then refuses,
        naming it)."""

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def _latest_before_commit(self, commit_user: str) -> int | None:
        return max(self.committed_identifiers(commit_user), default=None)  # refreshes the table

    def _publish(
        self,
        commit_user: str,
        identifier: int,
        plan: Sequence[Planned[_Committable]],
        latest: int | None,
        fallback: str,
    ) -> None:
        """Append the data files of `plan` as one snapshot of `commit_user` for checkpoint
        `identifier`, recording the job, user, checkpoint and fallback units in its summary,
        after the duplicate-file backstop (see the module's docstring)."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table import Table, TableProperties

        table = self._table()
        paths = [self._path(x.item.file if x.kept is None else x.kept) for x in plan]
        self._check_names(commit_user, identifier, paths)
        properties = {
            JOB_PROPERTY: job_of(commit_user),
            COMMIT_USER_PROPERTY: commit_user,
            CHECKPOINT_PROPERTY: str(identifier),
            FALLBACK_PROPERTY: fallback,
        }
        # pyiceberg would re-base the append onto a concurrent commit and retry without asking
        # us; a commit of ours in between would then be duplicated. Commit once, on a copy of
        # the table whose retries are off: a conflict is an error, and the coordinator's retry
        # re-reads what is committed first.
        no_retry = table.metadata.model_copy(
            update={
                "properties": {**table.metadata.properties, TableProperties.COMMIT_NUM_RETRIES: "0"}
            }
        )
        once = Table(table.name(), no_retry, table.metadata_location, table.io, table.catalog)
        sources = [p for x in plan if x.keep is not None for p in x.sources]
        self._check_not_committed(table, commit_user, identifier, [*paths, *sources])
        for x, path in zip(plan, paths, strict=True):
            if x.keep is not None and not x.gone:  # the cut-out, replacing a lost try's
                with table.io.new_input(x.sources[0]).open() as f:
                    rows = take_ranges(pq.read_table(f), x.keep)
                with table.io.new_output(path).create(overwrite=True) as out:
                    pq.write_table(rows, out)
        whole_table = latest is None and self._history_cut(table)  # see the module's docstring
        transaction = once.transaction()
        try:
            transaction.add_files(
                paths, snapshot_properties=properties, check_duplicate_files=whole_table
            )
            transaction.commit_transaction()
        except CommitFailedException as exc:
            raise CommitError(
                f"Iceberg table {self.table_name!r}: commit of checkpoint {identifier} (commit "
                f"user {commit_user!r}) met a concurrent commit to the table and was not made "
                f"({exc}); it is retried after re-reading the table's snapshots"
            ) from exc
        except ValueError as exc:  # pyiceberg's backstop: files already in the table
            raise CommitError(
                f"Iceberg table {self.table_name!r}: cannot commit checkpoint {identifier} of "
                f"user {commit_user!r}: {exc}; was it committed by a snapshot that has since "
                "expired or by another writer? nothing was committed"
            ) from exc
        self._table_object.refresh()

    def committed_identifiers(self, commit_user: str) -> frozenset[int]:
        """Checkpoint ids committed by `commit_user`: the snapshot summaries of the current
        snapshot and its ancestors. Ancestry does not change, so only snapshots added since
        the last call are read (a new sink, e.g. after a driver crash, walks them all once;
        a rolled-back table is walked again)."""
        from pyiceberg.table.snapshots import ancestors_of

        table = self._refreshed()
        current = table.current_snapshot()
        head = current.snapshot_id if current is not None else None
        if head != self._head:
            added = []
            for s in ancestors_of(current, table.metadata):
                if s.snapshot_id == self._head:
                    break
                added.append(s)
            else:  # the cached head is not an ancestor (a rollback): start over
                self._identifiers, self._snapshots_of = {}, {}
            self.snapshots_read += len(added)
            for s in reversed(added):  # oldest first
                user, checkpoint = _mark(s)
                if user is not None and checkpoint is not None:
                    self._identifiers.setdefault(user, set()).add(checkpoint)
                if (marked := _checkpoint_mark(s)) is not None:
                    self._snapshots_of.setdefault(marked, []).append(s.snapshot_id)
            self._head = head
        return frozenset(self._identifiers.get(commit_user, ()))

    def latest_committed(self, commit_user: str) -> int | None:
        """The latest checkpoint id committed by `commit_user` (`TableCommitter`)."""
        return max(self.committed_identifiers(commit_user), default=None)

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo `commit_user`'s commits after checkpoint `identifier` (`rollback_users`);
        returns the checkpoints undone. `regional.sinks.base.TableRollback`."""
        return self.rollback_users((commit_user,), identifier).get(commit_user, [])

    def rollback_users(
        self, commit_users: Collection[str], identifier: int
    ) -> dict[str, list[int]]:
        """Undo the commits after checkpoint `identifier` of every user in `commit_users` (the
        sink vertices of one job, which may share this table) by making the snapshot before
        the first of them the table's current one; returns, per user, the checkpoints undone.
        A commit of theirs up to `identifier` that came after such a commit goes back too: it
        was not confirmed when checkpoint `identifier` was taken, so the restore commits it
        again.

        Refused (`RestoreError`) when another writer committed after that snapshot: moving the
        table back would drop its rows too. `regional.sinks.base.TableRollbackUsers`."""
        from pyiceberg.exceptions import CommitFailedException
        from pyiceberg.table.snapshots import ancestors_of

        users = set(commit_users)
        described = f"user{'s' if len(users) > 1 else ''} " + ", ".join(map(repr, sorted(users)))
        # the users with commits to undo, until the walk meets one of theirs at or before it
        waiting = {u for u in users if (self.latest_committed(u) or 0) > identifier}
        table = self._refreshed()
        newer = []  # newest first, up to the oldest commit of theirs after `identifier`
        for s in ancestors_of(table.current_snapshot(), table.metadata) if waiting else ():
            user, checkpoint = _mark(s)
            if user in waiting and checkpoint is not None and checkpoint <= identifier:
                waiting.discard(user)
                if not waiting:
                    break
            newer.append(s)
        while newer and not (
            _mark(newer[-1])[0] in users and (_mark(newer[-1])[1] or 0) > identifier
        ):
            newer.pop()
        if not newer:
            return {}
        if others := [s for s in newer if _mark(s)[0] not in users]:
            raise RestoreError(
                f"Iceberg table {self.table_name!r}: cannot roll back the commits of "
                f"{described} after checkpoint {identifier}: snapshot(s) "
                f"{', '.join(str(s.snapshot_id) for s in reversed(others))} of other writers "
                "came after them and would be dropped too; remove the commits by hand (e.g. "
                "delete their rows) or restore a newer checkpoint"
            )
        target = newer[-1].parent_snapshot_id
        manage = table.manage_snapshots()
        if target is None:
            manage.remove_branch("main")  # the table had no snapshot before the user's commits
        else:
            manage.set_current_snapshot(target)
        try:
            manage.commit()
        except CommitFailedException as exc:
            raise CommitError(
                f"Iceberg table {self.table_name!r}: the rollback of {described} to "
                f"checkpoint {identifier} met a concurrent commit and was not made ({exc}); "
                "restore again"
            ) from exc
        self._head, self._identifiers, self._snapshots_of = None, {}, {}
        undone: dict[str, list[int]] = {}
        for s in reversed(newer):  # oldest first
            user, checkpoint = _mark(s)
            if user is not None and checkpoint is not None and checkpoint > identifier:
                undone.setdefault(user, []).append(checkpoint)
        return undone

    # --- the duplicate-file backstop (see the module's docstring) ------------------------------

    def _check_names(self, commit_user: str, identifier: int, paths: Sequence[str]) -> None:
        """Refuse a data file not named by `write` for checkpoint `identifier`."""
        for path in paths:
            if _checkpoint_of(path) != identifier:
                raise CommitError(
                    f"Iceberg table {self.table_name!r}: cannot commit checkpoint {identifier} "
                    f"of user {commit_user!r}: data file {path} is not named as the sink names "
                    f"the files of checkpoint {identifier} (<sink>-<subtask>-c{identifier}-"
                    "a<attempt>-<12 hex>.parquet); nothing was committed (is the checkpoint "
                    "metadata from another writer or tampered with?)"
                )

    def _check_not_committed(
        self, table: Any, commit_user: str, identifier: int, paths: Sequence[str]
    ) -> None:
        """Refuse data files already added by an ancestor snapshot marked with checkpoint
        `identifier`, reading only the manifests those snapshots added."""
        wanted = set(paths)
        for snapshot_id in self._snapshots_of.get(identifier, ()):
            snapshot = table.metadata.snapshot_by_id(snapshot_id)
            if snapshot is None:  # expired meanwhile
                continue
            if again := sorted(wanted & _added_files(table.io, snapshot)):
                user = snapshot.summary.get(COMMIT_USER_PROPERTY) if snapshot.summary else None
                raise CommitError(
                    f"Iceberg table {self.table_name!r}: cannot commit checkpoint {identifier} "
                    f"of user {commit_user!r}: data file(s) {', '.join(again[:5])} were already "
                    f"committed by snapshot {snapshot_id} (commit user "
                    f"{user if user is None else repr(user)}, checkpoint {identifier}); "
                    "committing them again would duplicate their rows; nothing was committed "
                    "(is another run committing this job's checkpoints?)"
                )

    def _history_cut(self, table: Any) -> bool:
        """Whether the table held data files before its oldest kept snapshot, i.e. some of
        them were added by expired snapshots, whose summaries are gone. The oldest ancestor's
        summary totals say so (pyiceberg's expiry even clears its parent id). A whole walk of
        the ancestry: only a commit user's first commit asks."""
        from pyiceberg.table.snapshots import ancestors_of

        oldest = None
        for oldest in ancestors_of(table.current_snapshot(), table.metadata):  # noqa: B007
            pass
        if oldest is None:
            return False
        summary = oldest.summary
        total = summary.get("total-data-files") if summary is not None else None
        if summary is None or total is None:
            return True  # no totals (another engine): assume the worst
        added = summary.get("added-data-files") or 0
        deleted = summary.get("deleted-data-files") or 0
        return int(total) - int(added) + int(deleted) > 0

    # --- reading ----------------------------------------------------------------------------

    def read(self) -> pa.Table:
        """Every committed row of the table (pyiceberg's own reader)."""
        return self._refreshed().scan().to_arrow()

    def current_files(self) -> list[str]:
        """Locations of the data files of the current snapshot, from its manifest entries."""
        table = self._refreshed()
        snapshot = table.current_snapshot()
        if snapshot is None:
            return []
        return [
            entry.data_file.file_path
            for manifest in snapshot.manifests(table.io)
            for entry in manifest.fetch_manifest_entry(table.io, discard_deleted=True)
        ]
