"""The compiled plan (`regional.dataflow.plan`): each vertex's role and scope, each unit shape's
order, dead-letter feeds and pass eligibility, decided once per pipeline shape."""

from __future__ import annotations

import pytest

from regional.dataflow.pipeline import Pipeline
from regional.dataflow.plan import Role, Scope, compile_plan
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n, "ts": n * 1000}


def _exchange_job(*, event_time: bool = False) -> Pipeline:
    p = Pipeline("plan", on_error="dead-letter", dead_letter=ParquetSink("/unused/dead"))
    src = p.source(
        GeneratorSource(2, _record),
        parallelism=2,
        name="src",
        event_time="ts" if event_time else None,
    )
    (
        src.map(lambda r: r, name="m")
        .key_by(lambda r: r["n"] % 3, partitions=2, name="ex")
        .process(lambda ctx, r: [r], name="count")
        .sink(ParquetSink("/unused/out"), name="out")
    )
    return p


def test_roles_scopes_and_capabilities_are_decided_per_vertex() -> None:
    plan = compile_plan(_exchange_job())
    got = {
        v.id: (v.role, v.scope, v.timed is not None, v.marks is not None)
        for v in plan.vertices.values()
    }
    assert got["src"] == (Role.SOURCE, None, False, False)
    assert got["m"] == (Role.OPERATOR, Scope.SPLIT, False, False)
    assert got["ex-writer"] == (Role.SINK, None, False, True)  # judges keys, commits marks
    assert plan.vertices["ex-writer"].key is not None
    assert got["ex"] == (Role.SOURCE, None, True, False)  # stamps origins, tells its watermark
    assert got["count"] == (Role.OPERATOR, Scope.KEY, False, False)
    assert got["out"] == (Role.SINK, None, False, False)
    dead = [v.id for v in plan.vertices.values() if v.role is Role.DEAD_LETTERS]
    assert len(dead) == 2  # one per stage: each stage is its own part of the graph


def test_a_shape_runs_dead_letters_last_and_feeds_them_its_sources_and_writers() -> None:
    p = _exchange_job()
    plan = compile_plan(p)
    upstream = [v for v in p.vertices if v in ("src", "m", "ex-writer")]
    dead = next(
        v.id for v in plan.vertices.values() if v.role is Role.DEAD_LETTERS and "m" in v.inputs
    )
    shape = plan.shape([dead, *reversed(upstream)])
    assert [v.id for v in shape.order] == ["src", "m", "ex-writer", dead]
    assert shape.fed == {dead: ("m", "src", "ex-writer")}
    assert shape.readers == {"src": 1, "m": 2, "ex-writer": 0, dead: 0}  # the writer, dead
    assert shape.dead_letters
    # after the exchange: the key-scoped operator runs once per unit inside the pass
    downstream = plan.shape([v for v in p.vertices if v in ("ex", "count", "out")])
    assert [v.id for v in downstream.order if not v.merges] == ["count"]


def test_with_event_time_an_operator_that_needs_watermarks_runs_per_unit() -> None:
    from regional.dataflow.windows import Tumbling, count

    p = Pipeline("timed")
    src = p.source(GeneratorSource(2, _record), parallelism=2, name="src", event_time="ts")
    (
        src.map(lambda r: r, name="m")
        .key_by(lambda r: r["n"] % 3)
        .window(Tumbling("10 s"), aggregate=count(), name="w")
        .sink(ParquetSink("/unused/out"), name="out")
    )
    plan = compile_plan(p)
    shape = plan.shape(["src", "m", "w", "out"])
    assert plan.timed
    assert [v.id for v in shape.order if not v.merges] == ["w"]  # its unit's watermarks


def test_the_plan_is_compiled_once_per_shape_of_the_pipeline() -> None:
    p = Pipeline("grow")
    src = p.source(GeneratorSource(1, _record), name="src")
    first = compile_plan(p)
    assert compile_plan(p) is first
    assert first.shape(["src"]) is first.shape({"src"})
    src.map(lambda r: r, name="m")
    second = compile_plan(p)
    assert second is not first and set(second.vertices) == {"src", "m"}
    p.records_per_epoch = 7
    assert second.records_per_epoch == 7  # read live


def test_a_shape_of_vertices_the_pipeline_lacks_is_named() -> None:
    plan = compile_plan(_exchange_job())
    with pytest.raises(KeyError, match=r"pipeline 'plan' has no vertex nope: the work is for"):
        plan.shape(["src", "nope"])
