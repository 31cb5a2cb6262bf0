"""A sink's rows as Arrow record batches, converted once per Spark task instead of once per unit.

Operators hand a sink its rows as chunks: Arrow record batches, or lists of records (dicts).
A chunk's columns are the **union of its records' fields**, in the order they are first seen
(`records_batch`), never only the first record's (`pyarrow.RecordBatch.from_pylist` takes its
columns from the first record and drops the others' extra fields: a field absent from the
first record would be committed as null in every record). The usual case, every record with
the first one's fields, is found by comparing key views and converted in one
`from_pylist` call. A value of a type Arrow cannot hold in one column with the chunk's other
values of that field (an int in one record, a str in another) leaves its record out of the
batch as a `Rejected` record whose error names the place, the field and both types: with
`on_error="dead-letter"` it becomes a dead letter (`regional.dataflow.unit_epoch.sink_rows`),
otherwise its unit declines with that error.

A unit's batches for one sink are then given **one schema** (`conformed`): columns missing
from a batch are null, and a column whose types differ is widened where no value can change
(`lossless_type`: int32 and int64 make int64, float32 and float64 float64, string and
large_string large_string, null and anything the other); a batch with a column that cannot be
(int64 in one, string in another: an `apply_in_arrow` function that returns another type for
one key) is rejected whole, with an error naming the column and both types.

Turning a list into a batch costs tens of microseconds per call besides the per-record work, so
with many small units a task converts the lists of all its units at once (`parts_batches`) and
gives each unit zero-copy slices of the result. The rows and columns are exactly what
converting each unit's chunks on its own gives (`batches_of`): chunks are converted together
only when all their records have the same fields; types are inferred over all of them (a
column that is all null in one unit takes the others' type, as merging the units' tables does
anyway).

A unit whose rows cannot be converted fails alone: its part is the error, the other units'
parts are converted one chunk at a time as before.

>>> parts = parts_batches([[[{"x": 1}, {"x": 2}]], [], [[{"x": 3}]]], "out")
>>> [[b.to_pylist() for b in part] for part in parts]
[[[{'x': 1}, {'x': 2}]], [], [[{'x': 3}]]]
>>> records_batch([{"x": 1}, {"x": 2, "y": "b"}], "sink 'out'")[0].to_pylist()
[{'x': 1, 'y': None}, {'x': 2, 'y': 'b'}]
>>> batch, [rejected] = records_batch([{"x": 1}, {"x": "a"}, {"x": 3}], "sink 'out'")
>>> batch.to_pylist(), rejected.at
([{'x': 1}, {'x': 3}], 1)
>>> import textwrap
>>> print(textwrap.fill(str(rejected.error), 90))
sink 'out': field 'x' is string (a Python str) in this record but int64 in the other
records of its chunk; Arrow holds one type per column: give the field one type in every
record
>>> bad = parts_batches([[[{"x": 1}]], [[{"x": "a"}, {"x": 2}]]], "out")
>>> bad[0][0].to_pylist()
[{'x': 1}]
>>> str(bad[1]).startswith("sink 'out': field 'x' is int64 (a Python int) in this record")
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

import pyarrow as pa

#: Rows as operators hand them on: an Arrow record batch, or a list of records (dicts); the
#: same as `regional.sources.base.Batch`, which this layer does not import.
Batch: TypeAlias = pa.RecordBatch | list[Any]

__all__ = [
    "Rejected",
    "SinkRowsError",
    "batches_of",
    "conformed",
    "fields_of",
    "lossless_type",
    "parts_batches",
    "records_batch",
]

#: What pyarrow raises for values it cannot put in one column.
_ARROW_ERRORS = (pa.ArrowException, TypeError, ValueError, OverflowError)


class SinkRowsError(TypeError):
    """A sink (or an operator taking Arrow batches) got rows that do not make an Arrow table
    (a record that is not a dict, a field of two types): names the place, the field and both
    types, and what to give it."""


class Rejected(NamedTuple):
    """A record left out of a chunk's batch: its index in the chunk, the record, and why."""

    at: int
    record: Any
    error: SinkRowsError


def fields_of(records: Sequence[Any]) -> list[str] | None:
    """The union of the records' fields in the order first seen, or None when every record
    has the first one's fields (the usual case: one comparison of key views per record).
    Raises AttributeError for a record that is not a dict."""
    first = records[0].keys()
    if all(r.keys() == first for r in records):
        return None
    union = dict.fromkeys(first)
    for r in records:
        if r.keys() != first:
            union.update(dict.fromkeys(r))
    return list(union)


