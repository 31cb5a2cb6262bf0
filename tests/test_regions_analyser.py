"""Region analysis against Flink 2.3's scheduler (research/flink_regional.md §5.4, §10 items 1-3)
and against a brute-force subtask-level model on random graphs."""

from __future__ import annotations

import math
from fractions import Fraction

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.errors import GraphError
from regional.graph.job_graph import ALL_TO_ALL, PIPELINED, Edge, JobGraph, Vertex
from regional.graph.regions import RegionPlan, Subtask, analyse, pointwise_links


def graph(vertices: dict[str, int], *edges: tuple[str, ...], **vertex_args: dict) -> JobGraph:
    return JobGraph(
        vertices=tuple(Vertex(v, p, **vertex_args.get(v, {})) for v, p in vertices.items()),
        edges=tuple(Edge(*e) for e in edges),
    )


def names(groups: tuple[tuple[Subtask, ...], ...]) -> list[list[str]]:
    return [[str(s) for s in group] for group in groups]


# --- §10 item 1: forward chains and a keyBy edge -------------------------------------------


def test_forward_chain_gives_one_region_per_index() -> None:
    plan = analyse(
        graph(
            {"src": 3, "map": 3, "sink": 3}, ("src", "map", "forward"), ("map", "sink", "forward")
        )
    )
    assert names(plan.regions) == [
        ["src#0", "map#0", "sink#0"],
        ["src#1", "map#1", "sink#1"],
        ["src#2", "map#2", "sink#2"],
    ]
    assert plan.units == plan.regions
    assert (plan.regional_allowed, plan.reason, plan.warnings) == (True, None, ())


def test_one_keyby_edge_makes_one_region_and_rejects_regional() -> None:
    plan = analyse(
        graph({"src": 3, "map": 3, "sink": 3}, ("src", "map", "hash"), ("map", "sink", "forward"))
    )
    assert (plan.num_regions, plan.num_units) == (1, 1)
    assert plan.regional_allowed is False
    assert plan.reason == (
        "the job has a single fallback unit (every subtask exchanges data with every other, "
        "e.g. through a hash/rebalance edge), so it runs with global checkpoints only"
    )


# --- §10 item 2: blocking edges and cycles --------------------------------------------------


def test_pointwise_pipelined_plus_blocking_all_to_all_is_one_region() -> None:
    plan = analyse(graph({"a": 2, "b": 2}, ("a", "b", "forward"), ("a", "b", "hash", "blocking")))
    assert names(plan.regions) == [["a#0", "a#1", "b#0", "b#1"]]


def test_without_the_blocking_edge_two_regions() -> None:
    plan = analyse(graph({"a": 2, "b": 2}, ("a", "b", "forward")))
    assert names(plan.regions) == [["a#0", "b#0"], ["a#1", "b#1"]]


def test_only_the_blocking_edge_gives_single_subtask_regions_in_one_unit() -> None:
    plan = analyse(graph({"a": 2, "b": 2}, ("a", "b", "hash", "blocking")))
    assert names(plan.regions) == [["a#0"], ["a#1"], ["b#0"], ["b#1"]]
    assert names(plan.units) == [["a#0", "a#1", "b#0", "b#1"]]
    assert plan.warnings == (
        "edge a -> b (hash, blocking) joins different pipelined regions through a blocking "
        "exchange, so they fall back together as one unit; make the exchange pipelined for "
        "finer units",
    )
    assert plan.regions_of_unit(0) == (0, 1, 2, 3)


@pytest.mark.parametrize("exchange", ["hybrid_full", "hybrid_selective"])
def test_hybrid_only_edges_give_one_region_per_subtask(exchange: str) -> None:
    plan = analyse(graph({"a": 2, "b": 3}, ("a", "b", "rebalance", exchange)))
    assert names(plan.regions) == [["a#0"], ["a#1"], ["b#0"], ["b#1"], ["b#2"]]
    assert plan.num_units == 1


