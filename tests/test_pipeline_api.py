"""The pipeline API without Spark: graph building, regions, operators and keyed state."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from regional.dataflow.operators import Filter, FlatMap, Map, MapBatches, Process
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.errors import GraphError
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def _gen(n: int = 2) -> GeneratorSource:
    return GeneratorSource(n, lambda s, i: {"s": s, "i": i}, records_per_split=4)


def test_job_graph_has_forward_pipelined_edges_and_one_unit_per_chain_index(tmp_path):
    p = Pipeline("p")
    a = p.source(_gen(), parallelism=3, name="a")
    b = p.source(_gen(), parallelism=2, name="b")
    a.map(lambda r: r, name="m").sink(ParquetSink(str(tmp_path)), name="out")
    b.filter(lambda r: True, name="f")
    g = p.job_graph()
    assert sorted((e.from_, e.to, e.partitioner, e.exchange) for e in g.edges) == [
        ("a", "m", "forward", "pipelined"),
        ("b", "f", "forward", "pipelined"),
        ("m", "out", "forward", "pipelined"),
    ]
    assert g.vertex("a").bounded and g.vertex("out").kind == "sink"
    plan = p.regions()
    assert plan.num_units == 5 and plan.regional_allowed
    assert [str(s) for s in plan.subtasks_of_unit(plan.unit_of("out", 2))] == [
        "a#2",
        "m#2",
        "out#2",
    ]


def test_union_of_different_parallelism_is_refused():
    p = Pipeline("p")
    a = p.source(_gen(), parallelism=3, name="a")
    b = p.source(_gen(), parallelism=2, name="b")
    with pytest.raises(GraphError, match=r"joins inputs a, b of different parallelism \[2, 3\]"):
        a.union(b, name="u")


def test_duplicate_names_and_non_sources_are_refused():
    p = Pipeline("p")
    p.source(_gen(), name="a")
    with pytest.raises(GraphError, match="vertex 'a' exists"):
        p.source(_gen(), name="a")
    with pytest.raises(GraphError, match="list is not a source"):
        p.source([1, 2])  # type: ignore[arg-type]
    with pytest.raises(GraphError, match="is empty"):
        Pipeline("empty").job_graph()


def test_record_and_batch_operators():
    chunks = [("s0", pa.record_batch({"x": [1, 2, 3]})), ("s1", [{"x": 4}])]
    assert Map(lambda r: {"x": r["x"] * 2}).run(chunks, None, None, None, None)[0] == [
        ("s0", [{"x": 2}, {"x": 4}, {"x": 6}]),
        ("s1", [{"x": 8}]),
    ]
    assert Filter(lambda r: r["x"] % 2).run(chunks, None, None, None, None)[0] == [
        ("s0", [{"x": 1}, {"x": 3}])
    ]
    assert FlatMap(lambda r: [r] * (r["x"] == 4) * 2).run(chunks, None, None, None, None)[0] == [
        ("s1", [{"x": 4}, {"x": 4}])
    ]
    doubled, _ = MapBatches(lambda b: pa.record_batch({"x": pc.multiply(b["x"], 10)})).run(
        chunks, None, None, None, None
    )
    assert [(s, b.to_pylist()) for s, b in doubled] == [
        ("s0", [{"x": 10}, {"x": 20}, {"x": 30}]),
        ("s1", [{"x": 40}]),
    ]


def test_map_batches_takes_a_table_and_names_the_operator_when_it_returns_something_else():
    p = Pipeline("job")
    src = p.source(GeneratorSource(1, lambda s, n: {"x": n}, records_per_split=1), name="src")
    as_table = src.map_batches(lambda b: pa.Table.from_batches([b]), name="to-table")
    as_list = as_table.map_batches(lambda b: b.to_pylist(), name="to-list")
    chunks = [("s0", pa.record_batch({"x": [1, 2]}))]
    to_table = p.vertices[as_table.vertex_id].operator
    [(split, batch)], _ = to_table.run(chunks, None, None, None, None)
    assert (split, batch.to_pylist()) == ("s0", [{"x": 1}, {"x": 2}])
    with pytest.raises(TypeError) as error:
        p.vertices[as_list.vertex_id].operator.run(chunks, None, None, None, None)
    assert str(error.value) == (
        "operator 'to-list': the map_batches function returned builtins.list; return a "
        "pyarrow.RecordBatch, a pyarrow.Table or None"
    )


def test_keyed_state_is_scoped_by_split_and_key_and_survives_a_snapshot():
    def count(ctx, r):
        c = ctx.value_state("c", 0)
        c.update(c.value() + 1)
        ctx.map_state("last")[r["k"]] = r["v"]
        ctx.list_state("seen").append(r["v"])
        yield (ctx.split_id, ctx.key, c.value())

    op = Process(count, key=lambda r: r["k"])
    state = OperatorState()
    rows = [{"k": "a", "v": 1}, {"k": "b", "v": 2}, {"k": "a", "v": 3}]
    out, _ = op.run([("s0", rows), ("s1", rows[:1])], None, state, None, None)
    assert out == [
        ("s0", [("s0", "a", 1), ("s0", "b", 1), ("s0", "a", 2)]),
        ("s1", [("s1", "a", 1)]),
    ]
    restored = OperatorState.from_bytes(state.to_bytes())
    assert restored.lists == {"seen": [1, 2, 3, 1]}
    again, _ = op.run([("s0", rows[:1])], None, restored, None, None)
    assert again == [("s0", [("s0", "a", 3)])]
    assert dict(restored.context("s0", "a").map_state("last")) == {"a": 1}