def _struct_batch(records: Sequence[Any]) -> pa.RecordBatch:
    """`records` as a record batch with the union of their fields (first-seen order), Arrow
    inferring each column's type over all of them. The usual case, no record with a field
    the first lacks, is one set union of every record's keys (in C, a fifth of what the
    conversion costs) and `from_pylist`, which takes the columns of the first record (a
    record without one of them has null there). Raises AttributeError when one is not a dict
    (as `fields_of` does), what Arrow raises when a field's values do not make one column."""
    if not records:
        return pa.RecordBatch.from_pylist([])
    rows = records if isinstance(records, list) else list(records)
    first = rows[0]
    if not isinstance(first, dict):
        fields_of(rows)  # raises AttributeError, naming its type
    try:
        union = set().union(*rows)
    except TypeError as exc:  # a record that is not even iterable
        raise AttributeError(str(exc)) from exc
    if len(union) == len(first):
        return pa.RecordBatch.from_pylist(rows)
    fields = fields_of(rows) or list(first)
    return pa.RecordBatch.from_pydict({f: [r.get(f) for r in rows] for f in fields})


def _not_rows(where: str, exc: BaseException, records: Sequence[Any]) -> SinkRowsError:
    first = records[0] if records else None
    return SinkRowsError(
        f"{where}: its rows do not make an Arrow table ({type(exc).__name__}: {exc}; "
        f"first record: {first!r:.200}); give a sink records that are dicts with one type "
        "per field, e.g. map(lambda r: {'n': r['n']})"
    )


def records_batch(records: Sequence[Any], where: str) -> tuple[pa.RecordBatch, list[Rejected]]:
    """`records` (dicts) as one record batch whose columns are the union of their fields
    (first-seen order), and the records left out: those with a value Arrow cannot hold in one
    column with the others' values of that field (`where`, e.g. "sink 'out'", names the place
    in their errors). Raises `SinkRowsError` for rows that are not records at all."""
    try:
        return _struct_batch(records), []
    except AttributeError as exc:
        raise _not_rows(where, exc, records) from exc
    except _ARROW_ERRORS as exc:
        conversion_error: BaseException = exc
    try:
        fields = fields_of(records) or list(records[0])
    except AttributeError as exc:
        raise _not_rows(where, exc, records) from exc
    bad: dict[int, SinkRowsError] = {}
    for field in fields:
        for i, error in _column_rejects([r.get(field) for r in records], field, where):
            bad.setdefault(i, error)
    kept = [r for i, r in enumerate(records) if i not in bad]
    rejected = [Rejected(i, records[i], error) for i, error in sorted(bad.items())]
    try:
        return _struct_batch(kept), rejected
    except _ARROW_ERRORS as exc:  # not a type conflict we can name: the rows as a whole
        raise _not_rows(where, conversion_error, records) from exc


def _column_rejects(
    column: Sequence[Any], field: str, where: str
) -> list[tuple[int, SinkRowsError]]:
    """The values of one field (one per record, None where absent) that Arrow cannot hold with
    the others. The values of each Python type are taken together, in the order their type is
    first seen, as long as Arrow infers one type over them and the ones taken before (int and
    float make float64, as Arrow's inference does); the values of a type that does not fit
    are left out. When the first type's values do not fit together (nested values of
    different shapes), each is tried with the first one."""
    try:
        pa.array(column)
        return []
    except _ARROW_ERRORS:
        pass
    groups: dict[type, list[int]] = {}
    for i, value in enumerate(column):
        if value is not None:
            groups.setdefault(type(value), []).append(i)
    accepted: list[Any] = []
    out: list[tuple[int, SinkRowsError]] = []
    for indices in groups.values():
        values = [column[i] for i in indices]
        try:
            pa.array(accepted + values)
            accepted += values
            continue
        except _ARROW_ERRORS:
            pass
        if accepted:
            refused = indices
        else:  # the first type's values do not fit together: each against the first
            refused = []
            for i in indices:
                try:
                    pa.array([*accepted[:1], column[i]])
                    accepted.append(column[i])
                except _ARROW_ERRORS:
                    refused.append(i)
        column_type = _arrow_type(accepted) if accepted else None
        for i in refused:
            out.append((i, _conflict(where, field, column[i], column_type)))
    return out


