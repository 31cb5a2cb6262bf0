"""What an operator module sees of the pipeline it adds its operator to (DESIGN §3).

Each keyed operator's module has a ``build_<operator>`` function that checks its own arguments
(every error names the operator and says how to fix it), asks the pipeline what it needs of
the graph through `Build` (the input's event time, its state scope, both join sides partitioned
alike, the late-record policy) and adds its vertex. `KeyedStream` (the user API,
`regional.dataflow.pipeline`) only hands its arguments on, so a new operator is its module, its
test and one line of API; the pipeline's graph rules stay in one place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from regional.dataflow.event_time import EventTime
    from regional.dataflow.operators import Operator

__all__ = ["Build", "Keyed"]


class Keyed(NamedTuple):
    """A keyed input of an operator: the vertex it reads and the key function."""

    vertex_id: str
    key: Callable[[Any], Any]


class Build(Protocol):
    """The pipeline as an operator's builder uses it."""

    def keyed(
        self, stream: object, what: str, *, want: str = "a keyed stream, e.g. other.key_by('id')"
    ) -> Keyed:
        """`stream` as a keyed input; `GraphError` naming `what` and what it wants when it is
        not a keyed stream (``stream.key_by(...)``)."""
        ...

    def late_policy(self, what: str, on_late: str) -> None:
        """`GraphError` naming `what` when `on_late` is not a policy the pipeline can keep
        (``"dead-letter"`` needs the pipeline's dead-letter sink)."""
        ...

    def event_time_of(
        self, vertex_id: str, given: Callable[[Any], Any] | str | None, what: str
    ) -> EventTime:
        """`given`, else the event time of the sources `vertex_id` reads; `GraphError` naming
        `what` when no source upstream reads with event time."""
        ...

    def key_scope(self, vertex_id: str, key: Callable[[Any], Any], name: str | None) -> str:
        """Where the keyed state of an operator reading `vertex_id` by `key` lives: "split"
        (no exchange upstream) or "key" (after keyed exchanges by `key`)."""
        ...

    def co_partition(
        self, left: Keyed, right: Keyed, *, partitions: int | None, name: str
    ) -> tuple[str, str]:
        """The reader vertices of `left` and `right` partitioned alike (a join's inputs),
        adding the keyed exchanges a side needs."""
        ...

    def schema_of(self, vertex_id: str) -> pa.Schema | None:
        """The schema of the records vertex `vertex_id` produces (None: not known), which an
        operator on columns checks its columns against and derives its own from."""
        ...

    def vertex_id(self, kind: str, name: str | None) -> str:
        """The id the next vertex of `kind` gets: `name`, else a numbered default."""
        ...

    def add(self, operator: Operator, name: str | None, inputs: tuple[str, ...]) -> str:
        """Add `operator` as a vertex reading `inputs`; its id."""
        ...
