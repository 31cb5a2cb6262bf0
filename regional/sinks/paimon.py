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
"""

from __future__ import annotations

import dataclasses
import hashlib
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
from regional.sinks.merging import (
    DiscardedParts,
    FilePart,
    commit_plan,
    kept_stem,
    merged_table,
    take_ranges,
)

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
    """One Paimon commit message, or one unit's part of a merged one (`write_merged`): `rows`
    from `first_row` of the message's `file_rows` (its data files' rows, in order; -1: the
    committable is the whole message). The part fields come last, with defaults, so
    committables of older versions still decode; every part of a merged message carries the
    whole message."""

    version: int  # serializer version of `message`
    schema_id: int
    rows: int
    message: bytes
    table_path: str  # the table's location when written (discard skips other tables' files)
    first_row: int = 0
    file_rows: int = -1

    @property
    def part(self) -> FilePart | None:
        """Its part of a merged message, or None when it is a whole message."""
        return None if self.file_rows < 0 else FilePart(self.first_row, self.rows, self.file_rows)


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
        self._discarded = DiscardedParts()  # parts of merged messages discarded so far
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
        self._discarded = DiscardedParts()

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
        """The commit messages behind `committables`, decoded (a merged message once)."""
        return [self._message(c) for c in self._unique(self._items(committables))]

    @staticmethod
    def _items(committables: Iterable[bytes]) -> list[_Committable]:
        return [msgspec.msgpack.decode(raw, type=_Committable) for raw in committables]

    @staticmethod
    def _unique(items: Iterable[_Committable]) -> list[_Committable]:
        """`items` without the further parts of a merged message (its first part stands for
        it)."""
        seen: set[bytes] = set()
        out = []
        for c in items:
            if c.part is not None:
                if c.message in seen:
                    continue
                seen.add(c.message)
            out.append(c)
        return out

    def _message(self, c: _Committable) -> Any:
        from pypaimon.write.commit_message_serializer import deserialize_commit_message

        table = self._table()
        try:
            return deserialize_commit_message(
                c.message,
                table.partition_keys_fields,
                table.trimmed_primary_keys_fields,
                version=c.version,
            )
        except ValueError as exc:
            raise CommitError(
                f"Paimon table {self.table_name!r}: cannot decode a committable written "
                f"with schema {c.schema_id} (message version {c.version}): {exc}"
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

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Write `batches` as Paimon data files; one committable per commit message (none if
        there are no rows). Nothing is visible until the driver commits."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return ()
        table = self._table()
        messages = self._write_messages(
            batches, _data_prefix(context), context.checkpoint_id, fit=True
        )
        return tuple(
            msgspec.msgpack.encode(
                _Committable(
                    _MESSAGE_VERSION,
                    table.table_schema.id,
                    sum(f.row_count for f in m.new_files),
                    self._serialized(m),
                    str(table.table_path),
                )
            )
            for m in messages
        )

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Write the rows of every part (the units of one task and epoch) as one Paimon commit
        message (one data file, more only when the rows exceed the table's target file size),
        its files named after the first part; per part, its committable naming its rows of the
        message (none for a part without rows; `regional.sinks.base.MergingWriter`). The
        commit commits the message whole, or a rewrite of it without the rows of parts it does
        not hold.

        A partitioned table's rows go to one message per partition, so there each part is
        written on its own, as `write` does (its committables are whole messages)."""
        if not parts:
            return []
        table = self._table()
        if table.partition_keys:
            return [self.write(batches, context) for context, batches in parts]
        schema = self._arrow_schema()
        fitted = [
            [self._fit(b, schema).replace_schema_metadata(None) for b in batches if b.num_rows]
            for _, batches in parts
        ]
        merged, places = merged_table([[b for t in f for b in t.to_batches()] for f in fitted])
        if merged is None:
            return [() for _ in parts]
        first = parts[0][0]
        messages = self._write_messages(
            merged.to_batches(), _data_prefix(first), first.checkpoint_id, fit=False
        )
        if len(messages) != 1 or sum(f.row_count for f in messages[0].new_files) != len(merged):
            for m in messages:  # one bucket of an unpartitioned append table: never so
                for path in self._data_files([m]):
                    table.file_io.delete_quietly(path)
            raise SinkError(
                f"Paimon table {self.table_name!r}: the merged rows of {len(parts)} units "
                f"({len(merged)} rows) were written as {len(messages)} commit messages, not as "
                "one; only unpartitioned append tables with bucket = -1 are supported"
            )
        message = self._serialized(messages[0])
        return [
            ()
            if p is None
            else (
                msgspec.msgpack.encode(
                    _Committable(
                        _MESSAGE_VERSION,
                        table.table_schema.id,
                        p.rows,
                        message,
                        str(table.table_path),
                        p.first_row,
                        p.file_rows,
                    )
                ),
            )
            for p in places
        ]

    def _arrow_schema(self) -> pa.Schema:
        """The table's columns as Arrow (what its writers take)."""
        write = self._table().new_stream_write_builder().new_write()
        try:
            schema: pa.Schema = write.table_pyarrow_schema
        finally:
            write.close()
        return schema

    def _write_messages(
        self, batches: Sequence[pa.RecordBatch], prefix: str, identifier: int, *, fit: bool
    ) -> list[Any]:
        """Write `batches` (fitted to the table's columns first when `fit`) with one pypaimon
        writer whose data file names start with `prefix`; its non-empty commit messages. A
        failed write deletes the files it wrote."""
        from pypaimon.common.options.core_options import CoreOptions

        write = self._table().new_stream_write_builder().new_write()
        write.file_store_write.options.set(CoreOptions.DATA_FILE_PREFIX, prefix)
        try:
            schema = write.table_pyarrow_schema
            for b in batches:
                write.write_arrow(self._fit(b, schema) if fit else pa.Table.from_batches([b]))
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
        planned = [(self._message(c), keep) for c, keep in self._plan(self._items(committables))]
        if missing := self._missing(self._data_files(m for m, _ in planned)):
            raise CommitError(
                f"Paimon table {self.table_name!r}: cannot commit checkpoint {identifier}: data "
                f"file(s) {', '.join(missing[:5])} are missing (were they deleted?); nothing was "
                "committed; restore from a newer checkpoint or restore the files"
            )
        messages = [
            rewritten
            for m, keep in planned
            for rewritten in ([m] if keep is None else self._rewrite(m, keep, identifier))
        ]
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
        file_io = self._table().file_io
        for path in self._data_files(m for m, keep in planned if keep is not None):
            file_io.delete_quietly(path)  # merged files rewritten without other units' rows

    def _plan(
        self, items: Sequence[_Committable]
    ) -> list[tuple[_Committable, tuple[tuple[int, int], ...] | None]]:
        """The commit messages a commit of `items` commits, in order: a whole message each, and
        one per merged message (its first part): whole (None) when the commit holds every part
        of it, else with the ranges of its rows to keep (`regional.sinks.merging.kept_ranges`),
        for `_rewrite`."""

        def describe(c: _Committable) -> str:
            name = self._data_files([self._message(c)])[0].rsplit("/", 1)[-1]
            return f"Paimon table {self.table_name!r}: {name}"

        return commit_plan(
            items, part=lambda c: c.part, file=lambda c: c.message, describe=describe
        )

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
        rewritten = self._write_messages(rows.to_batches(), f"{stem}-", identifier, fit=True)
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

    def _missing(self, paths: Sequence[str]) -> list[str]:
        file_io = self._table().file_io
        return [p for p in paths if not file_io.exists(p)]

    def data_files(self, committables: Iterable[bytes]) -> list[str]:
        """Paths of the data files behind `committables` (a merged message's once)."""
        return self._data_files(self._messages(committables))

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The data files behind `committables` that are gone."""
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
        """Delete the files of a declined or aborted attempt (already gone is fine). A merged
        message's files are deleted once all of its parts were discarded through this sink
        object (the other units' rows in them may still commit).

        Committables of other sinks (the runtime may hand a unit's committables to every sink)
        are skipped.
        """
        table = self._table()
        gone = []
        for raw in self._own(committables):
            c = msgspec.msgpack.decode(raw, type=_Committable)
            key = hashlib.blake2b(c.message, digest_size=16).hexdigest()
            if (part := c.part) is not None and not self._discarded.add(key, part):
                continue
            gone.append(raw)
        for path in self.data_files(gone):
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
