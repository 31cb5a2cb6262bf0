"""The job graph: vertices (sources, operators, sinks) joined by edges (DESIGN §2, §4 rule 1).

A `JobGraph` is validated when it is built, whichever way it comes in (Python API, our JSON/TOML
file, a Flink plan JSON; see `regional.graph.files`): every error is a `GraphError` naming the
vertex or edge and the fix. The vertex order used everywhere (`topological_order`) breaks ties by
vertex id, so region and unit ids depend only on the graph's content, like `fingerprint()`.

>>> g = JobGraph(
...     vertices=(Vertex("src", 2, kind="source"), Vertex("sink", 2, kind="sink")),
...     edges=(Edge("src", "sink", "forward"),),
... )
>>> g.vertex("sink").max_parallelism
128
>>> g.topological_order()
('src', 'sink')
>>> g.num_subtasks
4
>>> [str(e) for e in g.inputs("sink")]
['src -> sink (forward, pipelined_bounded)']
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterator
from typing import Literal

import msgspec
import networkx as nx

from metadata.model import VertexInfo
from regional.errors import GraphError

__all__ = [
    "ALL_TO_ALL",
    "MAX_PARALLELISM_UPPER_BOUND",
    "PIPELINED",
    "POINTWISE",
    "Edge",
    "Exchange",
    "JobGraph",
    "Kind",
    "Partitioner",
    "StateBackend",
    "Vertex",
    "default_max_parallelism",
]

Kind = Literal["source", "operator", "sink"]
Partitioner = Literal["forward", "rescale", "rebalance", "hash", "broadcast", "global", "custom"]
Exchange = Literal[
    "pipelined", "pipelined_bounded", "blocking", "hybrid_full", "hybrid_selective", "durable"
]
StateBackend = Literal["hashmap", "incremental", "changelog"]

#: Partitioners whose consumer subtask reads a few producer subtasks (Flink's POINTWISE).
POINTWISE: frozenset[str] = frozenset({"forward", "rescale"})
#: Partitioners whose consumer subtasks read every producer subtask (Flink's ALL_TO_ALL).
ALL_TO_ALL: frozenset[str] = frozenset({"rebalance", "hash", "broadcast", "global", "custom"})
#: Exchanges whose results must be consumed while produced: they join regions.
PIPELINED: frozenset[str] = frozenset({"pipelined", "pipelined_bounded"})
#: The exchange whose results are committed with the producer's checkpoint and read back by
#: the consumer from its own stored positions (`regional.dataflow.exchange`): it splits fallback
#: units.
DURABLE = "durable"

#: Flink's upper bound for max parallelism (number of key groups), 2**15.
MAX_PARALLELISM_UPPER_BOUND = 32768


def default_max_parallelism(parallelism: int) -> int:
    """Flink's default max parallelism: ``min(max(roundUpToPowerOfTwo(p + p/2), 128), 32768)``.

    >>> [default_max_parallelism(p) for p in (1, 100, 1000, 30000)]
    [128, 256, 2048, 32768]
    """
    wanted = parallelism + parallelism // 2
    power = 1 << max(wanted - 1, 0).bit_length()
    return min(max(power, 128), MAX_PARALLELISM_UPPER_BOUND)


class Vertex(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One job vertex: `parallelism` subtasks `(id, 0) .. (id, parallelism - 1)`.

    `max_parallelism` defaults to Flink's formula (`default_max_parallelism`), `name` to the id.
    `state_backend` and `union_state` matter for regional checkpoints (DESIGN §4 rule 13).
    """

    id: str
    parallelism: int
    name: str = ""
    kind: Kind = "operator"
    max_parallelism: int | None = None
    bounded: bool = False
    state_backend: StateBackend = "hashmap"
    union_state: bool = False

    def __post_init__(self) -> None:
        if not self.id:
            raise GraphError("a vertex has an empty id; give every vertex a non-empty `id`")
        if not self.name:
            msgspec.structs.force_setattr(self, "name", self.id)
        if self.parallelism < 1:
            raise GraphError(
                f"vertex {self.id!r}: parallelism {self.parallelism} is < 1; "
                "set `parallelism` to at least 1"
            )
        max_parallelism = self.max_parallelism
        if max_parallelism is None:
            max_parallelism = default_max_parallelism(self.parallelism)
            msgspec.structs.force_setattr(self, "max_parallelism", max_parallelism)
        elif not 1 <= max_parallelism <= MAX_PARALLELISM_UPPER_BOUND:
            raise GraphError(
                f"vertex {self.id!r}: max_parallelism {max_parallelism} is outside "
                f"1..{MAX_PARALLELISM_UPPER_BOUND}; set it in that range or leave it out"
            )
        if self.parallelism > max_parallelism:
            raise GraphError(
                f"vertex {self.id!r}: parallelism {self.parallelism} is > max_parallelism "
                f"{self.max_parallelism}; lower `parallelism` or raise `max_parallelism`"
            )

    @property
    def info(self) -> VertexInfo:
        """The vertex as checkpoint metadata records it."""
        return VertexInfo(self.id, self.parallelism, self.max_parallelism or 0)


