"""Schemas through the plan: what each stateful operator on columns produces, and the checks
that refuse a pipeline whose columns do not line up, when it is built. Pure.

A stream carries a schema once its source declares one (`regional.dataflow.schema`); the
expression stages compute theirs. The rest follow from their input's (DESIGN §4 rule 24):

* ``key_by`` / a keyed exchange / ``drop_duplicates``: the input's schema;
* a windowed aggregate keyed by columns (`window_schema`): the key columns, ``window_start``,
  ``window_end`` (``timestamp[us, UTC]``) and the aggregate's column (`aggregate_field`), or
  one per aggregate of a list (``aggregate=[count(), sum_of("v")]``), in order;
  a running aggregate (`running_schema`): the key columns and the aggregate's column(s);
* a join on a column (`JoinColumns`): the key column once, then the left side's other
  columns, then the right side's; a name both sides have is prefixed ``left_`` / ``right_``
  on both; the side that may be missing (the right one of ``how="left"``, the left one of
  ``"right"``, both of ``"outer"``) is nullable. A join of keyed streams with its default
  ``emit`` gives ``left`` and ``right`` struct columns (`nested_join_schema`);
* a ``map`` / ``process`` with a Python function: none, unless given (``schema=``).

>>> orders = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("ts", pa.int64())])
>>> from regional.dataflow.windows import sum_of
>>> window_schema(orders, ("user",), sum_of("amount"), "w").names
['user', 'window_start', 'window_end', 'sum_amount']
>>> column_of(orders, "amout", "key_by after 'orders'")
Traceback (most recent call last):
...
regional.errors.GraphError: key_by after 'orders': unknown column 'amout'; did you mean \
'amount'? The columns are: user, amount, ts
"""

from __future__ import annotations

import datetime as dt
import difflib
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from regional.dataflow.windows import Aggregate, Window
from regional.errors import GraphError

__all__ = [
    "WINDOW_TIME",
    "JoinColumns",
    "KeyColumnsRow",
    "WindowRow",
    "aggregate_field",
    "aggregate_fields",
    "as_schema_rows",
    "column_of",
    "describe",
    "event_time_column",
    "join_key_types",
    "nested_join_schema",
    "running_schema",
    "same_schemas",
    "window_schema",
]

#: The type of ``window_start`` / ``window_end`` (what `default_emit`'s UTC datetimes are).
WINDOW_TIME = pa.timestamp("us", "UTC")
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
#: How a join names its sides, per `how`: which may be missing (nullable columns).
_MISSING_SIDES = {"inner": (), "left": ("right",), "right": ("left",), "outer": ("left", "right")}


def describe(schema: pa.Schema) -> str:
    """A schema on one line, for messages: ``user string, amount int64``."""
    return ", ".join(f"{f.name} {f.type}" for f in schema) or "(no columns)"


