"""Operators: one interface for every transformation of a stage.

An operator runs once per subtask and epoch, and the task side knows it only through this
interface (`Operator`):

* `restore(data, ...)`: its state from the segments of the checkpoint the coordinator named
  (`None` for a stateless operator);
* `run(chunks, origins, state, dead_letters, time)`: the epoch's input, each chunk with its
  origin watermark under event time (`regional.dataflow.epoch_time`), to output chunks (and
  theirs); windows and timers fire at the end of `run`, against `time.end`. The runtime calls
  `run_inputs` with the input of each input vertex apart; an operator with two inputs it
  tells apart (a join) overrides that, every other one gets them one after the other;
* `snapshot(state, live_splits)`: the state's bytes for the checkpoint.

Record-wise operators (`Map`, `Filter`, `FlatMap`, the keyed `Process`) share the per-record
loop and dead-lettering of `RecordOperator`; `MapBatches` works on Arrow batches; `WindowOp`
runs `regional.dataflow.window_operator`. A new operator is one subclass (a module of its own
when it is large) and its test: the pipeline builder adds it, the runtime runs it.

>>> op = Map(lambda r: {"x": r["x"] * 2}, name="double")
>>> op.run([("s0", [{"x": 1}, {"x": 2}])], None, None, None, None)
([('s0', [{'x': 2}, {'x': 4}])], None)
>>> Filter(lambda r: r["x"] > 1).run([("s0", [{"x": 1}, {"x": 2}])], None, None, None, None)
([('s0', [{'x': 2}])], None)
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from typing import Any, ClassVar, TypeVar

import pyarrow as pa

from regional.dataflow.building import Build, Keyed
from regional.dataflow.dead_letters import DeadLetters, set_aside
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.failures import UserFunctionError, raised_on
from regional.dataflow.keys import key_columns, read_key
from regional.dataflow.state import KEY_SCOPE, KeyedContext, OperatorState
from regional.dataflow.state_codec import StateCodec
from regional.dataflow.stream_schemas import WindowRow, event_time_column, window_schema
from regional.dataflow.timers import bind, fire_timers
from regional.dataflow.window_operator import WindowSpec, run_windows
from regional.dataflow.windows import Aggregate, Window, WindowAssigner, combine, reduce_with
from regional.errors import GraphError
from regional.sinks.rows import conformed, records_batch
from regional.sources.base import Batch

__all__ = [
    "ApplyInArrow",
    "Chunk",
    "Filter",
    "FlatMap",
    "KeyedTimers",
    "Map",
    "MapBatches",
    "Operator",
    "Process",
    "RecordOperator",
    "WindowOp",
    "build_apply_in_arrow",
    "build_process",
    "build_window",
    "records_of",
]

#: Data flowing between operators: the split the records came from, and the records.
Chunk = tuple[str, Batch]
_Data = TypeVar("_Data")


def _same(data: Batch) -> Batch:
    return data


def records_of(data: Batch) -> list[Any]:
    """The records of a chunk's data (an Arrow batch, or a list of records)."""
    return data.to_pylist() if isinstance(data, pa.RecordBatch) else data


def _numbered(
    chunks: Sequence[Chunk],
    origins: Sequence[int] | None,
    convert: Callable[[Batch], _Data],
    size: Callable[[_Data], int],
) -> Iterator[tuple[str, _Data, int, int]]:
    """Per chunk: its split, its data as `convert` makes it, how many of the split's records
    came before it this epoch (a dead letter names a record by that) and its origin
    watermark (0 without event time)."""
    seen: dict[str, int] = {}
    for n, (split, data) in enumerate(chunks):
        converted = convert(data)
        base = seen.get(split, 0)
        seen[split] = base + size(converted)
        yield split, converted, base, origins[n] if origins is not None else 0


def _arrow_of(
    data: Batch, operator: str, split: str, base: int, dead_letters: DeadLetters | None
) -> pa.RecordBatch:
    """A chunk's data as one record batch for an operator that takes Arrow (`operator`): a
    list of records with the union of their fields (`regional.sinks.rows.records_batch`); a
    record whose field has a type the others' cannot share is a dead letter of `operator`
    (index `base` + its place in the chunk), or without dead letters the error that declines
    its unit, naming the operator, the field and both types."""
    if isinstance(data, pa.RecordBatch):
        return data
    places = range(base, base + len(data))
    return _arrow_rows(data, operator, split, places, dead_letters)[0]


