"""Schemas of streams: what a stage's records look like, as a `pyarrow.Schema`.

A source can declare the schema of its records (`Pipeline.source(src, schema=...)`): a
`pyarrow.Schema`, a msgspec `Struct` class or a dataclass (`schema_of`). Every record it reads
is then fitted to that schema (`fit`) before any operator sees it, and the stream carries it
(`Stream.schema`; the plan vertex's `schema`), which the expression stages
(`regional.dataflow.expressions`) type their expressions against.

The rule for a record (DESIGN §8):

* a field of the schema the record lacks, or holds as null, is null when the field is
  nullable, and makes the record a misfit when it is not (a *required* field);
* a value of another type than its field's is cast when the cast loses nothing (an int to a
  wider int, an int to a double that holds it exactly, a whole double to an int, ISO text to a
  timestamp or date); anything else (text to a number, a fraction to an int, an overflow, a
  number to text, a bool to a number) makes the record a misfit. Whether a record fits never
  depends on the records read with it;
* fields the schema does not name are dropped (what Spark's ``from_json`` with a schema does).

A misfit is never a crash and never a silent null: it is a `SchemaMismatch` naming the field,
the expected and the found type, and the pipeline's ``on_error`` rule applies (a dead letter
of the source, or the unit declines naming it).

>>> import dataclasses
>>> @dataclasses.dataclass
... class Order:
...     id: int
...     amount: float
...     note: str | None = None
>>> schema_of(Order)
id: int64 not null
amount: double not null
note: string
>>> batch, misfits = fit([{"id": 1, "amount": 2}, {"id": "x", "amount": 1.0}], schema_of(Order))
>>> batch.to_pylist()
[{'id': 1, 'amount': 2.0, 'note': None}]
>>> [(m.at, str(m.error)) for m in misfits]
[(1, "field 'id': expected int64, found string ('x')")]
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import types
import typing
from collections.abc import Sequence
from typing import Any, NamedTuple

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from regional.sources.base import Batch

__all__ = ["Misfit", "SchemaMismatch", "fit", "one_batch", "produced_schema", "schema_of"]


class SchemaMismatch(ValueError):
    """A record that does not fit its stream's declared schema: names the field, the expected
    and the found type."""


class Misfit(NamedTuple):
    """Record `at` of a batch (its place in the input) does not fit: `record` as read,
    `error` saying why."""

    at: int
    record: Any
    error: SchemaMismatch


_PYTHON_TYPES: dict[Any, pa.DataType] = {
    int: pa.int64(),
    float: pa.float64(),
    str: pa.string(),
    bool: pa.bool_(),
    bytes: pa.binary(),
    datetime.datetime: pa.timestamp("us", "UTC"),
    datetime.date: pa.date32(),
    decimal.Decimal: pa.decimal128(38, 18),
}


def _arrow_type(annotation: Any, where: str) -> tuple[pa.DataType, bool]:
    """The Arrow type of a field annotation and whether it is nullable (``X | None``)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(annotation)) == 2:
            return _arrow_type(args[0], where)[0], True
    elif origin in (list, Sequence):
        (item,) = typing.get_args(annotation) or (Any,)
        inner, nullable = _arrow_type(item, where)
        return pa.list_(pa.field("item", inner, nullable=nullable)), False
    elif annotation in _PYTHON_TYPES:
        return _PYTHON_TYPES[annotation], False
    elif isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation) or issubclass(annotation, msgspec.Struct)
    ):
        return pa.struct(list(schema_of(annotation))), False
    raise TypeError(
        f"{where}: no Arrow type for {annotation!r}; use int, float, str, bool, bytes, "
        "datetime, date, Decimal, list[...], a nested dataclass or Struct, or X | None, or "
        "give a pyarrow.Schema"
    )


def schema_of(declared: Any) -> pa.Schema:
    """The `pyarrow.Schema` `declared` stands for: itself, or the fields of a msgspec
    `Struct` class or a dataclass in order (``X | None`` nullable, the rest required).
    `TypeError` naming the field for a type with no Arrow counterpart."""
    if isinstance(declared, pa.Schema):
        return declared
    if isinstance(declared, type) and issubclass(declared, msgspec.Struct):
        hints = typing.get_type_hints(declared)
        names = declared.__struct_fields__
    elif isinstance(declared, type) and dataclasses.is_dataclass(declared):
        hints = typing.get_type_hints(declared)
        names = tuple(f.name for f in dataclasses.fields(declared))
    else:
        raise TypeError(
            f"schema={declared!r}: give a pyarrow.Schema, a msgspec Struct class or a dataclass"
        )
    fields = []
    for name in names:
        arrow, nullable = _arrow_type(hints[name], f"field {name!r} of {declared.__name__}")
        fields.append(pa.field(name, arrow, nullable=nullable))
    return pa.schema(fields)


