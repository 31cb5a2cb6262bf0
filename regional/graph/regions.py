"""Region analysis: pipelined regions and fallback units of a job graph (DESIGN §4 rules 1, 13).

Regions are computed at subtask level exactly as Flink 2.3's scheduler does it:

1. *Logical regions*: vertices joined by pipelined edges (`pipelined`, `pipelined_bounded`).
2. Per logical region: if any edge inside it (of any exchange) is all-to-all, it is **one**
   region. Otherwise its subtasks are joined over the pipelined pointwise links inside it
   (forward ``i <-> i``, rescale by `pointwise_links`), and regions forming a cycle through the
   blocking/hybrid links inside it are merged (strongly connected components). Cycles through
   another logical region are not merged.

A **fallback unit** is a connected component of the subtask graph over every edge but durable
ones: regions joined by a blocking/hybrid edge fall back together (with a warning). The same two
steps compute units, with every non-durable edge treated as joining. A **durable** exchange
(`regional.dataflow.exchange`: the producer commits what it sends with its checkpoint, the consumer
reads
it back from positions in its own state) joins nothing: each side falls back on its own, and the
plan says so in `notes`.

Nothing is materialised per all-to-all link. Vertices joined by identity links (forward, or
rescale between equal parallelisms) share one id sequence (a `range` when every subtask has its
own id, an `array('l')` otherwise), and the remaining pointwise links go through a union-find
over integers, so a 1,000-vertex forward chain at parallelism 1,000 stays a few kilobytes.

Ids are ints numbered in the order of each region's (unit's) first subtask, vertices taken in
`JobGraph.topological_order()` and indices ascending.

>>> from regional.graph.job_graph import Edge, JobGraph, Vertex
>>> g = JobGraph(
...     vertices=(Vertex("a", 3, kind="source"), Vertex("b", 3), Vertex("c", 3, kind="sink")),
...     edges=(Edge("a", "b", "forward"), Edge("b", "c", "forward")),
... )
>>> plan = analyse(g)
>>> plan.num_regions, plan.num_units, plan.regional_allowed
(3, 3, True)
>>> [str(s) for s in plan.subtasks_of_unit(plan.unit_of("c", 1))]
['a#1', 'b#1', 'c#1']
"""

from __future__ import annotations

import dataclasses
import functools
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import NamedTuple

import networkx as nx

from metadata.model import VertexInfo
from regional.errors import GraphError
from regional.graph.job_graph import Edge, JobGraph

__all__ = ["RegionPlan", "Subtask", "analyse", "pointwise_links"]


class Subtask(NamedTuple):
    """One parallel instance of a vertex; written ``"<vertex_id>#<index>"``."""

    vertex_id: str
    index: int  # type: ignore[assignment]  # shadows tuple.index on purpose: Flink's name

    def __str__(self) -> str:
        return f"{self.vertex_id}#{self.index}"


