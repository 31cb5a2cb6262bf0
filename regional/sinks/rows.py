"""A sink's rows as Arrow record batches, converted once per Spark task instead of once per unit.

Operators hand a sink its rows as chunks: Arrow record batches, or lists of records (dicts).
Turning a list into a batch (`pyarrow.RecordBatch.from_pylist`) costs tens of microseconds per
call besides the per-record work, so with many small units a task converts the lists of all its
units at once (`parts_batches`) and gives each unit zero-copy slices of the result. The rows
and columns are exactly what converting each chunk on its own gives (`batches_of`):
`from_pylist` takes a batch's columns from its first record, so chunks are converted together
only when their first records have the same fields in the same order; types are inferred over
all of them (a column that is all null in one unit takes the others' type, as merging the
units' tables does anyway).

A unit whose rows cannot be converted fails alone: its part is the error, the other units'
parts are converted one chunk at a time as before.

>>> parts = parts_batches([[[{"x": 1}, {"x": 2}]], [], [[{"x": 3}]]], "out")
>>> [[b.to_pylist() for b in part] for part in parts]
[[[{'x': 1}, {'x': 2}]], [], [[{'x': 3}]]]
>>> bad = parts_batches([[[{"x": 1}]], [[{"x": "a"}, {"x": 2}]]], "out")
>>> bad[0][0].to_pylist()
[{'x': 1}]
>>> str(bad[1]).startswith("sink 'out': its rows do not make an Arrow table (ArrowTypeError")
True
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import pyarrow as pa

#: Rows as operators hand them on: an Arrow record batch, or a list of records (dicts); the
#: same as `regional.sources.base.Batch`, which this layer does not import.
Batch: TypeAlias = pa.RecordBatch | list[Any]

__all__ = ["SinkRowsError", "batches_of", "parts_batches"]


class SinkRowsError(TypeError):
    """A sink got rows that do not make an Arrow table (a record that is not a dict, a field
    of two types): names the sink and what to give it."""


def batches_of(rows: Sequence[Batch], sink: str) -> list[pa.RecordBatch]:
    """Each chunk of one unit's rows for sink vertex `sink` as a record batch (lists converted
    one by one); `SinkRowsError` when one does not convert."""
    try:
        return [b if isinstance(b, pa.RecordBatch) else pa.RecordBatch.from_pylist(b) for b in rows]
    except (pa.ArrowException, TypeError, ValueError, AttributeError) as exc:
        first = next((c[0] for c in rows if isinstance(c, list) and c), None)
        raise SinkRowsError(
            f"sink {sink!r}: its rows do not make an Arrow table ({type(exc).__name__}: {exc}; "
            f"first record: {first!r:.200}); give a sink records that are dicts with one type "
            "per field, e.g. map(lambda r: {'n': r['n']})"
        ) from exc


def parts_batches(
    parts: Sequence[Sequence[Batch]], sink: str
) -> list[list[pa.RecordBatch] | Exception]:
    """Per part (one unit's rows for sink vertex `sink`), its chunks as record batches, or the
    `SinkRowsError` converting them raised (that unit fails; the others do not). Lists of
    records whose first records have the same fields are converted in one call."""
    lists = [c for part in parts for c in part if not isinstance(c, pa.RecordBatch) and c]
    fields = {tuple(c[0]) if isinstance(c[0], dict) else None for c in lists}
    joint: pa.RecordBatch | None = None
    if len(lists) > 1 and len(fields) == 1 and None not in fields:
        try:
            joint = pa.RecordBatch.from_pylist([r for c in lists for r in c])
        except (pa.ArrowException, TypeError, ValueError):
            joint = None  # some unit's rows do not convert: find it, chunk by chunk
    if joint is None:
        out: list[list[pa.RecordBatch] | Exception] = []
        for part in parts:
            try:
                out.append(batches_of(part, sink))
            except SinkRowsError as exc:
                out.append(exc)
        return out
    at = 0
    converted: list[list[pa.RecordBatch] | Exception] = []
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
        converted.append(batches)
    return converted