class Edge(msgspec.Struct, frozen=True, forbid_unknown_fields=True, rename={"from_": "from"}):
    """A data exchange from vertex `from_` (key ``from`` in files) to vertex `to`.

    The `partitioner` decides which consumer subtasks read which producer subtasks; the
    `exchange` whether the data is consumed while produced (pipelined), after (blocking,
    hybrid: the two sides still fall back together), or read back from committed storage
    (durable: the two sides are separate fallback units).
    """

    from_: str
    to: str
    partitioner: Partitioner
    exchange: Exchange = "pipelined_bounded"

    @property
    def pointwise(self) -> bool:
        """True for forward and rescale (each consumer reads a few producers)."""
        return self.partitioner in POINTWISE

    @property
    def pipelined(self) -> bool:
        """True for pipelined and pipelined_bounded exchanges (they join regions)."""
        return self.exchange in PIPELINED

    @property
    def durable(self) -> bool:
        """True for a durable exchange: producer and consumer fall back on their own."""
        return self.exchange == DURABLE

    def __str__(self) -> str:
        return f"{self.from_} -> {self.to} ({self.partitioner}, {self.exchange})"


class JobGraph(msgspec.Struct, frozen=True, forbid_unknown_fields=True, dict=True):
    """A validated DAG of vertices and edges (parallel edges between two vertices are allowed).

    Raises `GraphError` for duplicate vertex ids, edges naming unknown vertices, cycles and
    forward edges between vertices of different parallelism.
    """

    vertices: tuple[Vertex, ...]
    edges: tuple[Edge, ...] = ()

    def __post_init__(self) -> None:
        if not self.vertices:
            raise GraphError("the job graph has no vertices; declare at least one under `vertices`")
        seen: set[str] = set()
        for v in self.vertices:
            if v.id in seen:
                raise GraphError(f"duplicate vertex id {v.id!r}; give every vertex its own id")
            seen.add(v.id)
        for e in self.edges:
            for end in (e.from_, e.to):
                if end not in seen:
                    raise GraphError(
                        f"edge {e} names unknown vertex {end!r}; declare it under `vertices` "
                        "or fix the edge"
                    )
            if e.from_ == e.to:
                raise GraphError(f"edge {e} is a cycle (a vertex feeding itself); remove it")
            if e.partitioner == "forward":
                p, q = self.vertex(e.from_).parallelism, self.vertex(e.to).parallelism
                if p != q:
                    raise GraphError(
                        f"forward edge {e} joins parallelism {p} to {q}; give both vertices "
                        "the same parallelism or use `rescale`/`rebalance`"
                    )
        try:
            cycle = nx.find_cycle(self._digraph)
        except nx.NetworkXNoCycle:
            return
        path = " -> ".join([u for u, _ in cycle] + [cycle[0][0]])
        raise GraphError(f"the job graph has a cycle {path}; remove one of these edges")

    @functools.cached_property
    def _by_id(self) -> dict[str, Vertex]:
        return {v.id: v for v in self.vertices}

    @functools.cached_property
    def _digraph(self) -> nx.DiGraph:
        g = nx.DiGraph()
        g.add_nodes_from(v.id for v in self.vertices)
        g.add_edges_from((e.from_, e.to) for e in self.edges)
        return g

    def vertex(self, vertex_id: str) -> Vertex:
        """The vertex with this id (`GraphError` naming it if there is none)."""
        try:
            return self._by_id[vertex_id]
        except KeyError:
            raise GraphError(f"no vertex {vertex_id!r} in the job graph") from None

    def inputs(self, vertex_id: str) -> Iterator[Edge]:
        """The edges into `vertex_id`, in declaration order."""
        return (e for e in self.edges if e.to == vertex_id)

    @functools.cached_property
    def _order(self) -> tuple[str, ...]:
        return tuple(nx.lexicographical_topological_sort(self._digraph))

    def topological_order(self) -> tuple[str, ...]:
        """Vertex ids, producers before consumers, ties broken by id (stable across files)."""
        return self._order

    @property
    def num_subtasks(self) -> int:
        """Total number of subtasks over all vertices."""
        return sum(v.parallelism for v in self.vertices)

    def vertex_infos(self) -> tuple[VertexInfo, ...]:
        """`VertexInfo` of every vertex in topological order, for checkpoint metadata."""
        return tuple(self._by_id[v].info for v in self.topological_order())

    def fingerprint(self) -> str:
        """Hex SHA-256 of the canonical JSON (vertices sorted by id, edges sorted), for the
        `graph_fingerprint` of checkpoint metadata; declaration order does not matter."""
        canonical = {
            "vertices": sorted(self.vertices, key=lambda v: v.id),
            "edges": sorted(self.edges, key=lambda e: (e.from_, e.to, e.partitioner, e.exchange)),
        }
        return hashlib.sha256(msgspec.json.encode(canonical)).hexdigest()
