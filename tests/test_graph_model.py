"""Job graph: validation errors, defaults, fingerprint, and the three file formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from regional.errors import GraphError
from regional.graph.files import load_graph, parse_graph
from regional.graph.job_graph import Edge, JobGraph, Vertex, default_max_parallelism
from regional.graph.regions import analyse

EXAMPLES = Path(__file__).resolve().parent.parent / "examples" / "graphs"


def two(edge: Edge, p: int = 2, q: int = 2) -> JobGraph:
    return JobGraph(vertices=(Vertex("a", p), Vertex("b", q)), edges=(edge,))


# --- validation ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: JobGraph(vertices=(Vertex("a", 1), Vertex("a", 2))),
            "duplicate vertex id 'a'; give every vertex its own id",
        ),
        (
            lambda: two(Edge("a", "x", "hash")),
            "edge a -> x (hash, pipelined_bounded) names unknown vertex 'x'; declare it under "
            "`vertices` or fix the edge",
        ),
        (
            lambda: two(Edge("a", "b", "forward"), 2, 3),
            "forward edge a -> b (forward, pipelined_bounded) joins parallelism 2 to 3; give both "
            "vertices the same parallelism or use `rescale`/`rebalance`",
        ),
        (
            lambda: JobGraph(
                vertices=(Vertex("a", 1), Vertex("b", 1), Vertex("c", 1)),
                edges=(Edge("a", "b", "hash"), Edge("b", "c", "hash"), Edge("c", "a", "hash")),
            ),
            "the job graph has a cycle a -> b -> c -> a; remove one of these edges",
        ),
        (
            lambda: two(Edge("a", "a", "hash")),
            "edge a -> a (hash, pipelined_bounded) is a cycle (a vertex feeding itself); remove it",
        ),
        (
            lambda: Vertex("map", 0),
            "vertex 'map': parallelism 0 is < 1; set `parallelism` to at least 1",
        ),
        (
            lambda: Vertex("map", 200, max_parallelism=128),
            "vertex 'map': parallelism 200 is > max_parallelism 128; lower `parallelism` or "
            "raise `max_parallelism`",
        ),
        (
            lambda: Vertex("map", 1, max_parallelism=40000),
            "vertex 'map': max_parallelism 40000 is outside 1..32768; set it in that range or "
            "leave it out",
        ),
        (
            lambda: JobGraph(vertices=()),
            "the job graph has no vertices; declare at least one under `vertices`",
        ),
    ],
)
def test_validation_errors_name_the_thing_and_the_fix(build, message: str) -> None:
    with pytest.raises(GraphError) as info:
        build()
    assert str(info.value) == message
    assert info.value.exit_code == 2


def test_defaults_follow_flink() -> None:
    assert [default_max_parallelism(p) for p in (1, 85, 86, 1000, 21846, 30000)] == [
        128,
        128,
        256,
        2048,
        32768,
        32768,
    ]
    v = Vertex("m", 3)
    assert (v.name, v.kind, v.max_parallelism, v.state_backend, v.union_state) == (
        "m",
        "operator",
        128,
        "hashmap",
        False,
    )
    assert Edge("a", "b", "hash").exchange == "pipelined_bounded"


def test_fingerprint_depends_on_content_not_declaration_order() -> None:
    g1 = JobGraph(
        vertices=(Vertex("a", 2), Vertex("b", 2), Vertex("c", 1)),
        edges=(Edge("a", "b", "forward"), Edge("b", "c", "rescale")),
    )
    g2 = JobGraph(
        vertices=(Vertex("c", 1), Vertex("b", 2), Vertex("a", 2)),
        edges=(Edge("b", "c", "rescale"), Edge("a", "b", "forward")),
    )
    g3 = JobGraph(
        vertices=(Vertex("a", 2), Vertex("b", 2), Vertex("c", 1)),
        edges=(Edge("a", "b", "forward"), Edge("b", "c", "rescale", "blocking")),
    )
    assert g1.fingerprint() == g2.fingerprint() != g3.fingerprint()
    assert len(g1.fingerprint()) == 64
    assert analyse(g1).units == analyse(g2).units
    assert [(i.vertex_id, i.parallelism, i.max_parallelism) for i in g2.vertex_infos()] == [
        ("a", 2, 128),
        ("b", 2, 128),
        ("c", 1, 128),
    ]


# --- our file format ------------------------------------------------------------------------


def test_json_and_toml_files_describe_the_same_graph(tmp_path: Path) -> None:
    doc = {
        "vertices": [
            {"id": "src", "kind": "source", "parallelism": 2, "bounded": True},
            {
                "id": "sink",
                "kind": "sink",
                "parallelism": 1,
                "max_parallelism": 4,
                "state_backend": "incremental",
                "union_state": False,
                "name": "Sink: out",
            },
        ],
        "edges": [{"from": "src", "to": "sink", "partitioner": "rescale", "exchange": "blocking"}],
    }
    (tmp_path / "g.json").write_text(json.dumps(doc))
    (tmp_path / "g.toml").write_text(
        '[[vertices]]\nid = "src"\nkind = "source"\nparallelism = 2\nbounded = true\n'
        '[[vertices]]\nid = "sink"\nkind = "sink"\nparallelism = 1\nmax_parallelism = 4\n'
        'state_backend = "incremental"\nunion_state = false\nname = "Sink: out"\n'
        '[[edges]]\nfrom = "src"\nto = "sink"\npartitioner = "rescale"\nexchange = "blocking"\n'
    )
    g = load_graph(tmp_path / "g.json")
    assert g == load_graph(tmp_path / "g.toml")
    assert g.edges == (Edge("src", "sink", "rescale", "blocking"),)
    assert g.vertex("sink") == Vertex(
        "sink", 1, name="Sink: out", kind="sink", max_parallelism=4, state_backend="incremental"
    )


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"vertices": [{"id": "a", "parallelism": 1}], "edges": [{"from": "a", "to": "a", '
            '"partitioner": "hash", "exchnage": "blocking"}]}',
            "g: Object contains unknown field `exchnage` - at `$.edges[0]`",
        ),
        (
            '{"vertices": [{"id": "a", "parallelism": 1, "state_backend": "rocksdb"}]}',
            "g: Invalid enum value 'rocksdb' - at `$.vertices[0].state_backend`",
        ),
        (
            '{"vertices": [{"id": "a", "parallelism": "2"}]}',
            "g: Expected `int`, got `str` - at `$.vertices[0].parallelism`",
        ),
        (
            'vertices = [{id = "a", parallelism = 1}]\nedges = [{from = "a", to = "b", '
            'partitioner = "keyby"}]',
            "g: Invalid enum value 'keyby' - at `$.edges[0].partitioner`",
        ),
        (
            '{"vertices": [{"id": "a", "parallelism": 1}], "edges": [{"from": "a", "to": "b", '
            '"partitioner": "hash"}]}',
            "g: edge a -> b (hash, pipelined_bounded) names unknown vertex 'b'; declare it "
            "under `vertices` or fix the edge",
        ),
        (
            '{"vertices": [',
            "g: neither valid JSON nor TOML (Input data was truncated); fix the syntax",
        ),
        (
            '{"jobs": []}',
            "g: no `vertices` (our job-graph format) and no `nodes` (a Flink plan "
            "JSON); see examples/graphs/ for both",
        ),
    ],
)
def test_file_errors_name_the_file_and_key_path(text: str, message: str) -> None:
    with pytest.raises(GraphError) as info:
        parse_graph(text.encode(), source="g")
    assert str(info.value) == message


def test_missing_file_is_a_graph_error(tmp_path: Path) -> None:
    with pytest.raises(GraphError, match=r"nope\.json: cannot read the job-graph file: No such"):
        load_graph(tmp_path / "nope.json")


# --- Flink plans ----------------------------------------------------------------------------


def test_flink_rest_plan_example() -> None:
    g = load_graph(EXAMPLES / "flink_rest_plan.json")
    by_name = {v.name: v for v in g.vertices}
    assert sorted(by_name) == [
        "Filter",
        "KeyedProcess -> Sink: alerts",
        "Sink: orders table",
        "Source: clicks",
        "Source: orders -> Map",
    ]
    assert [by_name[n].kind for n in ("Source: orders -> Map", "Filter", "Sink: orders table")] == [
        "source",
        "operator",
        "sink",
    ]
    assert sorted((e.partitioner, e.exchange) for e in g.edges) == [
        ("forward", "pipelined_bounded"),
        ("hash", "pipelined_bounded"),
        ("rescale", "pipelined_bounded"),
    ]
    plan = analyse(g)
    assert (plan.num_regions, plan.num_units, plan.regional_allowed) == (3, 3, True)


def test_flink_rest_plan_unwrapped_with_blocking_and_hybrid_exchanges() -> None:
    plan = {
        "jid": "j",
        "nodes": [
            {"id": "s", "parallelism": 2, "description": "Source"},
            {
                "id": "m",
                "parallelism": 2,
                "description": "Map",
                "inputs": [{"num": 0, "id": "s", "ship_strategy": "hash", "exchange": "BLOCKING"}],
            },
            {
                "id": "k",
                "parallelism": 2,
                "description": "Sink",
                "inputs": [
                    {"num": 0, "id": "m", "ship_strategy": "FORWARD", "exchange": "hybrid_full"}
                ],
            },
        ],
    }
    g = parse_graph(json.dumps(plan).encode(), source="p")
    assert [(e.from_, e.to, e.partitioner, e.exchange) for e in g.edges] == [
        ("s", "m", "hash", "blocking"),
        ("m", "k", "forward", "hybrid_full"),
    ]
    assert analyse(g).num_regions == 6


def test_flink_execution_plan_example_and_sql_style_strategies() -> None:
    g = load_graph(EXAMPLES / "flink_execution_plan.json")
    assert [(v.id, v.kind, v.parallelism) for v in g.vertices] == [
        ("1", "source", 3),
        ("2", "operator", 3),
        ("4", "sink", 3),
    ]
    assert {e.exchange for e in g.edges} == {"pipelined_bounded"}
    assert analyse(g).num_units == 3
    sql = {
        "nodes": [
            {"id": 1, "type": "Source: T", "parallelism": 2},
            {
                "id": 2,
                "type": "GroupAggregate",
                "parallelism": 2,
                "predecessors": [{"id": 1, "ship_strategy": "HASH[user_id]", "side": "second"}],
            },
        ]
    }
    g = parse_graph(json.dumps(sql).encode(), source="x")
    assert g.edges == (Edge("1", "2", "hash"),)


@pytest.mark.parametrize(
    ("link", "message"),
    [
        (
            {"id": 1, "ship_strategy": "ZIGZAG"},
            "p: $.nodes[1].predecessors[0]: unknown ship_strategy 'ZIGZAG'; expected one of",
        ),
        (
            {"id": 9, "ship_strategy": "FORWARD"},
            "p: edge 9 -> 2 (forward, pipelined_bounded) names unknown vertex '9'",
        ),
    ],
)
def test_flink_plan_errors(link: dict, message: str) -> None:
    plan = {
        "nodes": [
            {"id": 1, "type": "S", "parallelism": 2},
            {"id": 2, "type": "M", "parallelism": 2, "predecessors": [link]},
        ]
    }
    with pytest.raises(GraphError) as info:
        parse_graph(json.dumps(plan).encode(), source="p")
    assert str(info.value).startswith(message)


def test_flink_rest_plan_with_unsupported_exchange() -> None:
    plan = {
        "plan": {
            "nodes": [
                {"id": "a", "parallelism": 1},
                {
                    "id": "b",
                    "parallelism": 1,
                    "inputs": [
                        {"id": "a", "ship_strategy": "FORWARD", "exchange": "pipelined_approximate"}
                    ],
                },
            ]
        }
    }
    with pytest.raises(GraphError) as info:
        parse_graph(json.dumps(plan).encode(), source="p")
    assert str(info.value) == (
        "p: $.nodes[1].inputs[0]: exchange 'pipelined_approximate' is not supported; expected "
        "one of blocking, blocking_persistent, hybrid_full, hybrid_selective, pipelined, "
        "pipelined_bounded"
    )


def test_every_example_graph_loads() -> None:
    got = {p.name: analyse(load_graph(p)) for p in sorted(EXAMPLES.iterdir())}
    assert {n: (p.num_regions, p.num_units, p.regional_allowed) for n, p in got.items()} == {
        "flink_execution_plan.json": (3, 3, True),
        "flink_rest_plan.json": (3, 3, True),
        "forward_chain.toml": (8, 8, True),
        "keyby.toml": (1, 1, False),
        "mixed.json": (5, 3, True),
    }
