"""The compiled plan of a pipeline (DESIGN §6): what every epoch of every unit would otherwise
work out again from the pipeline's vertices, decided once.

`compile_plan(pipeline)` gives a `Plan`: per vertex its `Role` (a source, an operator, a sink,
the dead-letter sink of its part of the graph), its operator's state `Scope`, the capabilities
the epoch asks of its source and sink (an exchange reader that stamps origin watermarks, an
exchange writer that commits its subtask's watermark and judges keys) and a schema slot; and
per *shape* (the set of vertices a unit runs: one region's stage) the order the walker
(`regional.dataflow.walker`) runs them in, which vertices feed the dead letters and how many
vertices of the shape read each vertex's output. `Stream` and `KeyedStream` are the user API;
the walker reads only the plan.

>>> from regional.dataflow.pipeline import Pipeline
>>> from regional.sinks.parquet import ParquetSink
>>> from regional.sources.generator import GeneratorSource
>>> p = Pipeline("demo")
>>> src = p.source(GeneratorSource(2, lambda s, n: {"n": n}), parallelism=2, name="nums")
>>> src.key_by(lambda r: r["n"]).process(lambda ctx, r: [r], name="count").sink(
...     ParquetSink("/tmp/out"), name="out")
>>> plan = compile_plan(p)
>>> [(v.id, v.role.name) for v in plan.shape(["out", "count", "nums"]).order]
[('nums', 'SOURCE'), ('count', 'OPERATOR'), ('out', 'SINK')]
>>> plan.vertices["count"].scope
<Scope.SPLIT: 'split'>
>>> [v.id for v in plan.shape(["nums", "count", "out"]).order if v.merges]
['nums', 'count', 'out']
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import pyarrow as pa

from regional.dataflow.operators import Operator
from regional.sinks.base import Sink, WatermarkSink
from regional.sources.base import Source, TimedSource

if TYPE_CHECKING:
    from regional.dataflow.event_time import EventTime
    from regional.dataflow.pipeline import Pipeline, VertexSpec
    from regional.dataflow.state_codec import StateCodec

__all__ = ["Plan", "PlannedVertex", "Role", "Scope", "Shape", "compile_plan"]


class Role(enum.Enum):
    """What a vertex does in a unit's epoch."""

    SOURCE = "source"  # reads its subtask's splits
    OPERATOR = "operator"  # transforms its inputs' chunks (`regional.dataflow.operators`)
    SINK = "sink"  # takes its inputs' rows (an exchange writer too)
    DEAD_LETTERS = "dead-letters"  # the dead letters of its part of the graph


class Scope(enum.Enum):
    """Where an operator's keyed state lives (`regional.dataflow.state`)."""

    SPLIT = "split"  # per (input split, key): on a forward chain
    KEY = "key"  # per key, across splits: after a keyed exchange


#: Protocol checks cost tens of microseconds: made once per class.
_TIMED: dict[type, bool] = {}
_MARKING: dict[type, bool] = {}


def timed_source(source: object) -> TimedSource | None:
    """`source` if it is a `TimedSource` (it stamps each batch with its origin watermark and
    tells its subtask's watermark itself: the keyed exchange's reader), else None."""
    cls = type(source)
    timed = _TIMED.get(cls)
    if timed is None:
        timed = _TIMED[cls] = issubclass(cls, TimedSource)
    return cast(TimedSource, source) if timed else None


def watermark_sink(sink: object) -> WatermarkSink | None:
    """`sink` if it is a `WatermarkSink` (it commits its subtask's watermark with its rows,
    which stay inside the job: the keyed exchange's writer), else None."""
    cls = type(sink)
    marking = _MARKING.get(cls)
    if marking is None:
        marking = _MARKING[cls] = issubclass(cls, WatermarkSink)
    return cast(WatermarkSink, sink) if marking else None


@dataclasses.dataclass(frozen=True, eq=False)
class PlannedVertex:
    """One vertex as the walker runs it: its role and inputs, what it runs (`source`,
    `operator`, `sink`), the source's event time, the operator's state scope, the capabilities
    (`timed`: a `TimedSource`; `marks`: a `WatermarkSink`), the key an exchange writer judges
    each record by, and the schema it produces (None: not declared)."""

    id: str
    role: Role
    parallelism: int
    inputs: tuple[str, ...]
    source: Source | None = None
    operator: Operator | None = None
    sink: Sink | None = None
    event_time: EventTime | None = None
    scope: Scope | None = None
    timed: TimedSource | None = None
    marks: WatermarkSink | None = None
    key: Callable[[Any], Any] | None = None
    schema: pa.Schema | None = None

    @property
    def merges(self) -> bool:
        """Whether a pass runs this vertex once over all its units' records: anything but an
        operator that keeps state per key across splits, needs its unit's watermarks (windows,
        timers, joins, dedup: `Operator.timed`) or does not say it can (`Operator.one_pass`);
        such an operator runs once per unit inside the pass."""
        op = self.operator
        return op is None or (op.one_pass and self.scope is Scope.SPLIT and not op.timed)

    @property
    def stateful(self) -> bool:
        """Whether the vertex keeps operator state between epochs."""
        return self.operator is not None and self.operator.stateful