def _castable(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether values of `found` may be cast to `expected` (the cast itself still checks
    each value loses nothing): numbers among numbers (not bool), text to time, nulls to
    anything, and nested types pyarrow casts field by field."""
    if found == expected or pa.types.is_null(found):
        return True
    number = (pa.types.is_integer, pa.types.is_floating, pa.types.is_decimal)
    if any(t(found) for t in number) and any(t(expected) for t in number):
        return True  # the cast refuses a fraction to an int, an overflow, a lost digit
    if pa.types.is_string(found) or pa.types.is_large_string(found):
        return (
            pa.types.is_timestamp(expected)
            or pa.types.is_date(expected)
            or pa.types.is_large_string(expected)
            or pa.types.is_string(expected)
        )
    if pa.types.is_timestamp(found) and pa.types.is_timestamp(expected):
        return True
    nested = (pa.types.is_struct, pa.types.is_list, pa.types.is_large_list)
    return any(t(found) and t(expected) for t in nested)


def _value_text(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _mismatch(name: str, expected: pa.DataType, found: Any, value: Any) -> SchemaMismatch:
    return SchemaMismatch(
        f"field {name!r}: expected {expected}, found {found} ({_value_text(value)})"
    )


def _lossless(column: pa.Array, expected: pa.DataType) -> pa.Array:
    """`column` cast to `expected`, refusing any loss (`pyarrow` raises); text without a
    zone offset cast to a timestamp with a zone is read as UTC (regional's rule for naive
    times)."""
    try:
        return pc.cast(column, expected, safe=True)
    except pa.ArrowInvalid:
        if not (
            pa.types.is_timestamp(expected) and expected.tz and pa.types.is_string(column.type)
        ):
            raise
    naive = pc.cast(column, pa.timestamp(expected.unit), safe=True)
    return pc.cast(pc.assume_timezone(naive, "UTC"), expected)


def _cast_column(
    name: str, column: pa.Array, expected: pa.DataType, bad: dict[int, SchemaMismatch]
) -> pa.Array:
    """`column` cast to `expected`, losslessly; the rows it cannot cast go into `bad` (by row)
    and are null in the result."""
    if column.type == expected:
        return column
    if not _castable(column.type, expected):
        for i, value in enumerate(column.to_pylist()):
            if value is not None:
                bad.setdefault(i, _mismatch(name, expected, column.type, value))
        return pa.nulls(len(column), expected)
    try:
        return _lossless(column, expected)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
        pass
    values = []
    for i in range(len(column)):  # only when the cast failed: find the rows it failed on
        one = column.slice(i, 1)
        try:
            values.append(_lossless(one, expected)[0])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError):
            bad.setdefault(i, _mismatch(name, expected, column.type, one[0].as_py()))
            values.append(pa.scalar(None, expected))
    return pa.array([v.as_py() for v in values], expected)


def _fit_field(
    path: str,
    column: pa.Array | None,
    field: pa.Field,
    rows: int,
    bad: dict[int, SchemaMismatch],
    present: pa.Array | None = None,
) -> pa.Array:
    """`column` (None: the records lack the field) fitted to `field`, whose name in the
    record is `path` (``value.amount`` in a struct); rows that misfit go into `bad`. A
    required field must have a value where its parent has one (`present`)."""
    if column is None:
        out = pa.nulls(rows, field.type)
    elif pa.types.is_struct(field.type) and pa.types.is_struct(column.type):
        out = _fit_struct(path, column, field.type, bad)
    else:
        out = _cast_column(path, column, field.type, bad)
    if not field.nullable and out.null_count:
        missing = pc.is_null(out)
        if present is not None:
            missing = pc.and_(missing, present)
        for i in pc.indices_nonzero(missing).to_pylist():
            bad.setdefault(
                i,
                SchemaMismatch(
                    f"field {path!r}: expected {field.type} (required), found no value (null "
                    "or missing)"
                ),
            )
    return out


def _fit_struct(
    path: str, column: pa.StructArray, expected: pa.StructType, bad: dict[int, SchemaMismatch]
) -> pa.Array:
    """A struct column fitted to `expected` by the same rule as a record, field by field
    (missing children null, extra children dropped, each child cast losslessly)."""
    present = pc.is_valid(column)
    children = dict(zip([f.name for f in column.type], column.flatten(), strict=True))
    fields = [expected.field(i) for i in range(expected.num_fields)]
    arrays = [
        _fit_field(f"{path}.{f.name}", children.get(f.name), f, len(column), bad, present)
        for f in fields
    ]
    return pa.StructArray.from_arrays(arrays, fields=fields, mask=pc.invert(present))


def _fit_batch(batch: pa.RecordBatch, schema: pa.Schema) -> tuple[pa.RecordBatch, list[Misfit]]:
    bad: dict[int, SchemaMismatch] = {}
    columns = []
    for field in schema:
        at = batch.schema.get_field_index(field.name)
        column = batch.column(at) if at >= 0 else None
        columns.append(_fit_field(field.name, column, field, batch.num_rows, bad))
    out = pa.RecordBatch.from_arrays(columns, schema=schema)
    if not bad:
        return out, []
    keep = pa.array([i not in bad for i in range(batch.num_rows)])
    rows = [batch.slice(i, 1).to_pylist()[0] for i in sorted(bad)]
    misfits = [Misfit(i, row, bad[i]) for i, row in zip(sorted(bad), rows, strict=True)]
    return out.filter(keep), misfits


_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, TypeError)


def _fit_records(records: list[Any], schema: pa.Schema) -> tuple[pa.RecordBatch, list[Misfit]]:
    """`fit` for Python records: each field's values become one column of the type Arrow
    infers for them, then fitted as a batch; a record is looked at alone only when a column
    holds values of types no one Arrow type takes (`_fit_one`)."""
    objects = all(isinstance(r, dict) for r in records)
    columns = {}
    if objects:
        for name in schema.names:
            values = [r.get(name) for r in records]
            try:  # a field no record has is a column of nulls: `_fit_batch` judges it
                column = pa.array(values)
            except _ARROW_ERRORS:
                break
            if _inferred_lossily(values, column.type):
                break  # judge these records one by one
            columns[name] = column
        else:
            batch, found = _fit_batch(pa.RecordBatch.from_pydict(columns), schema)
            return batch, [Misfit(m.at, records[m.at], m.error) for m in found]
    fitted: list[pa.RecordBatch] = []
    misfits: list[Misfit] = []
    for i, record in enumerate(records):
        one, error = _fit_one(record, schema)
        if one is not None:
            fitted.append(one)
        else:
            assert error is not None
            misfits.append(Misfit(i, record, error))
    if not fitted:
        return pa.RecordBatch.from_pylist([], schema=schema), misfits
    return one_batch(fitted, schema), misfits


def _inferred_lossily(values: list[Any], inferred: pa.DataType) -> bool:
    """Whether Arrow's inference of `values` as `inferred` changed a value: a bool among
    numbers read as 0 or 1, an int beside floats read as a double that does not hold it
    (looked for inside structs and lists too)."""
    if pa.types.is_struct(inferred):
        objects = [v for v in values if isinstance(v, dict)]
        return any(_inferred_lossily([v.get(f.name) for v in objects], f.type) for f in inferred)
    if pa.types.is_list(inferred) or pa.types.is_large_list(inferred):
        items = [x for v in values if isinstance(v, list | tuple) for x in v]
        return _inferred_lossily(items, inferred.value_type)
    if not pa.types.is_boolean(inferred) and any(type(v) is bool for v in values):
        return True
    return pa.types.is_floating(inferred) and any(type(v) is int and abs(v) > 2**53 for v in values)


def _fit_one(record: Any, schema: pa.Schema) -> tuple[pa.RecordBatch | None, SchemaMismatch | None]:
    """One Python record fitted to `schema`: its one-row batch, or why it does not fit."""
    if not isinstance(record, dict):
        return None, SchemaMismatch(
            f"the record is a {type(record).__name__}, not an object with the fields "
            f"{', '.join(schema.names)}"
        )
    columns = {}
    for field in schema:
        value = record.get(field.name)
        try:
            columns[field.name] = pa.array([value])
        except _ARROW_ERRORS:
            return None, _mismatch(field.name, field.type, type(value).__name__, value)
    batch, misfits = _fit_batch(pa.RecordBatch.from_pydict(columns), schema)
    return (batch, None) if not misfits else (None, misfits[0].error)


def one_batch(batches: Sequence[pa.RecordBatch], schema: pa.Schema) -> pa.RecordBatch:
    """`batches` (all of `schema`) as one record batch (pyarrow 18 has no `concat_batches`)."""
    table = pa.Table.from_batches(batches, schema).combine_chunks()
    found = table.to_batches()
    return found[0] if found else pa.RecordBatch.from_pylist([], schema=schema)


def produced_schema(vertex: object) -> pa.Schema | None:
    """The schema a vertex's source or operator produces (its `output_schema`: a source read
    with ``schema=``, an expression stage), or None when it does not say."""
    found = getattr(vertex, "output_schema", None)
    return found if isinstance(found, pa.Schema) else None


def fit(data: Batch, schema: pa.Schema) -> tuple[pa.RecordBatch, list[Misfit]]:
    """The records of `data` (a record batch or a list of records) that fit `schema`, as a
    batch of exactly that schema, and the ones that do not (`Misfit`, by their index in
    `data`), by the rule of this module. Vectorised: a record is looked at alone only when
    a column of its batch cannot be converted whole."""
    if isinstance(data, pa.RecordBatch):
        return _fit_batch(data, schema)
    return _fit_records(list(data), schema)
