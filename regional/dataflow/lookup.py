"""The lookup join (DESIGN §4 rule 20): enrich each record from a lakehouse table read at its
latest committed version, refreshed at an interval (`Stream.lookup_join`).

The table is one of

* `ParquetTable(path)`: the committed rows of a table our `ParquetSink` writes (its version:
  each writer's latest commit);
* `DeltaTable(path)`: a Delta table (its version number; ``pip install
  'regional-checkpoints[delta]'``);
* `IcebergTable(warehouse, table)`: an Iceberg table, through the same catalog an
  `IcebergSink(warehouse, table)` uses (its current snapshot; ``[iceberg]``).

It is read (only the key column and `columns`, when given) into a dict from its key column to
its row, once per Python worker and `refresh` interval of processing time, and shared by every
unit and epoch the worker runs meanwhile; each unit's epoch meets one version. Which version a
record meets depends on when its epoch ran, so a lookup join is outside the determinism rule of
event time: a unit that falls back and runs its epoch again may meet a newer version. For joins
that must give the same rows whatever fell back, join a changelog with `temporal_join`.

>>> import pyarrow as pa
>>> index = index_rows(pa.table({"user": ["u1", "u2"], "tier": ["gold", "silver"]}), "user",
...                    table="profiles")
>>> index["u2"]
{'user': 'u2', 'tier': 'silver'}
"""

from __future__ import annotations

import importlib
import logging
import os
import threading
import time as clock
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa

from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.operators import Chunk, RecordOperator
from regional.dataflow.state import OperatorState
from regional.errors import RegionalError

__all__ = [
    "DeltaTable",
    "IcebergTable",
    "LookupJoin",
    "LookupTable",
    "LookupTableError",
    "ParquetTable",
    "TableRead",
    "default_emit",
    "index_rows",
]

log = logging.getLogger(__name__)


class LookupTableError(RegionalError):
    """The lookup table cannot be read or indexed (missing, no such column, a key twice):
    names the table, its version, the column and the fix."""


@dataclass(frozen=True)
class TableRead:
    """One read of a lookup table: its rows and the version they are, as its format names it
    (``"version 3"``, ``"snapshot 81…"``, ``"commit 7 of clicks-…-out"``)."""

    rows: pa.Table
    version: str


class LookupTable(Protocol):
    """A table a lookup join reads whole: `describe()` names it in errors, `read(columns)`
    returns its latest committed rows (only `columns` when not None) and their version."""

    def describe(self) -> str: ...

    def read(self, columns: Sequence[str] | None) -> TableRead: ...


def _missing(table: str, have: Sequence[str], columns: Sequence[str] | None) -> None:
    """`LookupTableError` naming the first of `columns` the table (with columns `have`) lacks."""
    for column in columns or ():
        if column not in have:
            raise LookupTableError(
                f"{table} has no column {column!r} (its columns: {', '.join(have) or 'none'}); "
                "give lookup_join key= and columns= columns of the table"
            )