def test_cycle_through_blocking_pointwise_links_inside_a_logical_region_is_merged() -> None:
    # Pipelined rescale links give R0 = {a0 a1 b0 c0 d0} and R1 = {a2 a3 b1 b2 b3 c1 c2 d1};
    # the blocking links a1 -> c1 (R0 -> R1) and b1 -> d0 (R1 -> R0) form a cycle: one region.
    edges = [
        ("a", "d", "rescale"),
        ("c", "d", "rescale"),
        ("b", "c", "rescale"),
        ("a", "c", "rescale", "blocking"),
        ("b", "d", "rescale", "blocking"),
    ]
    plan = analyse(graph({"a": 4, "b": 4, "c": 3, "d": 2}, *edges))
    assert (plan.num_regions, plan.num_units) == (1, 1)
    plan = analyse(graph({"a": 4, "b": 4, "c": 3, "d": 2}, *edges[:4]))
    assert names(plan.regions) == [
        ["a#0", "a#1", "b#0", "c#0", "d#0"],
        ["a#2", "a#3", "b#1", "b#2", "b#3", "c#1", "c#2", "d#1"],
    ]
    assert plan.num_units == 1


# --- §5.4: the cross-logical-region cycle is not merged -------------------------------------


def test_cycle_through_another_logical_region_is_not_merged() -> None:
    plan = analyse(
        graph(
            {"a": 2, "b": 1, "c": 2},
            ("a", "c", "forward"),
            ("a", "b", "hash", "blocking"),
            ("b", "c", "hash", "blocking"),
        )
    )
    assert names(plan.regions) == [["a#0", "c#0"], ["a#1", "c#1"], ["b#0"]]
    assert plan.num_units == 1
    assert len(plan.warnings) == 2


# --- rescale fan-in / fan-out (Flink's formulas) --------------------------------------------


@pytest.mark.parametrize(
    ("m", "n", "expected"),
    [
        (4, 2, [["a#0", "a#1", "b#0"], ["a#2", "a#3", "b#1"]]),
        (2, 6, [["a#0", "b#0", "b#1", "b#2"], ["a#1", "b#3", "b#4", "b#5"]]),
        # m < n: producer p feeds consumers [ceil(p*7/3), ceil((p+1)*7/3)) = [0,3) [3,5) [5,7)
        (3, 7, [["a#0", "b#0", "b#1", "b#2"], ["a#1", "b#3", "b#4"], ["a#2", "b#5", "b#6"]]),
        # m > n: consumer j reads producers [j*7//3, (j+1)*7//3) = [0,2) [2,4) [4,7)
        (7, 3, [["a#0", "a#1", "b#0"], ["a#2", "a#3", "b#1"], ["a#4", "a#5", "a#6", "b#2"]]),
    ],
)
def test_rescale_regions(m: int, n: int, expected: list[list[str]]) -> None:
    plan = analyse(graph({"a": m, "b": n}, ("a", "b", "rescale")))
    assert names(plan.regions) == expected
    assert plan.units == plan.regions


def test_rescale_between_equal_parallelisms_is_index_to_index() -> None:
    assert list(pointwise_links(3, 3)) == [(0, 0), (1, 1), (2, 2)]
    plan = analyse(graph({"a": 3, "b": 3}, ("a", "b", "rescale")))
    assert plan.num_regions == 3


# --- mixed units, verdicts, warnings, ids ----------------------------------------------------


