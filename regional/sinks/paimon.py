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

Only one process may commit to a table at a time (pypaimon's local rename lock is per process).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa
from pyarrow import fs as pafs

from metadata.model import SinkRetention
from regional.errors import CommitError, SinkError
from regional.sinks.base import WriteContext

__all__ = ["CHECKPOINT_PROPERTY", "FALLBACK_PROPERTY", "PaimonSink"]

#: Snapshot property: the checkpoint id committed by the snapshot (also its commit identifier).
CHECKPOINT_PROPERTY = "regional.checkpoint-id"
#: Snapshot property: JSON object unit -> owner checkpoint of the units that fell back.
FALLBACK_PROPERTY = "regional.fallback-units"

_MESSAGE_VERSION = 14  # Java Paimon's CommitMessageSerializer version of the message bytes
_TIME_RETAINED = "snapshot.time-retained"
_PAIMON_UNITS = {
    "ms": 1,
    "milli": 1,
    "millis": 1,
    "millisecond": 1,
    "milliseconds": 1,
    "s": 1000,
    "sec": 1000,
    "secs": 1000,
    "second": 1000,
    "seconds": 1000,
    "m": 60_000,
    "min": 60_000,
    "minute": 60_000,
    "minutes": 60_000,
    "h": 3_600_000,
    "hour": 3_600_000,
    "hours": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "days": 86_400_000,
}


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def _job_prefix(job_id: str) -> str:
    """How the names of job `job_id`'s data files start: `~` is in no job id, so one job's
    prefix never starts another's.

    >>> _job_prefix("clicks")
    'data-rg~clicks~'
    """
    return f"data-rg~{_UNSAFE.sub('_', job_id)}~"


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
    version: int  # serializer version of `message`
    schema_id: int
    rows: int
    message: bytes
    table_path: str  # the table's location when written (discard skips other tables' files)


def _require_pypaimon() -> Any:
    try:
        import pypaimon
    except ImportError as exc:
        raise SinkError(
            f"the Paimon sink needs the pypaimon package ({exc}): "
            "pip install 'regional-checkpoints[paimon]'"
        ) from exc
    return pypaimon


class PaimonSink:
    """The Paimon append table `table` ("database.table") in the catalog at `warehouse`.

    With `schema` the database and table are created if missing (`partition_keys` and
    `table_options` apply then); otherwise the table must exist. `catalog_options` are extra
    pypaimon catalog options (e.g. object-store credentials).
    """

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
        if table.count(".") != 1:
            raise SinkError(f"Paimon table {table!r}: expected 'database.table'")
        self.warehouse = warehouse
        self.table_name = table
        self.catalog_options = {**(catalog_options or {}), "warehouse": warehouse}
        self._table_object: Any = None
        self._seen_snapshots = 0  # snapshots up to this id are in `_latest`
        self._latest: dict[str, int] = {}  # commit user -> its latest commit identifier
        pypaimon = _require_pypaimon()
        if schema is not None:
            catalog = pypaimon.CatalogFactory.create(self.catalog_options)
            catalog.create_database(table.split(".")[0], True)
            paimon_schema = pypaimon.Schema.from_pyarrow_schema(
                schema, partition_keys=list(partition_keys), options=dict(table_options or {})
            )
            catalog.create_table(table, paimon_schema, True)
        self._check_append_table(self._table())

    def __getstate__(self) -> dict[str, Any]:
        """Ship only the configuration to tasks (no table object, no commit-side cache)."""
        return {
            "warehouse": self.warehouse,
            "table_name": self.table_name,
            "catalog_options": self.catalog_options,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._table_object = None
        self._seen_snapshots = 0
        self._latest = {}

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

    def _fit(self, batch: pa.RecordBatch, schema: pa.Schema) -> pa.Table:
        """`batch` as a table of the table's columns, in its order and types."""
        missing = [n for n in schema.names if n not in batch.schema.names]
        extra = [n for n in batch.schema.names if n not in schema.names]
        if missing or extra:
            raise SinkError(
                f"records for Paimon table {self.table_name!r} do not fit its columns "
                f"{schema.names}: missing {missing or 'none'}, unknown {extra or 'none'}; "
                "map the records to the table's columns before the sink"
            )
        try:
            return pa.Table.from_batches([batch]).select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
            raise SinkError(
                f"records for Paimon table {self.table_name!r} do not convert to its schema "
                f"({schema}): {exc}"
            ) from exc

    def _messages(self, committables: Iterable[bytes]) -> list[Any]:
        from pypaimon.write.commit_message_serializer import deserialize_commit_message

        table = self._table()
        out = []
        for raw in committables:
            c = msgspec.msgpack.decode(raw, type=_Committable)
            try:
                out.append(
                    deserialize_commit_message(
                        c.message,
                        table.partition_keys_fields,
                        table.trimmed_primary_keys_fields,
                        version=c.version,
                    )
                )
            except ValueError as exc:
                raise CommitError(
                    f"Paimon table {self.table_name!r}: cannot decode a committable written "
                    f"with schema {c.schema_id} (message version {c.version}): {exc}"
                ) from exc
        return out

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

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Write `batches` as Paimon data files; one committable per commit message (none if
        there are no rows). Nothing is visible until the driver commits."""
        from pypaimon.write.commit_message_serializer import serialize_commit_message

        batches = [b for b in batches if b.num_rows]
        if not batches:
            return ()
        from pypaimon.common.options.core_options import CoreOptions

        table = self._table()
        write = table.new_stream_write_builder().new_write()
        # our data file names: the job (for `clean_staged`), the run, checkpoint, unit, attempt
        run = _UNSAFE.sub("_", context.run_id)
        write.file_store_write.options.set(
            CoreOptions.DATA_FILE_PREFIX,
            f"{_job_prefix(context.job_id)}{run}-c{context.checkpoint_id}-u{context.unit_id}-"
            f"a{context.attempt}-",
        )
        try:
            schema = write.table_pyarrow_schema
            for b in batches:
                write.write_arrow(self._fit(b, schema))
            messages = write.prepare_commit(context.checkpoint_id)
        except BaseException:
            write.abort()  # delete this attempt's files
            raise
        finally:
            write.close()
        schema_id = table.table_schema.id
        return tuple(
            msgspec.msgpack.encode(
                _Committable(
                    _MESSAGE_VERSION,
                    schema_id,
                    sum(f.row_count for f in m.new_files),
                    serialize_commit_message(m, table.partition_keys_fields),
                    str(table.table_path),
                )
            )
            for m in messages
            if not m.is_empty()
        )

    def sync_staged(self) -> None:
        """Nothing is synced here (`regional.sinks.base.SinkWriter.sync_staged`): pypaimon
        writes and closes its data files in `prepare_commit`, durable on close on object
        stores; on a local disk they are not fsynced, so a power loss can lose a staged file
        (its commit then refuses, naming it)."""

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Commit `committables` as one snapshot of `commit_user` with `identifier`, recording
        the checkpoint and the fallback units (unit -> owner checkpoint) in its properties."""
        latest = self.latest_committed(commit_user)
        if latest is not None and identifier <= latest:
            raise CommitError(
                f"Paimon table {self.table_name!r}: commit {identifier} of user {commit_user!r} "
                f"is not after its latest commit {latest}; commits must be in checkpoint order"
            )
        messages = self._messages(committables)
        if missing := self._missing(self._data_files(messages)):
            raise CommitError(
                f"Paimon table {self.table_name!r}: cannot commit checkpoint {identifier}: data "
                f"file(s) {', '.join(missing[:5])} are missing (were they deleted?); nothing was "
                "committed; restore from a newer checkpoint or restore the files"
            )
        properties = {
            CHECKPOINT_PROPERTY: str(identifier),
            FALLBACK_PROPERTY: json.dumps(
                {str(u): o for u, o in sorted((fallback or {}).items())}, separators=(",", ":")
            ),
        }
        builder = self._table().new_stream_write_builder()
        builder.commit_user = commit_user
        commit = builder.new_commit()
        try:
            commit.commit(messages, identifier, snapshot_properties=properties)
        finally:
            commit.close()

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

    def _missing(self, paths: Sequence[str]) -> list[str]:
        file_io = self._table().file_io
        return [p for p in paths if not file_io.exists(p)]

    def data_files(self, committables: Iterable[bytes]) -> list[str]:
        """Paths of the data files behind `committables`."""
        return self._data_files(self._messages(committables))

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        return self._missing(self.data_files(committables))

    def _own(self, committables: Iterable[bytes]) -> list[bytes]:
        """The committables of this table (other sinks' and tables' are skipped)."""
        table_path = str(self._table().table_path)
        own = []
        for raw in committables:
            try:
                c = msgspec.msgpack.decode(raw, type=_Committable)
            except msgspec.DecodeError:  # another sink's format
                continue
            if c.table_path == table_path:
                own.append(raw)
        return own

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete the files of a declined or aborted attempt (already gone is fine).

        Committables of other sinks (the runtime may hand a unit's committables to every sink)
        are skipped.
        """
        table = self._table()
        for path in self.data_files(self._own(committables)):
            table.file_io.delete_quietly(path)

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
        kept = {p.rsplit("/", 1)[-1] for p in self.data_files(self._own(keep))}
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

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return sum(msgspec.msgpack.decode(c, type=_Committable).rows for c in committables)

    def marker_retention(self) -> SinkRetention:
        """How long the table keeps snapshots (`regional.sinks.base.TableRetention`): its
        `snapshot.time-retained` if set on the table (pypaimon never expires snapshots; Java,
        Spark and Flink writers and procedures do, by this option, default 1 h, keeping at
        least `snapshot.num-retained.min`), else None."""
        options = self._table().table_schema.options
        text = options.get(_TIME_RETAINED)
        return SinkRetention(
            "",
            "paimon",
            f"{self.warehouse} {self.table_name}",
            _TIME_RETAINED,
            _paimon_duration_ms(text) if text else None,
        )

    # --- reading ----------------------------------------------------------------------------

    def read(self) -> pa.Table:
        """Every committed row of the table (pypaimon's own reader)."""
        builder = self._table().new_read_builder()
        return builder.new_read().to_arrow(builder.new_scan().plan().splits())
