"""Job graphs from the two JSON plans Flink prints, so users can paste what Flink gave them.

* The REST plan, ``GET /jobs/<id>/plan`` (``{"plan": {...}}`` or the inner object): job vertices
  with ``nodes[].inputs[].ship_strategy`` and ``.exchange`` (e.g. ``pipelined_bounded``).
* The execution plan of ``StreamExecutionEnvironment.getExecutionPlan()`` or SQL
  ``EXPLAIN ... JSON_EXECUTION_PLAN``: ``nodes[].predecessors[].ship_strategy``; it has no exchange
  type, so every edge is pipelined (Flink's streaming default, ``pipelined_bounded``).

Ship strategies are read case-insensitively by their leading word (``"HASH[a]"`` is ``hash``).
Nodes without inputs become sources, nodes nobody consumes sinks; max parallelism gets Flink's
default, as neither plan records it.

>>> g = graph_from_flink_plan(
...     {"nodes": [{"id": 1, "type": "Source", "parallelism": 2},
...                {"id": 2, "type": "Map", "parallelism": 2,
...                 "predecessors": [{"id": 1, "ship_strategy": "FORWARD"}]}]},
...     source="plan.json",
... )
>>> [(v.id, v.kind) for v in g.vertices], g.edges[0].exchange
([('1', 'source'), ('2', 'sink')], 'pipelined_bounded')
"""

from __future__ import annotations

import html
import re
from collections.abc import Mapping
from typing import Any

import msgspec

from regional.errors import GraphError
from regional.graph.job_graph import Edge, JobGraph, Kind, Vertex

__all__ = ["SHIP_STRATEGIES", "graph_from_flink_plan", "is_flink_plan"]

#: Flink ship-strategy words (upper case) -> our partitioner. SHUFFLE (random) and the DataSet
#: API's PARTITION_* names are all-to-all like rebalance.
SHIP_STRATEGIES: Mapping[str, str] = {
    "FORWARD": "forward",
    "HASH": "hash",
    "REBALANCE": "rebalance",
    "RESCALE": "rescale",
    "BROADCAST": "broadcast",
    "GLOBAL": "global",
    "CUSTOM": "custom",
    "SHUFFLE": "rebalance",
    "PARTITION_HASH": "hash",
    "PARTITION_RANDOM": "rebalance",
    "PARTITION_FORCED_REBALANCE": "rebalance",
    "PARTITION_CUSTOM": "custom",
    "PARTITION_RANGE": "custom",
}

#: Flink result partition types (lower case) -> our exchange.
_EXCHANGES: Mapping[str, str] = {
    "pipelined": "pipelined",
    "pipelined_bounded": "pipelined_bounded",
    "blocking": "blocking",
    "blocking_persistent": "blocking",
    "hybrid_full": "hybrid_full",
    "hybrid_selective": "hybrid_selective",
}


class _Input(msgspec.Struct):
    id: str | int
    ship_strategy: str
    exchange: str = "pipelined_bounded"


class _Node(msgspec.Struct):
    id: str | int
    parallelism: int
    description: str = ""
    type: str = ""
    contents: str = ""
    inputs: list[_Input] = []
    predecessors: list[_Input] = []


class _Plan(msgspec.Struct):
    nodes: list[_Node]


def is_flink_plan(obj: Any) -> bool:
    """True when `obj` (decoded JSON) looks like one of Flink's plans (a `nodes` list)."""
    if isinstance(obj, Mapping) and isinstance(obj.get("plan"), Mapping):
        obj = obj["plan"]
    return isinstance(obj, Mapping) and isinstance(obj.get("nodes"), list)


def _name(node: _Node) -> str:
    text = node.description or node.contents or node.type
    text = re.sub(r"<[^>]*>", " ", html.unescape(text))
    return " ".join(text.split())


def _partitioner(value: str, where: str) -> str:
    word = re.match(r"[A-Za-z_]*", value.strip())
    key = word.group(0).upper() if word else ""
    if key not in SHIP_STRATEGIES:
        raise GraphError(
            f"{where}: unknown ship_strategy {value!r}; expected one of "
            f"{', '.join(sorted(SHIP_STRATEGIES))}"
        )
    return SHIP_STRATEGIES[key]


def _exchange(value: str, where: str) -> str:
    key = value.strip().lower()
    if key not in _EXCHANGES:
        raise GraphError(
            f"{where}: exchange {value!r} is not supported; expected one of "
            f"{', '.join(sorted(_EXCHANGES))}"
        )
    return _EXCHANGES[key]


def graph_from_flink_plan(obj: Any, *, source: str) -> JobGraph:
    """The job graph of a decoded Flink REST plan or execution plan; errors name `source`."""
    if isinstance(obj, Mapping) and isinstance(obj.get("plan"), Mapping):
        obj = obj["plan"]
    try:
        plan = msgspec.convert(obj, _Plan)
    except msgspec.ValidationError as exc:
        raise GraphError(f"{source}: not a Flink plan: {exc}") from None
    links: list[tuple[str, str, str, str]] = []
    for n, node in enumerate(plan.nodes):
        for key in ("inputs", "predecessors"):
            for i, link in enumerate(getattr(node, key)):
                where = f"{source}: $.nodes[{n}].{key}[{i}]"
                partitioner = _partitioner(link.ship_strategy, where)
                exchange = _exchange(link.exchange, where) if key == "inputs" else None
                links.append(
                    (str(link.id), str(node.id), partitioner, exchange or "pipelined_bounded")
                )
    producers = {link[0] for link in links}
    consumers = {link[1] for link in links}
    try:
        vertices = [
            Vertex(
                str(node.id),
                node.parallelism,
                name=_name(node),
                kind=_kind(str(node.id), producers, consumers),
            )
            for node in plan.nodes
        ]
        edges = [Edge(*link) for link in links]  # type: ignore[arg-type]
        return JobGraph(vertices=tuple(vertices), edges=tuple(edges))
    except GraphError as exc:
        raise GraphError(f"{source}: {exc}") from None


def _kind(vertex_id: str, producers: set[str], consumers: set[str]) -> Kind:
    if vertex_id not in consumers:
        return "source"
    return "sink" if vertex_id not in producers else "operator"