def _arrow_rows(
    records: Sequence[Any],
    operator: str,
    split: str,
    places: Sequence[int],
    dead_letters: DeadLetters | None,
) -> tuple[pa.RecordBatch, list[int] | None]:
    """`_arrow_of` for a list of records whose places in their split's epoch are `places`
    (a dead letter names its record by them), and which records the batch holds (indices
    into `records`; None: all of them, the usual case)."""
    batch, rejected = records_batch(records, f"operator {operator!r}")
    for r in rejected:
        if dead_letters is None:
            raised_on(r.error, split)
            raise r.error
        dead_letters.add(operator, split, places[r.at], r.record, r.error)
    if not rejected:
        return batch, None
    left_out = {r.at for r in rejected}
    return batch, [i for i in range(len(records)) if i not in left_out]


class Operator:
    """One transformation of a stage. `name` is its vertex id and `input_ids` the vertices
    feeding it, in input order (both set by the pipeline when the operator is added; errors
    name it); `scope` is where keyed state lives: per (input split, key) on a forward chain
    (``"split"``), per key after a keyed exchange (``"key"``)."""

    #: the vertex kind in the job graph and the default vertex name's prefix
    kind: ClassVar[str] = "operator"
    #: keeps state between epochs (restored, snapshotted, redistributed on rescale)
    stateful: ClassVar[bool] = False
    #: can run once over the records of several units of a task (`regional.dataflow.
    #: walker`): its output chunks keep their input's split, and its state (if any) is
    #: keyed state per split, never subtask-level lists
    one_pass: ClassVar[bool] = False
    #: the schema of the records it produces, where known (`regional.dataflow.stream_schemas`)
    output_schema: pa.Schema | None = None

    def __init__(self, *, name: str = "", scope: str = "split") -> None:
        self.name = name
        self.scope = scope
        self.input_ids: tuple[str, ...] = ()

    def scope_of(self, split: str) -> str:
        """Where the keyed state of a record read from `split` lives: that split on a forward
        chain, `KEY_SCOPE` (the subtask's keys) after a keyed exchange."""
        return split if self.scope == "split" else KEY_SCOPE

    @property
    def timed(self) -> bool:
        """True for an operator that needs watermarks (windows, timers)."""
        return False

    def user_functions(self) -> tuple[Any, ...]:
        """The user's functions this operator calls (shipped to the workers by value)."""
        return ()

    def restore(self, data: bytes, *, codec: StateCodec, source: str) -> OperatorState | None:
        """The subtask's state from its snapshot bytes (`source` names the state file in a
        decode error); None for a stateless operator."""
        if not self.stateful:
            return None
        return OperatorState.from_bytes(data, operator=self.name, codec=codec, source=source)

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        """One epoch of one subtask: the output chunks, and with event time (`origins` and
        `time` given) their origin watermarks. With `dead_letters`, a record the user's
        function raises on goes there and processing goes on; without, the error
        propagates (the unit declines)."""
        raise NotImplementedError

    def run_inputs(
        self,
        inputs: Sequence[tuple[Sequence[Chunk], Sequence[int] | None]],
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        """One epoch of one subtask, given its input per input vertex (in the order the
        vertex lists them): (chunks, their origin watermarks or None). An operator that tells
        its inputs apart (a join: left and right) overrides this; every other one sees their
        chunks one after the other, through `run`."""
        if len(inputs) == 1:
            chunks, origins = inputs[0]
        else:
            chunks = [c for side, _ in inputs for c in side]
            origins = None if time is None else [o for _, os in inputs for o in os or ()]
        return self.run(chunks, origins, state, dead_letters, time)

    def snapshot(self, state: OperatorState | None, live_splits: Collection[str]) -> bytes | None:
        """The state's bytes for the checkpoint (None: stateless). Split-scoped keyed state of
        splits not in `live_splits` (finished) leaves with this snapshot, which is also the
        first without the split in its source's state (DESIGN §4 rule 4)."""
        if state is None:
            return None
        if self.scope == "split":
            state.retain_splits(live_splits)
        return state.to_bytes()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


class RecordOperator(Operator):
    """An operator called once per record (`fn`): outputs are that record's results, in
    input order, kept in their input split's chunk."""

    def __init__(self, fn: Callable[..., Any], *, name: str = "", scope: str = "split") -> None:
        super().__init__(name=name, scope=scope)
        self.fn = fn

    def user_functions(self) -> tuple[Any, ...]:
        return (self.fn,)

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        """The outputs of one record."""
        raise NotImplementedError

    def outputs_of(
        self, records: list[Any], split: str, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        """The outputs of a chunk's records when no record may be dead-lettered (subclasses
        make this one comprehension, without a call per record)."""
        return [o for r in records for o in self.outputs(split, r, state, time)]

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        out: list[Chunk] = []
        out_origins: list[int] | None = [] if origins is not None else None
        for split, records, base, origin in _numbered(chunks, origins, records_of, len):
            if dead_letters is None:
                try:
                    produced = self.outputs_of(records, split, state, time)
                except BaseException as exc:  # SystemExit too: `failures.as_exception`
                    raised_on(exc, split)
                    raise
            else:
                produced = []
                for i, record in enumerate(records):
                    try:
                        produced += self.outputs(split, record, state, time)
                    except Exception as exc:
                        dead_letters.add(self.name, split, base + i, record, exc)
                    except BaseException as exc:  # no bad record: the unit's failure
                        raised_on(exc, split)
                        raise
            if produced:
                out.append((split, produced))
                if out_origins is not None:
                    out_origins.append(origin)
        return out, out_origins


class Map(RecordOperator):
    """One output record per input record: `fn(record)`."""

    kind = "map"
    one_pass = True

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        return [self.fn(record)]

    def outputs_of(
        self, records: list[Any], split: str, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        fn = self.fn
        return [fn(r) for r in records]


class Filter(RecordOperator):
    """The records for which `fn(record)` is true."""

    kind = "filter"
    one_pass = True

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        return [record] if self.fn(record) else []

    def outputs_of(
        self, records: list[Any], split: str, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        fn = self.fn
        return [r for r in records if fn(r)]


class FlatMap(RecordOperator):
    """Zero or more output records per input record: the iterable `fn(record)` (None: none)."""

    kind = "flat_map"
    one_pass = True

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        return list(self.fn(record) or ())

    def outputs_of(
        self, records: list[Any], split: str, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        fn = self.fn
        return [o for r in records for o in (fn(r) or ())]


class KeyedTimers:
    """What the keyed stateful operators with a user function share (`Process`,
    `ApplyInArrow`): the key, the timer callback, and the due timers fired at the end of an
    epoch (`regional.dataflow.timers`)."""

    fn: Callable[..., Any]
    key: Callable[[Any], Any]
    on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None
    scope: str

    @property
    def timed(self) -> bool:
        return self.on_timer is not None

    def user_functions(self) -> tuple[Any, ...]:
        return (self.fn, self.key, self.on_timer)

    def fire_due(
        self,
        state: OperatorState | None,
        time: EpochTime | None,
        out: list[Chunk],
        out_origins: list[int] | None,
    ) -> None:
        """Add the outputs of the timers the epoch's watermark made due to `out`."""
        if self.on_timer is not None and time is not None and out_origins is not None:
            assert state is not None
            fired, fired_origins = fire_timers(state, time, self.scope, self.on_timer)
            out += fired
            out_origins += fired_origins


class Process(KeyedTimers, RecordOperator):
    """A keyed stateful function `fn(ctx, record) -> iterable of outputs` (`ctx`: the record's
    `KeyedContext`); with `on_timer`, `ctx.timers` sets the key's timers and
    `on_timer(ctx, ts)` runs when one is due (`regional.dataflow.timers`)."""

    kind = "process"
    stateful = True
    one_pass = True  # timers need event time, which keeps a unit out of any pass

    def __init__(
        self,
        fn: Callable[[KeyedContext, Any], Iterable[Any] | None],
        key: Callable[[Any], Any],
        *,
        on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None = None,
        name: str = "",
        scope: str = "split",
    ) -> None:
        super().__init__(fn, name=name, scope=scope)
        self.key = key
        self.on_timer = on_timer

    def outputs(
        self, split: str, record: Any, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        assert state is not None
        scope = self.scope_of(split)
        ctx = state.context(scope, self.key(record))
        if time is not None and self.on_timer is not None:
            bind(ctx, state, scope, time.start_of(scope))
        return list(self.fn(ctx, record) or ())

    def outputs_of(
        self, records: list[Any], split: str, state: OperatorState | None, time: EpochTime | None
    ) -> list[Any]:
        """`outputs` of every record in one loop: the hot path of a stateful function. A
        key's context is looked up once per chunk (its slot cannot go away within one)."""
        assert state is not None
        scope = self.scope_of(split)
        fn, key_of, context = self.fn, self.key, state.context
        timed = time is not None and self.on_timer is not None
        watermark = time.start_of(scope) if time is not None else 0
        contexts: dict[Any, KeyedContext] = {}
        out: list[Any] = []
        extend = out.extend
        for record in records:
            key = key_of(record)
            ctx = contexts.get(key)
            if ctx is None:
                ctx = contexts[key] = context(scope, key)
            if timed:
                bind(ctx, state, scope, watermark)
            produced = fn(ctx, record)
            if produced is not None:
                extend(produced)
        return out

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        out, out_origins = super().run(chunks, origins, state, dead_letters, time)
        self.fire_due(state, time, out, out_origins)
        return out, out_origins


class MapBatches(Operator):
    """One Arrow record batch in, a record batch or table out (`fn(batch)`; None: nothing);
    with dead letters, a batch the function raises on is dead-lettered whole. Any other
    return type is a `TypeError` naming the operator (a bug in the function, never
    dead-lettered)."""

    kind = "map_batches"
    one_pass = True

    def __init__(
        self, fn: Callable[[pa.RecordBatch], pa.RecordBatch | pa.Table | None], *, name: str = ""
    ) -> None:
        super().__init__(name=name)
        self.fn = fn

    def user_functions(self) -> tuple[Any, ...]:
        return (self.fn,)

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        out: list[Chunk] = []
        out_origins: list[int] | None = [] if origins is not None else None
        for split, data, base, origin in _numbered(chunks, origins, _same, len):
            batch = _arrow_of(data, self.name, split, base, dead_letters)
            if data and not batch.num_rows:  # every record of the list was dead-lettered
                continue
            try:
                result = self.fn(batch)
            except BaseException as exc:
                if dead_letters is None or not isinstance(exc, Exception):
                    raised_on(exc, split)
                    raise
                for i, record in enumerate(batch.to_pylist()):
                    dead_letters.add(self.name, split, base + i, record, exc)
                continue
            produced = self._chunks(split, result)
            out += produced
            if out_origins is not None:
                out_origins += [origin] * len(produced)
        return out, out_origins

    def _chunks(self, split: str, result: Any) -> list[Chunk]:
        if isinstance(result, pa.Table):
            return [(split, b) for b in result.to_batches() if b.num_rows]
        if isinstance(result, pa.RecordBatch):
            return [(split, result)] if result.num_rows else []
        if result is None:
            return []
        raise TypeError(
            f"operator {self.name!r}: the map_batches function returned "
            f"{type(result).__module__}.{type(result).__qualname__}; return a "
            "pyarrow.RecordBatch, a pyarrow.Table or None"
        )


class WindowOp(Operator):
    """Event-time windows of a key (`regional.dataflow.window_operator`): records are added
    to their windows, and closed windows emit one row each at the end of the epoch."""

    kind = "window"
    stateful = True

    def __init__(
        self, spec: WindowSpec, key: Callable[[Any], Any], *, name: str = "", scope: str = "split"
    ) -> None:
        super().__init__(name=name, scope=scope)
        self.spec = spec
        self.key = key

    @property
    def timed(self) -> bool:
        return True

    def user_functions(self) -> tuple[Any, ...]:
        return (self.key, self.spec.time_of, self.spec.emit, self.spec.aggregate)

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        assert state is not None and time is not None and origins is not None
        return run_windows(
            self.spec,
            self.name,
            self.key,
            self.scope,
            chunks,
            origins,
            state,
            time,
            dead_letters,
            records_of,
        )


class ApplyInArrow(KeyedTimers, Operator):
    """A keyed function over Arrow tables: `fn(ctx, table)` is called once per key (per split
    and key on a forward chain) and epoch with that key's records of the epoch as one
    `pyarrow.Table`, in arrival order, and `ctx` its `KeyedContext` (state, and timers with
    `on_timer`). It returns a Table, a RecordBatch, an iterable of records or None. Keys come
    in the order of their first record. With dead letters, a key whose call raises has all
    its records of the epoch dead-lettered. A key that is a field name (`key_by("user")`)
    groups by that column without turning rows into Python records; any other key function
    is called on every record."""

    kind = "apply_in_arrow"
    stateful = True
    one_pass = True  # timers need event time, which keeps a unit out of any pass

    def __init__(
        self,
        fn: Callable[[KeyedContext, pa.Table], Any],
        key: Callable[[Any], Any],
        *,
        on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None = None,
        name: str = "",
        scope: str = "split",
    ) -> None:
        super().__init__(name=name, scope=scope)
        self.fn = fn
        self.key = key
        self.on_timer = on_timer

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        assert state is not None
        out: list[Chunk] = []
        out_origins: list[int] | None = [] if origins is not None else None
        for scope, split, batches, keys, origin in self._by_scope(chunks, origins, dead_letters):
            table = _table(batches)
            if not table.num_rows:
                continue
            groups: dict[Any, list[int]] = {}
            for i, k in enumerate(keys):
                group = groups.get(k)
                if group is None:
                    groups[k] = [i]
                else:
                    group.append(i)
            watermark = time.start_of(scope) if time is not None else 0
            for k, rows in groups.items():
                part = table.take(pa.array(rows, pa.int64())) if len(rows) < len(keys) else table
                ctx = state.context(scope, k)
                if time is not None and self.on_timer is not None:
                    bind(ctx, state, scope, watermark)
                try:
                    produced = _chunks_of(self.name, split, self.fn(ctx, part))
                except BaseException as exc:
                    if (
                        dead_letters is None
                        or isinstance(exc, _WrongResult)
                        or not isinstance(exc, Exception)
                    ):
                        raised_on(exc, split)
                        raise
                    for i, record in zip(rows, part.to_pylist(), strict=True):
                        dead_letters.add(self.name, split, i, record, exc)
                    continue
                out += produced
                if out_origins is not None:
                    out_origins += [origin] * len(produced)
        self.fire_due(state, time, out, out_origins)
        return out, out_origins

    def _by_scope(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        dead_letters: DeadLetters | None,
    ) -> list[tuple[str, str, list[pa.RecordBatch], list[Any], int]]:
        """The input as (scope, split of the output, batches, the key of each of their rows,
        origin watermark) per state scope: per split on a forward chain, one for the subtask
        after an exchange (whose origin is the lowest of its chunks': never later than any of
        its records'). Rows without a usable key are left out (`_keyed`), lists of records
        keep the union of their fields (`_arrow_rows`), and a scope's batches get one schema
        (`regional.sinks.rows.conformed`: widened where no value changes); a record or batch
        that cannot is a dead letter of this operator naming why, or without dead letters
        declines its unit."""
        grouped: dict[str, tuple[str, list[pa.RecordBatch], list[list[Any]], int]] = {}
        # per scope: each batch's split, and each of its rows' place in its split's epoch
        made: dict[str, list[tuple[str, list[int]]]] = {}
        for split, data, base, origin in _numbered(chunks, origins, _same, len):
            scope = self.scope_of(split)
            rows, keys, places = self._keyed(split, data, base, dead_letters)
            if isinstance(rows, pa.RecordBatch):
                batch = rows
            else:
                batch, held = _arrow_rows(rows, self.name, split, places, dead_letters)
                if held is not None:
                    keys = [keys[i] for i in held]
                    places = [places[i] for i in held]
            if not batch.num_rows:
                continue
            made.setdefault(scope, []).append((split, places))
            if scope in grouped:
                first_split, batches, keys_of, low = grouped[scope]
                batches.append(batch)
                keys_of.append(keys)
                grouped[scope] = (first_split, batches, keys_of, min(low, origin))
            else:
                grouped[scope] = (split, [batch], [keys], origin)
        out: list[tuple[str, str, list[pa.RecordBatch], list[Any], int]] = []
        for scope, (first_split, batches, keys_of, low) in grouped.items():
            kept, refused = conformed(batches, f"operator {self.name!r}")
            for n, error in refused:
                split, places = made[scope][n]
                if dead_letters is None:
                    raised_on(error, split)
                    raise error
                for index, record in zip(places, batches[n].to_pylist(), strict=True):
                    dead_letters.add(self.name, split, index, record, error)
            refused_at = {n for n, _ in refused}
            keys = [k for n, ks in enumerate(keys_of) if n not in refused_at for k in ks]
            out.append((scope, first_split, kept, keys, low))
        return out

    def _keyed(
        self, split: str, data: Batch, base: int, dead: DeadLetters | None
    ) -> tuple[Batch, list[Any], list[int]]:
        """One chunk's rows with a usable key (an Arrow batch stays one, a list stays a
        list), their keys and their places in the split's epoch (`base` + their place in the
        chunk; a dead letter names its record by it): the key column of a `FieldKey` the
        batch has (a null is the key None), else the key function of every record
        (`regional.dataflow.keys.read_key`: a record without the field, a key function
        raising, an unhashable key). A row without one is a dead letter naming the operator,
        the function and the reason, or its unit declines with that error."""
        field = getattr(self.key, "field", None)
        owner = f"apply_in_arrow {self.name!r}"
        bad: set[int] = set()
        if (
            isinstance(data, pa.RecordBatch)
            and isinstance(field, str)
            and field in data.schema.names
        ):
            keys = data.column(field).to_pylist()
            for i, k in enumerate(keys):
                try:
                    hash(k)
                except TypeError:  # a list or struct column: read_key names it
                    record = data.slice(i, 1).to_pylist()[0]
                    try:
                        read_key(self.key, record, owner)
                    except UserFunctionError as exc:
                        self._set_aside(exc, split, base + i, record, dead)
                    bad.add(i)
        else:
            records = records_of(data)
            keys = []
            for i, record in enumerate(records):
                try:
                    keys.append(read_key(self.key, record, owner))
                except UserFunctionError as exc:
                    self._set_aside(exc, split, base + i, record, dead)
                    bad.add(i)
                    keys.append(None)
                except BaseException as exc:  # SystemExit too: `failures.as_exception`
                    raised_on(exc, split)
                    raise
        size = len(keys)
        if not bad:
            return data, keys, list(range(base, base + size))
        good = [i for i in range(size) if i not in bad]
        rows: Batch = (
            data.take(pa.array(good, pa.int64()))
            if isinstance(data, pa.RecordBatch)
            else [data[i] for i in good]
        )
        return rows, [keys[i] for i in good], [base + i for i in good]

    def _set_aside(
        self,
        exc: UserFunctionError,
        split: str,
        index: int,
        record: Any,
        dead: DeadLetters | None,
    ) -> None:
        """A record without a usable key: a dead letter, or (without) its unit's failure."""
        set_aside(dead, exc, self.name, split, index, record)


def _table(batches: list[pa.RecordBatch]) -> pa.Table:
    """One table of a scope's batches (of one schema: `ApplyInArrow._by_scope`)."""
    if not batches:
        return pa.table({})
    return pa.Table.from_batches(batches)


class _WrongResult(TypeError):
    """An `apply_in_arrow` function returned something else than rows (a bug in the function,
    never dead-lettered)."""


def _chunks_of(name: str, split: str, result: Any) -> list[Chunk]:
    """The output chunks of one `apply_in_arrow` call."""
    if result is None:
        return []
    if isinstance(result, pa.Table):
        return [(split, b) for b in result.to_batches() if b.num_rows]
    if isinstance(result, pa.RecordBatch):
        return [(split, result)] if result.num_rows else []
    if isinstance(result, str | bytes | dict) or not isinstance(result, Iterable):
        raise _WrongResult(
            f"operator {name!r}: the apply_in_arrow function returned "
            f"{type(result).__module__}.{type(result).__qualname__}; return a pyarrow.Table, "
            "a pyarrow.RecordBatch, an iterable of records or None"
        )
    rows = list(result)
    return [(split, rows)] if rows else []


def build_process(
    graph: Build,
    keyed: Keyed,
    fn: Callable[[KeyedContext, Any], Iterable[Any] | None],
    *,
    on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None,
    name: str | None,
) -> str:
    """Add `KeyedStream.process`; its vertex id."""
    return _add_keyed(
        graph, keyed, lambda scope: Process(fn, keyed.key, scope=scope, on_timer=on_timer), name
    )


def build_apply_in_arrow(
    graph: Build,
    keyed: Keyed,
    fn: Callable[[KeyedContext, pa.Table], Any],
    *,
    on_timer: Callable[[KeyedContext, int], Iterable[Any] | None] | None,
    name: str | None,
) -> str:
    """Add `KeyedStream.apply_in_arrow`; its vertex id."""
    return _add_keyed(
        graph,
        keyed,
        lambda scope: ApplyInArrow(fn, keyed.key, scope=scope, on_timer=on_timer),
        name,
    )


def _add_keyed(
    graph: Build, keyed: Keyed, make: Callable[[str], Operator], name: str | None
) -> str:
    """Add the keyed operator `make(state scope)` reading `keyed`; one with timers needs event
    time upstream (`GraphError` naming it otherwise)."""
    op = make(graph.key_scope(keyed.vertex_id, keyed.key, name))
    if op.timed:
        graph.event_time_of(keyed.vertex_id, None, name or op.kind)
    return graph.add(op, name, (keyed.vertex_id,))


def build_window(
    graph: Build,
    keyed: Keyed,
    assigner: WindowAssigner,
    *,
    aggregate: Aggregate | Sequence[Aggregate] | None,
    reduce: Callable[[Any, Any], Any] | None,
    allowed_lateness: Any,
    on_late: str,
    emit: Callable[[Any, Window, Any], Any] | None,
    event_time: Callable[[Any], Any] | str | None,
    name: str | None,
) -> str:
    """Add `KeyedStream.window`; its vertex id. `GraphError` naming the window unless exactly
    one of `aggregate` and `reduce` is given, for an `on_late` the pipeline cannot keep, or
    without event time upstream."""
    what = f"window {name or '(unnamed)'!r}"
    if (aggregate is None) == (reduce is None):
        raise GraphError(
            f"{what}: give aggregate=<count(), sum_of('field') or an Aggregate> or "
            "reduce=<a function of two records>, one of them"
        )
    if aggregate is not None and not isinstance(aggregate, Aggregate):
        aggregate = combine(aggregate, what)
    graph.late_policy(what, on_late)
    time = graph.event_time_of(keyed.vertex_id, event_time, what)
    scope = graph.key_scope(keyed.vertex_id, keyed.key, name)
    schema, keys, out = graph.schema_of(keyed.vertex_id), key_columns(keyed.key), None
    if schema is not None and time.field is not None:
        event_time_column(schema, time.field, what)
    if aggregate is not None and emit is None and schema is not None and keys is not None:
        out = window_schema(schema, keys, aggregate, what)
        if out is not None:
            emit = WindowRow(keys, None if aggregate.parts else aggregate.output_column)
    spec = WindowSpec(
        assigner,
        aggregate if aggregate is not None else reduce_with(reduce),  # type: ignore[arg-type]
        time_of=time.fn,
        time_field=time.field,
        allowed_lateness=allowed_lateness,
        on_late=on_late,
        emit=emit,
        schema=out,
    )
    op = WindowOp(spec, keyed.key, scope=scope)
    op.output_schema = out
    return graph.add(op, name, (keyed.vertex_id,))
