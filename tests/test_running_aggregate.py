"""The running keyed aggregate (`key_by(k).aggregate(...)`, DESIGN §4 rule 21): a row per key
with records in the epoch, ordered by key; over Arrow columns the same rows and state as
record by record, for any data cut into any epochs; dead letters; the graph errors; a job run
in this process without event time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orders_job
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from windows_job import canonical

from metadata.storage import JobStorage
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.keys import FieldKey
from regional.dataflow.pipeline import KeyedOnlyError, Pipeline
from regional.dataflow.running_aggregate import RunningAggregate
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.state_codec import StateTypeError
from regional.dataflow.windows import Aggregate, count, max_of, mean_of, min_of, sum_of
from regional.errors import GraphError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

AGGREGATES = {"count": count(), "sum": sum_of("v"), "min": min_of("v"), "max": max_of("v"),
              "mean": mean_of("v")}  # fmt: skip
_ints = st.one_of(st.integers(-1000, 1000), st.integers(-(2**62), 2**62))
_floats = st.one_of(
    st.sampled_from([0.0, -0.0, 0.1, 0.2, 0.3, 1.0, 1e16, -1e16]), st.floats(width=64)
)


@st.composite
def _chunk(draw: st.DrawFn) -> tuple[str, list[dict[str, Any]]]:
    """(split, records whose values are all ints or all floats, or None)."""
    values = draw(st.sampled_from([_ints, _floats]))
    row = st.fixed_dictionaries(
        {"k": st.one_of(st.sampled_from(["a", "b", "c"]), st.none()),
         "v": st.one_of(st.none(), values)}
    )  # fmt: skip
    return draw(st.sampled_from("pq")), draw(st.lists(row, min_size=1, max_size=8))


def _run(epochs: list[Any], columnar: bool, aggregate: str, scope: str) -> tuple[str, str]:
    """The rows of every epoch and the state after it, the state restored from its snapshot
    between epochs (`canonical`: floats bit for bit)."""
    op = RunningAggregate(AGGREGATES[aggregate], FieldKey("k"), name="agg", scope=scope)
    blob, rows, states = b"", [], []
    for chunks in epochs:
        state = OperatorState.from_bytes(blob, operator="agg")
        data = []
        for split, records in chunks:
            batch = pa.RecordBatch.from_pylist(records)  # as an exchange hands them
            data.append((split, batch if columnar else batch.to_pylist()))
        out, _ = op.run(data, None, state, None, None)
        rows.append(out)
        states.append(state.keyed)
        try:
            blob = op.snapshot(state, ["p", "q"]) or b""
        except StateTypeError as exc:  # a sum beyond 64 bits: both paths fail alike
            rows.append(str(exc))
            break
    return canonical(rows), canonical(states)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.lists(_chunk(), max_size=3), min_size=1, max_size=5),
    st.sampled_from(sorted(AGGREGATES)),
    st.sampled_from(["key", "split"]),
)
def test_columnar_running_aggregates_equal_the_record_wise_path(
    epochs: list[Any], aggregate: str, scope: str
) -> None:
    assert _run(epochs, True, aggregate, scope) == _run(epochs, False, aggregate, scope)


def test_a_row_per_key_with_records_in_the_epoch_ordered_by_key(monkeypatch: Any) -> None:
    import regional.dataflow.running_aggregate as ra

    folded: list[int] = []
    real = ra.fold

    def spy(*args: Any) -> Any:
        folded.append(len(args[1]))
        return real(*args)

    monkeypatch.setattr(ra, "fold", spy)
    op = RunningAggregate(max_of("v"), FieldKey("k"), name="agg", scope="key")
    state = OperatorState(operator="agg")
    first = pa.RecordBatch.from_pylist([{"k": "b", "v": 3}, {"k": "a", "v": 1}, {"k": "b", "v": 5}])
    out, _ = op.run([("x", first)], None, state, None, None)
    assert out == [("x", [{"key": "a", "value": 1}, {"key": "b", "value": 5}])]
    # "b" had a record but kept its value: still a row; "a" had none: no row
    out, _ = op.run(
        [("x", pa.RecordBatch.from_pylist([{"k": "b", "v": 4}]))], None, state, None, None
    )
    assert out == [("x", [{"key": "b", "value": 5}])]
    assert folded == [3, 1]  # both batches over Arrow columns
    assert state.keyed == {KEY_SCOPE: {"a": {"a": 1}, "b": {"a": 5}}}


def test_records_whose_key_or_aggregate_raises_are_dead_letters() -> None:
    def add(acc: int, record: Any) -> int:
        return acc + int(record["v"])

    op = RunningAggregate(Aggregate(lambda: 0, add, int.__add__, int), FieldKey("k"), name="agg")
    state, dead = OperatorState(operator="agg"), DeadLetters(1, {"p": "0"})
    records = [{"k": "a", "v": "1"}, {"v": "2"}, {"k": "a", "v": "x"}, {"k": "a", "v": "3"}]
    out, _ = op.run([("p", records)], None, state, dead, None)
    assert out == [("p", [{"key": "a", "value": 4}])]
    letters = dead.batch(("agg",)).to_pylist()
    assert [(r["record_index"], r["error_type"]) for r in letters] == [
        (1, "KeyError"),
        (2, "ValueError"),
    ]
    with pytest.raises(KeyError):  # without dead letters the unit declines
        op.run([("p", records)], None, OperatorState(operator="agg"), None, None)


def test_the_graph_errors_name_the_aggregate_and_the_fix() -> None:
    p = Pipeline("p")
    stream = p.source(GeneratorSource(1, lambda s, n: {"k": n % 2}, records_per_split=2))
    with pytest.raises(KeyedOnlyError, match=r"aggregate\(\.\.\.\) after 'source-0'"):
        stream.aggregate(count())  # type: ignore[attr-defined]
    with pytest.raises(GraphError) as error:
        stream.key_by("k").aggregate(count, name="totals")  # type: ignore[arg-type]
    assert str(error.value).startswith("aggregate 'totals': agg=<function count at ") and str(
        error.value
    ).endswith(
        "is no aggregate (call it: count(), not count); give count(), sum_of('field'), "
        "min_of('field'), max_of('field'), mean_of('field') or an Aggregate(init, add, merge, "
        "result)"
    )


def order(split: int, n: int) -> dict[str, Any]:
    return {"customer": f"c{(n * 5 + split) % 4}", "amount": n % 9}


def _totals_job(table: str) -> Pipeline:
    """orders of 3 splits (no event time) -> exchange by customer -> running mean."""
    p = Pipeline("totals", records_per_epoch=7)
    (
        p.source(GeneratorSource(3, order, records_per_split=40), parallelism=3, name="orders")
        .key_by("customer", partitions=2, name="by-customer")
        .aggregate(mean_of("amount"), emit=lambda k, v: {"customer": k, "mean": v}, name="means")
        .sink(ParquetSink(table), name="out")
    )
    return p


def test_a_job_without_event_time_commits_each_keys_running_value(tmp_path: Path) -> None:
    table, root = str(tmp_path / "table"), str(tmp_path / "ckpt")
    p = _totals_job(table)
    assert not p.timed
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    env = TaskEnv(root, "totals", p, unit_timeout=30)
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "totals"), policy=policy
    )
    assert driver.run().finished
    last: dict[str, float] = {}
    for row in read_table(table).to_pylist():  # in commit order: the last row is the value
        last[row["customer"]] = row["mean"]
    amounts: dict[str, list[int]] = {}
    for r in (order(s, n) for s in range(3) for n in range(40)):
        amounts.setdefault(r["customer"], []).append(r["amount"])
    assert last == {c: sum(v) / len(v) for c, v in amounts.items()}