def test_blocking_edge_between_pipelined_regions_merges_their_units() -> None:
    plan = analyse(
        graph(
            {"orders": 4, "clean": 4, "sink": 2, "backfill": 1, "clicks": 2, "out": 2},
            ("orders", "clean", "forward"),
            ("clean", "sink", "rescale"),
            ("backfill", "clean", "rescale", "blocking"),
            ("clicks", "out", "forward"),
        )
    )
    assert plan.num_regions == 5
    first_unit = "backfill#0 orders#0 orders#1 orders#2 orders#3 clean#0 clean#1 clean#2 clean#3"
    assert names(plan.units) == [
        [*first_unit.split(), "sink#0", "sink#1"],
        ["clicks#0", "out#0"],
        ["clicks#1", "out#1"],
    ]
    assert plan.regions_of_unit(0) == (0, 3, 4)
    assert plan.unit_of("clean", 3) == 0 and plan.unit_of("out", 1) == 2
    assert plan.region_of("orders", 2) == 4 and plan.region_of("backfill", 0) == 0
    assert plan.regional_allowed is True
    assert [w.split(" joins")[0] for w in plan.warnings] == [
        "edge backfill -> clean (rescale, blocking)"
    ]


def test_changelog_and_union_state_reject_regional_with_one_warning_each() -> None:
    plan = analyse(
        graph(
            {"a": 2, "b": 2},
            ("a", "b", "forward"),
            a={"state_backend": "changelog"},
            b={"union_state": True},
        )
    )
    assert plan.num_units == 2
    assert plan.regional_allowed is False
    assert plan.reason == (
        "regional checkpoints are rejected: vertex 'a' uses the changelog state backend, "
        "vertex 'b' uses union list state (DESIGN §4 rule 13)"
    )
    assert plan.warnings == (
        "vertex 'a' uses the changelog state backend, which regional checkpoints reject "
        "(DESIGN §4 rule 13); use `hashmap` or `incremental`",
        "vertex 'b' uses union list state, which regional checkpoints reject "
        "(DESIGN §4 rule 13); use split or keyed state instead",
    )


def test_ids_follow_topological_order_with_ties_broken_by_vertex_id() -> None:
    # Declared z first, but "a" < "z": a's regions are numbered first.
    plan = analyse(graph({"z": 2, "a": 1}))
    assert names(plan.regions) == [["a#0"], ["z#0"], ["z#1"]]


def test_lookups_name_the_missing_thing() -> None:
    plan = analyse(graph({"a": 2}))
    with pytest.raises(GraphError, match=r"^vertex 'a' has no subtask 2: its parallelism is 2$"):
        plan.unit_of("a", 2)
    with pytest.raises(GraphError, match=r"^no vertex 'x' in the job graph$"):
        plan.region_of("x", 0)
    with pytest.raises(GraphError, match=r"^no unit 2: the plan has units 0\.\.1$"):
        plan.subtasks_of_unit(2)


def test_large_forward_chain_stays_compact() -> None:
    plan = analyse(
        graph(
            {f"v{i:03}": 500 for i in range(100)},
            *[(f"v{i:03}", f"v{i + 1:03}", "forward") for i in range(99)],
        )
    )
    assert (plan.num_regions, plan.num_units) == (500, 500)
    assert plan.subtasks_of_unit(499)[-1] == Subtask("v099", 499)
    assert len(plan.subtasks_of_unit(7)) == 100


# --- brute force: materialise every subtask link --------------------------------------------


