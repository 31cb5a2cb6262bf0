"""Several aggregates per window or running aggregate, and the approximate `count_distinct`
(issue 44): the output schema a user reads (one column per aggregate, named), duplicate names
refused naming both aggregates, and the HLL sketch's estimate: within its documented bound of
the exact count, independent of the order and the merges of the values, kept through a state
snapshot, and a clear error without the library. Pure: no Spark."""

from __future__ import annotations

import datetime as dt
import random
import sys
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.watermarks import MAX_WATERMARK
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.distinct_sketches import MissingSketches, relative_error
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.running_aggregate import RunningAggregate
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.state_codec import StateCodec
from regional.dataflow.windows import (
    Session,
    Tumbling,
    count,
    count_distinct,
    max_of,
    mean_of,
    sum_of,
)
from regional.errors import GraphError
from regional.sources.generator import GeneratorSource

TS = pa.timestamp("us", "UTC")
ORDERS = pa.schema(
    [
        pa.field("user", pa.string(), nullable=False),
        ("amount", pa.float64()),
        ("item", pa.int64()),
        ("ts", pa.int64()),
    ]
)


def _order(split: int, n: int) -> dict[str, Any]:
    return {"user": f"u{n % 3}", "amount": n / 4, "item": n % 7, "ts": n * 100}


def _keyed(p: Pipeline) -> Any:
    src = GeneratorSource(1, _order, records_per_split=4)
    name = f"orders-{len(p.vertices)}"
    return p.source(src, name=name, schema=ORDERS, event_time="ts").key_by("user")


def _rows(op: Any, batches: list[pa.RecordBatch]) -> list[dict[str, Any]]:
    """What `op` emits over `batches` (one epoch each, state through its snapshot), the last
    epoch's watermark closing every window."""
    blob, rows = b"", []
    for n, batch in enumerate(batches):
        state = OperatorState.from_bytes(blob, operator=op.name)
        end = MAX_WATERMARK if n == len(batches) - 1 else 0
        scopes = ["p", KEY_SCOPE]  # a forward chain's (per split) or after an exchange
        time = EpochTime(0, start=dict.fromkeys(scopes, 0), end=dict.fromkeys(scopes, end),
                         key_split="p")  # fmt: skip
        out, _ = op.run([("p", batch)], [0], state, DeadLetters(n, {"p": "0"}), time)
        for _, emitted in out:
            rows += emitted.to_pylist() if isinstance(emitted, pa.RecordBatch) else emitted
        blob = op.snapshot(state, scopes) or b""
    return rows


def test_a_window_with_several_aggregates_has_one_named_column_each() -> None:
    p = Pipeline("several")
    window = _keyed(p).window(
        Tumbling("1 s"),
        aggregate=[count(), sum_of("amount"), max_of("amount").alias("top"),
                   count_distinct("item", exact=False)],
        name="w",
    )  # fmt: skip
    assert window.schema == pa.schema(
        [
            pa.field("user", pa.string(), nullable=False),
            pa.field("window_start", TS, nullable=False),
            pa.field("window_end", TS, nullable=False),
            pa.field("count", pa.int64(), nullable=False),
            pa.field("sum_amount", pa.float64(), nullable=False),
            ("top", pa.float64()),
            pa.field("approx_count_distinct_item", pa.int64(), nullable=False),
        ]
    )
    op = p.vertices[window.vertex_id].operator
    batch = pa.RecordBatch.from_pylist([_order(0, n) for n in range(12)], schema=ORDERS)
    rows = _rows(op, [batch.slice(0, 5), batch.slice(5)])
    assert rows[0] == {
        "user": "u0",
        "window_start": dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
        "window_end": dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC),
        "count": 4,  # n = 0, 3, 6, 9
        "sum_amount": (0 + 3 + 6 + 9) / 4,
        "top": 9 / 4,
        "approx_count_distinct_item": 4,  # items 0, 3, 6, 2
    }
    assert len(rows) == 5  # 3 users in [0 s, 1 s), u1 and u2 (n = 10, 11) in [1 s, 2 s)