def pointwise_links(m: int, n: int) -> Iterator[tuple[int, int]]:
    """The `(producer, consumer)` subtask pairs of a pointwise edge from parallelism `m` to `n`,
    by Flink's formulas: ``m >= n``: consumer ``j`` reads producers ``[j*m//n, (j+1)*m//n)``;
    ``m < n``: producer ``p`` feeds consumers ``[ceil(p*n/m), ceil((p+1)*n/m))``.

    >>> list(pointwise_links(4, 2))
    [(0, 0), (1, 0), (2, 1), (3, 1)]
    >>> list(pointwise_links(2, 6))
    [(0, 0), (0, 1), (0, 2), (1, 3), (1, 4), (1, 5)]
    """
    if m >= n:
        for j in range(n):
            for p in range(j * m // n, (j + 1) * m // n):
                yield p, j
    else:
        for p in range(m):
            for c in range(-(-p * n // m), -(-(p + 1) * n // m)):
                yield p, c


class _UnionFind:
    """Union-find over the integers ``0 .. size-1`` (path halving, smaller root wins)."""

    def __init__(self, size: int) -> None:
        self.parent = array("l", range(size))
        self.changed = False

    def find(self, x: int) -> int:
        parent = self.parent
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(self, x: int, y: int) -> None:
        rx, ry = self.find(x), self.find(y)
        if rx != ry:
            self.parent[max(rx, ry)] = min(rx, ry)
            self.changed = True


def _partition(
    graph: JobGraph, joins: Callable[[Edge], bool], merge_cycles: bool
) -> dict[str, Sequence[int]]:
    """Per vertex, a raw component id per subtask index (ids unique across the graph)."""
    order = graph.topological_order()
    logical = nx.utils.UnionFind(order)
    for e in graph.edges:
        if joins(e):
            logical.union(e.from_, e.to)
    members: dict[str, list[str]] = defaultdict(list)
    for v in order:
        members[logical[v]].append(v)
    inside: dict[str, list[Edge]] = defaultdict(list)
    for e in graph.edges:
        if logical[e.from_] == logical[e.to]:
            inside[logical[e.from_]].append(e)

    raw: dict[str, Sequence[int]] = {}
    next_id = 0
    for root, vertices in members.items():
        edges = inside[root]
        if any(not e.pointwise for e in edges):
            same: dict[int, array[int]] = {}
            for v in vertices:
                p = graph.vertex(v).parallelism
                raw[v] = same.setdefault(p, array("l", [next_id]) * p)
            next_id += 1
            continue
        next_id += _join_pointwise(graph, vertices, edges, joins, merge_cycles, next_id, raw)
    return raw


def _join_pointwise(
    graph: JobGraph,
    vertices: list[str],
    edges: list[Edge],
    joins: Callable[[Edge], bool],
    merge_cycles: bool,
    first_id: int,
    raw: dict[str, Sequence[int]],
) -> int:
    """Components of one logical region without all-to-all edges; fills `raw`, returns the
    number of ids it allocated (from `first_id`)."""
    par = {v: graph.vertex(v).parallelism for v in vertices}
    identity = nx.utils.UnionFind(vertices)
    for e in edges:
        if joins(e) and par[e.from_] == par[e.to]:
            identity.union(e.from_, e.to)
    base: dict[str, int] = {}
    size = 0
    for v in vertices:
        cls = identity[v]
        if cls not in base:
            base[cls] = size
            size += par[v]
    uf = _UnionFind(size)

    def links(e: Edge) -> Iterator[tuple[int, int]]:
        a, b = base[identity[e.from_]], base[identity[e.to]]
        for p, c in pointwise_links(par[e.from_], par[e.to]):
            yield a + p, b + c

    for e in edges:
        if joins(e) and par[e.from_] != par[e.to]:
            for x, y in links(e):
                uf.union(x, y)
    if merge_cycles:
        cross = nx.DiGraph()
        for e in edges:
            if not joins(e):
                cross.add_edges_from(
                    (rx, ry) for x, y in links(e) if (rx := uf.find(x)) != (ry := uf.find(y))
                )
        for scc in nx.strongly_connected_components(cross):
            first, *rest = scc
            for other in rest:
                uf.union(first, other)

    by_class: dict[str, Sequence[int]] = {}
    for v in vertices:
        cls = identity[v]
        if cls not in by_class:
            own = range(first_id + base[cls], first_id + base[cls] + par[v])
            if uf.changed:  # roots may lie in other classes: the renumbering maps them
                by_class[cls] = array("l", (first_id + uf.find(x - first_id) for x in own))
            else:  # every subtask is its own component
                by_class[cls] = own
        raw[v] = by_class[cls]
    return size


def _renumber(
    order: Sequence[str], raw: Mapping[str, Sequence[int]]
) -> tuple[dict[str, Sequence[int]], int]:
    """Raw ids -> ``0, 1, ...`` in the order of first appearance (topological order, index)."""
    mapping: dict[int, int] = {}
    count = 0
    done: dict[int, Sequence[int]] = {}
    out: dict[str, Sequence[int]] = {}
    for v in order:
        seq = raw[v]
        if id(seq) not in done:
            if isinstance(seq, range):  # ids no other vertex class shares: all new
                done[id(seq)] = range(count, count + len(seq))
                count += len(seq)
            else:
                new = array("l", [0]) * len(seq)
                for i, r in enumerate(seq):
                    got = mapping.get(r)
                    if got is None:
                        got = mapping[r] = count
                        count += 1
                    new[i] = got
                done[id(seq)] = new
        out[v] = done[id(seq)]
    return out, count


@dataclasses.dataclass(frozen=True, eq=False)
class RegionPlan:
    """Regions and fallback units of a job graph, and whether regional checkpoints may run.

    `reason` says why not (None when allowed); `warnings` has one line per DESIGN §4 rule 13
    limitation found, naming the vertices or edges; `notes` one line per durable exchange
    (why its two sides are separate fallback units).
    """

    graph: JobGraph
    num_regions: int
    num_units: int
    regional_allowed: bool
    reason: str | None
    warnings: tuple[str, ...]
    _region_ids: Mapping[str, Sequence[int]] = dataclasses.field(repr=False)
    _unit_ids: Mapping[str, Sequence[int]] = dataclasses.field(repr=False)
    notes: tuple[str, ...] = ()

    def _lookup(self, ids: Mapping[str, Sequence[int]], vertex_id: str, index: int) -> int:
        seq = ids.get(vertex_id)
        if seq is None:
            raise GraphError(f"no vertex {vertex_id!r} in the job graph")
        if not 0 <= index < len(seq):
            raise GraphError(
                f"vertex {vertex_id!r} has no subtask {index}: its parallelism is {len(seq)}"
            )
        return seq[index]

    def region_of(self, vertex_id: str, index: int) -> int:
        """The region id of subtask `(vertex_id, index)`."""
        return self._lookup(self._region_ids, vertex_id, index)

    def unit_of(self, vertex_id: str, index: int) -> int:
        """The fallback unit id of subtask `(vertex_id, index)`."""
        return self._lookup(self._unit_ids, vertex_id, index)

    def subtasks_of_region(self, region_id: int) -> tuple[Subtask, ...]:
        """The subtasks of one region, in topological vertex order then index."""
        return self._members(self._region_ids, region_id, self.num_regions, "region")

    def subtasks_of_unit(self, unit_id: int) -> tuple[Subtask, ...]:
        """The subtasks of one fallback unit, in topological vertex order then index."""
        return self._members(self._unit_ids, unit_id, self.num_units, "unit")

    def vertex_infos(self) -> tuple[VertexInfo, ...]:
        """`VertexInfo` of every vertex (topological order), for checkpoint metadata."""
        return self.graph.vertex_infos()

    def regions_of_unit(self, unit_id: int) -> tuple[int, ...]:
        """The ids of the regions that make up one fallback unit, ascending."""
        return tuple(sorted({self.region_of(*s) for s in self.subtasks_of_unit(unit_id)}))

    @property
    def regions(self) -> tuple[tuple[Subtask, ...], ...]:
        """Every region's subtasks, by region id (materialises every subtask: for display)."""
        return tuple(self.subtasks_of_region(r) for r in range(self.num_regions))

    @property
    def units(self) -> tuple[tuple[Subtask, ...], ...]:
        """Every unit's subtasks, by unit id (materialises every subtask: for display)."""
        return tuple(self.subtasks_of_unit(u) for u in range(self.num_units))

    def _members(
        self, ids: Mapping[str, Sequence[int]], wanted: int, count: int, what: str
    ) -> tuple[Subtask, ...]:
        if not 0 <= wanted < count:
            raise GraphError(f"no {what} {wanted}: the plan has {what}s 0..{count - 1}")
        out: list[Subtask] = []
        for v in self.graph.topological_order():
            out.extend(Subtask(v, i) for i in self._positions(ids[v], wanted))
        return tuple(out)

    @functools.cached_property
    def _where(self) -> dict[int, dict[int, list[int]]]:
        return {}

    def _positions(self, seq: Sequence[int], value: int) -> Sequence[int]:
        """The indices of `seq` holding `value` (an index per shared id array, built once)."""
        if isinstance(seq, range):
            return range(value - seq.start, value - seq.start + 1) if value in seq else ()
        where = self._where.get(id(seq))
        if where is None:
            where = self._where[id(seq)] = defaultdict(list)
            for i, v in enumerate(seq):
                where[v].append(i)
        return where.get(value, ())


def analyse(graph: JobGraph) -> RegionPlan:
    """Regions, fallback units, warnings and the regional verdict of `graph` (pure)."""
    order = graph.topological_order()
    regions, num_regions = _renumber(order, _partition(graph, _pipelined, merge_cycles=True))
    units, num_units = _renumber(order, _partition(graph, _joins_units, merge_cycles=False))
    warnings: list[str] = []
    rejected: list[str] = []
    for v in (graph.vertex(v) for v in order):
        if v.state_backend == "changelog":
            rejected.append(f"vertex {v.id!r} uses the changelog state backend")
            warnings.append(
                f"vertex {v.id!r} uses the changelog state backend, which regional checkpoints "
                "reject (DESIGN §4 rule 13); use `hashmap` or `incremental`"
            )
        if v.union_state:
            rejected.append(f"vertex {v.id!r} uses union list state")
            warnings.append(
                f"vertex {v.id!r} uses union list state, which regional checkpoints reject "
                "(DESIGN §4 rule 13); use split or keyed state instead"
            )
    notes = tuple(
        f"edge {e} is a durable exchange: {e.from_!r} commits what it sends with its "
        f"checkpoint and {e.to!r} reads it back from positions in its own state, so their "
        "units fall back on their own"
        for e in graph.edges
        if e.durable
    )
    for e in graph.edges:
        if not e.pipelined and not e.durable and _crosses(graph, e, regions):
            warnings.append(
                f"edge {e} joins different pipelined regions through a {e.exchange} exchange, "
                "so they fall back together as one unit; make the exchange pipelined for "
                "finer units"
            )
    reasons = []
    if rejected:
        reasons.append(
            "regional checkpoints are rejected: " + ", ".join(rejected) + " (DESIGN §4 rule 13)"
        )
    if num_units <= 1:
        reasons.append(
            "the job has a single fallback unit (every subtask exchanges data with every other, "
            "e.g. through a hash/rebalance edge), so it runs with global checkpoints only"
        )
    return RegionPlan(
        graph=graph,
        num_regions=num_regions,
        num_units=num_units,
        regional_allowed=not reasons,
        reason="; ".join(reasons) or None,
        warnings=tuple(warnings),
        _region_ids=regions,
        _unit_ids=units,
        notes=notes,
    )


def _pipelined(e: Edge) -> bool:
    return e.pipelined


def _joins_units(e: Edge) -> bool:
    return not e.durable


def _crosses(graph: JobGraph, e: Edge, regions: Mapping[str, Sequence[int]]) -> bool:
    """True when some link of `e` joins two different regions."""
    a, b = regions[e.from_], regions[e.to]
    if e.pointwise:
        return any(a[p] != b[c] for p, c in pointwise_links(len(a), len(b)))
    first = a[0]
    return any(r != first for r in a) or any(r != first for r in b)