def _arrow_type(values: list[Any]) -> pa.DataType | None:
    """The type Arrow infers for `values` (None: Arrow has none for them)."""
    try:
        return pa.array(values).type
    except _ARROW_ERRORS:
        return None


def _conflict(where: str, field: str, value: Any, column_type: pa.DataType | None) -> SinkRowsError:
    own = _arrow_type([value])
    python = type(value).__name__
    if own is None:
        text = f"holds a Python {python}, which Arrow has no type for"
    elif column_type is None:
        text = f"is {own} (a Python {python}) in this record, unlike the other records of its chunk"
    else:
        text = (
            f"is {own} (a Python {python}) in this record but {column_type} in the other "
            "records of its chunk"
        )
    return SinkRowsError(
        f"{where}: field {field!r} {text}; Arrow holds one type per column: give the field one "
        "type in every record"
    )


def lossless_type(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type one column takes for values of `a` (the rows before) and of `b`, or None when
    there is none: equal types; null and any; two signed or two unsigned integers (the wider);
    an unsigned and a wider signed integer (the signed); two floats (the wider); string and
    large_string (large_string), binary and large_binary (large_binary). Two pairs are taken
    as Arrow takes Python values of both kinds in one column, since per-unit conversion must
    not refuse what one conversion of the same records accepts: an int and a float make
    float64 (as Spark SQL's union coerces them), and a timestamp with a time zone and one
    without take `a`'s zone (an aware value stored as UTC, a naive one read as UTC), in the
    finer unit. Anything else (int and string, ...) is None."""
    if a.equals(b):
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    if pa.types.is_integer(a) and pa.types.is_integer(b):
        sa, sb = pa.types.is_signed_integer(a), pa.types.is_signed_integer(b)
        if sa == sb:
            return a if a.bit_width >= b.bit_width else b
        signed, unsigned = (a, b) if sa else (b, a)
        return signed if signed.bit_width > unsigned.bit_width else None
    if pa.types.is_floating(a) and pa.types.is_floating(b):
        return a if a.bit_width >= b.bit_width else b
    if (pa.types.is_integer(a) and pa.types.is_floating(b)) or (
        pa.types.is_floating(a) and pa.types.is_integer(b)
    ):
        return pa.float64()
    if pa.types.is_timestamp(a) and pa.types.is_timestamp(b):
        finer = max(a.unit, b.unit, key=("s", "ms", "us", "ns").index)
        return pa.timestamp(finer, a.tz)
    for small, large in ((pa.string(), pa.large_string()), (pa.binary(), pa.large_binary())):
        if {str(a), str(b)} == {str(small), str(large)}:
            return large
    return None


def _widened(
    schema: pa.Schema, other: pa.Schema
) -> pa.Schema | tuple[str, pa.DataType, pa.DataType]:
    """`schema` widened to hold `other`'s columns too (new ones after, nullable; a column
    missing from either is nullable), or the first column that cannot be: (name, its type in
    `schema`, in `other`)."""
    fields: list[pa.Field] = []
    theirs = {f.name: f for f in other}
    for f in schema:
        o = theirs.get(f.name)
        if o is None:
            fields.append(f.with_nullable(True))
            continue
        t = lossless_type(f.type, o.type)
        if t is None:
            return (f.name, f.type, o.type)
        fields.append(f.with_type(t).with_nullable(f.nullable or o.nullable))
    mine = set(schema.names)
    fields += [f.with_nullable(True) for f in other if f.name not in mine]
    return pa.schema(fields, metadata=schema.metadata)


def _as(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` with the columns of `schema` (cast losslessly; null where it has none)."""
    if batch.schema.equals(schema):
        return batch
    names = batch.schema.names
    columns = [
        batch.column(f.name).cast(f.type) if f.name in names else pa.nulls(batch.num_rows, f.type)
        for f in schema
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def conformed(
    batches: Sequence[pa.RecordBatch], where: str, names: Sequence[str] | None = None
) -> tuple[list[pa.RecordBatch], list[tuple[int, SinkRowsError]]]:
    """One unit's batches for one place (`where`, e.g. "sink 'out'") with one schema: each
    batch's columns widened losslessly (`lossless_type`) to the union of theirs, in the order
    first seen, and the batches that cannot be (by position, with an error naming the column,
    its type there and in the batches before; `names[i]` says whose rows batch i holds, e.g.
    "operator 'a'"). Batches without rows are dropped from the schema's making, never
    rejected. The usual case, one schema, is one comparison per batch."""
    if not batches:
        return [], []
    schema = batches[0].schema
    if all(b.schema.equals(schema) for b in batches[1:]):
        return list(batches), []
    rejected: list[tuple[int, SinkRowsError]] = []
    unified: pa.Schema | None = None
    for at, b in enumerate(batches):
        if not b.num_rows:
            continue
        if unified is None:
            unified = b.schema
            continue
        widened = _widened(unified, b.schema)
        if isinstance(widened, pa.Schema):
            unified = widened
            continue
        column, before, here = widened
        whose = f" of {names[at]}" if names is not None else ""
        rejected.append(
            (
                at,
                SinkRowsError(
                    f"{where}: column {column!r} is {here} in these rows{whose} but {before} in "
                    "the rows before them, and Arrow has no type that holds both unchanged; "
                    "give the column one type (e.g. cast it in the function that makes it)"
                ),
            )
        )
    if unified is None:
        return [b for b in batches if not b.num_rows], []
    refused = {at for at, _ in rejected}
    kept = [_as(b, unified) for at, b in enumerate(batches) if b.num_rows and at not in refused]
    return kept, rejected


def _raise_rejected(rejected: Sequence[tuple[int, SinkRowsError]] | Sequence[Rejected]) -> None:
    if rejected:
        first = rejected[0]
        raise first.error if isinstance(first, Rejected) else first[1]


def batches_of(rows: Sequence[Batch], sink: str) -> list[pa.RecordBatch]:
    """Each chunk of one unit's rows for sink vertex `sink` as a record batch (lists converted
    one by one, `records_batch`), all of one schema (`conformed`); `SinkRowsError` when one
    does not convert (its unit declines, naming the field and both types)."""
    where = f"sink {sink!r}"
    out: list[pa.RecordBatch] = []
    for chunk in rows:
        if isinstance(chunk, pa.RecordBatch):
            out.append(chunk)
        elif chunk:
            batch, rejected = records_batch(chunk, where)
            _raise_rejected(rejected)
            out.append(batch)
        else:
            out.append(pa.RecordBatch.from_pylist([]))
    kept, refused = conformed(out, where)
    _raise_rejected(refused)
    return kept


def _first_fields(lists: Sequence[list[Any]]) -> tuple[str, ...] | None:
    """The fields of the first record of every list, in order, when they are the same for
    all (all dicts); else None."""
    try:
        order = tuple(lists[0][0].keys())
        return order if all(tuple(c[0].keys()) == order for c in lists) else None
    except AttributeError:
        return None


def parts_batches(
    parts: Sequence[Sequence[Batch]], sink: str
) -> list[list[pa.RecordBatch] | Exception]:
    """Per part (one unit's rows for sink vertex `sink`), its chunks as record batches of one
    schema, or the `SinkRowsError` converting them raised (that unit fails; the others do
    not). Lists of records are converted in one call when the union of all their fields is
    the fields of each list's first record, in its order (`_struct_batch` makes the union's
    columns, first-seen order): then each list's own union is the same, and its slice of the
    joint batch is what converting it alone gives."""
    lists = [c for part in parts for c in part if not isinstance(c, pa.RecordBatch) and c]
    joint: pa.RecordBatch | None = None
    first = _first_fields(lists) if len(lists) > 1 else None
    if first is not None:
        try:
            joint = _struct_batch([r for c in lists for r in c])
        except (AttributeError, *_ARROW_ERRORS):
            joint = None  # some unit's rows do not convert: find it, chunk by chunk
        if joint is not None and tuple(joint.schema.names) != first:
            joint = None  # some record has a field its list's first lacks: chunk by chunk
    out: list[list[pa.RecordBatch] | Exception] = []
    if joint is None:
        for part in parts:
            try:
                out.append(batches_of(part, sink))
            except SinkRowsError as exc:
                out.append(exc)
        return out
    at = 0
    for part in parts:
        batches = []
        for chunk in part:
            if isinstance(chunk, pa.RecordBatch):
                batches.append(chunk)
            elif chunk:
                batches.append(joint.slice(at, len(chunk)))
                at += len(chunk)
            else:
                batches.append(pa.RecordBatch.from_pylist(chunk))
        kept, refused = conformed(batches, f"sink {sink!r}")
        out.append(refused[0][1] if refused else kept)
    return out