def column_of(schema: pa.Schema, name: str, what: str) -> pa.Field:
    """Column `name` of `schema`; `GraphError` naming `what` (the stage), the column, a
    "did you mean" and the columns there are, when it has none."""
    index = schema.get_field_index(name)
    if index >= 0:
        return schema.field(index)
    close = difflib.get_close_matches(name, schema.names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    raise GraphError(
        f"{what}: unknown column {name!r}{hint} The columns are: {', '.join(schema.names)}"
    )


def event_time_column(schema: pa.Schema, name: str, what: str) -> pa.Field:
    """Column `name` of `schema` as an event time: a timestamp, a date or an int of ms;
    `GraphError` naming `what` when it is missing or of another type (text must be cast:
    ``to_timestamp(ts)`` in a select)."""
    field = column_of(schema, name, f"{what}: event_time")
    kind = field.type
    if not (pa.types.is_timestamp(kind) or pa.types.is_date(kind) or pa.types.is_integer(kind)):
        raise GraphError(
            f"{what}: event_time={name!r} is a {kind} column; an event time is a timestamp, "
            f"a date or an int of ms since the epoch: convert it first, e.g. "
            f'.with_columns({name}="to_timestamp({name})")'
        )
    return field


def aggregate_field(agg: Aggregate, schema: pa.Schema, what: str) -> pa.Field | None:
    """The output column of built-in `agg` over `schema` (named `Aggregate.output_column`),
    typed exactly: ``count`` and ``count_distinct`` int64, ``sum`` int64 over ints and float64
    over floats, ``mean`` float64, ``min``/``max`` the column's own type. None for an
    aggregate that is no built-in (its values' type is unknown). `GraphError` naming `what`
    for an unknown column, or a sum or mean of a column that holds no numbers."""
    if agg.kind is None:
        return None
    name = agg.output_column
    if agg.kind == "count":
        return pa.field(name, pa.int64(), nullable=False)
    assert agg.field is not None
    source = column_of(schema, agg.field, what)
    if agg.kind in ("count_distinct", "approx_count_distinct"):
        return pa.field(name, pa.int64(), nullable=False)
    if agg.kind in ("min", "max"):
        return pa.field(name, source.type)
    kind = source.type
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        raise GraphError(
            f"{what}: {agg.kind}_of({agg.field!r}) adds numbers, but column {agg.field!r} is "
            f"{kind}; cast it first, e.g. .with_columns({agg.field}="
            f'"CAST({agg.field} AS DOUBLE)"), or aggregate another column'
        )
    if agg.kind == "mean":
        return pa.field(name, pa.float64())
    floats = pa.types.is_floating(kind)
    return pa.field(name, pa.float64() if floats else pa.int64(), nullable=False)


def aggregate_fields(agg: Aggregate, schema: pa.Schema, what: str) -> list[pa.Field] | None:
    """The output columns of `agg` over `schema`: `aggregate_field` of each part of a
    combination (`regional.dataflow.windows.combine`), in order, or of `agg` itself; None
    when one of them is no built-in."""
    fields = [aggregate_field(p, schema, what) for p in (agg.parts or (agg,))]
    known = [f for f in fields if f is not None]
    return known if len(known) == len(fields) else None


def _key_fields(schema: pa.Schema, keys: Sequence[str], what: str) -> list[pa.Field]:
    return [column_of(schema, k, what) for k in keys]


def _unique(fields: list[pa.Field], what: str) -> pa.Schema:
    names = [f.name for f in fields]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise GraphError(
            f"{what}: the output would have the column {twice[0]!r} twice; name the "
            "aggregate's column otherwise, e.g. count().alias('clicks')"
        )
    return pa.schema(fields)


def window_schema(
    schema: pa.Schema, keys: Sequence[str], agg: Aggregate, what: str
) -> pa.Schema | None:
    """The rows of a windowed aggregate keyed by the columns `keys` of `schema`: the key
    columns, ``window_start``, ``window_end``, the aggregate's column (a combination's: one
    per aggregate, in order); None when an aggregate is no built-in."""
    columns = aggregate_fields(agg, schema, what)
    if columns is None:
        return None
    time = [pa.field(n, WINDOW_TIME, nullable=False) for n in ("window_start", "window_end")]
    return _unique([*_key_fields(schema, keys, what), *time, *columns], what)


def running_schema(
    schema: pa.Schema, keys: Sequence[str], agg: Aggregate, what: str
) -> pa.Schema | None:
    """The rows of a running aggregate keyed by the columns `keys`: the key columns and the
    aggregate's column (a combination's: one per aggregate); None when an aggregate is no
    built-in."""
    columns = aggregate_fields(agg, schema, what)
    if columns is None:
        return None
    return _unique([*_key_fields(schema, keys, what), *columns], what)


def _aggregate_columns(row: dict[str, Any], column: str | None, value: Any) -> dict[str, Any]:
    """`row` with the aggregate's column, or a combination's columns (`column` None: `value`
    is ``{column: value}``)."""
    if column is None:
        row.update(value)
    else:
        row[column] = value
    return row


class KeyColumnsRow:
    """The row of a running aggregate keyed by columns: ``emit(key, value)`` ->
    ``{key columns..., column: value}`` (a multi-column key is the tuple of their values);
    `column` None for a combination of aggregates, whose value is ``{column: value}``."""

    def __init__(self, keys: Sequence[str], column: str | None) -> None:
        self.keys = tuple(keys)
        self.column = column

    def __call__(self, key: Any, value: Any) -> dict[str, Any]:
        row = dict(zip(self.keys, key, strict=True)) if len(self.keys) > 1 else {self.keys[0]: key}
        return _aggregate_columns(row, self.column, value)


class WindowRow:
    """The row of a windowed aggregate keyed by columns: ``emit(key, window, value)`` ->
    ``{key columns..., window_start, window_end, column: value}`` (UTC datetimes); `column`
    None for a combination of aggregates, whose value is ``{column: value}``."""

    def __init__(self, keys: Sequence[str], column: str | None) -> None:
        self.keys = tuple(keys)
        self.column = column

    def __call__(self, key: Any, window: Window, value: Any) -> dict[str, Any]:
        row = dict(zip(self.keys, key, strict=True)) if len(self.keys) > 1 else {self.keys[0]: key}
        row["window_start"] = _EPOCH + dt.timedelta(milliseconds=window.start)
        row["window_end"] = _EPOCH + dt.timedelta(milliseconds=window.end)
        return _aggregate_columns(row, self.column, value)


def as_schema_rows(rows: list[Any], schema: pa.Schema | None) -> list[Any] | pa.RecordBatch:
    """An operator's output rows as a record batch of `schema` (the vertex's schema, so the
    stages after it read columns), or as they are when it has none."""
    return rows if schema is None else pa.RecordBatch.from_pylist(rows, schema=schema)


def same_schemas(schemas: Sequence[tuple[str, pa.Schema | None]], what: str) -> pa.Schema | None:
    """The one schema of every stream `schemas` names (vertex id, its schema), for a union:
    None when some stream has none; `GraphError` naming `what` and every differing schema
    when they differ (a union's rows must have one shape)."""
    known = [(v, s) for v, s in schemas if s is not None]
    if len(known) < len(schemas) or not known:
        return None
    first_id, first = known[0]
    for vid, schema in known[1:]:
        if not schema.equals(first):
            raise GraphError(
                f"{what}: the streams have different schemas, {first_id!r}: "
                f"{describe(first)}; {vid!r}: {describe(schema)}; make them alike first, "
                "e.g. .select(...) with the same columns and CASTs on each"
            )
    return first


def join_key_types(
    left: pa.Schema | None,
    right: pa.Schema | None,
    keys: tuple[tuple[str, ...] | None, tuple[str, ...] | None],
    what: str,
) -> None:
    """`GraphError` naming `what` and both schemas when the key columns of a join's sides
    (`keys`: each side's key columns, None for a key function) are missing from a side's
    schema or differ in type; nothing to check where a side has no schema or no key
    columns."""
    if left is None or right is None or keys[0] is None or keys[1] is None:
        return
    both = f"left: {describe(left)}; right: {describe(right)}"
    if len(keys[0]) != len(keys[1]):
        raise GraphError(
            f"{what}: the sides are keyed by {len(keys[0])} and {len(keys[1])} columns "
            f"({', '.join(keys[0])} / {', '.join(keys[1])}); key both alike ({both})"
        )
    for side, schema, names in (("left", left, keys[0]), ("right", right, keys[1])):
        for name in names:
            if schema.get_field_index(name) < 0:
                column_of(schema, name, f"{what} ({side} side; {both})")
    for a, b in zip(keys[0], keys[1], strict=True):
        ta, tb = left.field(a).type, right.field(b).type
        if ta != tb:
            raise GraphError(
                f"{what}: the key column {a!r} is {ta} on the left and {b!r} {tb} on the "
                f"right, so equal keys could not meet; cast one side, e.g. "
                f'.with_columns({b}="CAST({b} AS {_sql_type(ta)})") ({both})'
            )


def _sql_type(kind: pa.DataType) -> str:
    names = {
        pa.int64(): "BIGINT",
        pa.int32(): "INT",
        pa.string(): "STRING",
        pa.float64(): "DOUBLE",
        pa.bool_(): "BOOLEAN",
    }
    return names.get(kind, str(kind).upper())


def nested_join_schema(
    left: pa.Schema | None, right: pa.Schema | None, names: tuple[str, str], how: str
) -> pa.Schema | None:
    """The rows of a join's default ``emit`` (``{names[0]: left, names[1]: right}``): one
    struct column per side, the side that may be missing nullable; None unless both sides
    have a schema."""
    if left is None or right is None:
        return None
    missing = _MISSING_SIDES[how]
    return pa.schema(
        [
            pa.field(names[0], pa.struct(list(left)), nullable="left" in missing),
            pa.field(names[1], pa.struct(list(right)), nullable="right" in missing),
        ]
    )


class JoinColumns:
    """The flat row of a join on column `on` (``Stream.interval_join(other, on=...)``):
    ``emit(left, right)`` -> the key once (from whichever side is there), the left side's
    other columns, then the right side's; a name both sides have gets ``left_`` /
    ``right_`` on both (see the module). `schema` is the rows' schema."""

    def __init__(self, on: str, left: pa.Schema, right: pa.Schema, how: str, what: str) -> None:
        self.on = on
        join_key_types(left, right, ((on,), (on,)), what)
        missing = _MISSING_SIDES[how]
        shared = (set(left.names) & set(right.names)) - {on}
        key = left.field(on).with_nullable(left.field(on).nullable or right.field(on).nullable)
        fields = [key]
        self.left: list[tuple[str, str]] = []
        self.right: list[tuple[str, str]] = []
        for side, schema, out in (("left", left, self.left), ("right", right, self.right)):
            for f in schema:
                if f.name == on:
                    continue
                name = f"{side}_{f.name}" if f.name in shared else f.name
                out.append((f.name, name))
                fields.append(f.with_name(name).with_nullable(f.nullable or side in missing))
        self.schema = _unique(fields, what)

    def __call__(self, left: Any, right: Any) -> dict[str, Any]:
        row = {self.on: (left if left is not None else right)[self.on]}
        for record, names in ((left, self.left), (right, self.right)):
            if record is None:
                row.update({out: None for _, out in names})
            else:
                row.update({out: record.get(col) for col, out in names})
        return row
