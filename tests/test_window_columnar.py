"""Counting tumbling windows over Arrow columns (a field key, a field event time, `count()`)
gives exactly what the record-wise path gives: the rows and their order, the late records and
their dead letters, the state after each epoch, for any data cut into any epochs."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.watermarks import MAX_WATERMARK
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.keys import FieldKey
from regional.dataflow.operators import WindowOp
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.window_operator import WindowSpec
from regional.dataflow.windows import Tumbling, count

_row = st.fixed_dictionaries(
    {"k": st.one_of(st.sampled_from(["a", "b"]), st.none()), "ts": st.integers(0, 9_999)}
)
_epoch = st.tuples(st.lists(st.lists(_row, min_size=1, max_size=8), max_size=3),
                   st.integers(0, 3_000))  # fmt: skip


def _op() -> WindowOp:
    spec = WindowSpec(Tumbling("1 s", offset="0.25 s"), count(), time_of=lambda r: r["ts"],
                      time_field="ts", allowed_lateness="0.5 s", on_late="dead-letter")  # fmt: skip
    return WindowOp(spec, FieldKey("k"), name="win", scope="key")


def _run(epochs: list[Any], columnar: bool) -> tuple[list[Any], list[Any], list[Any], int]:
    op, state, rows, dead_rows, late = _op(), OperatorState(operator="win"), [], [], 0
    watermark = 0
    for n, (chunks, step) in enumerate([*epochs, ([], None)]):
        end = MAX_WATERMARK if step is None else watermark + step
        batches = [pa.RecordBatch.from_pylist(c) for c in chunks]  # as an exchange hands them
        data = [("p", b if columnar else b.to_pylist()) for b in batches]
        time = EpochTime(0, start={KEY_SCOPE: watermark}, end={KEY_SCOPE: end}, key_split="p")
        dead = DeadLetters(n, {"p": str(n)})
        out, _ = op.run(data, [watermark] * len(data), state, dead, time)
        rows += [r for _, batch in out for r in batch]
        dead_rows += [(r["record"], r["record_index"], r["error_message"])
                      for r in dead.batch(("win",)).to_pylist()]  # fmt: skip
        late += time.late
        watermark = end
    return rows, dead_rows, [state.keyed], late


@settings(max_examples=300, deadline=None)
@given(st.lists(_epoch, min_size=1, max_size=5))
def test_columnar_counts_equal_the_record_wise_path(epochs: list[Any]) -> None:
    assert _run(epochs, columnar=True) == _run(epochs, columnar=False)


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


def test_arrow_batches_keyed_and_timed_by_fields_take_the_columnar_path(monkeypatch: Any) -> None:
    import regional.dataflow.window_operator as wo

    counted: list[bool] = []
    real = wo._count_batch

    def spy(*args: Any) -> bool:
        counted.append(real(*args))
        return counted[-1]

    monkeypatch.setattr(wo, "_count_batch", spy)
    rows, _, _, _ = _run([([[{"k": "a", "ts": 5}, {"k": "a", "ts": 7}]], 0)], columnar=True)
    assert counted == [True]
    assert [r["value"] for r in rows] == [2]


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
