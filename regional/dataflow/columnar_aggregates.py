"""The built-in aggregates (`count`, `sum_of`, `min_of`, `max_of`, `mean_of`) over Arrow
columns: one Arrow group-by per batch instead of a Python call per record, folded into the
accumulators the record-wise path keeps, with the values that path gives. Pure.

A batch is *foldable* (`can_fold`) when its key is a field whose column Arrow groups as the
record-wise path keys (ints, strings, binary, bools, dates, timestamps: no floats, whose NaNs
Arrow groups but a dict does not, nor nested types) and the aggregate's field is a column of
ints (up to 64 bits, no uint64) or floats (32 or 64 bits), with no NaN for `min_of`/`max_of`
(comparisons with NaN depend on the order) and an int sum that cannot overflow int64 inside
the batch. Any other batch goes the record-wise way, which names what is wrong with it.

**Exactly the record-wise values.** Counts, int sums, minima and maxima are merged into the
accumulator (`Aggregate.merge`); ties keep the accumulator's value, as ``v < acc`` does. A sum
of floats depends on the order of its additions, so where the record-wise path would add a
batch's floats to an accumulator one by one (``((acc + v1) + v2) + ...``), the group-by is run
again with the accumulator as each group's first row: Arrow adds a group's values in row order
when run on one thread (a property test holds it to that), giving the same float, bit for bit.

>>> from regional.dataflow.windows import sum_of
>>> batch = pa.record_batch({"k": ["a", "b", "a"], "v": [1.5, None, 2.0]})
>>> can_fold(sum_of("v"), batch, "k")
True
>>> fold(sum_of("v"), batch.column("k"), value_column(sum_of("v"), batch), None,
...      lambda key, start: 10 if key == "a" else MISSING)
[('a', None, 13.5), ('b', None, 0)]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from regional.dataflow.windows import Aggregate

__all__ = [
    "COLUMNAR",
    "MISSING",
    "can_fold",
    "columnar",
    "fold",
    "fold_all",
    "groupable",
    "value_column",
    "value_columns",
]

#: The built-ins that can run over Arrow columns (`Aggregate.columnar`).
COLUMNAR = ("count", "sum", "min", "max", "mean")
#: What `fold`'s `current` returns for a group without an accumulator yet.
MISSING: Any = type("Missing", (), {"__repr__": lambda self: "MISSING"})()
_INT64_MAX = 2**63 - 1


def groupable(kind: pa.DataType) -> bool:
    """True for a key column Arrow groups exactly as a dict of its Python values does."""
    t = pa.types
    return bool(
        t.is_integer(kind)
        or t.is_string(kind)
        or t.is_large_string(kind)
        or t.is_binary(kind)
        or t.is_large_binary(kind)
        or t.is_boolean(kind)
        or t.is_date(kind)
        or t.is_timestamp(kind)
    )


def _numeric(kind: pa.DataType) -> bool:
    """Ints of up to 64 bits (no uint64: its values pass int64) and 32- or 64-bit floats."""
    return (pa.types.is_integer(kind) and kind != pa.uint64()) or kind in (
        pa.float32(),
        pa.float64(),
    )


def columnar(agg: Aggregate) -> bool:
    """True for a built-in `fold` computes over columns, or a combination of them
    (`regional.dataflow.windows.combine`: every part one)."""
    if agg.parts:
        return all(p.columnar in COLUMNAR for p in agg.parts)
    return agg.columnar in COLUMNAR


def can_fold(agg: Aggregate, batch: pa.RecordBatch, key_field: str | tuple[str, ...]) -> bool:
    """True when `fold` gives for `batch`, keyed by column `key_field` (or by the tuple of the
    columns it names), what adding its records one by one to `agg`'s accumulators gives (see
    the module's rules); for a combination, when it does for every part."""
    if agg.parts:
        return all(can_fold(p, batch, key_field) for p in agg.parts)
    names = batch.schema.names
    fields = (key_field,) if isinstance(key_field, str) else key_field
    if agg.columnar not in COLUMNAR or not all(f in names for f in fields):
        return False
    if not all(groupable(batch.schema.field(f).type) for f in fields):
        return False
    if agg.columnar == "count":
        return True
    if agg.field is None or agg.field not in names:
        return False
    column = batch.column(agg.field)
    if column.null_count == len(column):  # None values only (Arrow: null, or any type)
        return True
    if not _numeric(column.type):
        return False
    if pa.types.is_floating(column.type):
        return agg.columnar not in ("min", "max") or not pc.any(pc.is_nan(column)).as_py()
    if agg.columnar in ("sum", "mean"):  # no partial sum may wrap around in int64
        low, high = pc.min_max(column).values()
        return max(abs(low.as_py()), abs(high.as_py())) * len(column) <= _INT64_MAX
    return True


