"""Records whose event time cannot be used (issue 32 §3): a time at or past the int64 ends, a
huge int, None, NaN, a float, a string, a bool, a missing field, an `event_time` function that
raises. None is ever silently dropped: with `on_error="dead-letter"` each is a dead letter
(the record and the reason), else its unit declines naming the source, the function, the split
and position, and the record. The driver runs the real task code in this process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from metadata.storage import JobStorage
from regional.dataflow.event_time import (
    EARLIEST_EVENT_TIME,
    LATEST_EVENT_TIME,
    EventTime,
    EventTimeError,
)
from regional.dataflow.pipeline import Pipeline
from regional.errors import JobFailedError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

#: The event times of split 0's records 1..9 (the others have ts = n * 1000).
BAD = {
    1: 2**63 - 1,  # the +inf watermark: its window could never fire
    2: 2**63,  # past int64
    3: 10**30,
    4: None,
    5: float("nan"),
    6: 1500.0,
    7: "12:00",
    8: True,
    9: LATEST_EVENT_TIME + 1,
}


def test_records_without_a_usable_event_time_are_taken_out_with_the_reason():
    et = EventTime("ts", "1 s")
    rows = [{"n": n, "ts": BAD.get(n, n * 1000)} for n in range(12)] + [{"n": 12}]
    stamped = et.stamp(
        [pa.RecordBatch.from_pylist(rows[:1]), rows[1:]], source="src", split="g0", position="7"
    )
    assert [
        r["n"] for b in stamped.batches for r in (b if isinstance(b, list) else b.to_pylist())
    ] == [0, 10, 11]
    assert stamped.stamps == [0, 10_000, 11_000]
    assert [i for i, _, _ in stamped.rejected] == [*BAD, 12]
    reasons = {i: str(e) for i, _, e in stamped.rejected}
    assert reasons[1] == (
        "the event time of record {'n': 1, 'ts': 9223372036854775807} (split 'g0', record 1 "
        "read from position 7) is 9223372036854775807 ms, outside the supported event times "
        "(0002-01-01T00:00:00.000Z to 9998-12-31T23:59:59.999Z), given by the event_time "
        "field 'ts' of source 'src'; fix the function or the record, or run the pipeline "
        "with on_error='dead-letter' to set such records aside"
    )
    assert "is None (NoneType); it must be a datetime (naive = UTC) or an int" in reasons[4]
    assert "is nan (float); it must be" in reasons[5]
    assert "is 1500.0 (float)" in reasons[6] and "is '12:00' (str)" in reasons[7]
    assert "is True (bool)" in reasons[8]
    assert reasons[12] == (
        "the event_time field 'ts' of source 'src' is missing from record {'n': 12} (split "
        "'g0', record 12 read from position 7); give every record that field, or run the "
        "pipeline with on_error='dead-letter' to set such records aside"
    )
    edges = [{"ts": EARLIEST_EVENT_TIME}, {"ts": LATEST_EVENT_TIME}]
    assert et.stamp([edges], source="s", split="x", position="").stamps == [
        EARLIEST_EVENT_TIME,
        LATEST_EVENT_TIME,
    ]


def _record(split: int, n: int) -> dict:
    if split == 0 and n in BAD:
        return {"n": n, "ts": BAD[n]}
    return {"n": n, "ts": n * 1000} if (split, n) != (1, 3) else {"n": n, "time": 3000}


def _pipeline(tmp_path: Path, on_error: str, event_time: Any = "ts") -> Pipeline:
    """2 splits of 12 records, 5 per epoch, straight into a sink (no operator)."""
    dead = ParquetSink(str(tmp_path / "dead")) if on_error == "dead-letter" else None
    p = Pipeline("stamps", records_per_epoch=5, on_error=on_error, dead_letter=dead)
    src = p.source(
        GeneratorSource(2, _record, records_per_split=12),
        parallelism=2,
        name="src",
        event_time=event_time,
    )
    src.sink(ParquetSink(str(tmp_path / "out")), name="out")
    return p


def _driver(tmp_path: Path, p: Pipeline, **policy: Any) -> JobDriver:
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", **policy}}
    env = TaskEnv(root, "stamps", p, unit_timeout=10)
    return JobDriver(
        p,
        InProcessDispatcher(env),
        storage=JobStorage(root, "stamps"),
        policy=load_policy(env={}, overrides=overrides).policy,
    )


def test_every_record_without_a_usable_event_time_is_a_dead_letter(tmp_path):
    summary = _driver(tmp_path, _pipeline(tmp_path, "dead-letter")).run()
    assert summary.finished
    out = read_table(str(tmp_path / "out")).to_pylist()
    good = [(0, n) for n in range(12) if n not in BAD] + [(1, n) for n in range(12) if n != 3]
    assert sorted((r["n"], r["ts"]) for r in out) == sorted((n, n * 1000) for _, n in good)
    dead = read_table(str(tmp_path / "dead")).to_pylist()
    got = sorted((r["split_id"], json.loads(r["record"])["n"]) for r in dead)
    assert got == [("g0", n) for n in BAD] + [("g1", 3)]
    assert {r["operator"] for r in dead} == {"src"} and {r["error_type"] for r in dead} == {
        "EventTimeError"
    }
    [missing] = [r for r in dead if r["split_id"] == "g1"]
    assert (missing["split_position"], missing["record_index"]) == ("", 3)  # "": the start
    assert missing["error_message"].startswith(
        "the event_time field 'ts' of source 'src' is missing from record {'n': 3, 'time': 3000}"
    )


def test_without_dead_letters_the_decline_names_the_function_the_record_and_the_fix(tmp_path):
    def stamp(record: dict) -> int:
        return record["timestamp"]

    p = _pipeline(tmp_path, "fail", event_time=stamp)
    driver = _driver(tmp_path, p, **{"tolerable-failed-checkpoints": 0})
    with pytest.raises(JobFailedError):
        driver.run()
    event = driver.last_event
    assert event is not None
    assert event.causes[0] == (
        "declined: EventTimeError: the event_time function "
        "test_without_dead_letters_the_decline_names_the_function_the_record_and_the_fix."
        "<locals>.stamp of source 'src' raised KeyError: 'timestamp' on record {'n': 0, "
        "'ts': 0} (split 'g0', record 0 read from position 0); fix the function or the "
        "record, or run the pipeline with on_error='dead-letter' to set such records aside"
    )


def test_a_failure_ratio_abort_sends_the_user_to_the_causes_first():
    from fractions import Fraction

    from regional.coordinator.verdict import evaluate

    cause = "declined: EventTimeError: the event_time field 'ts' of source 'src' is missing"
    verdict = evaluate(
        4,
        {1: cause},
        num_units=2,
        max_failure_ratio=Fraction(3, 10),
        must_be_fresh=lambda unit: None,
        unusable=lambda units: None,
        fallback_snapshots=lambda: {},
    )
    assert verdict.message == (
        "checkpoint 4 aborted (rule 3c): 1 of 2 units failed (0.5 > max-failure-ratio 0.3): "
        f"unit 1: {cause}; fix what the causes name (a unit failing on a record or in user "
        "code fails the same way on every retry), or, for failures that pass on their own, "
        "raise checkpointing.region.max-failure-ratio"
    )


def test_event_time_may_name_a_field_and_sources_sharing_it_agree():
    from regional.dataflow.windows import Tumbling, count

    p = Pipeline("fields")
    a = p.source(GeneratorSource(1, _record), name="a", event_time="ts")
    b = p.source(GeneratorSource(1, _record), name="b", event_time="ts")
    a.union(b).key_by(lambda r: r["n"]).window(Tumbling("1 s"), aggregate=count(), name="w")
    assert p.vertices["w"].operator.spec.time_field == "ts"  # type: ignore[union-attr]
    with pytest.raises(EventTimeError, match="the event_time field 'ts' of window 'w' is missing"):
        p.vertices["w"].operator.spec.ts({"n": 1}, "w")  # type: ignore[union-attr]
