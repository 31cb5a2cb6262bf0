"""An exactly-once Apache Paimon sink through pypaimon (DESIGN §4 rule 8, Paimon PIP-30).

Needs the optional extra: ``pip install 'regional-checkpoints[paimon]'`` (pypaimon is imported only
when a `PaimonSink` is created or used). Only append tables without a primary key and with unaware
buckets (``bucket = -1``, the default) are supported, as in PIP-30 itself.

Writers (in Spark tasks) write their epoch's rows as Paimon data files and return one committable
per Paimon commit message: the message in Java Paimon's ``CommitMessageSerializer`` v14 layout,
with the table's schema id and row count. The committables live in the writer's subtask state.
Once checkpoint Y's metadata is durable the driver commits Y's committables as one Paimon snapshot
with commit identifier Y and the job's commit user, after

- skipping Y if the table already has a snapshot of that commit user with identifier Y (read from
  Paimon's own snapshots, so the check survives a driver crash; pypaimon does not filter), and
- checking that every data file exists (pypaimon would commit a missing file and every later read
  of the table would fail).

Each snapshot records ``regional.checkpoint-id`` (Y) and ``regional.fallback-units`` (JSON: unit ->
the checkpoint owning its state, for the units that fell back in Y, whose output since then is not
in this snapshot) in its properties. Staged files of declined or aborted attempts are deleted;
data files are named ``data-rg~<job>~<run>-c<checkpoint>-u<unit>-a<attempt>-<uuid>-0.parquet``, so
when the job's next driver starts it deletes the files of attempts lost in a crash: its job's
files that no snapshot the table still has and no committable of the restored checkpoint names
(`clean_staged`).

With output merging (`write_merged`, `regional.sinks.merging`) a task writes one commit message
(one data file, unless the rows exceed the table's target file size) for all the units it ran in
an epoch on an unpartitioned table, and each unit's committable carries the message and names its
rows of it (a partitioned table's units are written one by one: their rows go to one file per
partition anyway). A commit commits such a message whole when it holds every part of it;
otherwise (a unit was declared fallen back after its rows were written) it first rewrites the
kept rows with a pypaimon writer (which computes the new file's statistics) as
``<file>-k<kept ranges>-<n>.parquet``, commits that message, and then deletes the merged files.
The merged files are in no snapshot, so readers do not see them; one left behind by a crash
between the commit and the delete is deleted by `clean_staged` once no restored checkpoint
names it.

Only one process may commit to a table at a time (pypaimon's local rename lock is per process).
Staging, merged parts, discard and the commit's frame are the table-sink template's
(`regional.sinks.table.TableSink`); a Paimon "data file" there is a commit message.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa
from pyarrow import fs as pafs

from regional.errors import CommitError, SinkError
from regional.sinks.base import WriteContext
from regional.sinks.merging import kept_stem, take_ranges
from regional.sinks.table import COMMITTABLE_VERSION, Planned, TableSink, require

__all__ = ["CHECKPOINT_PROPERTY", "FALLBACK_PROPERTY", "PaimonSink"]

#: Snapshot property: the checkpoint id committed by the snapshot (also its commit identifier).
CHECKPOINT_PROPERTY = "regional.checkpoint-id"
#: Snapshot property: JSON object unit -> owner checkpoint of the units that fell back.
FALLBACK_PROPERTY = "regional.fallback-units"

_MESSAGE_VERSION = 14  # Java Paimon's CommitMessageSerializer version of the message bytes
_TIME_RETAINED = "snapshot.time-retained"
_PAIMON_UNITS = {  # the unit names Paimon's durations accept, in ms
    name: ms
    for names, ms in (
        ("ms milli millis millisecond milliseconds", 1),
        ("s sec secs second seconds", 1000),
        ("m min minute minutes", 60_000),
        ("h hour hours", 3_600_000),
        ("d day days", 86_400_000),
    )
    for name in names.split()
}

_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _job_prefix(job_id: str) -> str:
    """How the names of job `job_id`'s data files start: `~` is in no job id, so one job's
    prefix never starts another's.

    >>> _job_prefix("clicks")
    'data-rg~clicks~'
    """
    return f"data-rg~{_UNSAFE.sub('_', job_id)}~"


def _data_prefix(context: WriteContext) -> str:
    """How the names of the data files `context` writes start: the job (for `clean_staged`),
    the run, checkpoint, unit and attempt."""
    return (
        f"{_job_prefix(context.job_id)}{_UNSAFE.sub('_', context.run_id)}-c{context.checkpoint_id}"
        f"-u{context.unit_id}-a{context.attempt}-"
    )


def _paimon_duration_ms(text: str) -> int | None:
    """A Paimon duration option (`1 h`, `30min`, `500 ms`) in milliseconds; None if it is not
    one (then nothing is recorded: Paimon itself would refuse it).

    >>> _paimon_duration_ms("1 h"), _paimon_duration_ms("30min"), _paimon_duration_ms("soon")
    (3600000, 1800000, None)
    """
    match = re.fullmatch(r"\s*(\d+)\s*([a-z]*)\s*", text.lower())
    if match is None or match[2] not in {**_PAIMON_UNITS, "": 1}:
        return None
    return int(match[1]) * _PAIMON_UNITS.get(match[2], 1)


class _Committable(msgspec.Struct, frozen=True, array_like=True):
    """One Paimon commit message, or one unit's part of a merged one (`write_merged`;
    `regional.sinks.table.TableCommittable`: `rows` from `first_row` of the message's
    `file_rows`, its data files' rows in order). Every part of a merged message carries the
    whole message. The fields after `table_path` came later, with defaults: older committables
    still decode."""

    message_version: int  # Java Paimon's CommitMessageSerializer version of `message`
    schema_id: int
    rows: int
    message: bytes
    table_path: str  # the table's location when written (discard skips other tables' files)
    first_row: int = 0
    file_rows: int = -1
    version: int = 1


def _require_pypaimon() -> Any:
    return require("pypaimon", "Paimon", "paimon")


class PaimonSink(TableSink[_Committable]):
    """The Paimon append table `table` ("database.table") in the catalog at `warehouse`.

    With `schema` the database and table are created if missing (`partition_keys` and
    `table_options` apply then); otherwise the table must exist. `catalog_options` are extra
    pypaimon catalog options (e.g. object-store credentials).
    """

    committable = _Committable
    kind = "paimon"
    shipped = ("warehouse", "table_name", "catalog_options")  # no table object, no cache

    def __init__(
        self,
        warehouse: str,
        table: str,
        *,
        schema: pa.Schema | None = None,
        partition_keys: Sequence[str] = (),
        table_options: Mapping[str, str] | None = None,
        catalog_options: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if table.count(".") != 1:
            raise SinkError(f"Paimon table {table!r}: expected 'database.table'")
        self.warehouse = warehouse
        self.table_name = table
        self.catalog_options = {**(catalog_options or {}), "warehouse": warehouse}
        pypaimon = _require_pypaimon()
        if schema is not None:
            catalog = pypaimon.CatalogFactory.create(self.catalog_options)
            catalog.create_database(table.split(".")[0], True)
            paimon_schema = pypaimon.Schema.from_pyarrow_schema(
                schema, partition_keys=list(partition_keys), options=dict(table_options or {})
            )
            catalog.create_table(table, paimon_schema, True)
        self._check_append_table(self._table())

    def _forget(self) -> None:
        super()._forget()
        self._table_object: Any = None
        self._seen_snapshots = 0  # snapshots up to this id are in `_latest`
        self._latest: dict[str, int] = {}  # commit user -> its latest commit identifier

    def __repr__(self) -> str:
        return f"PaimonSink({self.warehouse!r}, {self.table_name!r})"

    # --- the table --------------------------------------------------------------------------

    def _table(self) -> Any:
        if self._table_object is None:
            pypaimon = _require_pypaimon()
            from pypaimon.catalog.catalog_exception import TableNotExistException

            catalog = pypaimon.CatalogFactory.create(self.catalog_options)
            try:
                self._table_object = catalog.get_table(self.table_name)
            except TableNotExistException as exc:
                raise SinkError(
                    f"Paimon table {self.table_name!r} does not exist in warehouse "
                    f"{self.warehouse}: create it, or pass schema= to PaimonSink to create it"
                ) from exc
        return self._table_object

    def _check_append_table(self, table: Any) -> None:
        from pypaimon.table.bucket_mode import BucketMode

        if table.is_primary_key_table or table.bucket_mode() != BucketMode.BUCKET_UNAWARE:
            raise SinkError(
                f"Paimon table {self.table_name!r} in {self.warehouse}: only append tables "
                "without a primary key and with bucket = -1 are supported (PIP-30); it has "
                f"primary keys {table.primary_keys or 'none'}, bucket mode "
                f"{table.bucket_mode().name}"
            )

    # --- regional.sinks.table.TableSink's hooks ------------------------------------------------

    @property
    def describe(self) -> str:
        return f"Paimon table {self.table_name!r}"

    def _other_table(self, committable: _Committable) -> str | None:
        mine = str(self._table().table_path)
        return None if committable.table_path == mine else committable.table_path

    def _schema(self) -> pa.Schema:
        """The table's columns as Arrow (what its writers take)."""
        write = self._table().new_stream_write_builder().new_write()
        try:
            schema: pa.Schema = write.table_pyarrow_schema
        finally:
            write.close()
        return schema

    def _name(self, committable: _Committable) -> str:
        return self._paths(committable)[0].rsplit("/", 1)[-1]

    def _key(self, committable: _Committable) -> str:
        return hashlib.blake2b(committable.message, digest_size=16).hexdigest()

    def _paths(self, committable: _Committable) -> list[str]:
        return self._data_files([self._message(committable)])

    def _kept_name(self, committable: _Committable, keep: Sequence[tuple[int, int]]) -> None:
        """None: a pypaimon writer writes the cut-out (`_rewrite`), which names it."""
        return None

    def _exist(self, paths: Sequence[str]) -> list[bool]:
        file_io = self._table().file_io
        return [bool(file_io.exists(p)) for p in paths]

    def _delete(self, paths: Sequence[str]) -> None:
        file_io = self._table().file_io
        for path in paths:
            file_io.delete_quietly(path)

    def _merges(self) -> bool:
        """A partitioned table's rows go to one message per partition, so there each unit is
        written on its own, as `write` does (its committables are whole messages)."""
        return not self._table().partition_keys

    @property
    def location(self) -> str:
        return f"{self.warehouse} {self.table_name}"

    def _retention(self) -> tuple[str, int | None]:
        """The table's `snapshot.time-retained` if set on it (pypaimon never expires snapshots;
        Java, Spark and Flink writers and procedures do, by this option, default 1 h, keeping at
        least `snapshot.num-retained.min`), else None."""
        text = self._table().table_schema.options.get(_TIME_RETAINED)
        return _TIME_RETAINED, _paimon_duration_ms(text) if text else None

    def _message(self, c: _Committable) -> Any:
        from pypaimon.write.commit_message_serializer import deserialize_commit_message

        table = self._table()
        try:
            return deserialize_commit_message(
                c.message,
                table.partition_keys_fields,
                table.trimmed_primary_keys_fields,
                version=c.message_version,
            )
        except ValueError as exc:
            raise CommitError(
                f"Paimon table {self.table_name!r}: cannot decode a committable written "
                f"with schema {c.schema_id} (message version {c.message_version}): {exc}"
            ) from exc

    def _data_files(self, messages: Iterable[Any]) -> list[str]:
        """Paths of every data file (and sidecar) the commit messages add."""
        from pypaimon.utils.file_store_path_factory import canonical_data_file_path

        table = self._table()
        paths: list[str] = []
        for m in messages:
            for f in [*m.new_files, *m.changelog_files]:
                if not f.physical_path():  # v14 bytes do not carry the path: derive it
                    f.file_path = canonical_data_file_path(
                        table, tuple(m.partition), m.bucket, f.file_name
                    )
                paths += f.collect_files()
        return paths

    # --- writer side (in tasks) -------------------------------------------------------------

    def _stage(self, rows: pa.Table, context: WriteContext) -> list[_Committable]:
        """Write `rows` as Paimon data files; one committable per commit message."""
        table = self._table()
        messages = self._write_messages(
            rows.to_batches(), _data_prefix(context), context.checkpoint_id
        )
        return [
            _Committable(
                _MESSAGE_VERSION,
                table.table_schema.id,
                sum(f.row_count for f in m.new_files),
                self._serialized(m),
                str(table.table_path),
                version=COMMITTABLE_VERSION,
            )
            for m in messages
        ]

    def _write_messages(
        self, batches: Sequence[pa.RecordBatch], prefix: str, identifier: int
    ) -> list[Any]:
        """Write `batches` (fitted to the table's columns) with one pypaimon writer whose data
        file names start with `prefix`; its non-empty commit messages. A failed write deletes
        the files it wrote."""
        from pypaimon.common.options.core_options import CoreOptions

        write = self._table().new_stream_write_builder().new_write()
        write.file_store_write.options.set(CoreOptions.DATA_FILE_PREFIX, prefix)
        try:
            for b in batches:
                write.write_arrow(pa.Table.from_batches([b]))
            messages = write.prepare_commit(identifier)
        except BaseException:
            write.abort()  # delete this attempt's files
            raise
        finally:
            write.close()
        return [m for m in messages if not m.is_empty()]

    def _serialized(self, message: Any) -> bytes:
        from pypaimon.write.commit_message_serializer import serialize_commit_message

        data: bytes = serialize_commit_message(message, self._table().partition_keys_fields)
        return data

    def sync_staged(self) -> None:
        """Nothing is synced here (`regional.sinks.base.SinkWriter.sync_staged`): pypaimon
        writes and closes its data files in `prepare_commit`, durable on close on object
        stores; on a local disk they are not fsynced, so a power loss can lose a staged file
        (its commit then refuses, naming it)."""

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def _publish(
        self,
        commit_user: str,
        identifier: int,
        plan: Sequence[Planned[_Committable]],
        latest: int | None,
        fallback: str,
    ) -> None:
        """Commit the messages of `plan` (a merged one cut out first: `_rewrite`) as one
        snapshot of `commit_user` with `identifier`, recording the checkpoint and the fallback
        units in its properties."""
        messages = [
            m
            for x in plan
            for m in (
                [self._message(x.item)]
                if x.keep is None
                else self._rewrite(self._message(x.item), x.keep, identifier)
            )
        ]
        properties = {CHECKPOINT_PROPERTY: str(identifier), FALLBACK_PROPERTY: fallback}
        builder = self._table().new_stream_write_builder()
        builder.commit_user = commit_user
        commit = builder.new_commit()
        try:
            commit.commit(messages, identifier, snapshot_properties=properties)
        finally:
            commit.close()

    def _rewrite(self, message: Any, keep: Sequence[tuple[int, int]], identifier: int) -> list[Any]:
        """The commit messages of a rewrite of merged `message`'s data files keeping the rows in
        `keep`: written by a pypaimon writer (which computes their statistics), then renamed
        to ``<first file's stem>-k<kept ranges>-<n>.<format>`` (`kept_stem`), so a commit
        retried after a crash writes the same files again. A file with sidecars or an external
        path keeps pypaimon's name: a lost try's file is then deleted by `clean_staged`, which
        it is named for like every file of the job."""
        import pyarrow.parquet as pq

        table = self._table()
        paths = [
            self._data_files([dataclasses.replace(message, new_files=[f])])[0]
            for f in message.new_files
        ]
        if not all(p.endswith(".parquet") for p in paths):
            raise CommitError(
                f"Paimon table {self.table_name!r}: cannot commit checkpoint {identifier}: merged "
                f"data file(s) {', '.join(paths)} must be rewritten without the rows of units "
                "not in the checkpoint, which needs Parquet data files; use file.format = parquet "
                "(the default)"
            )
        tables = []
        for path in paths:
            with table.file_io.new_input_stream(path) as f:
                tables.append(pq.read_table(f))
        rows = take_ranges(pa.concat_tables(tables, promote_options="default"), keep)
        stem = kept_stem(message.new_files[0].file_name.rsplit(".", 1)[0], keep)
        fitted = self._fit(rows.to_batches()).to_batches()
        rewritten = self._write_messages(fitted, f"{stem}-", identifier)
        out = []
        for m in rewritten:
            self._data_files([m])  # their paths
            files: list[Any] = []
            for i, f in enumerate(m.new_files):
                if f.external_path is None and not f.extra_files and f.file_path:
                    name = f"{stem}-{i}.{f.file_name.rsplit('.', 1)[-1]}"
                    target = f"{str(f.file_path).rsplit('/', 1)[0]}/{name}"
                    if table.file_io.exists(target):  # written by a lost try of this commit
                        table.file_io.delete(target)
                    if not table.file_io.rename(str(f.file_path), target):
                        raise CommitError(
                            f"Paimon table {self.table_name!r}: cannot rename rewritten data "
                            f"file {f.file_path} to {target}; nothing was committed; check the "
                            "table directory's permissions"
                        )
                    f = dataclasses.replace(f, file_name=name, file_path=target)
                files.append(f)
            out.append(dataclasses.replace(m, new_files=files))
        return out

    def latest_committed(self, commit_user: str) -> int | None:
        """The highest commit identifier of the table's snapshots by `commit_user`.

        Snapshots are immutable, so those already read are remembered and only newer ones are
        read (a new `PaimonSink`, e.g. after a driver crash, reads them all once).
        """
        manager = self._table().snapshot_manager()
        latest = manager.get_latest_snapshot()
        if latest is not None and latest.id > self._seen_snapshots:
            if self._seen_snapshots == 0:
                snapshots = manager.list_snapshots()
            else:
                snapshots = [
                    s
                    for i in range(self._seen_snapshots + 1, latest.id + 1)
                    if (s := manager.get_snapshot_by_id(i)) is not None
                ]
            for s in snapshots:
                known = self._latest.get(s.commit_user)
                if known is None or s.commit_identifier > known:
                    self._latest[s.commit_user] = s.commit_identifier
            self._seen_snapshots = max([latest.id, *(s.id for s in snapshots)])
        return self._latest.get(commit_user)

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]:
        """Delete the data files job `job_id`'s writers left in lost attempts: named by the job
        (`data-rg~<job>~...`), in a bucket directory of the table, and referenced neither by any
        snapshot the table still has (every snapshot's manifests are read: once per driver
        start) nor by a committable in `keep`; returns their paths
        (`regional.sinks.base.TableStaging`). Other writers' files are never touched."""
        from pypaimon.manifest.manifest_file_manager import ManifestFileManager
        from pypaimon.manifest.manifest_list_manager import ManifestListManager

        table = self._table()
        prefix = _job_prefix(job_id)
        kept = {p.rsplit("/", 1)[-1] for c in self.own(keep) for p in self._paths(c)}
        lists, manifests = ManifestListManager(table), ManifestFileManager(table)
        names = {  # manifests are immutable and shared by snapshots: each is read once
            meta.file_name
            for snapshot in table.snapshot_manager().list_snapshots()
            for meta in lists.read_all(snapshot)
        }
        for name in sorted(names):
            kept.update(e.file.file_name for e in manifests.read(name))
        deleted = []
        for path in self._data_dir_files(str(table.table_path).rstrip("/")):
            name = path.rsplit("/", 1)[-1]
            if name.startswith(prefix) and name not in kept:
                table.file_io.delete_quietly(path)
                deleted.append(path)
        return sorted(deleted)

    def _data_dir_files(self, directory: str) -> list[str]:
        """Files under the table's bucket directories (`bucket-N/`, inside partition
        directories `k=v/`), as paths in the table path's form."""
        out = []
        for info in self._table().file_io.list_status(directory):
            name = str(info.path).rstrip("/").rsplit("/", 1)[-1]
            path = f"{directory}/{name}"
            if info.type == pafs.FileType.Directory and (name.startswith("bucket-") or "=" in name):
                out += self._data_dir_files(path)
            elif info.type == pafs.FileType.File and "/bucket-" in path:
                out.append(path)
        return out

    # --- reading ----------------------------------------------------------------------------

    def read(self) -> pa.Table:
        """Every committed row of the table (pypaimon's own reader)."""
        builder = self._table().new_read_builder()
        return builder.new_read().to_arrow(builder.new_scan().plan().splits())