def test_a_running_aggregate_takes_several_aggregates_as_pyspark_agg_does() -> None:
    p = Pipeline("running")
    totals = _keyed(p).aggregate(count(), mean_of("amount"), name="totals")
    assert totals.schema is not None
    assert totals.schema.names == ["user", "count", "mean_amount"]
    as_list = _keyed(p).aggregate([count(), mean_of("amount")], name="totals-2")
    assert as_list.schema == totals.schema
    op = p.vertices[totals.vertex_id].operator
    assert isinstance(op, RunningAggregate)
    batch = pa.RecordBatch.from_pylist([_order(0, n) for n in range(4)], schema=ORDERS)
    assert _rows(op, [batch]) == [
        {"user": "u0", "count": 2, "mean_amount": (0 + 3 / 4) / 2},
        {"user": "u1", "count": 1, "mean_amount": 1 / 4},
        {"user": "u2", "count": 1, "mean_amount": 2 / 4},
    ]


def test_without_a_schema_the_value_of_several_aggregates_is_a_dict_by_column() -> None:
    p = Pipeline("plain")
    src = GeneratorSource(1, _order, records_per_split=4)
    keyed = p.source(src, name="orders", event_time="ts").key_by(lambda r: r["user"])
    window = keyed.window(Session("1 s"), aggregate=[count(), sum_of("amount")], name="s")
    op = p.vertices[window.vertex_id].operator
    rows = _rows(op, [[_order(0, n) for n in range(6)]])  # type: ignore[list-item]
    assert [r["value"] for r in rows if r["key"] == "u1"] == [{"count": 2, "sum_amount": 1.25}]


def test_two_aggregates_filling_one_column_are_refused_naming_both() -> None:
    p = Pipeline("twice")
    with pytest.raises(GraphError) as info:
        _keyed(p).window(Tumbling("1 s"), aggregate=[sum_of("amount"), count().alias("sum_amount")],
                         name="w")  # fmt: skip
    assert str(info.value) == (
        "window 'w': sum_of('amount') and count().alias('sum_amount') both fill the column "
        "'sum_amount'; name one otherwise with .alias('...')"
    )
    with pytest.raises(GraphError, match=r"aggregate 'r': .*count.* is no aggregate.*call it"):
        _keyed(p).aggregate([count, sum_of("amount")], name="r")  # type: ignore[list-item]
    with pytest.raises(GraphError, match="the column 'user' twice"):
        _keyed(p).aggregate([count().alias("user"), sum_of("amount")], name="r")


# -- the approximate count_distinct ------------------------------------------------------------


def _estimate(values: list[Any], lg_k: int, parts: int = 1) -> int:
    """The estimate of `values` added in `parts` accumulators, merged in order."""
    agg = count_distinct("v", exact=False, lg_k=lg_k)
    size = -(-len(values) // parts) if values else 1
    accs = []
    for i in range(0, max(len(values), 1), size):
        acc = agg.init()
        for v in values[i : i + size]:
            acc = agg.add(acc, {"v": v})
        accs.append(acc)
    acc = accs[0]
    for other in accs[1:]:
        acc = agg.merge(acc, other)
    return int(agg.result(acc))


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    distinct=st.integers(0, 30_000),
    lg_k=st.sampled_from([8, 10, 12]),
    seed=st.integers(0, 2**32 - 1),
    parts=st.integers(1, 4),
)
def test_the_estimate_is_within_its_bound_and_the_same_in_any_order_and_merges(
    distinct: int, lg_k: int, seed: int, parts: int
) -> None:
    rng = random.Random(seed)
    values: list[Any] = [rng.randrange(2**40) for _ in range(distinct)]
    values += [None, *rng.sample(values, min(len(values), 50))]  # repeats and a null
    rng.shuffle(values)
    exact = len({v for v in values if v is not None})
    estimate = _estimate(values, lg_k)
    # 3 standard deviations (99.7%); the inputs are fixed (derandomized), so it cannot flake
    assert abs(estimate - exact) <= relative_error(lg_k, 3) * exact + 1
    reordered = values[::-1]
    assert _estimate(reordered, lg_k, parts) == estimate