def value_column(agg: Aggregate, batch: pa.RecordBatch) -> pa.Array | None:
    """The column `agg` reads from a foldable `batch` as int64 or float64 (None for count)."""
    if agg.columnar == "count" or agg.field is None:
        return None
    column = batch.column(agg.field)
    return column.cast(pa.float64() if pa.types.is_floating(column.type) else pa.int64())


def value_columns(agg: Aggregate, batch: pa.RecordBatch) -> list[pa.Array | None]:
    """`value_column` of each part of `agg` (of `agg` itself when it is no combination)."""
    return [value_column(p, batch) for p in (agg.parts or (agg,))]


def fold_all(
    agg: Aggregate,
    keys: pa.Array | tuple[pa.Array, ...],
    values: list[pa.Array | None],
    starts: np.ndarray | None,
    current: Callable[[Any, int | None], Any],
) -> list[tuple[Any, int | None, Any]]:
    """`fold` of a combination part by part (`values`: `value_columns`; of `agg` itself when
    it is none): each part folded into its place of the combined accumulator (a list), one
    group-by per part. The groups are the same rows in every part, in the same order (of
    their first row)."""
    if not agg.parts:
        return fold(agg, keys, values[0], starts, current)
    per_part = []
    for i, (part, column) in enumerate(zip(agg.parts, values, strict=True)):

        def current_part(key: Any, start: int | None, i: int = i) -> Any:
            acc = current(key, start)
            return MISSING if acc is MISSING else acc[i]

        per_part.append(fold(part, keys, column, starts, current_part))
    first = per_part[0]
    return [
        (key, start, [groups[g][2] for groups in per_part])
        for g, (key, start, _) in enumerate(first)
    ]


def _key_columns(keys: pa.Array | tuple[pa.Array, ...]) -> dict[str, pa.Array]:
    """The key column(s) as group-by columns: ``k`` for one, ``k0``, ``k1``... for a tuple."""
    if isinstance(keys, tuple):
        return {f"k{i}": k for i, k in enumerate(keys)}
    return {"k": keys}


def _group_keys(grouped: pa.Table, names: list[str]) -> list[Any]:
    """The key of each group: its one key column's value, or the tuple of its columns'."""
    if names == ["k"]:
        return grouped.column("k").to_pylist()
    return list(zip(*(grouped.column(n).to_pylist() for n in names), strict=True))