def _package(name: str, table: str, extra: str) -> Any:
    """The optional package `name` reading `table` needs, or an error naming the extra."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise LookupTableError(
            f"{table}: reading it needs the {name.split('.')[0]} package ({exc}); "
            f"pip install 'regional-checkpoints[{extra}]'"
        ) from None


class ParquetTable:
    """The committed rows of a table written by `ParquetSink(path)` (`read_committed`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> str:
        return f"parquet table {self.path}"

    def read(self, columns: Sequence[str] | None) -> TableRead:
        import pyarrow.parquet as pq

        from regional.sinks.parquet import committed_files, read_committed

        try:
            rows, latest = read_committed(self.path, columns=columns)
        except pa.ArrowInvalid:  # a column not in the files: say which, with the files' columns
            _missing(self.describe(), pq.read_schema(committed_files(self.path)[0]).names, columns)
            raise
        if not latest:
            raise LookupTableError(
                f"{self.describe()} has no commit (nothing under {self.path}/_commits): check "
                "the path, or run the job whose ParquetSink writes it first"
            )
        version = ", ".join(f"commit {i} of {user}" for user, i in latest.items())
        return TableRead(rows, version)


class DeltaTable:
    """The latest version of the Delta table at `path` (``regional-checkpoints[delta]``)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> str:
        return f"delta table {self.path}"

    def read(self, columns: Sequence[str] | None) -> TableRead:
        deltalake = _package("deltalake", self.describe(), "delta")
        try:
            table = deltalake.DeltaTable(self.path)
        except deltalake.exceptions.TableNotFoundError as exc:
            first = str(exc).splitlines()[0]
            raise LookupTableError(
                f"{self.describe()} does not exist ({first}); check the path, or run the job "
                "that writes it first"
            ) from None
        version = f"version {table.version()}"
        _missing(f"{self.describe()} ({version})", [f.name for f in table.schema().fields], columns)
        names = None if columns is None else list(columns)
        return TableRead(table.to_pyarrow_table(columns=names), version)


class IcebergTable:
    """The current snapshot of the Iceberg table `table` ("namespace.table") in the catalog an
    `IcebergSink(warehouse, table, catalog_properties=...)` with the same arguments uses: by
    default the SQLite catalog ``<warehouse>/catalog.db`` (``regional-checkpoints[iceberg]``)."""

    def __init__(
        self,
        warehouse: str,
        table: str,
        *,
        catalog_properties: dict[str, str] | None = None,
        catalog_name: str = "regional",
    ) -> None:
        from regional.sinks.iceberg import catalog_of

        self.table = table
        self.catalog_name = catalog_name
        self.catalog_properties = catalog_of(warehouse, table, catalog_properties)
        self.default_catalog = catalog_properties is None

    def describe(self) -> str:
        return f"iceberg table {self.table} (warehouse {self.catalog_properties['warehouse']})"

    def read(self, columns: Sequence[str] | None) -> TableRead:
        catalogs = _package("pyiceberg.catalog", self.describe(), "iceberg")
        exceptions = _package("pyiceberg.exceptions", self.describe(), "iceberg")
        database = self.catalog_properties["uri"].removeprefix("sqlite:///")
        if self.default_catalog and not os.path.isfile(database):
            raise LookupTableError(
                f"{self.describe()}: there is no catalog {database}; check the warehouse, or "
                "run the job whose IcebergSink writes the table first"
            )
        catalog = catalogs.load_catalog(self.catalog_name, **self.catalog_properties)
        try:
            table = catalog.load_table(self.table)
        except (exceptions.NoSuchTableError, exceptions.NoSuchNamespaceError):
            raise LookupTableError(
                f"{self.describe()} is not in its catalog; check the table name, or create it "
                "(IcebergSink(..., schema=...) does)"
            ) from None
        snapshot = table.current_snapshot()
        version = "no snapshot" if snapshot is None else f"snapshot {snapshot.snapshot_id}"
        _missing(f"{self.describe()} ({version})", table.schema().column_names, columns)
        fields = ("*",) if columns is None else tuple(columns)
        return TableRead(table.scan(selected_fields=fields).to_arrow(), version)


def index_rows(rows: pa.Table, key: str, *, table: str) -> dict[Any, dict[str, Any]]:
    """The rows of `rows` by their `key` column (a row whose key is null matches nothing);
    `LookupTableError` naming `table` when the column is missing or a key is in several rows
    (a lookup needs one row per key)."""
    _missing(table, rows.column_names, [key])
    out: dict[Any, dict[str, Any]] = {}
    listed = rows.to_pylist()
    for row in listed:
        k = row[key]
        if k is None:
            continue
        if k in out:
            count = sum(1 for r in listed if r[key] == k)
            raise LookupTableError(
                f"{table}: key {k!r} of column {key!r} is in {count} rows; a lookup table "
                "needs one row per key (deduplicate the table, or look up by a unique column)"
            )
        out[k] = row
    return out


def default_emit(record: Any, row: Any) -> dict[str, Any]:
    """The default joined row: ``{"record": record, "row": row}`` (None: no row for the key)."""
    return {"record": record, "row": row}


#: Per (table, key column, columns): when this worker read it (processing time), the version
#: and its rows by key.
_CACHE: dict[tuple[str, str, tuple[str, ...] | None], tuple[float, str, dict[Any, Any]]] = {}
_CACHE_LOCK = threading.Lock()


class LookupJoin(RecordOperator):
    """Look each record's key (`on`: a function of a record) up in `table` (indexed by its
    column `key`; only `key` and `columns` read when `columns` is given); ``how="inner"`` drops
    a record without a row, ``"left"`` emits it with None. `now` gives processing time in
    seconds (tests inject a clock); the table is read again once `refresh_s` passed."""

    kind = "lookup_join"
    one_pass = True  # a pass of units meets one version of the table

    def __init__(
        self,
        table: LookupTable,
        *,
        key: str,
        on: Callable[[Any], Any],
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
        columns: Sequence[str] | None = None,
        refresh_s: float = 60.0,
        now: Callable[[], float] = clock.monotonic,
        name: str = "",
    ) -> None:
        super().__init__(on, name=name)
        self.table = table
        self.key = key
        self.how = how
        self.emit = emit or default_emit
        self.columns = None if columns is None else (key, *(c for c in columns if c != key))
        self.refresh_s = refresh_s
        self.now = now
        self.version = ""  # of the table the last epoch met (in this worker)

    def user_functions(self) -> tuple[Any, ...]:
        return (self.fn, self.emit)

    def index(self) -> tuple[str, dict[Any, dict[str, Any]]]:
        """The table's version and rows by key, read again once `refresh_s` passed since this
        worker last read it."""
        cache_key = (self.table.describe(), self.key, self.columns)
        now = self.now()
        with _CACHE_LOCK:
            cached = _CACHE.get(cache_key)
            if cached is not None and now - cached[0] < self.refresh_s:
                return cached[1], cached[2]
            try:
                read = self.table.read(self.columns)
            except LookupTableError:
                raise
            except Exception as exc:
                raise LookupTableError(
                    f"lookup join {self.name!r}: cannot read {self.table.describe()} "
                    f"({type(exc).__name__}: {exc}); check that it exists and has committed "
                    "data"
                ) from exc
            index = index_rows(
                read.rows, self.key, table=f"{self.table.describe()} ({read.version})"
            )
            log.info(
                "lookup join %r read %s at %s: %d keys",
                self.name,
                self.table.describe(),
                read.version,
                len(index),
            )
            _CACHE[cache_key] = (now, read.version, index)
            return read.version, index

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        self.version, self._rows = self.index()  # one version for the whole epoch of this unit
        return super().run(chunks, origins, state, dead_letters, time)

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        row = self._rows.get(self.fn(record))
        if row is None and self.how == "inner":
            return []
        return [self.emit(record, row)]
