"""The exchange writer places every record exactly where the per-record function does
(`partition_of(key(record), N)`): a restored job's keyed state and its unread segments depend on
it. Placing in Arrow (a field key's column, each distinct key hashed once: `Placement`) and
calling a key function per record must agree with it for every kind of key."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.dataflow.exchange import ExchangeWriter
from regional.dataflow.keys import key_function
from regional.dataflow.partitioning import Placement, partition_of

_ZONES = (dt.UTC, dt.timezone(dt.timedelta(hours=2)), dt.timezone(dt.timedelta(hours=-5)))

scalars = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([7, 7.0, True, False, 1, 0, 0.0, -0.0, 1.0, 2**63, float(2**63)]),
    st.booleans(),
    st.text(max_size=6),
    st.sampled_from(["7", "", "a"]),
    st.binary(max_size=4),
    st.none(),
    st.datetimes(),
    st.datetimes(timezones=st.sampled_from(_ZONES)),
)
keys = st.recursive(
    scalars,
    lambda inner: st.one_of(st.tuples(inner, inner), st.lists(inner, max_size=3).map(tuple)),
    max_leaves=6,
)


def _expected(key: Any, partitions: int) -> int | str:
    try:
        return partition_of(key, partitions)
    except TypeError:
        return "TypeError"


def _placed(placement: Placement, key: Any) -> int | str:
    try:
        return placement.of(key)
    except TypeError:
        return "TypeError"


@settings(max_examples=300, deadline=None)
@given(st.lists(keys, max_size=40), st.integers(min_value=1, max_value=1100))
def test_a_placement_places_every_key_as_partition_of(many: list[Any], partitions: int) -> None:
    """Whatever keys came before (remembered ones included, 7 before 7.0 or True, a key
    forgotten when the memory is full), each key's partition is `partition_of`'s."""
    placement = Placement(partitions, remember=7)
    assert [_placed(placement, k) for k in many + many] == [
        _expected(k, partitions) for k in many + many
    ]
    plain = [k for k in many if _expected(k, partitions) != "TypeError"]
    assert placement.of_keys(plain).tolist() == [partition_of(k, partitions) for k in plain]


def _reference(records: list[dict[str, Any]], key: Any, partitions: int) -> dict[int, list[Any]]:
    """The per-record placement the writer had (and a restore relies on)."""
    out: dict[int, list[Any]] = {}
    for r in records:
        out.setdefault(partition_of(key(r), partitions), []).append(r)
    return dict(sorted(out.items()))


column_values = st.sampled_from(
    [
        st.integers(min_value=-5, max_value=5),
        st.floats(allow_nan=False, min_value=-4, max_value=4).map(lambda f: round(f * 2) / 2),
        st.booleans(),
        st.sampled_from(["a", "b", "7", ""]),
        st.sampled_from([dt.datetime(2026, 1, 1, h) for h in range(3)]),
        st.sampled_from([dt.datetime(2026, 1, 1, h, tzinfo=dt.UTC) for h in range(3)]),
    ]
)


@settings(max_examples=120, deadline=None)
@given(
    column_values.flatmap(lambda v: st.lists(st.one_of(v, st.none()), min_size=1, max_size=30)),
    st.integers(min_value=1, max_value=70),
    st.integers(min_value=1, max_value=3),
)
def test_the_writer_places_arrow_rows_as_the_per_record_function(
    values: list[Any], partitions: int, batches: int
) -> None:
    """By a field (its column) and by a key function (called per record), every row of every
    batch lands in the partition the per-record function gives, in record order."""
    records = [{"k": v, "n": i} for i, v in enumerate(values)]
    table = pa.Table.from_pylist(records)
    rows = table.to_pylist()  # the values the key sees (Arrow's: an int column of 7.0 is 7)
    part = table.to_batches(max_chunksize=max(1, len(records) // batches))
    for key in (key_function("k"), lambda r: r["k"], lambda r: (r["k"], r["n"] % 2)):
        [placed] = ExchangeWriter("x", key, partitions).partition_tables([part])
        assert {q: t.to_pylist() for q, t in placed.items()} == _reference(rows, key, partitions)
        assert all(t.schema == table.schema for t in placed.values())


@pytest.mark.parametrize("key", [7, 7.0, True, "7", (7,), (7.0, "a"), None])
def test_equal_keys_meet_in_one_partition_through_the_writer(key: Any) -> None:
    """7, 7.0 and True (and tuples of them) are one key: placed together by a key function
    that returns each, whatever came first."""
    writer = ExchangeWriter("x", lambda r: r["k"], 64)
    mixed = [{"k": k} for k in (7, 7.0, True, 1, 1.0, key)]
    table = pa.Table.from_pylist([{"n": i} for i in range(len(mixed))])
    writer.key = lambda r: mixed[r["n"]]["k"]
    [placed] = writer.partition_tables([table.to_batches()])
    where = {n: q for q, t in placed.items() for n in t.column("n").to_pylist()}
    assert where[0] == where[1] and where[2] == where[3] == where[4]
    assert where[5] == partition_of(key, 64)
