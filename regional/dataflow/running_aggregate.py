"""The running keyed aggregate: ``key_by(k).aggregate(count())`` keeps per key one accumulator
over every record of the key so far and emits, per epoch, the new value of every key that had
records in it (DESIGN §4 rule 21).

* **State.** The accumulator is keyed state (slot entry ``"a"``): per (input split, key) on a
  forward chain, per key after a keyed exchange, so it falls back, restores and moves on
  rescale like any keyed state.
* **Rows.** At the end of an epoch, one row per key with records in the epoch (also when its
  value did not change: a `max_of` that saw smaller values), ``emit(key, value)``, by default
  ``{"key": key, "value": value}``, ordered by the key's msgpack encoding, not by arrival
  (which changes when a unit falls back).
* **No event time.** Every record counts; none is late, and the operator needs no watermark.
* **Columns.** With a built-in aggregate (`count`, `sum_of`, `min_of`, `max_of`,
  `mean_of`) and a field key (``key_by("user")``), an Arrow batch is folded with one group-by
  (`regional.dataflow.columnar_aggregates`), with the values of the record-wise path, which
  every other case takes (a user `Aggregate`, a key function, a batch the columns cannot
  fold). With dead letters, a record whose key or `add` raises is a dead letter; without, the
  unit declines.

>>> from regional.dataflow.keys import FieldKey
>>> from regional.dataflow.state import OperatorState
>>> from regional.dataflow.windows import sum_of
>>> op = RunningAggregate(sum_of("n"), FieldKey("user"), name="totals")
>>> state = OperatorState()
>>> op.run([("s0", [{"user": "bo", "n": 2}, {"user": "al", "n": 1}])], None, state, None, None)
([('s0', [{'key': 'al', 'value': 1}, {'key': 'bo', 'value': 2}])], None)
>>> op.run([("s0", [{"user": "bo", "n": 5}])], None, state, None, None)
([('s0', [{'key': 'bo', 'value': 7}])], None)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from regional.dataflow.building import Build, Keyed
from regional.dataflow.columnar_aggregates import (
    MISSING,
    can_fold,
    columnar,
    fold,
    fold_all,
    value_columns,
)
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.keys import FieldKey, key_columns
from regional.dataflow.operators import Chunk, Operator, records_of
from regional.dataflow.state import OperatorState
from regional.dataflow.stream_schemas import KeyColumnsRow, as_schema_rows, running_schema
from regional.dataflow.windows import Aggregate, combine
from regional.errors import GraphError

__all__ = ["RunningAggregate", "build_aggregate", "default_emit"]

_RUNNING = "a"  # slot entry: the key's accumulator
_ENCODE = msgspec.msgpack.Encoder()


def default_emit(key: Any, value: Any) -> dict[str, Any]:
    """The default row of a running aggregate: ``{key, value}``."""
    return {"key": key, "value": value}


class _Scope:
    """One state scope's epoch: the split its rows carry, their origin watermark (the lowest
    of its chunks') and the slots of the keys that had records, by key."""

    def __init__(self, split: str, origin: int) -> None:
        self.split = split
        self.origin = origin
        self.changed: dict[Any, dict[Any, Any]] = {}


