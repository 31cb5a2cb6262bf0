"""The pipeline API: sources -> operators -> sinks, joined by forward edges and keyed exchanges.

Every operator runs with the parallelism of its input, and subtask `i` of an operator reads only
subtask `i` of its inputs (a forward edge), so each chain of subtasks `(source#i, op#i, ...,
sink#i)` is one region that can fall back on its own. Operators are record-wise (`map`,
`flat_map`, `filter`), Arrow-batch-wise (`map_batches`) or stateful (`key_by(...).process(fn)`).

Keyed state comes in two scopes (`regional.dataflow.state`):

* **split-scoped** on a forward chain: `key_by(key).process(fn)` keeps state per (input split,
  key), because subtask `i` only sees the splits its source subtask reads;
* **key-scoped** after a durable keyed exchange: `key_by(key, partitions=N).process(fn)` ends
  the stage (`regional.dataflow.exchange`); what follows runs in N subtasks, each owning the keys
  that
  hash to it, and keeps state per key, across every input split.

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
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import pyarrow as pa

from regional.dataflow.building import Keyed
from regional.dataflow.dead_letters import DEAD_LETTERS, ON_ERROR
from regional.dataflow.event_time import EventTime
from regional.dataflow.fitted_source import fitted
from regional.dataflow.keys import KeyLike, key_columns, key_function
from regional.dataflow.operators import (
    Chunk,
    Filter,
    FlatMap,
    Map,
    MapBatches,
    Operator,
    build_apply_in_arrow,
    build_process,
    build_window,
)
from regional.dataflow.schema import produced_schema, schema_of
from regional.dataflow.state import KeyedContext
from regional.dataflow.state_codec import PickledState, StateCodec
from regional.dataflow.stream_schemas import (
    JoinColumns,
    column_of,
    describe,
    same_schemas,
)
from regional.dataflow.window_operator import ON_LATE
from regional.dataflow.windows import Aggregate, Window, WindowAssigner
from regional.errors import GraphError
from regional.graph.job_graph import Edge, JobGraph, Vertex
from regional.sinks.base import Sink
from regional.sources.base import Source

if TYPE_CHECKING:
    from regional.dataflow.exchange import ExchangeReader, ExchangeWriter
    from regional.graph.regions import RegionPlan

__all__ = ["Chunk", "Exchange", "KeyedOnlyError", "Operator", "Pipeline", "Stream", "VertexSpec"]


@dataclasses.dataclass(frozen=True)
class VertexSpec:
    """A vertex of the pipeline: what it runs (`source`, `operator` or `sink`) and its inputs."""

    id: str
    kind: str
    parallelism: int
    inputs: tuple[str, ...] = ()
    source: Source | None = None
    operator: Operator | None = None
    sink: Sink | None = None
    dead_letter: bool = False  # the dead-letter sink of its chain (`on_error="dead-letter"`)
    exchange_from: str | None = None  # an exchange reader: its writer vertex (a durable edge)
    event_time: EventTime | None = None  # a source read with event time (watermarks)
    #: a sink placing records by key (an exchange's writer): the epoch judges each record's
    #: key before the sink gets it (`regional.dataflow.keys.exchange_chunks`)
    key: Callable[[Any], Any] | None = None
    #: the schema of the records it produces (None: not known; a sink has none):
    #: `regional.dataflow.stream_schemas` says how each vertex's follows from its inputs'
    schema: pa.Schema | None = None


class Exchange(NamedTuple):
    """A durable keyed exchange of the pipeline (`Stream.exchange`): its writer vertex (a sink
    ending the upstream stage) and reader vertex (a source starting the downstream one)."""

    writer_spec: VertexSpec
    reader_spec: VertexSpec
    writer: ExchangeWriter
    reader: ExchangeReader


class KeyedOnlyError(GraphError, AttributeError):
    """A keyed-stream method called on a stream that is not keyed, or a stream method on a
    keyed one (`stream.window(...)` before `key_by`): names the method and the fix. Also an
    `AttributeError`, so `hasattr(stream, "window")` stays False."""


#: The methods only a `KeyedStream` has, and what a `Stream` has but a `KeyedStream` not.
_KEYED_ONLY = (
    "process",
    "window",
    "apply_in_arrow",
    "aggregate",
)
_UNKEYED_ONLY = (
    "map",
    "flat_map",
    "filter",
    "map_batches",
    "where",
    "select",
    "with_columns",
    "sql",
    "key_by",
    "exchange",
    "union",
    "sink",
    "lookup_join",
)


class Stream:
    """The output of one vertex; methods add a downstream operator over a forward edge."""

    def __init__(self, pipeline: Pipeline, vertex_id: str) -> None:
        self.pipeline = pipeline
        self.vertex_id = vertex_id

    if not TYPE_CHECKING:  # a type checker keeps reporting `Stream.window` as missing

        def __getattr__(self, name: str) -> Any:
            if name in _KEYED_ONLY:
                raise self._keyed_only(name)
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _keyed_only(self, name: str) -> KeyedOnlyError:
        return KeyedOnlyError(
            f"{name}(...) after {self.vertex_id!r}: {name} works on keyed records; key "
            f"the stream first, e.g. .key_by(lambda r: r['user']).{name}(...)"
        )

    def _then(self, op: Operator, name: str | None, schema: Any = None) -> Stream:
        if schema is not None:
            op.output_schema = _declared(schema, f"{op.kind} {name or '(unnamed)'!r}")
        return self.pipeline._add(op.kind, name, (self.vertex_id,), operator=op)

    def map(
        self, fn: Callable[[Any], Any], *, name: str | None = None, schema: Any = None
    ) -> Stream:
        """One output record per input record. `schema` (a `pyarrow.Schema`, msgspec Struct
        or dataclass) declares the records `fn` makes, for the SQL stages and operators on
        columns after it; the first SQL stage after it fits them to it (a record that does
        not fit is its dead letter, naming the field)."""
        return self._then(Map(fn), name, schema)

    def flat_map(
        self,
        fn: Callable[[Any], Iterable[Any]],
        *,
        name: str | None = None,
        schema: Any = None,
    ) -> Stream:
        """Zero or more output records per input record (`schema`: as in `map`)."""
        return self._then(FlatMap(fn), name, schema)

    def filter(self, fn: Callable[[Any], bool], *, name: str | None = None) -> Stream:
        """The records for which `fn` is true (the stream keeps its schema)."""
        op = Filter(fn)
        op.output_schema = self.schema
        return self._then(op, name)

    def map_batches(
        self,
        fn: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table | None],
        *,
        name: str | None = None,
        schema: Any = None,
    ) -> Stream:
        """One Arrow record batch in, a record batch or table out (vectorised work); anything
        else fails the unit with a `TypeError` naming the operator. With
        `on_error="dead-letter"`, a batch the function raises on is dead-lettered whole.
        `schema`: as in `map`."""
        return self._then(MapBatches(fn), name, schema)

    # -- schemas and Spark SQL expression stages (regional.dataflow.sql_stages) -------------

    @property
    def schema(self) -> pa.Schema | None:
        """The schema of this stream's records: declared at its source (``schema=``), computed
        by an expression stage or a stateful operator on columns, kept through an exchange
        (`regional.dataflow.stream_schemas`); None when unknown (after a record-wise operator
        not given ``schema=``)."""
        return self.pipeline.vertices[self.vertex_id].schema

    def _sql_stage(self, kind: str, name: str | None, **what: Any) -> Stream:
        """Add a `SqlStage` of `kind`, compiled against this stream's schema now (so every
        error a pipeline can hold surfaces when it is built, naming the stage)."""
        from regional.dataflow.sql_stages import SqlStage

        vid = name or f"{kind}-{len(self.pipeline.vertices)}"
        schema = self.schema
        if schema is None:
            raise GraphError(
                f"{kind} {vid!r} after {self.vertex_id!r}: the stream has no schema, so its "
                "columns are unknown; declare it at the source, p.source(src, "
                "schema=<a pyarrow.Schema, msgspec Struct or dataclass>), and put SQL stages "
                "before record-wise ones (map, filter, flat_map, process)"
            )
        return self._then(SqlStage(kind, schema, name=vid, **what), vid)

    def where(self, condition: str, *, name: str | None = None) -> Stream:
        """The records for which `condition` (a Spark SQL boolean expression over the
        stream's columns, e.g. ``"amount > 0 AND country IN ('DE', 'FR')"``) is true;
        PySpark's ``DataFrame.where``. Runs over each Arrow batch in one vectorised call."""
        return self._sql_stage("where", name, where=condition)

    def select(self, *columns: str, name: str | None = None) -> Stream:
        """One output row per record with the columns `columns` name: column names and Spark
        SQL expressions with an alias (``"user"``, ``"amount * 1.19 AS gross"``, ``"*"``),
        as PySpark's ``selectExpr``."""
        if not columns:
            raise GraphError(f"select after {self.vertex_id!r}: name at least one column")
        return self._sql_stage("select", name, select=columns)

    def with_columns(
        self, columns: dict[str, str] | None = None, /, *, name: str | None = None, **named: str
    ) -> Stream:
        """Every column, plus the columns given (name -> Spark SQL expression), which
        replace a column of that name in place, as PySpark's ``withColumns``:
        ``with_columns(gross="amount * 1.19")`` or ``with_columns({"gross": "..."})``
        (the dict for a column called ``name``, which names the stage)."""
        assign = {**(columns or {}), **named}
        if not assign:
            raise GraphError(f"with_columns after {self.vertex_id!r}: give name=expression")
        return self._sql_stage("with_columns", name, assign=assign)

    def sql(self, query: str, *, name: str | None = None) -> Stream:
        """Row-wise Spark SQL over the stream, read as the table ``input``: ``SELECT ...
        FROM input [WHERE ...]``. What would depend on how records are cut into epochs
        (GROUP BY, ORDER BY, LIMIT, window functions, ``rand()``, ``now()``...) is refused
        with the stateful operator to use instead (docs/guide/sql.md)."""
        return self._sql_stage("sql", name, query=query)

    def key_by(
        self,
        key: KeyLike,
        *,
        partitions: int | None = None,
        name: str | None = None,
    ) -> KeyedStream:
        """Key the records (by a function of a record, a column: ``key_by("user")``, or
        columns: ``key_by(["user", "country"])``, whose key is the tuple of their values)
        for a stateful `process`, `window`, `aggregate` or `apply_in_arrow`. On a stream with
        a schema the columns are checked now (an unknown one names this stage, the column and
        the columns there are). Without `partitions`, state is
        per (input split, key) on this forward chain; with `partitions=N`, a durable keyed
        exchange (`exchange`, named `name`) ends the stage first and state is per key,
        globally."""
        key = self._key(key, f"key_by after {self.vertex_id!r}")
        if partitions is None:
            if name is not None:
                raise GraphError(
                    f"key_by(name={name!r}) names an exchange; give partitions=N too, or drop "
                    "the name"
                )
            return KeyedStream(self, key)
        return self.exchange(key, partitions=partitions, name=name).key_by(key)

    def exchange(self, key: KeyLike, *, partitions: int, name: str | None = None) -> Stream:
        """End the stage with a durable keyed exchange (`regional.dataflow.exchange`): the returned
        stream runs in `partitions` subtasks, subtask q getting every record whose key hashes
        to q (`regional.dataflow.partitioning.partition_of`). The exchange's reader vertex is `name`
        (default ``exchange-<n>``), its writer ``<name>-writer``."""
        from regional.dataflow.exchange import ExchangeReader, ExchangeWriter

        if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
            raise GraphError(
                f"exchange after {self.vertex_id!r}: partitions={partitions!r}; give a whole "
                "number of downstream subtasks, at least 1"
            )
        key = self._key(key, f"exchange after {self.vertex_id!r}")
        pipeline = self.pipeline
        reader = name or f"exchange-{len(pipeline.vertices)}"
        writer = f"{reader}-writer"
        bounded = pipeline._bounded_upstream(self.vertex_id)
        pipeline._add(
            "sink",
            writer,
            (self.vertex_id,),
            sink=ExchangeWriter(reader, key, partitions),
            key=key,
        )
        stream = pipeline._add(
            "source",
            reader,
            (),
            parallelism=partitions,
            source=ExchangeReader(
                reader,
                partitions,
                bounded=bounded,
                writers=pipeline.vertices[self.vertex_id].parallelism,
            ),
            exchange_from=writer,
            schema=self.schema,
        )
        return stream

    def _key(self, key: KeyLike, what: str) -> Callable[[Any], Any]:
        """`key` as a key function (`regional.dataflow.keys.key_function`), its columns
        checked against this stream's schema when it has one."""
        function = key_function(key, what)
        schema, columns = self.schema, key_columns(function)
        if schema is not None and columns is not None:
            for column in columns:
                column_of(schema, column, what)
        return function

    def union(self, *others: Stream, name: str | None = None) -> Stream:
        """The records of this stream and `others` (same parallelism, forward edges). Streams
        with schemas must have the same one (refused when built, naming both); the union
        has it, or none when some stream has none."""
        streams = (self, *others)
        what = f"union {name or '(unnamed)'!r} of {', '.join(repr(s.vertex_id) for s in streams)}"
        schema = same_schemas([(s.vertex_id, s.schema) for s in streams], what)
        op = Map(_identity)
        op.output_schema = schema
        return self.pipeline._add("map", name, tuple(s.vertex_id for s in streams), operator=op)

    # -- stateful operators on columns (sugar: key both sides by the column) ------------------

    def _on(self, other: Any, on: Any, what: str) -> tuple[pa.Schema, pa.Schema]:
        """Both sides' schemas of a join of this stream with `other` on the column `on`;
        `GraphError` naming `what` (and both schemas) when `other` is no stream, a side has
        no schema, or `on` is not a column of both."""
        if not isinstance(other, Stream):
            raise GraphError(f"{what}: join with a stream; got {type(other).__name__}")
        if not isinstance(on, str) or not on:
            raise GraphError(f"{what}: on={on!r}; give the name of the column both sides have")
        for side in (self, other):
            if side.schema is None:
                raise GraphError(
                    f"{what}: on={on!r} joins on a column, but {side.vertex_id!r} has no "
                    "schema; declare one at its source (p.source(src, schema=...)), or key "
                    "both sides yourself: a.key_by(...).interval_join(b.key_by(...), ...)"
                )
        left, right = self.schema, other.schema
        assert left is not None and right is not None
        both = f"{self.vertex_id!r}: {describe(left)}; {other.vertex_id!r}: {describe(right)}"
        for side, schema in ((self, left), (other, right)):
            if schema.get_field_index(on) < 0:
                raise GraphError(
                    f"{what}: on={on!r} is not a column of {side.vertex_id!r}; both sides "
                    f"need it ({both})"
                )
        return left, right

    def interval_join(
        self,
        other: Stream,
        *,
        on: str | None = None,
        between: tuple[Any, Any],
        how: str = "inner",
        partitions: int | None = None,
        on_late: str = "drop",
        event_time: Callable[[Any], Any] | str | None = None,
        other_event_time: Callable[[Any], Any] | str | None = None,
        name: str | None = None,
    ) -> Stream:
        """`KeyedStream.interval_join` on the column `on` of both streams (which must have a
        schema with that column, of one type: refused when built, naming both schemas).
        The rows: the key once, this stream's other columns, then `other`'s; a name both
        have is prefixed ``left_`` / ``right_``; the side ``how`` may leave out is nullable
        (`regional.dataflow.stream_schemas.JoinColumns`)."""
        what = f"interval join {name or '(unnamed)'!r}"
        if on is None:  # the keyed form, called on a stream not keyed
            raise self._keyed_only("interval_join")
        left, right = self._on(other, on, what)
        if how not in ("inner", "left", "right", "outer"):
            raise GraphError(f"{what}: how={how!r}; use 'inner', 'left', 'right' or 'outer'")
        emit = JoinColumns(on, left, right, how, what)
        return self.key_by(on).interval_join(
            other.key_by(on),
            between=between,
            how=how,
            emit=emit,
            partitions=partitions,
            on_late=on_late,
            event_time=event_time,
            other_event_time=other_event_time,
            name=name,
        )

    def temporal_join(
        self,
        table: Stream,
        *,
        on: str | None = None,
        how: str = "inner",
        is_delete: Callable[[Any], Any] | str | None = None,
        partitions: int | None = None,
        on_late: str = "drop",
        event_time: Callable[[Any], Any] | str | None = None,
        table_event_time: Callable[[Any], Any] | str | None = None,
        name: str | None = None,
    ) -> Stream:
        """`KeyedStream.temporal_join` on the column `on` of this stream and the changelog
        `table` (both with a schema holding it, of one type). The rows: the key once, this
        stream's other columns, then the version's; a name both have is prefixed ``left_``
        / ``right_``; with ``how="left"`` the version's columns are nullable."""
        what = f"temporal join {name or '(unnamed)'!r}"
        if on is None:
            raise self._keyed_only("temporal_join")
        left, right = self._on(table, on, what)
        if how not in ("inner", "left"):
            raise GraphError(f"{what}: how={how!r}; use 'inner' or 'left'")
        emit = JoinColumns(on, left, right, how, what)
        return self.key_by(on).temporal_join(
            table.key_by(on),
            how=how,
            emit=emit,
            is_delete=is_delete,
            partitions=partitions,
            on_late=on_late,
            event_time=event_time,
            table_event_time=table_event_time,
            name=name,
        )

    def drop_duplicates(
        self,
        subset: str | Sequence[str] | None = None,
        *,
        within: Any,
        event_time: Callable[[Any], Any] | str | None = None,
        on_late: str = "drop",
        name: str | None = None,
    ) -> Stream:
        """`KeyedStream.drop_duplicates` keyed by the columns `subset` (``["id"]``, as
        PySpark's ``dropDuplicatesWithinWatermark(["id"])``): a record whose columns equal
        those of one let through within `within` of event time is dropped."""
        what = f"drop_duplicates {name or '(unnamed)'!r}"
        if subset is None:
            raise self._keyed_only("drop_duplicates")
        if callable(subset):
            raise GraphError(
                f"{what}: give the column names to compare, e.g. ['id'] (to compare by a "
                "function, key the stream: .key_by(fn).drop_duplicates(within=...))"
            )
        return KeyedStream(self, self._key(subset, what)).drop_duplicates(
            within=within, event_time=event_time, on_late=on_late, name=name
        )

    def sink(self, sink: Sink, *, name: str | None = None) -> None:
        """Write the records to `sink` (e.g. `regional.sinks.parquet.ParquetSink`)."""
        self.pipeline._add("sink", name, (self.vertex_id,), sink=sink)

    def lookup_join(
        self,
        table: Any,
        *,
        key: str,
        on: KeyLike,
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
        columns: Iterable[str] | None = None,
        refresh: Any = "1 min",
        clock: Callable[[], float] | None = None,
        name: str | None = None,
    ) -> Stream:
        """Enrich each record with the row of `table` (`ParquetTable`, `DeltaTable` or
        `IcebergTable` of `regional.dataflow.lookup`) whose column `key` equals the record's
        `on` (a field name or a function of a record), reading the table at its latest
        committed version (only `key` and `columns`, when given), again once `refresh` passed
        (processing time: `clock()` in seconds, `time.monotonic` by default). ``how="inner"``
        drops a record without a row, ``"left"`` emits it with None; ``emit(record, row)``
        makes the output (default ``{"record": r, "row": row}``). Outside the determinism
        rule: a replayed epoch may meet a newer version (DESIGN §4 rule 20; `temporal_join`
        is exact)."""
        import time

        from regional.dataflow.event_time import span_ms
        from regional.dataflow.lookup import LookupJoin

        what = f"lookup join {name or '(unnamed)'!r}"
        if how not in ("inner", "left"):
            raise GraphError(f"{what}: how={how!r}; use 'inner' or 'left'")
        if not (
            callable(getattr(table, "read", None)) and callable(getattr(table, "describe", None))
        ):
            raise GraphError(
                f"{what}: table={table!r} is not a lookup table; give ParquetTable(path), "
                "DeltaTable(path) or IcebergTable(warehouse, table) from regional.dataflow.lookup"
            )
        wanted = None if columns is None or isinstance(columns, str) else tuple(columns)
        if columns is not None and (wanted is None or not all(isinstance(c, str) for c in wanted)):
            raise GraphError(
                f"{what}: columns={columns!r}; give a list of the table's column names"
            )
        try:
            refresh_ms = span_ms(refresh, "refresh", allow_zero=False)
        except ValueError as exc:
            raise GraphError(f"{what}: {exc}") from None
        op = LookupJoin(
            table,
            key=key,
            on=key_function(on, what),
            how=how,
            emit=emit,
            columns=wanted,
            refresh_s=refresh_ms / 1000,
            now=clock or time.monotonic,
        )
        return self._then(op, name)


def _identity(record: Any) -> Any:
    return record


def _declared(schema: Any, what: str) -> pa.Schema:
    """The schema a user declared for an operator's output; `GraphError` naming `what`."""
    try:
        return schema_of(schema)
    except TypeError as exc:
        raise GraphError(f"{what}: {exc}") from None


class KeyedStream:
    """A stream keyed by `key`: `process(fn)` runs `fn(ctx, record) -> iterable of outputs`."""

    def __init__(self, stream: Stream, key: Callable[[Any], Any]) -> None:
        self._stream = stream
        self._key = key

    @property
    def _keyed(self) -> Keyed:
        return Keyed(self._stream.vertex_id, self._key)

    @property
    def _graph(self) -> _PipelineBuild:
        return _PipelineBuild(self._stream.pipeline)

    if not TYPE_CHECKING:  # a type checker keeps reporting `KeyedStream.map` as missing

        def __getattr__(self, name: str) -> Any:
            if name in _UNKEYED_ONLY:
                raise KeyedOnlyError(
                    f"{name}(...) after key_by on {self._stream.vertex_id!r}: a keyed stream "
                    "only takes process(...), window(...), aggregate(...), apply_in_arrow(...), "
                    "the joins or drop_duplicates(...); call "
                    f"{name}(...) before key_by, or on the stream process or window returns"
                )
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def process(
        self,
        fn: Callable[[KeyedContext, Any], Iterable[Any] | None],
        *,
        on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None = None,
        name: str | None = None,
        schema: Any = None,
    ) -> Stream:
        """A stateful operator; `ctx` gives value/map state of the key (per split on a forward
        chain, per key after a keyed exchange) and list state. With `on_timer`, `ctx.timers`
        sets event-time and processing-time timers of the key, and `on_timer(ctx, ts)` is
        called when one is due (`regional.dataflow.timers`); its outputs join the stream.
        `schema` declares its outputs' schema, as in `Stream.map`."""
        vid = build_process(self._graph, self._keyed, fn, on_timer=on_timer, name=name)
        return self._declare(vid, schema)

    def _declare(self, vid: str, schema: Any) -> Stream:
        """The stream of vertex `vid`, whose records the user declared to be of `schema`."""
        pipeline = self._stream.pipeline
        if schema is not None:
            spec = pipeline.vertices[vid]
            declared = _declared(schema, f"{spec.operator.kind if spec.operator else ''} {vid!r}")
            if spec.operator is not None:
                spec.operator.output_schema = declared
            pipeline.vertices[vid] = dataclasses.replace(spec, schema=declared)
        return Stream(pipeline, vid)

    def apply_in_arrow(
        self,
        fn: Callable[[KeyedContext, pa.Table], Any],
        *,
        on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None = None,
        name: str | None = None,
        schema: Any = None,
    ) -> Stream:
        """A stateful operator over Arrow tables, in the shape of PySpark's
        ``applyInPandasWithState``: `fn(ctx, table)` runs once per key and epoch with the
        key's records of the epoch as a `pyarrow.Table` (``table.to_pandas()`` for pandas)
        and returns a Table, a RecordBatch, records or None; `ctx` is the key's state as in
        `process` (with `on_timer`, its timers). Key by a field name (``key_by("user")``) so
        the records are grouped as columns (`regional.dataflow.operators.ApplyInArrow`).
        `schema`: as in `Stream.map`."""
        vid = build_apply_in_arrow(self._graph, self._keyed, fn, on_timer=on_timer, name=name)
        return self._declare(vid, schema)

    def window(
        self,
        assigner: WindowAssigner,
        *,
        aggregate: Aggregate | Sequence[Aggregate] | None = None,
        reduce: Callable[[Any, Any], Any] | None = None,
        allowed_lateness: Any = 0,
        on_late: str = "drop",
        emit: Callable[[Any, Window, Any], Any] | None = None,
        event_time: Callable[[Any], Any] | str | None = None,
        name: str | None = None,
    ) -> Stream:
        """Event-time windows of the key (`regional.dataflow.windows`: `Tumbling`, `Sliding`,
        `Session`), aggregated with `aggregate` (`count()`, `sum_of(field)`, `min_of(field)`,
        `max_of(field)`, `mean_of(field)`, `count_distinct(field)`, an `Aggregate`, or a list
        of them, ``[count(), sum_of("amount")]``, whose value is ``{column: value}`` and
        which fill one column each on a stream with a schema) or `reduce(a, b)`; one row per
        (key, window), ``emit(key, window, value)`` (default
        ``{key, window_start, window_end, value}``), once the watermark passes the window's end
        plus `allowed_lateness`. Late records are dropped and counted, or with
        ``on_late="dead-letter"`` also written to the pipeline's dead-letter sink. The event
        time of a record is `event_time` (a field name or a function of a record), by default
        the source's `event_time`; a record without a usable one is a dead letter with
        ``on_error="dead-letter"``, else its unit declines naming the window and the record."""
        vid = build_window(
            self._graph,
            self._keyed,
            assigner,
            aggregate=aggregate,
            reduce=reduce,
            allowed_lateness=allowed_lateness,
            on_late=on_late,
            emit=emit,
            event_time=event_time,
            name=name,
        )
        return Stream(self._stream.pipeline, vid)

    def interval_join(
        self,
        other: KeyedStream,
        *,
        between: tuple[Any, Any],
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
        partitions: int | None = None,
        on_late: str = "drop",
        event_time: Callable[[Any], Any] | str | None = None,
        other_event_time: Callable[[Any], Any] | str | None = None,
        name: str | None = None,
    ) -> Stream:
        """Join this keyed stream (left) with `other` (right) on their keys where the right
        record's event time is within `between` = (lower, upper) of the left one's:
        ``l.ts + lower <= r.ts <= l.ts + upper`` (`"-5 min"`, `"15 min"`, timedeltas or
        seconds). ``how`` is ``"inner"``, ``"left"``, ``"right"`` or ``"outer"``: a row
        without a match is emitted once, with None for the other side, when the watermark
        shows none can come. ``emit(left, right)`` makes the output row (default
        ``{"left": l, "right": r}``). Both sides are read through keyed exchanges of
        `partitions` subtasks (added where a side is not keyed with ``partitions=N``
        already). A record behind its watermark is late: never joined, counted, and with
        ``on_late="dead-letter"`` a dead letter. Event times are the sources' unless given
        (`event_time`, `other_event_time`: a field name or a function of a record). The rule
        under faults: DESIGN §4 rule 17 (`regional.dataflow.joins`)."""
        from regional.dataflow.joins import build_interval_join

        vid = build_interval_join(
            self._graph,
            self,
            other,
            between=between,
            how=how,
            emit=emit,
            partitions=partitions,
            on_late=on_late,
            event_time=event_time,
            other_event_time=other_event_time,
            name=name,
        )
        return Stream(self._stream.pipeline, vid)

    def temporal_join(
        self,
        table: KeyedStream,
        *,
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
        is_delete: Callable[[Any], Any] | str | None = None,
        partitions: int | None = None,
        on_late: str = "drop",
        event_time: Callable[[Any], Any] | str | None = None,
        table_event_time: Callable[[Any], Any] | str | None = None,
        name: str | None = None,
    ) -> Stream:
        """Join every record of this keyed stream with the version of its key that was valid
        at its event time in `table`, a versioned table built from a keyed changelog stream:
        each change is an upsert of its key at its event time, or a delete where `is_delete`
        (a field name or a function of a change) says so. ``how="inner"`` drops a record
        without a valid version, ``"left"`` emits it with None. ``emit(record, version)``
        makes the output row (default ``{"record": r, "version": v}``). A record is emitted
        once the watermark passes its time (no change still to come can be valid at it);
        the table keeps only the versions a record still to come can need. Both inputs are
        read through keyed exchanges of `partitions` subtasks; late records are never
        joined (``on_late``, as in `window`). DESIGN §4 rule 18
        (`regional.dataflow.temporal_join`)."""
        from regional.dataflow.temporal_join import build_temporal_join

        vid = build_temporal_join(
            self._graph,
            self,
            table,
            how=how,
            emit=emit,
            is_delete=is_delete,
            partitions=partitions,
            on_late=on_late,
            event_time=event_time,
            table_event_time=table_event_time,
            name=name,
        )
        return Stream(self._stream.pipeline, vid)

    def drop_duplicates(
        self,
        *,
        within: Any,
        event_time: Callable[[Any], Any] | str | None = None,
        on_late: str = "drop",
        name: str | None = None,
    ) -> Stream:
        """Drop the records of a key that come within `within` (`"10 min"`, a timedelta or
        seconds) of event time after the key's last record let through, like Spark's
        ``dropDuplicatesWithinWatermark``; a key's state leaves once the watermark passes
        ``its time + within``. Late records are never let through (``on_late``, as in
        `window`). Per (split, key) on a forward chain, per key after a keyed exchange.
        DESIGN §4 rule 19 (`regional.dataflow.dedup`)."""
        from regional.dataflow.dedup import build_drop_duplicates

        vid = build_drop_duplicates(
            self._graph,
            self._keyed,
            within=within,
            event_time=event_time,
            on_late=on_late,
            name=name,
        )
        return Stream(self._stream.pipeline, vid)

    def aggregate(
        self,
        agg: Aggregate | Sequence[Aggregate],
        *more: Aggregate,
        emit: Callable[[Any, Any], Any] | None = None,
        name: str | None = None,
    ) -> Stream:
        """A running aggregate of the key over every record so far (`count()`,
        `sum_of(field)`, `min_of`, `max_of`, `mean_of`, `count_distinct` or an `Aggregate`;
        several as PySpark's ``.agg(...)``: ``aggregate(count(), sum_of("amount"))`` or a
        list, whose value is ``{column: value}``, one column each on a stream with a schema),
        no event time needed: per epoch one row per key that had records in it, ``emit(key, value)``
        (default ``{key, value}``), ordered by key. Per (split, key) on a forward chain, per
        key after a keyed exchange (``key_by(k, partitions=N)``: one total per key). Built-ins
        on a field key (``key_by("user")``) run over Arrow columns. DESIGN §4 rule 21
        (`regional.dataflow.running_aggregate`)."""
        from regional.dataflow.running_aggregate import build_aggregate

        if more:
            agg = [*([agg] if isinstance(agg, Aggregate) else agg), *more]
        vid = build_aggregate(self._graph, self._keyed, agg, emit=emit, name=name)
        return Stream(self._stream.pipeline, vid)


class _PipelineBuild:
    """`regional.dataflow.building.Build` over a pipeline: what operator builders use."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    def keyed(
        self, stream: object, what: str, *, want: str = "a keyed stream, e.g. other.key_by('id')"
    ) -> Keyed:
        if not isinstance(stream, KeyedStream):
            raise GraphError(f"{what}: join with {want}; got {type(stream).__name__}")
        return stream._keyed

    def late_policy(self, what: str, on_late: str) -> None:
        self.pipeline._late_policy(what, on_late)

    def event_time_of(
        self, vertex_id: str, given: Callable[[Any], Any] | str | None, what: str
    ) -> EventTime:
        return self.pipeline._event_time_of(vertex_id, given, what)

    def key_scope(self, vertex_id: str, key: Callable[[Any], Any], name: str | None) -> str:
        return self.pipeline._key_scope(vertex_id, key, name)

    def co_partition(
        self, left: Keyed, right: Keyed, *, partitions: int | None, name: str
    ) -> tuple[str, str]:
        return self.pipeline._co_partition(left, right, partitions=partitions, name=name)

    def schema_of(self, vertex_id: str) -> pa.Schema | None:
        return self.pipeline.vertices[vertex_id].schema

    def vertex_id(self, kind: str, name: str | None) -> str:
        return name or f"{kind}-{len(self.pipeline.vertices)}"

    def add(self, operator: Operator, name: str | None, inputs: tuple[str, ...]) -> str:
        return self.pipeline._add(operator.kind, name, inputs, operator=operator).vertex_id


class Pipeline:
    """A job: add sources with `source(...)`, chain operators on the streams, end in sinks.

    `records_per_epoch` caps how many records each source subtask reads per epoch (per
    checkpoint); `splits_per_subtask` how many splits a source subtask reads at once.
    `state_types` are the msgspec Struct classes operator state may hold;
    `state_serializer=PickledState(secret=...)` opts in to pickled state (any picklable
    object, segments signed with the secret) instead of msgpack (`regional.dataflow.state_codec`).
    `on_error` says what a record a user function raises on does: `"fail"` its unit (the
    default), or `"dead-letter"`: it becomes a row of the `dead_letter` sink
    (`regional.dataflow.dead_letters`) and processing goes on.
    """

    def __init__(
        self,
        name: str = "pipeline",
        *,
        records_per_epoch: int = 10_000,
        splits_per_subtask: int = 1,
        state_types: Iterable[type] = (),
        state_serializer: PickledState | None = None,
        on_error: str = "fail",
        dead_letter: Sink | None = None,
    ) -> None:
        if on_error not in ON_ERROR:
            raise GraphError(
                f"pipeline {name!r}: on_error={on_error!r}; use 'fail' (a failing record fails "
                "its unit) or 'dead-letter' (with dead_letter=<a sink>)"
            )
        if (on_error == "dead-letter") != (dead_letter is not None):
            raise GraphError(
                f"pipeline {name!r}: on_error='dead-letter' and dead_letter=<a sink, e.g. "
                "ParquetSink(path)> go together; give both, or neither to fail on errors"
            )
        if dead_letter is not None and not isinstance(dead_letter, Sink):
            raise GraphError(
                f"pipeline {name!r}: dead_letter={type(dead_letter).__name__} is not a sink; "
                "give one of the sinks (ParquetSink, PaimonSink, DeltaSink, IcebergSink)"
            )
        self.name = name
        self.records_per_epoch = records_per_epoch
        self.splits_per_subtask = splits_per_subtask
        self.vertices: dict[str, VertexSpec] = {}
        self.state_codec = StateCodec(state_types, state_serializer)
        self.on_error = on_error
        self.dead_letter = dead_letter

    def source(
        self,
        source: Source,
        *,
        parallelism: int = 1,
        name: str | None = None,
        event_time: Callable[[Any], Any] | str | None = None,
        max_out_of_orderness: Any = 0,
        idle_timeout: Any = None,
        schema: Any = None,
    ) -> Stream:
        """A source vertex with `parallelism` subtasks reading `source`'s splits.

        With `schema` (a `pyarrow.Schema`, a msgspec Struct class or a dataclass; "infer":
        the schema of a Parquet `FileSource`'s first file), every record is fitted to it
        (`regional.dataflow.schema`): the stream carries the schema (`Stream.schema`, for
        `where`/`select`/`sql`), and a record that does not fit is a dead letter of the
        source (or declines its unit) naming the field and both types.

        With `event_time` (the name of the field holding a record's time, e.g. `"ts"`, or a
        function of a record; giving a datetime, naive = UTC, or an int of ms since the
        epoch, within the supported event times of `regional.dataflow.event_time`), each
        split keeps a watermark, the largest event time read minus `max_out_of_orderness`
        (`"5 s"`, a timedelta or seconds), in its split state. A record without a usable
        event time is a dead letter with `on_error="dead-letter"`, else its unit declines
        with an `EventTimeError` naming the source, the function and the record.
        `idle_timeout` (off by default) lets a split that delivered nothing for that long stop
        holding its subtask's watermark back: processing time, so outside the determinism
        rule (docs/event-time.md)."""
        if not isinstance(source, Source):
            raise GraphError(
                f"{type(source).__name__} is not a source; give a FileSource, LogSource, "
                "GeneratorSource or an object with bounded/discover/read"
            )
        et = None
        if event_time is not None:
            try:
                et = EventTime(event_time, max_out_of_orderness, idle_timeout)
            except (TypeError, ValueError) as exc:
                raise GraphError(f"source {name or '(unnamed)'!r}: {exc}") from None
        if schema is not None:
            source = fitted(source, schema, name or f"source-{len(self.vertices)}")
        return self._add("source", name, (), source=source, parallelism=parallelism, event_time=et)

    def _late_policy(self, what: str, on_late: str) -> None:
        """`GraphError` unless `on_late` is "drop", or "dead-letter" with a dead-letter sink."""
        if on_late not in ON_LATE:
            raise GraphError(f"{what}: on_late={on_late!r}; use 'drop' or 'dead-letter'")
        if on_late == "dead-letter" and self.dead_letter is None:
            raise GraphError(
                f"{what}: on_late='dead-letter' writes late records to the pipeline's "
                "dead-letter sink; build the pipeline with on_error='dead-letter', "
                "dead_letter=<a sink>"
            )

    @property
    def timed(self) -> bool:
        """True when some source reads with event time or some operator needs watermarks."""
        return any(
            v.event_time is not None or (v.operator is not None and v.operator.timed)
            for v in self.vertices.values()
        )

    def _event_time_of(
        self, vertex_id: str, given: Callable[[Any], Any] | str | None, what: str
    ) -> EventTime:
        """`given` (a field name or a function of a record), else the event time of the
        sources `vertex_id` reads (through exchanges); `GraphError` when no source upstream
        reads with event time."""
        found: list[EventTime] = []
        todo = [vertex_id]
        while todo:
            spec = self.vertices[todo.pop()]
            if spec.event_time is not None:
                found.append(spec.event_time)
            todo += spec.inputs
            if spec.exchange_from is not None:
                todo.append(spec.exchange_from)
        if not found:
            raise GraphError(
                f"{what}: no source upstream reads with event time, so no watermark would "
                "ever close it; give the source event_time=<a field name or a function of a "
                "record>, e.g. p.source(src, event_time='ts', max_out_of_orderness='5 s')"
            )
        if given is not None:
            try:
                return EventTime(given)
            except TypeError as exc:
                raise GraphError(f"{what}: {exc}") from None
        distinct = {e.identity: e for e in found}
        if len(distinct) > 1:
            raise GraphError(
                f"{what}: the sources upstream have different event_time functions; give "
                "it its own: event_time='ts' (a field name or a function of a record)"
            )
        return next(iter(distinct.values()))

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
        if self.dead_letter is not None and (
            vid == DEAD_LETTERS or vid.startswith(f"{DEAD_LETTERS}-")
        ):
            raise GraphError(
                f"pipeline {self.name!r}: vertex {vid!r}: names starting with {DEAD_LETTERS!r} "
                "are the dead-letter sink's; pick another name"
            )
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
        if role != "sink" and "schema" not in what:
            what["schema"] = produced_schema(
                what["source"] if what.get("source") is not None else what.get("operator")
            )
        if isinstance(what.get("operator"), Operator):
            what["operator"].name = vid
            what["operator"].input_ids = tuple(inputs)
        self.vertices[vid] = VertexSpec(vid, role, parallelism or 1, inputs, **what)
        if self.dead_letter is not None:
            self._place_dead_letters()
        return Stream(self, vid)

    def _place_dead_letters(self) -> None:
        """One dead-letter sink vertex per independent part of the graph that can produce dead
        letters, after the user's vertices: fed by every operator of its part over forward
        edges, or, in a part without operators (a source straight into a sink), by its
        sources (whose poison records and bad event times it takes). Parts with operators are
        numbered first, so their sinks keep the ids they had before source-only parts had
        one. Subtask i of every vertex of a part is already in region i of that part, so the
        sink merges no regions (a vertex shared by two parts would merge theirs)."""
        from regional.dataflow.exchange import ExchangeReader

        for vid in [v for v, spec in self.vertices.items() if spec.dead_letter]:
            del self.vertices[vid]
        part = {vid: vid for vid in self.vertices}

        def find(v: str) -> str:
            while part[v] != v:
                v = part[v]
            return v

        for spec in self.vertices.values():
            for i in spec.inputs:
                part[find(i)] = find(spec.id)
        operators: dict[str, list[VertexSpec]] = {}
        sources: dict[str, list[VertexSpec]] = {}
        for spec in self.vertices.values():
            if spec.kind == "operator":
                operators.setdefault(find(spec.id), []).append(spec)
            elif spec.kind == "source" and not isinstance(spec.source, ExchangeReader):
                sources.setdefault(find(spec.id), []).append(spec)
        feeds = [*operators.values(), *(s for p, s in sources.items() if p not in operators)]
        for n, inputs in enumerate(feeds):
            vid = DEAD_LETTERS if n == 0 else f"{DEAD_LETTERS}-{n + 1}"
            self.vertices[vid] = VertexSpec(
                vid,
                "sink",
                inputs[0].parallelism,
                tuple(o.id for o in inputs),
                sink=self.dead_letter,
                dead_letter=True,
            )

    def forward_sources(self, vertex_id: str) -> list[str]:
        """The ids of the sources `vertex_id` reads through forward edges (itself if it is
        one): whose splits its split-scoped state is kept by."""
        return [spec.id for spec in self._ancestors(vertex_id)]

    def _ancestors(self, vertex_id: str) -> list[VertexSpec]:
        """The sources `vertex_id` reads through forward edges (itself if it is one)."""
        out: dict[str, VertexSpec] = {}
        todo = [vertex_id]
        while todo:
            spec = self.vertices[todo.pop()]
            if spec.kind == "source":
                out[spec.id] = spec
            todo += spec.inputs
        return list(out.values())

    def _bounded_upstream(self, vertex_id: str) -> bool:
        return all(s.source is not None and s.source.bounded for s in self._ancestors(vertex_id))

    def _key_scope(self, vertex_id: str, key: Callable[[Any], Any], name: str | None) -> str:
        """ "key" when `vertex_id` reads keyed exchanges by `key` only, "split" when it reads
        no exchange; `GraphError` for a process keyed otherwise after an exchange."""
        from regional.dataflow.exchange import ExchangeWriter

        sources = self._ancestors(vertex_id)
        readers = [s for s in sources if s.exchange_from is not None]
        if not readers:
            return "split"
        writers = [self.vertices[s.exchange_from].sink for s in readers]  # type: ignore[index]
        if len(readers) == len(sources) and all(
            isinstance(w, ExchangeWriter) and w.key == key for w in writers
        ):
            return "key"
        raise GraphError(
            f"process {name or '(unnamed)'!r} after exchange "
            f"{', '.join(repr(s.id) for s in readers)} is keyed by another function than the "
            "exchange (or also reads a source): its keys would not stay in one subtask. Key it "
            "with the exchange's own key function: stream.key_by(key, partitions=N).process(fn)"
        )

    def _co_partition(
        self,
        left: Keyed,
        right: Keyed,
        *,
        partitions: int | None,
        name: str,
    ) -> tuple[str, str]:
        """The reader vertices of two keyed streams partitioned alike, for an operator with
        both as inputs (a join): subtask q of each holds exactly the keys that hash to q
        (`regional.dataflow.partitioning.partition_of`), so subtask q of the operator sees
        every record of its keys on both sides, and each side's regions upstream fall back on
        their own. A side already read from a keyed exchange by its own key with the same
        partition count is used as it is; any other gets an exchange,
        ``<name>-left`` / ``<name>-right``. `GraphError` when the partition counts disagree
        or none is known."""
        from regional.dataflow.exchange import ExchangeWriter

        what = f"{name!r}"
        if left.vertex_id == right.vertex_id:
            raise GraphError(
                f"{what} joins stream {left.vertex_id!r} with itself; key each side "
                "from the stream before the exchange (two exchanges of one stream are allowed)"
            )
        if partitions is not None and (
            isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1
        ):
            raise GraphError(
                f"{what}: partitions={partitions!r}; give a whole number of subtasks, at least 1"
            )

        def partitioned(side: Keyed) -> int | None:
            spec = self.vertices[side.vertex_id]
            if spec.exchange_from is None:
                return None
            writer = self.vertices[spec.exchange_from].sink
            if isinstance(writer, ExchangeWriter) and writer.key == side.key:
                return spec.parallelism
            return None

        known = {
            role: n
            for role, n in (("left", partitioned(left)), ("right", partitioned(right)))
            if n is not None
        }
        counts = set(known.values()) | ({partitions} if partitions is not None else set())
        if len(counts) > 1:
            given = ", ".join(
                [f"the {role} side is read from an exchange of {n}" for role, n in known.items()]
                + ([f"partitions={partitions}"] if partitions is not None else [])
            )
            raise GraphError(
                f"{what}: both sides must be partitioned alike, but {given}; key both sides "
                "with the same partitions=N (or key a side without partitions and give the "
                "join partitions=N: it adds the exchange)"
            )
        if not counts:
            raise GraphError(
                f"{what}: neither side is partitioned by its key; give partitions=N, the "
                "number of subtasks the join runs in (each side gets a keyed exchange)"
            )
        count = counts.pop()
        ids = []
        for role, side in (("left", left), ("right", right)):
            if role in known:
                ids.append(side.vertex_id)
            else:
                stream = Stream(self, side.vertex_id).exchange(
                    side.key, partitions=count, name=f"{name}-{role}"
                )
                ids.append(stream.vertex_id)
        return ids[0], ids[1]

    def bind(self, job_path: str, filesystem: Any = None) -> None:
        """Point every exchange at its directory in job root `job_path`, and every source at
        its replay inbox there (`regional.sources.replay`; a source fitted to a schema replays
        through the fitting). The driver does this before any task runs; `filesystem` is the
        job storage's."""
        from pyarrow import fs as pafs

        from regional.dataflow.exchange import ExchangeReader, ExchangeWriter, exchange_path
        from regional.dataflow.fitted_source import FittedSource
        from regional.sources.replay import inbox_path, replaying

        for vertex_id, spec in list(self.vertices.items()):
            for side in (spec.sink, spec.source):
                if isinstance(side, ExchangeReader | ExchangeWriter):
                    side.bind(exchange_path(job_path, side.reader), filesystem)
            if spec.source is not None and spec.exchange_from is None:
                inbox = inbox_path(job_path, vertex_id)
                fs = filesystem if filesystem is not None else pafs.LocalFileSystem()
                if isinstance(spec.source, FittedSource):
                    spec.source.source = replaying(spec.source.source, inbox, fs)
                else:
                    source = replaying(spec.source, inbox, fs)
                    self.vertices[vertex_id] = dataclasses.replace(spec, source=source)

    @property
    def exchanges(self) -> dict[str, Exchange]:
        """Reader vertex id -> every keyed exchange, with its writer and reader vertices."""
        from regional.dataflow.exchange import ExchangeReader, ExchangeWriter

        found = {}
        for v in self.vertices.values():
            if v.exchange_from is None:
                continue
            writer_spec = self.vertices[v.exchange_from]
            writer, reader = writer_spec.sink, v.source
            assert isinstance(writer, ExchangeWriter) and isinstance(reader, ExchangeReader)
            found[v.id] = Exchange(writer_spec, v, writer, reader)
        return found

    @property
    def sources(self) -> dict[str, VertexSpec]:
        return {k: v for k, v in self.vertices.items() if v.kind == "source"}

    @property
    def sinks(self) -> dict[str, VertexSpec]:
        return {k: v for k, v in self.vertices.items() if v.kind == "sink"}

    def sink_of(self, vertex_id: str) -> Sink:
        """The sink of sink vertex `vertex_id` (a checkpoint names it); `GraphError` when the
        pipeline has no such sink (the checkpoint is from another pipeline)."""
        spec = self.vertices.get(vertex_id)
        if spec is None or spec.sink is None:
            raise GraphError(
                f"pipeline {self.name!r} has no sink vertex {vertex_id!r}; the checkpoint is "
                "from another pipeline"
            )
        return spec.sink

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
        ) + tuple(
            Edge(v.exchange_from, v.id, "hash", "durable")
            for v in self.vertices.values()
            if v.exchange_from is not None
        )
        return JobGraph(vertices, edges)

    def regions(self) -> RegionPlan:
        """The region analyser's plan for this pipeline (`regional.graph.regions.analyse`)."""
        from regional.graph.regions import analyse

        return analyse(self.job_graph())

    def topological_order(self) -> tuple[str, ...]:
        """Vertex ids, producers first (the order a region task runs them in). Computed once
        per shape of the pipeline: every unit of every epoch asks for it."""
        shape = tuple(self.vertices)
        cached = self.__dict__.get("_order")
        if cached is None or cached[0] != shape:
            cached = self.__dict__["_order"] = (shape, self.job_graph().topological_order())
        return cached[1]
