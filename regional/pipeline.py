"""The pipeline API: sources -> operators -> sinks, joined by forward edges.

Every operator runs with the parallelism of its input, and subtask `i` of an operator reads only
subtask `i` of its inputs (a forward edge), so each chain of subtasks `(source#i, op#i, ...,
sink#i)` is one region that can fall back on its own. Operators are record-wise (`map`,
`flat_map`, `filter`), Arrow-batch-wise (`map_batches`) or stateful (`key_by(...).process(fn)`
with split-scoped keyed state, see `regional.state`).

>>> from regional.sources.generator import GeneratorSource
>>> p = Pipeline("demo")
>>> nums = p.source(GeneratorSource(3, lambda s, n: {"n": n}, records_per_split=5), name="nums",
...                 parallelism=3)
>>> evens = nums.filter(lambda r: r["n"] % 2 == 0, name="evens")
>>> _ = evens.map(lambda r: {"n": r["n"] * 10}, name="times10")
>>> plan = p.regions()
>>> plan.num_units, [str(s) for s in plan.subtasks_of_unit(1)]
(3, ['nums#1', 'evens#1', 'times10#1'])
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional.errors import GraphError
from regional.graph import Edge, JobGraph, Vertex
from regional.sources.base import Source
from regional.state import KeyedContext, OperatorState
from regional.state_codec import PickledState, StateCodec

if TYPE_CHECKING:
    from regional.regions import RegionPlan

__all__ = ["Chunk", "Operator", "Pipeline", "Stream", "VertexSpec"]

#: Data flowing between operators: the split the records came from, and the records.
Chunk = tuple[str, pa.RecordBatch | list[Any]]


def _records(data: pa.RecordBatch | list[Any]) -> list[Any]:
    return data.to_pylist() if isinstance(data, pa.RecordBatch) else data


def _batch(data: pa.RecordBatch | list[Any]) -> pa.RecordBatch:
    return data if isinstance(data, pa.RecordBatch) else pa.RecordBatch.from_pylist(data)


@dataclasses.dataclass(frozen=True)
class Operator:
    """One transformation. `kind` is map, flat_map, filter, map_batches or process."""

    kind: str
    fn: Callable[..., Any]
    key: Callable[[Any], Any] | None = None
    name: str = ""  # the vertex id, for errors (set when the operator is added)

    @property
    def stateful(self) -> bool:
        return self.kind == "process"

    def apply(self, chunks: Iterable[Chunk], state: OperatorState | None) -> list[Chunk]:
        """Run over one epoch's chunks of one subtask (state: for `process` only)."""
        out: list[Chunk] = []
        for split, data in chunks:
            if self.kind == "map_batches":
                result = self.fn(_batch(data))
                if isinstance(result, pa.Table):
                    out += [(split, b) for b in result.to_batches() if b.num_rows]
                elif isinstance(result, pa.RecordBatch):
                    if result.num_rows:
                        out.append((split, result))
                elif result is not None:
                    raise TypeError(
                        f"operator {self.name!r}: the map_batches function returned "
                        f"{type(result).__module__}.{type(result).__qualname__}; return a "
                        "pyarrow.RecordBatch, a pyarrow.Table or None"
                    )
                continue
            records = _records(data)
            if self.kind == "map":
                produced = [self.fn(r) for r in records]
            elif self.kind == "filter":
                produced = [r for r in records if self.fn(r)]
            elif self.kind == "flat_map":
                produced = [o for r in records for o in (self.fn(r) or ())]
            else:  # process
                assert state is not None and self.key is not None
                produced = []
                for r in records:
                    ctx: KeyedContext = state.context(split, self.key(r))
                    produced.extend(self.fn(ctx, r) or ())
            if produced:
                out.append((split, produced))
        return out


@dataclasses.dataclass(frozen=True)
class VertexSpec:
    """A vertex of the pipeline: what it runs (`source`, `operator` or `sink`) and its inputs."""

    id: str
    kind: str
    parallelism: int
    inputs: tuple[str, ...] = ()
    source: Source | None = None
    operator: Operator | None = None
    sink: Any = None


class Stream:
    """The output of one vertex; methods add a downstream operator over a forward edge."""

    def __init__(self, pipeline: Pipeline, vertex_id: str) -> None:
        self.pipeline = pipeline
        self.vertex_id = vertex_id

    def _then(self, kind: str, fn: Callable[..., Any], name: str | None, key: Any = None) -> Stream:
        op = Operator(kind, fn, key)
        return self.pipeline._add(kind, name, (self.vertex_id,), operator=op)

    def map(self, fn: Callable[[Any], Any], *, name: str | None = None) -> Stream:
        """One output record per input record."""
        return self._then("map", fn, name)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], *, name: str | None = None) -> Stream:
        """Zero or more output records per input record."""
        return self._then("flat_map", fn, name)

    def filter(self, fn: Callable[[Any], bool], *, name: str | None = None) -> Stream:
        """The records for which `fn` is true."""
        return self._then("filter", fn, name)

    def map_batches(
        self,
        fn: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table | None],
        *,
        name: str | None = None,
    ) -> Stream:
        """One Arrow record batch in, a record batch or table out (vectorised work); anything
        else fails the unit with a `TypeError` naming the operator."""
        return self._then("map_batches", fn, name)

    def key_by(self, key: Callable[[Any], Any]) -> KeyedStream:
        """Key the records for a stateful `process`."""
        return KeyedStream(self, key)

    def union(self, *others: Stream, name: str | None = None) -> Stream:
        """The records of this stream and `others` (same parallelism, forward edges)."""
        ids = (self.vertex_id, *(o.vertex_id for o in others))
        return self.pipeline._add("map", name, ids, operator=Operator("map", _identity))

    def sink(self, sink: Any, *, name: str | None = None) -> None:
        """Write the records to `sink` (e.g. `regional.sinks.parquet.ParquetSink`)."""
        self.pipeline._add("sink", name, (self.vertex_id,), sink=sink)


