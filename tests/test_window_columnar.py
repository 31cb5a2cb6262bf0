"""Built-in aggregates in tumbling and sliding windows over Arrow columns (a field key, a field
event time) give exactly what the record-wise path gives: the rows and their order (floats bit
for bit), the late records and their dead letters, the state after each epoch, for any data
(ints, floats, None, NaN, sums beyond int64) cut into any epochs with any origin watermarks."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from windows_job import canonical

from metadata.watermarks import MAX_WATERMARK
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.keys import FieldKey
from regional.dataflow.operators import WindowOp
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.state_codec import StateTypeError
from regional.dataflow.window_operator import WindowSpec
from regional.dataflow.windows import (
    Sliding,
    Tumbling,
    combine,
    count,
    max_of,
    mean_of,
    min_of,
    sum_of,
)

AGGREGATES = {"count": count(), "sum": sum_of("v"), "min": min_of("v"), "max": max_of("v"),
              "mean": mean_of("v"),
              "several": combine([count(), sum_of("v"), min_of("v").alias("low"),
                                  max_of("v"), mean_of("v")], "win")}  # fmt: skip
ASSIGNERS = {
    "tumbling": Tumbling("1 s", offset="0.25 s"),
    "sliding": Sliding("1 s", "0.25 s"),
    "sliding, uneven": Sliding("1 s", "0.3 s", offset="0.1 s"),
}
_ints = st.one_of(st.integers(-1000, 1000), st.integers(-(2**62), 2**62))  # the 2nd: no int64
# floats whose sums depend on the order of the additions ((0.1 + 0.2) + 0.3 != 0.1 + (0.2 + 0.3))
_floats = st.one_of(
    st.sampled_from([0.0, -0.0, 0.1, 0.2, 0.3, 1.0, 1e16, -1e16]), st.floats(width=64)
)
_key = st.one_of(st.sampled_from(["a", "b", "c"]), st.none())


@st.composite
def _chunk(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]], int]:
    """(split, records whose values are all ints or all floats (or None), origin step)."""
    values = draw(st.sampled_from([_ints, _floats]))
    row = st.fixed_dictionaries(
        {"k": _key, "ts": st.integers(0, 3_999), "v": st.one_of(st.none(), values)}
    )
    return (
        draw(st.sampled_from("pq")),
        draw(st.lists(row, min_size=1, max_size=8)),
        draw(st.integers(0, 1_500)),
    )


_epoch = st.tuples(st.lists(_chunk(), max_size=3), st.integers(0, 1_500))


def _op(aggregate: str = "count", assigner: str = "tumbling", scope: str = "key") -> WindowOp:
    spec = WindowSpec(ASSIGNERS[assigner], AGGREGATES[aggregate], time_of=lambda r: r["ts"],
                      time_field="ts", allowed_lateness="0.5 s", on_late="dead-letter")  # fmt: skip
    return WindowOp(spec, FieldKey("k"), name="win", scope=scope)


def _run(
    epochs: list[Any], columnar: bool, aggregate: str = "count", assigner: str = "tumbling",
    scope: str = "key",
) -> tuple[str, str, str, int]:  # fmt: skip
    """The rows, dead letters and state after each epoch (their reprs: -0.0 is not 0.0, nan
    is nan) and the late records, the state restored from its snapshot between epochs."""
    op, blob, rows, dead_rows, states, late = _op(aggregate, assigner, scope), b"", [], [], [], 0
    watermark = 0
    scopes = ["p", "q"] if scope == "split" else [KEY_SCOPE]
    for n, (chunks, step) in enumerate([*epochs, ([], None)]):
        state = OperatorState.from_bytes(blob, operator="win")
        end = MAX_WATERMARK if step is None else watermark + step
        data, origins = [], []
        for split, records, origin_step in chunks:
            batch = pa.RecordBatch.from_pylist(records)  # as an exchange hands them
            data.append((split, batch if columnar else batch.to_pylist()))
            origins.append(watermark + origin_step)  # at or above the epoch's start
        time = EpochTime(0, start=dict.fromkeys(scopes, watermark),
                         end=dict.fromkeys(scopes, end), key_split="p")  # fmt: skip
        dead = DeadLetters(n, {"p": str(n), "q": str(n)})
        out, _ = op.run(data, origins, state, dead, time)
        rows += [(split, r) for split, batch in out for r in batch]
        dead_rows += [(r["record"], r["record_index"], r["error_message"])
                      for r in dead.batch(("win",)).to_pylist()]  # fmt: skip
        states.append(state.keyed)
        late += time.late
        watermark = end
        try:
            blob = op.snapshot(state, scopes) or b""
        except StateTypeError as exc:  # a sum beyond 64 bits: both paths fail alike
            rows.append(("snapshot", str(exc)))
            break
    return repr(rows), repr(dead_rows), canonical(states), late


@settings(max_examples=400, deadline=None)
@given(
    st.lists(_epoch, min_size=1, max_size=5),
    st.sampled_from(sorted(AGGREGATES)),
    st.sampled_from(sorted(ASSIGNERS)),
    st.sampled_from(["key", "split"]),
)
@example(  # floats added to a float accumulator: one by one, not as one partial sum
    [([("p", [{"k": "a", "ts": 0, "v": 0.1}], 0)], 0),
     ([("p", [{"k": "a", "ts": 0, "v": 0.2}, {"k": "a", "ts": 0, "v": 0.3}], 0)], 0)],
    "sum", "tumbling", "key",
)  # fmt: skip
def test_columnar_windows_equal_the_record_wise_path(
    epochs: list[Any], aggregate: str, assigner: str, scope: str
) -> None:
    assert _run(epochs, True, aggregate, assigner, scope) == _run(
        epochs, False, aggregate, assigner, scope
    )


def test_a_batch_with_an_event_time_the_columns_cannot_give_goes_the_record_wise_way() -> None:
    op = _op()
    state = OperatorState(operator="win")
    time = EpochTime(0, start={KEY_SCOPE: 0}, end={KEY_SCOPE: MAX_WATERMARK}, key_split="p")
    dead = DeadLetters(1, {"p": "0"})
    batch = pa.RecordBatch.from_pylist([{"k": "a", "ts": 5}, {"k": "a", "ts": None}])
    out, _ = op.run([("p", batch)], [0], state, dead, time)
    assert [r["value"] for _, rows in out for r in rows] == [1]
    [letter] = dead.batch(("win",)).to_pylist()
    assert letter["error_type"] == "EventTimeError" and letter["record_index"] == 1


@pytest.mark.parametrize(
    ("aggregate", "assigner", "values"),
    [
        ("count", "tumbling", [2]),
        ("sum", "tumbling", [3.5]),
        ("min", "tumbling", [1.5]),
        ("max", "tumbling", [2]),
        ("mean", "tumbling", [1.75]),
        ("sum", "sliding", [3.5, 3.5, 3.5, 3.5]),  # 5 and 7 ms are in 4 windows of 1 s
        ("max", "sliding, uneven", [2, 2, 2]),  # in 3 windows of 1 s every 0.3 s
    ],
)
def test_arrow_batches_keyed_and_timed_by_fields_take_the_columnar_path(
    monkeypatch: Any, aggregate: str, assigner: str, values: list[Any]
) -> None:
    import regional.dataflow.window_operator as wo

    folded: list[bool] = []
    real = wo._fold_batch

    def spy(*args: Any) -> bool:
        folded.append(real(*args))
        return folded[-1]

    monkeypatch.setattr(wo, "_fold_batch", spy)
    op, state = _op(aggregate, assigner), OperatorState(operator="win")
    time = EpochTime(0, start={KEY_SCOPE: 0}, end={KEY_SCOPE: MAX_WATERMARK}, key_split="p")
    batch = pa.RecordBatch.from_pylist([{"k": "a", "ts": 5, "v": 1.5}, {"k": "a", "ts": 7, "v": 2}])
    out, _ = op.run([("p", batch)], [0], state, None, time)
    assert folded == [True]
    assert [r["value"] for _, rows in out for r in rows] == values


def test_a_sum_of_skips_none_values_as_the_docs_say() -> None:
    """`sum_of` added None to its accumulator and failed the unit with a TypeError naming
    neither the window nor the record, though the docs say None values are skipped."""
    op, state = _op("sum"), OperatorState(operator="win")
    time = EpochTime(0, start={KEY_SCOPE: 0}, end={KEY_SCOPE: MAX_WATERMARK}, key_split="p")
    records = [
        {"k": "a", "ts": 5, "v": 3},
        {"k": "a", "ts": 6, "v": None},
        {"k": "b", "ts": 7, "v": None},
    ]
    out, _ = op.run([("p", records)], [0], state, None, time)
    assert [(r["key"], r["value"]) for _, rows in out for r in rows] == [("a", 3), ("b", 0)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(-62_000_000_000_000, 253_000_000_000_000), min_size=1, max_size=20),
    st.sampled_from(["int", "s", "ms", "us", "ns"]),
)
def test_a_field_event_time_read_as_a_column_equals_reading_it_record_by_record(
    values: list[int], unit: str
) -> None:
    from regional.dataflow.event_time import EventTime

    if unit == "int":
        column = pa.array(values, pa.int64())
    else:
        scale = {"s": 1 / 1000, "ms": 1, "us": 1000, "ns": 1_000_000}[unit]
        raw = [int(v * scale) if unit != "s" else v // 1000 for v in values]
        if unit == "ns" and any(abs(r) >= 2**63 for r in raw):
            return
        column = pa.array(raw, pa.timestamp(unit, "UTC"))
    batch = pa.RecordBatch.from_arrays([column], ["ts"])
    by_column = EventTime("ts").stamp([batch], source="s", split="p", position="")
    by_record = EventTime(lambda r: r["ts"]).stamp([batch], source="s", split="p", position="")
    assert by_column.stamps == by_record.stamps
    assert [b.num_rows for b in by_column.batches] == [b.num_rows for b in by_record.batches]