@dataclasses.dataclass(frozen=True, eq=False)
class Shape:
    """The vertices a unit runs (one region's stage), as its epoch runs them: `order`
    topological with the dead-letter sinks last (the other sinks and the exchange writers may
    still set records aside); `fed` the vertices whose dead letters each dead-letter sink
    takes (its inputs, the shape's sources and exchange writers); `readers` how many vertices
    of the shape read each vertex's output (a pass drops an output after its last reader);
    `dead_letters` whether a bad record becomes a dead letter rather than failing the unit.
    Units of any one shape can share a pass (DESIGN §6): the vertices that cannot run once
    over several units' records (`PlannedVertex.merges`) run once per unit inside it."""

    order: tuple[PlannedVertex, ...]
    fed: Mapping[str, tuple[str, ...]]
    readers: Mapping[str, int]
    dead_letters: bool


@dataclasses.dataclass(eq=False)
class Plan:
    """A pipeline compiled for its epochs (`compile_plan`)."""

    pipeline: Pipeline
    vertices: Mapping[str, PlannedVertex]
    topological: tuple[str, ...]
    timed: bool
    state_codec: StateCodec
    on_error: str
    _shapes: dict[frozenset[str], Shape] = dataclasses.field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.pipeline.name

    @property
    def records_per_epoch(self) -> int:
        """How many records a source subtask reads per epoch (the pipeline's, read live: a
        simulation changes it between epochs)."""
        return self.pipeline.records_per_epoch

    def read_budget(self, vertex: PlannedVertex) -> int:
        """How many records a subtask of source `vertex` reads per epoch: `records_per_epoch`,
        times ⌈writer subtasks / reader subtasks⌉ for a keyed exchange's reader, so that the
        readers together may take in one epoch what the writers may send in one (DESIGN §6:
        without it a wide upstream leaves a backlog that only grows, drained epoch by epoch).

        >>> from regional import FileSource, ParquetSink, Pipeline
        >>> from regional.dataflow.windows import count
        >>> p = Pipeline("p", records_per_epoch=100)
        >>> s = p.source(FileSource("in/", format="jsonl"), parallelism=8, name="in")
        >>> totals = s.key_by("k", partitions=3, name="by-k").aggregate(count())
        >>> _ = totals.sink(ParquetSink("out/"), name="out")
        >>> plan = compile_plan(p)
        >>> plan.read_budget(plan.vertices["in"]), plan.read_budget(plan.vertices["by-k"])
        (100, 300)
        """
        return self.pipeline.records_per_epoch * self._fan_in.get(vertex.id, 1)

    @functools.cached_property
    def _fan_in(self) -> Mapping[str, int]:
        """Exchange reader id -> ⌈writer subtasks / reader subtasks⌉."""
        return {
            reader_id: -(-exchange.writer_spec.parallelism // exchange.reader_spec.parallelism)
            for reader_id, exchange in self.pipeline.exchanges.items()
        }

    def shape(self, vertices: Iterable[str]) -> Shape:
        """The `Shape` of units made of `vertices` (computed once per set)."""
        key = vertices if isinstance(vertices, frozenset) else frozenset(vertices)
        found = self._shapes.get(key)
        if found is None:
            found = self._shapes[key] = self._shape_of(key)
        return found

    def _shape_of(self, vertices: frozenset[str]) -> Shape:
        unknown = vertices - self.vertices.keys()
        if unknown:
            raise KeyError(
                f"pipeline {self.name!r} has no vertex {', '.join(sorted(unknown))}: the work "
                "is for another pipeline"
            )
        ids = [v for v in self.topological if v in vertices]
        planned = [self.vertices[v] for v in ids]
        order = tuple(
            [v for v in planned if v.role is not Role.DEAD_LETTERS]
            + [v for v in planned if v.role is Role.DEAD_LETTERS]
        )
        sources = [v.id for v in order if v.role is Role.SOURCE]
        writers = [v.id for v in order if v.key is not None]
        fed = {
            v.id: tuple(dict.fromkeys([*v.inputs, *sources, *writers]))
            for v in order
            if v.role is Role.DEAD_LETTERS
        }
        readers = {v.id: sum(v.id in w.inputs for w in order) for v in order}
        return Shape(
            order=order,
            fed=fed,
            readers=readers,
            dead_letters=self.on_error == "dead-letter"
            and any(v.role is Role.DEAD_LETTERS for v in order),
        )


def _planned(spec: VertexSpec) -> PlannedVertex:
    if spec.source is not None:
        role = Role.SOURCE
    elif spec.operator is not None:
        role = Role.OPERATOR
    elif spec.dead_letter:
        role = Role.DEAD_LETTERS
    else:
        role = Role.SINK
    op = spec.operator
    return PlannedVertex(
        id=spec.id,
        role=role,
        parallelism=spec.parallelism,
        inputs=spec.inputs,
        source=spec.source,
        operator=op,
        sink=spec.sink,
        event_time=spec.event_time,
        scope=None if op is None else Scope(op.scope),
        timed=timed_source(spec.source) if spec.source is not None else None,
        marks=watermark_sink(spec.sink) if spec.sink is not None else None,
        key=spec.key,
        schema=spec.schema,
    )


def compile_plan(pipeline: Pipeline) -> Plan:
    """The plan of `pipeline` as it stands (computed once per shape of the pipeline: a
    pipeline still being built gets a new plan when a vertex is added)."""
    specs = tuple(pipeline.vertices.values())
    cached = pipeline.__dict__.get("_plan")
    if (
        cached is not None
        and len(cached[0]) == len(specs)
        and all(a is b for a, b in zip(cached[0], specs, strict=True))
    ):
        return cast(Plan, cached[1])
    plan = Plan(
        pipeline=pipeline,
        vertices={s.id: _planned(s) for s in specs},
        topological=pipeline.topological_order(),
        timed=pipeline.timed,
        state_codec=pipeline.state_codec,
        on_error=pipeline.on_error,
    )
    pipeline.__dict__["_plan"] = (specs, plan)
    return plan