def fold(
    agg: Aggregate,
    keys: pa.Array | tuple[pa.Array, ...],
    values: pa.Array | None,
    starts: np.ndarray | None,
    current: Callable[[Any, int | None], Any],
) -> list[tuple[Any, int | None, Any]]:
    """(key, window start, new accumulator) of every group of rows, by key (and window start
    when `starts` is given), in the order of their first row: the accumulator `current(key,
    start)` (`MISSING`: none yet) with the group's `values` (`value_column`; None for count)
    added as `agg.add` would add them, in row order. `keys` is one column, or a tuple of
    columns whose rows' tuples are the keys (``key_by(["user", "country"])``)."""
    kind = agg.columnar
    columns: dict[str, Any] = _key_columns(keys)
    key_names = list(columns)
    if starts is not None:
        columns["s"] = pa.array(starts, pa.int64())
    specs: list[tuple[Any, str]] = [([], "count_all")]
    if values is not None:
        columns["v"] = values
        specs += {"sum": [("v", "sum")], "mean": [("v", "sum"), ("v", "count")]}.get(
            kind or "", [("v", kind or "")]
        )
    by = [*key_names, *(["s"] if "s" in columns else [])]
    grouped = pa.table(columns).group_by(by, use_threads=False).aggregate(specs)
    group_keys = _group_keys(grouped, key_names)
    group_starts = (
        grouped.column("s").to_pylist() if starts is not None else [None] * len(group_keys)
    )
    currents = [current(k, s) for k, s in zip(group_keys, group_starts, strict=True)]
    if kind == "count":
        counts = grouped.column("count_all").to_pylist()
        news = [
            n if c is MISSING else agg.merge(c, n) for c, n in zip(currents, counts, strict=True)
        ]
    elif kind in ("min", "max"):
        parts = grouped.column(f"v_{kind}").to_pylist()
        news = [
            agg.merge(agg.init() if c is MISSING else c, p)
            for c, p in zip(currents, parts, strict=True)
        ]
    else:
        assert values is not None
        sums = grouped.column("v_sum").to_pylist()
        floats = pa.types.is_floating(values.type)
        olds = [0 if c is MISSING else c[0] if kind == "mean" else c for c in currents]
        redo = [
            i
            for i, (old, part) in enumerate(zip(olds, sums, strict=True))
            if part is not None and _in_order(old, floats)
        ]
        totals = [old if part is None else old + part for old, part in zip(olds, sums, strict=True)]
        if redo:
            again = _sums_after(
                keys, values, starts, [(group_keys[i], group_starts[i], olds[i]) for i in redo]
            )
            for i in redo:
                totals[i] = again[group_keys[i], group_starts[i]]
        if kind == "sum":
            news = totals
        else:
            counts = grouped.column("v_count").to_pylist()
            news = [
                [total, (0 if c is MISSING else c[1]) + n]
                for c, total, n in zip(currents, totals, counts, strict=True)
            ]
    return list(zip(group_keys, group_starts, news, strict=True))


def _in_order(old: Any, floats: bool) -> bool:
    """True when adding a group's values to the sum `old` one by one can give another float
    than adding their sum to it: `old` is a float, or a nonzero int meeting floats (0 + v1 +
    ... is what Arrow computes, 0.0 + v1 + ...). Ints to ints, or another type (which raises
    or adds as the record-wise path does), add at once."""
    return type(old) is float or (type(old) is int and floats and old != 0)


def _sums_after(
    keys: pa.Array | tuple[pa.Array, ...],
    values: pa.Array,
    starts: np.ndarray | None,
    firsts: list[tuple[Any, int | None, Any]],
) -> dict[tuple[Any, int | None], float]:
    """Per (key, start) of `firsts`: its first value (an accumulator) plus its group's `values`
    added one by one in row order, as floats: the group-by again, the accumulators first."""
    rows: dict[str, Any] = _key_columns(keys)
    key_names = list(rows)
    head: dict[str, Any] = {}
    for i, name in enumerate(key_names):
        firsts_of = [k if name == "k" else k[i] for k, _, _ in firsts]
        head[name] = pa.array(firsts_of, rows[name].type)
    head["v"] = pa.array([float(v) for _, _, v in firsts], pa.float64())
    rows["v"] = values.cast(pa.float64(), safe=False)
    if starts is not None:
        head["s"] = pa.array([s for _, s, _ in firsts], pa.int64())
        rows["s"] = pa.array(starts, pa.int64())
    by = [*key_names, *(["s"] if starts is not None else [])]
    table = pa.concat_tables([pa.table(head).select(list(rows)), pa.table(rows)])
    summed = table.group_by(by, use_threads=False).aggregate([("v", "sum")])
    group_starts = summed.column("s").to_pylist() if starts is not None else None
    group_keys = _group_keys(summed, key_names)
    return {
        (k, None if group_starts is None else group_starts[i]): total
        for i, (k, total) in enumerate(
            zip(group_keys, summed.column("v_sum").to_pylist(), strict=True)
        )
    }
