"""The lookup join (DESIGN §4 rule 20): enrich each record from a lakehouse table read at its
latest committed version, refreshed at an interval (`Stream.lookup_join`).

The table (`ParquetTable`: the committed rows of a table our `ParquetSink` writes; `DeltaTable`:
a Delta table, with the `regional[delta]` extra) is read whole into a dict from its key column
to its row, once per Python worker and `refresh` interval of processing time, and shared by
every unit and epoch the worker runs meanwhile. Which version a record meets depends on when
its epoch ran, so a lookup join is outside the determinism rule of event time: a unit that falls
back and runs its epoch again may meet a newer version. For joins that must give the same rows
whatever fell back, join a changelog with `temporal_join`.

>>> import pyarrow as pa
>>> index = index_rows(pa.table({"user": ["u1", "u2"], "tier": ["gold", "silver"]}), "user",
...                    table="profiles")
>>> index["u2"]
{'user': 'u2', 'tier': 'silver'}
"""

from __future__ import annotations

import threading
import time as clock
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import pyarrow as pa

from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.operators import Chunk, RecordOperator
from regional.dataflow.state import OperatorState
from regional.errors import RegionalError

__all__ = [
    "DeltaTable",
    "LookupJoin",
    "LookupTable",
    "LookupTableError",
    "ParquetTable",
    "default_emit",
    "index_rows",
]


class LookupTableError(RegionalError):
    """The lookup table cannot be read or indexed (missing, no such key column, a key twice):
    names the table, the column and the fix."""


class LookupTable(Protocol):
    """A table a lookup join reads whole: `describe()` names it in errors, `read()` returns its
    latest committed rows."""

    def describe(self) -> str: ...

    def read(self) -> pa.Table: ...


class ParquetTable:
    """The committed rows of a table written by `ParquetSink(path)` (`read_table`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> str:
        return f"parquet table {self.path}"

    def read(self) -> pa.Table:
        from regional.sinks.parquet import read_table

        return read_table(self.path)


class DeltaTable:
    """The latest version of the Delta table at `path` (`pip install regional[delta]`)."""

    def __init__(self, path: str) -> None:
        self.path = path

    def describe(self) -> str:
        return f"delta table {self.path}"

    def read(self) -> pa.Table:
        try:
            from deltalake import DeltaTable as Delta
        except ImportError:
            raise LookupTableError(
                f"{self.describe()}: reading it needs deltalake; pip install 'regional[delta]'"
            ) from None
        return Delta(self.path).to_pyarrow_table()


def index_rows(rows: pa.Table, key: str, *, table: str) -> dict[Any, dict[str, Any]]:
    """The rows of `rows` by their `key` column; `LookupTableError` when the column is missing or
    a key appears twice (a lookup needs one row per key)."""
    if key not in rows.column_names:
        raise LookupTableError(
            f"{table} has no column {key!r} (its columns: "
            f"{', '.join(rows.column_names) or 'none'}); give lookup_join(key=...) a column of "
            "the table"
        )
    out: dict[Any, dict[str, Any]] = {}
    for row in rows.to_pylist():
        k = row[key]
        if k in out:
            raise LookupTableError(
                f"{table}: key {k!r} of column {key!r} is in more than one row; a lookup table "
                "needs one row per key (deduplicate the table, or look up by a unique column)"
            )
        out[k] = row
    return out


def default_emit(record: Any, row: Any) -> dict[str, Any]:
    """The default joined row: ``{"record": record, "row": row}`` (None: no row for the key)."""
    return {"record": record, "row": row}


#: Per (table, key column): when this worker read it (processing time), and its rows by key.
_CACHE: dict[tuple[str, str], tuple[float, dict[Any, dict[str, Any]]]] = {}
_CACHE_LOCK = threading.Lock()


class LookupJoin(RecordOperator):
    """Look each record's key (`on`: a field name or a function of a record) up in `table`
    (indexed by its column `key`); ``how="inner"`` drops a record without a row, ``"left"``
    emits it with None. `now` gives processing time in seconds (tests inject a clock)."""

    kind = "lookup_join"

    def __init__(
        self,
        table: LookupTable,
        *,
        key: str,
        on: Callable[[Any], Any],
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
        refresh_s: float = 60.0,
        now: Callable[[], float] = clock.monotonic,
        name: str = "",
    ) -> None:
        super().__init__(on, name=name)
        self.table = table
        self.key = key
        self.how = how
        self.emit = emit or default_emit
        self.refresh_s = refresh_s
        self.now = now

    def user_functions(self) -> tuple[Any, ...]:
        return (self.fn, self.emit)

    def index(self) -> dict[Any, dict[str, Any]]:
        """The table's rows by key, read again once `refresh_s` passed since the last read."""
        cache_key = (self.table.describe(), self.key)
        now = self.now()
        with _CACHE_LOCK:
            cached = _CACHE.get(cache_key)
            if cached is not None and now - cached[0] < self.refresh_s:
                return cached[1]
            try:
                rows = self.table.read()
            except LookupTableError:
                raise
            except Exception as exc:
                raise LookupTableError(
                    f"lookup join {self.name!r}: cannot read {self.table.describe()} "
                    f"({type(exc).__name__}: {exc}); check that it exists and has committed "
                    "data"
                ) from exc
            index = index_rows(rows, self.key, table=self.table.describe())
            _CACHE[cache_key] = (now, index)
            return index

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        self._rows = self.index()  # one version for the whole epoch of this unit
        return super().run(chunks, origins, state, dead_letters, time)

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        row = self._rows.get(self.fn(record))
        if row is None and self.how == "inner":
            return []
        return [self.emit(record, row)]