def links(e: Edge, m: int, n: int) -> list[tuple[int, int]]:
    """Every (producer, consumer) pair, checking each pair against Flink's formulas."""
    if e.partitioner in ALL_TO_ALL:
        return [(p, c) for p in range(m) for c in range(n)]
    if m >= n:
        return [(p, c) for p in range(m) for c in range(n) if c * m // n <= p < (c + 1) * m // n]
    return [
        (p, c)
        for p in range(m)
        for c in range(n)
        if math.ceil(Fraction(p * n, m)) <= c < math.ceil(Fraction((p + 1) * n, m))
    ]


def brute_force(g: JobGraph) -> tuple[set[frozenset[Subtask]], set[frozenset[Subtask]]]:
    par = {v.id: v.parallelism for v in g.vertices}
    linked = [
        (e, [(Subtask(e.from_, p), Subtask(e.to, c)) for p, c in links(e, *_par(e, par))])
        for e in g.edges
    ]
    logical = nx.Graph()
    logical.add_nodes_from(par)
    logical.add_edges_from((e.from_, e.to) for e in g.edges if e.exchange in PIPELINED)
    regions: set[frozenset[Subtask]] = set()
    for group in nx.connected_components(logical):
        subtasks = [Subtask(v, i) for v in group for i in range(par[v])]
        inside = [(e, ls) for e, ls in linked if e.from_ in group and e.to in group]
        if any(e.partitioner in ALL_TO_ALL for e, _ in inside):
            regions.add(frozenset(subtasks))
            continue
        uf = nx.utils.UnionFind(subtasks)
        for e, ls in inside:
            if e.exchange in PIPELINED:
                for x, y in ls:
                    uf.union(x, y)
        cross = nx.DiGraph()
        for e, ls in inside:
            if e.exchange not in PIPELINED:
                cross.add_edges_from((uf[x], uf[y]) for x, y in ls if uf[x] != uf[y])
        for scc in nx.strongly_connected_components(cross):
            uf.union(*scc)
        regions.update(frozenset(s) for s in uf.to_sets())
    everything = nx.Graph()
    everything.add_nodes_from(Subtask(v, i) for v in par for i in range(par[v]))
    everything.add_edges_from(link for _, ls in linked for link in ls)
    units = {frozenset(c) for c in nx.connected_components(everything)}
    return regions, units


def _par(e: Edge, par: dict[str, int]) -> tuple[int, int]:
    return par[e.from_], par[e.to]


@st.composite
def random_graphs(draw: st.DrawFn) -> JobGraph:
    n = draw(st.integers(1, 6))
    ids = draw(st.permutations([chr(ord("a") + i) for i in range(n)]))
    par = [draw(st.integers(1, 5)) for _ in range(n)]
    edges = []
    for _ in range(draw(st.integers(0, 9))) if n > 1 else ():
        i = draw(st.integers(0, n - 2))
        j = draw(st.integers(i + 1, n - 1))
        partitioner = draw(
            st.sampled_from(["forward", "forward", "rescale", "rescale", *sorted(ALL_TO_ALL)])
        )
        if partitioner == "forward" and par[i] != par[j]:
            partitioner = "rescale"
        exchange = draw(
            st.sampled_from(
                ["pipelined", "pipelined_bounded", "blocking", "hybrid_full", "hybrid_selective"]
            )
        )
        edges.append(Edge(ids[i], ids[j], partitioner, exchange))  # type: ignore[arg-type]
    vertices = tuple(Vertex(ids[i], par[i]) for i in range(n))
    return JobGraph(vertices=vertices, edges=tuple(edges))


def _as_sets(groups: tuple[tuple[Subtask, ...], ...]) -> set[frozenset[Subtask]]:
    return {frozenset(g) for g in groups}


def _numbered_by_first_subtask(g: JobGraph, groups: tuple[tuple[Subtask, ...], ...]) -> bool:
    pos = {v: i for i, v in enumerate(g.topological_order())}
    firsts = [min((pos[s.vertex_id], s.index) for s in group) for group in groups]
    return firsts == sorted(firsts)


@settings(max_examples=400, deadline=None)
@given(random_graphs())
def test_analyser_matches_brute_force(g: JobGraph) -> None:
    plan: RegionPlan = analyse(g)
    regions, units = brute_force(g)
    assert _as_sets(plan.regions) == regions
    assert _as_sets(plan.units) == units
    assert (plan.num_regions, plan.num_units) == (len(regions), len(units))
    assert _numbered_by_first_subtask(g, plan.regions)
    assert _numbered_by_first_subtask(g, plan.units)
    for r, members in enumerate(plan.regions):
        assert {plan.region_of(*s) for s in members} == {r}
        assert len({plan.unit_of(*s) for s in members}) == 1  # a region never spans units
    assert plan.regional_allowed == (len(units) > 1)
