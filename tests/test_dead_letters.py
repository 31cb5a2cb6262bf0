"""Poison records (`Pipeline(on_error="dead-letter", dead_letter=sink)`): the record a user
function raises on goes to the dead-letter table, committed exactly once with its checkpoint
(also across a driver crash and restart), and the job goes on; `on_error="fail"` still fails
the unit. The driver runs the real task code in this process (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from metadata.events import read_events
from metadata.storage import JobStorage
from regional.dataflow.dead_letters import DEAD_LETTER_SCHEMA, DeadLetters
from regional.dataflow.operators import Filter, FlatMap, Map, MapBatches, Process
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.errors import GraphError, JobFailedError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def _check(r: dict) -> dict:
    if (r["split"], r["n"]) == (3, 12):
        raise ValueError(f"n={r['n']} is poison")
    return {"split": r["split"], "n": r["n"], "double": 2 * r["n"]}


def _pipeline(tmp_path: Path, on_error: str = "dead-letter") -> Pipeline:
    """4 splits of 20 records, 5 per epoch; record 12 of split 3 is poison for `check`."""
    dead = ParquetSink(str(tmp_path / "dead")) if on_error == "dead-letter" else None
    p = Pipeline("poison", records_per_epoch=5, on_error=on_error, dead_letter=dead)
    src = p.source(GeneratorSource(4, _record, records_per_split=20), parallelism=4, name="src")
    src.map(_check, name="check").sink(ParquetSink(str(tmp_path / "out")), name="out")
    return p


def _driver(tmp_path: Path, p: Pipeline, region: dict | None = None, **kw: Any) -> JobDriver:
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": region or {}}}
    policy = load_policy(env={}, overrides=overrides).policy
    env = TaskEnv(root, "poison", p, unit_timeout=10)
    storage = JobStorage(root, "poison")
    return JobDriver(p, InProcessDispatcher(env), storage=storage, policy=policy, **kw)


def test_a_poison_record_is_dead_lettered_once_across_a_driver_crash(tmp_path):
    p = _pipeline(tmp_path)
    first = _driver(tmp_path, p, faults=Faults(crash_at=(3, "after-metadata")))
    with pytest.raises(DriverCrash):
        first.run()  # checkpoint 3 (with the dead letter) is durable, not committed
    assert read_table(str(tmp_path / "dead")).num_rows == 0
    second = _driver(tmp_path, _pipeline(tmp_path))
    summary = second.run()
    assert summary.finished and summary.restored_from == 3
    assert {c.kind for c in summary.checkpoints} == {"global"}  # nobody fell back

    out = read_table(str(tmp_path / "out"))
    got = sorted(zip(out.column("split").to_pylist(), out.column("n").to_pylist(), strict=True))
    assert got == sorted((s, n) for s in range(4) for n in range(20) if (s, n) != (3, 12))

    dead = read_table(str(tmp_path / "dead"))
    assert dead.schema == DEAD_LETTER_SCHEMA
    [row] = dead.to_pylist()
    assert {k: v for k, v in row.items() if k != "traceback"} == {
        "checkpoint_id": 3,
        "operator": "check",
        "split_id": "g3",
        "split_position": "10",  # the epoch read split g3 from record 10 on ...
        "record_index": 2,  # ... and this was its third record
        "record": '{"split":3,"n":12}',
        "error_type": "ValueError",
        "error_message": "n=12 is poison",
    }
    assert "in _check" in row["traceback"]
    assert row["traceback"].endswith("ValueError: n=12 is poison\n")

    events, _ = read_events(JobStorage(str(tmp_path / "ckpt"), "poison"))
    # checkpoint 3's event was lost with the crash; its dead letter was committed on restore
    assert [(e.checkpoint_id, e.records_dead_lettered) for e in events] == [
        (1, 0),
        (2, 0),
        (4, 0),
        (5, 0),
    ]
    assert second.metrics.records_dead_lettered == 0  # counted since this driver started


def test_dead_letter_counts_reach_the_events_and_the_metrics(tmp_path):
    driver = _driver(tmp_path, _pipeline(tmp_path))
    summary = driver.run()
    assert [e.records_dead_lettered for e in summary.checkpoints] == [0, 0, 1, 0, 0]
    assert driver.metrics.records_dead_lettered == 1
    assert read_table(str(tmp_path / "dead")).column("checkpoint_id").to_pylist() == [3]


def test_on_error_fail_still_fails_the_unit_until_the_job_fails(tmp_path):
    p = _pipeline(tmp_path, on_error="fail")
    assert "dead-letters" not in p.vertices
    # force-fresh: unit 3 must be fresh after 3 fallbacks, so every checkpoint aborts (the
    # default, isolate, keeps the others committing until max-stuck-time: tests/test_stuck_units)
    with pytest.raises(JobFailedError, match="unit 3"):
        _driver(tmp_path, p, region={"on-unit-fallback-limit": "force-fresh"}).run()
    events, _ = read_events(JobStorage(str(tmp_path / "ckpt"), "poison"))
    assert events[2].causes == {3: "declined: ValueError: n=12 is poison"}


def test_the_dead_letter_sink_merges_no_regions():
    def build(**kw: Any) -> Pipeline:
        p = Pipeline("two-chains", **kw)
        a = p.source(GeneratorSource(3, _record), parallelism=3, name="a")
        a.filter(bool, name="fa").map(dict, name="ma").sink(ParquetSink("/unused/a"), name="oa")
        b = p.source(GeneratorSource(2, _record), parallelism=2, name="b")
        b.flat_map(lambda r: [r], name="fb").sink(ParquetSink("/unused/b"), name="ob")
        p.source(GeneratorSource(2, _record), parallelism=2, name="c").sink(
            ParquetSink("/unused/c"), name="oc"
        )
        return p

    plain = build().regions()
    dead = build(on_error="dead-letter", dead_letter=ParquetSink("/unused/dead"))
    plan = dead.regions()
    assert plan.num_units == plain.num_units == 7
    specs = {v: s for v, s in dead.vertices.items() if s.dead_letter}
    assert {v: (s.inputs, s.parallelism) for v, s in specs.items()} == {
        "dead-letters": (("fa", "ma"), 3),
        "dead-letters-2": (("fb",), 2),
        # a source straight into a sink has poison records and bad event times to set aside
        "dead-letters-3": (("c",), 2),
    }
    assert {str(s) for s in plan.subtasks_of_unit(1)} == {
        "a#1",
        "fa#1",
        "ma#1",
        "oa#1",
        "dead-letters#1",
    }


def test_each_record_wise_kind_dead_letters_the_record_and_goes_on():
    def flaky(r: dict) -> Any:
        if r["n"] == 1:
            raise KeyError("n")
        return r

    dead = DeadLetters(4, {"g0": "7"})
    chunks = [("g0", [{"n": 0}, {"n": 1}]), ("g0", [{"n": 2}])]
    for kind in (Map, Filter):
        out, _ = kind(flaky, name=kind.kind).run(chunks, None, None, dead, None)
        assert [r for _, rs in out for r in rs] == [{"n": 0}, {"n": 2}]
    out, _ = FlatMap(lambda r: [flaky(r)] * 2, name="fm").run(chunks, None, None, dead, None)
    assert [r["n"] for _, rs in out for r in rs] == [0, 0, 2, 2]

    def count(ctx: Any, r: dict) -> list:
        seen = ctx.value_state("seen", 0)
        seen.update(seen.value() + 1)
        return [{"n": flaky(r)["n"], "seen": seen.value()}]

    state = OperatorState()
    out, _ = Process(count, key=lambda r: "k", name="count").run(chunks, None, state, dead, None)
    # the update before the raise stays: state is not rolled back per record
    assert [r["seen"] for _, rs in out for r in rs] == [1, 3]
    rows = dead.batch(("map", "filter", "fm", "count")).to_pylist()
    assert [(r["operator"], r["record_index"], r["error_type"]) for r in rows] == [
        (k, 1, "KeyError") for k in ("map", "filter", "fm", "count")
    ]
    assert {r["split_position"] for r in rows} == {"7"}


def test_map_batches_dead_letters_the_failing_batch_whole():
    def first_only(batch: pa.RecordBatch) -> pa.RecordBatch:
        if batch.column("n")[0].as_py() >= 10:
            raise ZeroDivisionError("division by zero")
        return batch

    dead = DeadLetters(2, {"g1": "0"})
    chunks = [
        ("g1", pa.RecordBatch.from_pylist([{"n": 0}, {"n": 1}])),
        ("g1", pa.RecordBatch.from_pylist([{"n": 10}, {"n": 11}, {"n": 12}])),
    ]
    out, _ = MapBatches(first_only, name="vec").run(chunks, None, None, dead, None)
    assert [b.num_rows for _, b in out] == [2]
    rows = dead.batch(("vec",)).to_pylist()
    assert [(r["record_index"], json.loads(r["record"])) for r in rows] == [
        (2, {"n": 10}),
        (3, {"n": 11}),
        (4, {"n": 12}),
    ]
    # a wrong return type is a bug in the function: never dead-lettered
    with pytest.raises(TypeError, match="operator 'bad': the map_batches function returned"):
        MapBatches(lambda b: b.to_pylist(), name="bad").run(chunks, None, None, dead, None)


def test_on_error_choices_are_checked():
    with pytest.raises(GraphError, match=r"on_error='skip'; use 'fail'"):
        Pipeline("p", on_error="skip")
    with pytest.raises(GraphError, match="go together"):
        Pipeline("p", on_error="dead-letter")
    with pytest.raises(GraphError, match="go together"):
        Pipeline("p", dead_letter=ParquetSink("/unused"))
    with pytest.raises(GraphError, match="dead_letter=str is not a sink"):
        Pipeline("p", on_error="dead-letter", dead_letter="/tmp/dead")
    p = Pipeline("p", on_error="dead-letter", dead_letter=ParquetSink("/unused"))
    src = p.source(GeneratorSource(1, _record), name="src")
    with pytest.raises(GraphError, match="names starting with 'dead-letters'"):
        src.map(dict, name="dead-letters")