class RunningAggregate(Operator):
    """Per key, `aggregate` over every record so far; per epoch a row per key that had
    records (see the module)."""

    kind = "aggregate"
    stateful = True

    def __init__(
        self,
        aggregate: Aggregate,
        key: Callable[[Any], Any],
        *,
        emit: Callable[[Any, Any], Any] | None = None,
        name: str = "",
        scope: str = "split",
        schema: pa.Schema | None = None,
    ) -> None:
        super().__init__(name=name, scope=scope)
        #: the rows' schema when keyed by columns of a stream with one (rows are then a batch)
        self.output_schema = schema
        self.aggregate = aggregate
        self.key = key
        self.emit = emit or default_emit
        columns = key_columns(key)
        #: the key column (or the key's columns, a tuple) when batches may be folded over
        #: Arrow columns (else None)
        self.key_column: str | tuple[str, ...] | None = None
        if columns is not None and columnar(aggregate):
            self.key_column = columns[0] if isinstance(key, FieldKey) else columns

    def user_functions(self) -> tuple[Any, ...]:
        return (self.key, self.aggregate, self.emit)

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        assert state is not None
        scopes: dict[str, _Scope] = {}
        seen: dict[str, int] = {}
        for n, (split, data) in enumerate(chunks):
            name = self.scope_of(split)
            origin = origins[n] if origins is not None else 0
            scope = scopes.get(name)
            if scope is None:  # after an exchange, rows carry the split the unit reads
                key_split = time.key_split if time is not None else ""
                out_split = key_split if self.scope == "key" and key_split else split
                scope = scopes[name] = _Scope(out_split, origin)
            scope.origin = min(scope.origin, origin)
            slots = state.keyed.setdefault(name, {})
            base = seen.get(split, 0)
            if (
                self.key_column is not None
                and isinstance(data, pa.RecordBatch)
                and can_fold(self.aggregate, data, self.key_column)
            ):
                self._fold(data, slots, scope, state)
                seen[split] = base + data.num_rows
                continue
            rows = records_of(data)
            seen[split] = base + len(rows)
            self._add(rows, split, base, slots, scope, state, dead_letters)
        out: list[Chunk] = []
        out_origins: list[int] | None = [] if origins is not None else None
        for name, scope in scopes.items():
            if not state.keyed.get(name):
                state.keyed.pop(name, None)
            if not scope.changed:
                continue
            result, emit = self.aggregate.result, self.emit
            ordered = sorted(scope.changed.items(), key=lambda item: _ENCODE.encode(item[0]))
            rows = [emit(k, result(slot[_RUNNING])) for k, slot in ordered]
            out.append((scope.split, as_schema_rows(rows, self.output_schema)))
            if out_origins is not None:
                out_origins.append(scope.origin)
        return out, out_origins

    def _add(
        self,
        rows: list[Any],
        split: str,
        base: int,
        slots: dict[Any, Any],
        scope: _Scope,
        state: OperatorState,
        dead_letters: DeadLetters | None,
    ) -> None:
        """Add records one by one (`Aggregate.add`)."""
        agg, key_of = self.aggregate, self.key
        for i, record in enumerate(rows):
            try:
                key = key_of(record)
                slot = slots.get(key)
                acc = agg.add(agg.init() if slot is None else slot[_RUNNING], record)
                if slot is None:
                    state.codec.check(key, what=f"the key of split {split!r}", operator=self.name)
                    slot = slots[key] = {}
            except Exception as exc:
                if dead_letters is None:
                    raise
                dead_letters.add(self.name, split, base + i, record, exc)
                continue
            slot[_RUNNING] = acc
            scope.changed[key] = slot

    def _fold(
        self, batch: pa.RecordBatch, slots: dict[Any, Any], scope: _Scope, state: OperatorState
    ) -> None:
        """Add a foldable batch with one Arrow group-by (`columnar_aggregates.fold`)."""
        assert self.key_column is not None

        def current(key: Any, _start: int | None) -> Any:
            slot = slots.get(key)
            return MISSING if slot is None else slot[_RUNNING]

        column = self.key_column
        keys = (
            batch.column(column)
            if isinstance(column, str)
            else tuple(batch.column(c) for c in column)
        )
        values = value_columns(self.aggregate, batch)
        agg = self.aggregate
        groups = (
            fold_all(agg, keys, values, None, current)
            if agg.parts
            else fold(agg, keys, values[0], None, current)
        )
        for key, _, acc in groups:
            slot = slots.get(key)
            if slot is None:
                state.codec.check(key, what="the key of a running aggregate", operator=self.name)
                slot = slots[key] = {}
            slot[_RUNNING] = acc
            scope.changed[key] = slot


def build_aggregate(
    graph: Build,
    keyed: Keyed,
    agg: Aggregate | Sequence[Aggregate],
    *,
    emit: Callable[[Any, Any], Any] | None,
    name: str | None,
) -> str:
    """Add a running aggregate of `keyed` (`KeyedStream.aggregate` says what it does); its
    vertex id. `GraphError` naming the operator when `agg` is no aggregate (or a list of
    aggregates, `regional.dataflow.windows.combine`)."""
    if isinstance(agg, list | tuple) and not isinstance(agg, Aggregate):
        agg = combine(agg, f"aggregate {name or '(unnamed)'!r}")
    if not isinstance(agg, Aggregate):
        called = " (call it: count(), not count)" if callable(agg) else ""
        raise GraphError(
            f"aggregate {name or '(unnamed)'!r}: agg={agg!r} is no aggregate{called}; give "
            "count(), sum_of('field'), min_of('field'), max_of('field'), mean_of('field') "
            "or an Aggregate(init, add, merge, result)"
        )
    scope = graph.key_scope(keyed.vertex_id, keyed.key, name)
    schema, keys = graph.schema_of(keyed.vertex_id), key_columns(keyed.key)
    out = None
    if emit is None and schema is not None and keys is not None:
        out = running_schema(schema, keys, agg, f"aggregate {name or '(unnamed)'!r}")
        if out is not None:
            emit = KeyColumnsRow(keys, None if agg.parts else agg.output_column)
    op = RunningAggregate(agg, keyed.key, emit=emit, scope=scope, schema=out)
    return graph.add(op, name, (keyed.vertex_id,))