def test_the_sketch_is_exact_for_few_values_and_takes_any_value() -> None:
    values = ["a", "b", 1, 1.5, True, dt.date(2026, 1, 1), b"x", "a", 1]
    assert _estimate(values, 12) == 7


def test_a_sketch_in_state_survives_a_snapshot_and_a_rescale_of_its_key() -> None:
    agg = count_distinct("v", exact=False)
    acc = agg.init()
    for n in range(5_000):
        acc = agg.add(acc, {"v": n})
    codec = StateCodec()
    blob = codec.encode({"s": {"k": {"a": acc}}}, {}, operator="w")
    keyed, _ = codec.decode(blob, operator="w", source="chk-1/u0.state")
    restored = keyed["s"]["k"]["a"]
    assert agg.result(restored) == agg.result(acc)
    more = agg.add(restored, {"v": 5_000})
    assert agg.result(more) == _estimate(list(range(5_001)), 12)


def test_a_damaged_sketch_in_state_is_refused_naming_the_file() -> None:
    from msgspec.msgpack import Ext, encode

    blob = b"\xc1RSM\x01" + encode([{"s": {"k": {"a": Ext(9, b"\x00garbage")}}}, {}])
    with pytest.raises(Exception, match=r"chk-1/u0.state.*does not decode"):
        StateCodec().decode(blob, operator="w", source="chk-1/u0.state")


def test_lg_k_out_of_range_is_refused_with_the_range() -> None:
    with pytest.raises(ValueError, match=r"lg_k=30.*from 7 to 21"):
        count_distinct("v", exact=False, lg_k=30)


def test_without_datasketches_the_error_says_what_to_install(monkeypatch: Any) -> None:
    monkeypatch.setitem(sys.modules, "datasketches", None)
    with pytest.raises(MissingSketches, match=r"install regional-checkpoints\[sketches\]"):
        count_distinct("user", exact=False)


def test_a_sketch_whose_sizes_lie_is_refused_before_the_library_reads_it() -> None:
    """DataSketches' C++ deserializer trusts the preamble's sizes: a set-mode sketch claiming
    2**224 slots corrupted the heap (the process aborted). `decode` refuses it first."""
    from regional.dataflow.distinct_sketches import decode, encode

    agg = count_distinct("v", exact=False)
    acc = agg.init()
    for n in range(10):  # set mode
        acc = agg.add(acc, {"v": n})
    lying = bytearray(encode(acc))
    lying[4] = 224
    with pytest.raises(ValueError, match="inconsistent HLL preamble"):
        decode(bytes(lying))


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    distinct=st.sampled_from([0, 5, 10, 200, 5000]),
    lg_k=st.sampled_from([7, 12]),
    edits=st.lists(st.tuples(st.integers(0, 2**16), st.integers(0, 255)), min_size=1, max_size=4),
    cut=st.one_of(st.none(), st.integers(0, 2**16)),
)
def test_damaged_sketch_bytes_decode_or_raise_never_crash(
    distinct: int, lg_k: int, edits: list[tuple[int, int]], cut: int | None
) -> None:
    from regional.dataflow.distinct_sketches import decode, encode

    agg = count_distinct("v", exact=False, lg_k=lg_k)
    acc = agg.init()
    for n in range(distinct):
        acc = agg.add(acc, {"v": n})
    data = bytearray(encode(acc))
    for at, byte in edits:
        data[at % len(data)] = byte
    if cut is not None:
        data = data[: cut % (len(data) + 1)]
    try:
        sketch = decode(bytes(data))
    except ValueError:
        return
    agg.result(agg.merge(agg.add(sketch, {"v": -1}), acc))  # usable, whatever it counts
