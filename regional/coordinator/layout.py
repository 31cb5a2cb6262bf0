"""The job layout the coordinator works on: fallback units, their subtasks, vertex sizes.

The coordinator does not analyse graphs; the runtime adapts the region analyser's plan (anything
with `num_units` and `subtasks_of_unit(unit_id)`) with `JobLayout.from_plan`. Unit ids are dense,
`0 .. num_units - 1`.

>>> from metadata.model import VertexInfo
>>> layout = JobLayout(
...     units=((("src", 0), ("sink", 0)), (("src", 1), ("sink", 1))),
...     vertices=(VertexInfo("src", 2, 128), VertexInfo("sink", 2, 128)),
...     sources=frozenset({"src"}), bounded_sources=frozenset({"src"}))
>>> layout.num_units, layout.unit_of("sink", 1)
(2, 1)
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Protocol

from metadata.model import VertexInfo
from regional.errors import GraphError

__all__ = ["JobLayout", "UnitPlan"]

Subtask = tuple[str, int]


class UnitPlan(Protocol):
    """What the region analyser's plan offers (duck-typed; `regional.graph.regions` is not
    imported)."""

    @property
    def num_units(self) -> int: ...

    def subtasks_of_unit(self, unit_id: int) -> Iterable[Subtask]: ...


@dataclasses.dataclass(frozen=True)
class JobLayout:
    """Units (index = unit id) as tuples of subtasks `(vertex_id, index)`, vertex sizes, which
    vertices are sources and which of those read bounded input, and the graph fingerprint.

    Validated on construction: every subtask of every vertex is in exactly one unit.
    """

    units: tuple[tuple[Subtask, ...], ...]
    vertices: tuple[VertexInfo, ...]
    sources: frozenset[str] = frozenset()
    bounded_sources: frozenset[str] = frozenset()
    graph_fingerprint: str = ""
    _unit_of: dict[Subtask, int] = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        sizes = {v.vertex_id: v.parallelism for v in self.vertices}
        unit_of: dict[Subtask, int] = {}
        for unit_id, subtasks in enumerate(self.units):
            if not subtasks:
                raise GraphError(f"unit {unit_id} has no subtasks; every unit needs at least one")
            for vertex_id, index in subtasks:
                if vertex_id not in sizes:
                    raise GraphError(
                        f"unit {unit_id} holds subtask ({vertex_id!r}, {index}) of an unknown "
                        f"vertex; known vertices: {', '.join(sorted(sizes))}"
                    )
                if not 0 <= index < sizes[vertex_id]:
                    raise GraphError(
                        f"unit {unit_id} holds subtask ({vertex_id!r}, {index}) but vertex "
                        f"{vertex_id!r} has parallelism {sizes[vertex_id]}"
                    )
                if (vertex_id, index) in unit_of:
                    raise GraphError(
                        f"subtask ({vertex_id!r}, {index}) is in units {unit_of[vertex_id, index]}"
                        f" and {unit_id}; a subtask belongs to exactly one unit"
                    )
                unit_of[vertex_id, index] = unit_id
        for vertex_id, parallelism in sizes.items():
            for index in range(parallelism):
                if (vertex_id, index) not in unit_of:
                    raise GraphError(f"subtask ({vertex_id!r}, {index}) is in no unit")
        for name, group in (("sources", self.sources), ("bounded_sources", self.bounded_sources)):
            if unknown := sorted(group - sizes.keys()):
                raise GraphError(f"{name} names unknown vertices: {', '.join(unknown)}")
        if extra := sorted(self.bounded_sources - self.sources):
            raise GraphError(f"bounded_sources {', '.join(extra)} are not listed in sources")
        object.__setattr__(self, "_unit_of", unit_of)

    @classmethod
    def from_plan(
        cls,
        plan: UnitPlan,
        vertices: Iterable[VertexInfo],
        *,
        sources: Iterable[str] = (),
        bounded_sources: Iterable[str] = (),
        graph_fingerprint: str = "",
    ) -> JobLayout:
        """The layout of a region analyser plan."""
        units = tuple(tuple(plan.subtasks_of_unit(u)) for u in range(plan.num_units))
        return cls(
            units,
            tuple(vertices),
            frozenset(sources),
            frozenset(bounded_sources),
            graph_fingerprint,
        )

    @property
    def num_units(self) -> int:
        """How many fallback units the job has."""
        return len(self.units)

    def unit_of(self, vertex_id: str, index: int) -> int:
        """The unit holding subtask `(vertex_id, index)`."""
        return self._unit_of[vertex_id, index]
