"""Deduplication within a watermark (`regional.dataflow.dedup`, DESIGN §4 rule 19): the operator
against its definition over random epochs and watermarks; a job whose events are redelivered by
several splits keeps each event once, equal to the fault-free run under faults and a crash."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orders_job
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
from regional.dataflow.dedup import Dedup, DropDuplicates
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.errors import GraphError
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

_epoch = st.tuples(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)), max_size=8),
                   st.integers(0, 25))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(epochs=st.lists(_epoch, min_size=1, max_size=6), within=st.integers(0, 20))
def test_a_record_goes_through_unless_it_is_late_or_within_of_its_keys_last(
    epochs: list[Any], within: int
) -> None:
    op = DropDuplicates(
        Dedup(within_ms=within), lambda r: r["k"], lambda r: r["ts"], name="d", scope="key"
    )
    blob = OperatorState(operator="d").to_bytes()
    watermark, got, want = MIN_WATERMARK, [], []
    last: dict[int, int] = {}
    n = 0
    for rows, step in [*epochs, ([], None)]:
        end = (
            MAX_WATERMARK
            if step is None
            else (0 if watermark == MIN_WATERMARK else watermark) + step
        )
        records = []
        for k, ts in rows:
            records.append({"k": k, "ts": ts, "n": n})
            if ts >= watermark and (k not in last or ts > last[k] + within):
                last[k] = ts
                want.append(n)
            n += 1
        state = OperatorState.from_bytes(blob, operator="d", source="test")
        time = EpochTime(0, start={KEY_SCOPE: watermark}, end={KEY_SCOPE: end}, key_split="p")
        out, _ = op.run([("p", records)], [watermark], state, None, time)
        got += [r["n"] for _, rs in out for r in rs]
        blob = state.to_bytes()
        watermark = end
    assert got == want
    assert KEY_SCOPE not in OperatorState.from_bytes(blob, operator="d", source="t").keyed


_split_epoch = st.tuples(
    st.lists(st.tuples(st.sampled_from("ab"), st.integers(0, 2), st.integers(0, 60)), max_size=10),
    st.tuples(st.integers(0, 25), st.integers(0, 25)),
)


@settings(max_examples=300, deadline=None)
@given(epochs=st.lists(_split_epoch, min_size=1, max_size=6), within=st.integers(0, 20))
def test_on_a_forward_chain_each_split_keeps_its_own_keys(epochs: list[Any], within: int) -> None:
    """Without an exchange the state is per (split, key): the same definition, applied to each
    split's records in its order against its own watermark, whatever the epoch cuts."""
    op = DropDuplicates(Dedup(within_ms=within), lambda r: r["k"], lambda r: r["ts"], name="d")
    blob = OperatorState(operator="d").to_bytes()
    watermark = {"a": MIN_WATERMARK, "b": MIN_WATERMARK}
    last: dict[tuple[str, int], int] = {}
    got: list[int] = []
    want: list[int] = []
    n = 0
    for rows, steps in [*epochs, ([], None)]:
        end = {
            split: MAX_WATERMARK if steps is None else max(w, 0) + step
            for (split, w), step in zip(watermark.items(), steps or (0, 0), strict=True)
        }
        chunks: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
        for split, k, ts in rows:
            chunks[split].append({"k": k, "ts": ts, "n": n})
            first = last.get((split, k))
            if ts >= watermark[split] and (first is None or ts > first + within):
                last[split, k] = ts
                want.append(n)
            n += 1
        state = OperatorState.from_bytes(blob, operator="d", source="test")
        time = EpochTime(0, start=dict(watermark), end=end)
        out, _ = op.run(list(chunks.items()), list(watermark.values()), state, None, time)
        got += [r["n"] for _, rs in out for r in rs]
        blob = state.to_bytes()
        watermark = end
    assert sorted(got) == sorted(want)
    assert not OperatorState.from_bytes(blob, operator="d", source="t").keyed


SPLITS, PER_SPLIT, PER_EPOCH = 3, 40, 7


def delivery(split: int, n: int) -> dict[str, Any]:
    """Delivery n of split `split`: event e = n // 2 + split * 3 (each event is delivered by
    two or three splits, some twice by one), about one per second."""
    e = n // 2 + split * 3
    return {"event": e, "ts": 50_000 + e * 1_000, "payload": f"e{e}"}


def dedup_pipeline(table: str, *, partitions: int = 2) -> Pipeline:
    p = Pipeline("dedup", records_per_epoch=PER_EPOCH)
    (
        p.source(
            GeneratorSource(SPLITS, delivery, records_per_split=PER_SPLIT),
            parallelism=SPLITS,
            name="deliveries",
            event_time="ts",
            max_out_of_orderness="30 s",
        )
        .key_by("event", partitions=partitions, name="by-event")
        .drop_duplicates(within="1 min", name="once")
        .sink(ParquetSink(table), name="out")
    )
    return p


def _driver(tmp_path: Path, faults: Faults | None = None, *, partitions: int = 2) -> JobDriver:
    p = dedup_pipeline(str(tmp_path / "table"), partitions=partitions)
    root = str(tmp_path / "ckpt")
    faults = faults or Faults()
    env = TaskEnv(root, "dedup", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "dedup"),
                     faults=faults)  # fmt: skip


def _events(tmp_path: Path) -> Counter[int]:
    return Counter(r["event"] for r in read_table(str(tmp_path / "table")).to_pylist())


def test_every_event_delivered_by_several_splits_is_kept_once(tmp_path: Path) -> None:
    assert _driver(tmp_path).run().finished
    events = {delivery(s, n)["event"] for s in range(SPLITS) for n in range(PER_SPLIT)}
    assert _events(tmp_path) == Counter(events)


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_faults_and_a_crash_keep_every_event_once(tmp_path: Path, step: str) -> None:
    faults = Faults(units={(2, 0): "fail", (3, 1): "fail", (4, 3): "fail"}, crash_at=(5, step))
    with pytest.raises(DriverCrash):
        _driver(tmp_path, faults).run()
    assert _driver(tmp_path).run().finished
    events = {delivery(s, n)["event"] for s in range(SPLITS) for n in range(PER_SPLIT)}
    assert _events(tmp_path) == Counter(events)


def test_a_rescale_after_the_exchange_moves_each_keys_kept_time(tmp_path: Path) -> None:
    """2 dedup subtasks for three checkpoints, then 3, then 1: every event kept once, as in the
    fault-free run (a key's kept time moves with the key, so a redelivery after the rescale is
    still dropped)."""
    assert _driver(tmp_path / "clean").run().finished
    for partitions in (2, 3):
        assert not _driver(tmp_path, partitions=partitions).run(max_checkpoints=3).finished
    summary = _driver(tmp_path, partitions=1).run()
    assert summary.finished and summary.restored_from is not None
    assert _events(tmp_path) == _events(tmp_path / "clean")
    events = {delivery(s, n)["event"] for s in range(SPLITS) for n in range(PER_SPLIT)}
    assert _events(tmp_path) == Counter(events)


def test_a_bad_within_names_the_operator() -> None:
    p = Pipeline("bad")
    src = p.source(GeneratorSource(1, delivery, records_per_split=2), name="s", event_time="ts")
    with pytest.raises(GraphError) as info:
        src.key_by("event").drop_duplicates(within="forever", name="once")
    assert str(info.value) == (
        "drop_duplicates 'once': within='forever'; give a duration of 0 to 365 days: "
        '"500 ms", "5 s", "1 min", "30 d", a datetime.timedelta or a number of seconds'
    )