def _identity(record: Any) -> Any:
    return record


class KeyedStream:
    """A stream keyed by `key`: `process(fn)` runs `fn(ctx, record) -> iterable of outputs`."""

    def __init__(self, stream: Stream, key: Callable[[Any], Any]) -> None:
        self._stream = stream
        self._key = key

    def process(
        self, fn: Callable[[KeyedContext, Any], Iterable[Any] | None], *, name: str | None = None
    ) -> Stream:
        """A stateful operator; `ctx` gives value/map state of (split, key) and list state."""
        return self._stream._then("process", fn, name, self._key)


class Pipeline:
    """A job: add sources with `source(...)`, chain operators on the streams, end in sinks.

    `records_per_epoch` caps how many records each source subtask reads per epoch (per
    checkpoint); `splits_per_subtask` how many splits a source subtask reads at once.
    `state_types` are the msgspec Struct classes operator state may hold;
    `state_serializer=PickledState(secret=...)` opts in to pickled state (any picklable
    object, segments signed with the secret) instead of msgpack (`regional.state_codec`).
    """

    def __init__(
        self,
        name: str = "pipeline",
        *,
        records_per_epoch: int = 10_000,
        splits_per_subtask: int = 1,
        state_types: Iterable[type] = (),
        state_serializer: PickledState | None = None,
    ) -> None:
        self.name = name
        self.records_per_epoch = records_per_epoch
        self.splits_per_subtask = splits_per_subtask
        self.vertices: dict[str, VertexSpec] = {}
        self.state_codec = StateCodec(state_types, state_serializer)

    def source(self, source: Source, *, parallelism: int = 1, name: str | None = None) -> Stream:
        """A source vertex with `parallelism` subtasks reading `source`'s splits."""
        if not isinstance(source, Source):
            raise GraphError(
                f"{type(source).__name__} is not a source; give a FileSource, LogSource, "
                "GeneratorSource or an object with bounded/discover/read"
            )
        return self._add("source", name, (), source=source, parallelism=parallelism)

    def _add(
        self,
        kind: str,
        name: str | None,
        inputs: tuple[str, ...],
        *,
        parallelism: int | None = None,
        **what: Any,
    ) -> Stream:
        vid = name or f"{kind}-{len(self.vertices)}"
        if vid in self.vertices:
            raise GraphError(f"pipeline {self.name!r}: vertex {vid!r} exists; pick another name")
        if inputs:
            sizes = {self.vertices[i].parallelism for i in inputs}
            if len(sizes) > 1:
                raise GraphError(
                    f"vertex {vid!r} joins inputs {', '.join(inputs)} of different parallelism "
                    f"{sorted(sizes)}; forward edges need equal parallelism"
                )
            parallelism = sizes.pop()
        role = {"source": "source", "sink": "sink"}.get(kind, "operator")
        if isinstance(what.get("operator"), Operator):
            what["operator"] = dataclasses.replace(what["operator"], name=vid)
        self.vertices[vid] = VertexSpec(vid, role, parallelism or 1, inputs, **what)
        return Stream(self, vid)

    @property
    def sources(self) -> dict[str, VertexSpec]:
        return {k: v for k, v in self.vertices.items() if v.kind == "source"}

    @property
    def sinks(self) -> dict[str, VertexSpec]:
        return {k: v for k, v in self.vertices.items() if v.kind == "sink"}

    def job_graph(self) -> JobGraph:
        """The job graph: one vertex per source/operator/sink, forward pipelined edges."""
        if not self.vertices:
            raise GraphError(f"pipeline {self.name!r} is empty; add a source with .source(...)")
        vertices = tuple(
            Vertex(
                v.id,
                v.parallelism,
                kind=v.kind,  # type: ignore[arg-type]
                bounded=bool(v.source is not None and v.source.bounded),
            )
            for v in self.vertices.values()
        )
        edges = tuple(
            Edge(i, v.id, "forward", "pipelined") for v in self.vertices.values() for i in v.inputs
        )
        return JobGraph(vertices, edges)

    def regions(self) -> RegionPlan:
        """The region analyser's plan for this pipeline (`regional.regions.analyse`)."""
        from regional.regions import analyse

        return analyse(self.job_graph())

    def topological_order(self) -> tuple[str, ...]:
        """Vertex ids, producers first (the order a region task runs them in)."""
        return self.job_graph().topological_order()
