"""The stream-stream interval join (DESIGN §4 rule 17): two keyed streams, a pair (l, r) of
equal key joined when ``l.ts + lower <= r.ts <= l.ts + upper``.

Both inputs reach subtask q through durable keyed exchanges partitioned alike
(`Pipeline._co_partition`), so each side's upstream regions fall back on their own and the join
is one more stage of regions. Per key, the rows of each side wait in keyed state (so they
fall back, restore and move on rescale with their key) until no record still to come can match
them:

* a record is **late** when its event time is below its chunk's *origin* watermark (the one
  windows judge by, `regional.dataflow.epoch_time`): it is never joined; it is counted, and with
  ``on_late="dead-letter"`` written to the dead-letter sink with the reason;
* every match is emitted exactly once, in the epoch the later of its two records arrives: new
  left rows against the waiting and the new right rows, waiting left rows against the new
  right rows;
* at the end of the epoch, with W the subtask's watermark (the lower of the two sides'), a
  left row leaves when ``l.ts + upper < W`` and a right row when ``r.ts - lower < W``. *Why
  nothing matchable leaves:* a record still to come that is not late has ``ts >= origin``, and
  its origin is at least W (a writer's watermark only grows, and W is the lowest writer mark
  the reader has passed). A right row r' matching l needs ``r'.ts <= l.ts + upper < W``: late.
  A left row l' matching r needs ``l'.ts <= r.ts - lower < W``: late;
* outer joins (``how="left"``, ``"right"``, ``"outer"``): a row that leaves without a match is
  emitted once, then, with None for the other side; at the end of the input (W = +inf) every
  row leaves.

Keys follow SQL: a record whose key is None matches nothing (an outer join emits it unmatched
in the epoch it arrives). A record whose key function raises or gives an unhashable key, and a
pair whose ``emit`` raises, is that record's (pair's) failure, never the join's: with
``on_error="dead-letter"`` a dead letter naming the join, the function and the reason
(`regional.dataflow.failures.UserFunctionError`), the other records going on; otherwise the
unit declines with that error.

The rows are those of a batch join over the records that were not late, whichever units fell
back when: a record's lateness depends only on its own origin watermark, and a row leaves only
once nothing that is not late could still match it.

>>> j = IntervalJoinSpec(between=(0, 10), how="left")
>>> slot = {}
>>> pairs = j.match(slot, left=[(5, {"id": 1})], right=[(12, {"p": "a"}), (30, {"p": "b"})])
>>> pairs
[({'id': 1}, {'p': 'a'})]
>>> j.leave(slot, watermark=16)  # l.ts + upper = 15 < 16: it leaves (it had a match)
[]
>>> j.leave(slot, watermark=10**9)  # the right rows leave: a left join emits none of them
[]
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from metadata.watermarks import MIN_WATERMARK, format_watermark
from regional.dataflow.building import Build, Keyed
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.failures import UserFunctionError, function_error, raised_on
from regional.dataflow.keys import key_columns, read_key
from regional.dataflow.on_time import Lateness
from regional.dataflow.operators import Chunk, Operator, records_of
from regional.dataflow.partitioning import key_bytes
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.state_codec import StateTypeError
from regional.dataflow.stream_schemas import (
    JoinColumns,
    event_time_column,
    join_key_types,
    nested_join_schema,
)
from regional.dataflow.window_operator import FIRED_WATERMARK, LateRecord
from regional.errors import GraphError
from regional.policy import parse_duration

__all__ = [
    "HOW",
    "IntervalJoin",
    "IntervalJoinSpec",
    "KeyedJoin",
    "NewRows",
    "add_join",
    "build_interval_join",
    "default_emit",
    "join_bound_ms",
]

#: The kinds of interval join: which unmatched rows are emitted (with None for the other side).
HOW = ("inner", "left", "right", "outer")
_LEFT, _RIGHT = "l", "r"  # slot entries: [[ts, matched, record], ...] in arrival order
_MAX_BOUND_MS = 365 * 24 * 3600 * 1000


def default_emit(left: Any, right: Any) -> dict[str, Any]:
    """The default joined row: ``{"left": left, "right": right}`` (None for a missing side)."""
    return {"left": left, "right": right}


def join_bound_ms(value: Any, what: str) -> int:
    """Milliseconds of one bound of `between`: ``"5 min"``, ``"-30 s"``, a timedelta or a
    number of seconds, negative allowed, at most 365 days either way; `GraphError` naming
    `what` otherwise.

    >>> join_bound_ms("-30 s", "lower"), join_bound_ms("15 min", "upper"), join_bound_ms(2, "x")
    (-30000, 900000, 2000)
    """
    negative = isinstance(value, str) and value.strip().startswith("-")
    try:
        seconds = parse_duration(value.strip()[1:] if negative else value)
    except ValueError:
        seconds = float("nan")
    ms = round(seconds * 1000) if seconds == seconds and abs(seconds) < 1e300 else None
    if ms is None or abs(ms) > _MAX_BOUND_MS:
        raise GraphError(
            f'{what}={value!r}; give a duration of at most 365 days either way: "-5 min", '
            '"0 s", "15 min", a datetime.timedelta or a number of seconds'
        )
    return -ms if negative else ms


class IntervalJoinSpec:
    """The join's bounds (ms), its kind and its output row; the pure part of the operator:
    matching (`match`) and leaving the state (`leave`), on one key's slot."""

    def __init__(
        self,
        *,
        between: tuple[int, int],
        how: str = "inner",
        emit: Callable[[Any, Any], Any] | None = None,
    ) -> None:
        self.lower, self.upper = between
        self.how = how
        self.emit = emit or default_emit

    def match(
        self,
        slot: dict[str, Any],
        *,
        left: Sequence[tuple[int, Any]],
        right: Sequence[tuple[int, Any]],
    ) -> list[tuple[Any, Any]]:
        """Add a key's new rows of the epoch (event time, record) to its `slot` and return
        the new pairs (left record, right record): new left rows against every right row, the
        rows already waiting on the left against the new right rows."""
        lower, upper = self.lower, self.upper
        waiting_left: list[list[Any]] = slot.setdefault(_LEFT, [])
        waiting_right: list[list[Any]] = slot.setdefault(_RIGHT, [])
        old_left = len(waiting_left)
        new_right = [[ts, False, r] for ts, r in right]
        pairs: list[tuple[Any, Any]] = []
        for entry in waiting_left[:old_left]:
            low, high = entry[0] + lower, entry[0] + upper
            for other in new_right:
                if low <= other[0] <= high:
                    pairs.append((entry[2], other[2]))
                    entry[1] = other[1] = True
        waiting_right += new_right
        for ts, record in left:
            entry = [ts, False, record]
            low, high = ts + lower, ts + upper
            for other in waiting_right:
                if low <= other[0] <= high:
                    pairs.append((record, other[2]))
                    entry[1] = other[1] = True
            waiting_left.append(entry)
        return pairs

    def leave(self, slot: dict[str, Any], *, watermark: int) -> list[tuple[Any, Any]]:
        """Drop the rows of `slot` no record still to come can match (module docstring), and
        return the unmatched ones an outer join emits: (left, None) or (None, right)."""
        out: list[tuple[Any, Any]] = []
        for side, bound, emits in (
            (_LEFT, self.upper, self.how in ("left", "outer")),
            (_RIGHT, -self.lower, self.how in ("right", "outer")),
        ):
            rows = slot.get(side)
            if not rows:
                slot.pop(side, None)
                continue
            kept = []
            for entry in rows:
                if entry[0] + bound < watermark:
                    if emits and not entry[1]:
                        out.append((entry[2], None) if side == _LEFT else (None, entry[2]))
                else:
                    kept.append(entry)
            if kept:
                slot[side] = kept
            else:
                del slot[side]
        return out


def _late(what: str, side: str, ts: int, origin: int) -> LateRecord:
    return LateRecord(
        f"{what}: the {side} record's event time {format_watermark(ts)} is behind its "
        f"watermark {format_watermark(origin)}, so rows it would match may have left the "
        "join's state; raise max_out_of_orderness of the source to keep such records"
    )


#: One key's new records of the epoch, per input: (event time, record, ...: `KeyedJoin.entry`)
#: in arrival order.
NewRows = dict[Any, tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]]


class KeyedJoin(Operator):
    """What the joins of two keyed streams share (`IntervalJoin`,
    `regional.dataflow.temporal_join.TemporalJoin`): input 0 and input 1 read from keyed
    exchanges partitioned alike (state per key, ``scope="key"``); each record's event time,
    lateness against its origin watermark (counted, dead-lettered with ``on_late``), and the
    watermark the state is cleaned at, which never goes back (kept as windows keep theirs, so
    a rescale gives every new subtask the lowest). A join implements `join`."""

    stateful = True
    #: what the two inputs are called in errors and dead letters
    sides: tuple[str, str] = ("left", "right")
    what = "join"

    def __init__(
        self,
        spec: Any,
        keys: tuple[Callable[[Any], Any], Callable[[Any], Any]],
        times: tuple[Callable[[Any], Any], Callable[[Any], Any]],
        *,
        fields: tuple[str | None, str | None] = (None, None),
        on_late: str = "drop",
        name: str = "",
    ) -> None:
        super().__init__(name=name, scope="key")
        self.spec = spec  # the join's own definition (bounds, kind, output row)
        self.keys = keys
        self.times = times
        self.fields = fields
        self.on_late = on_late

    @property
    def timed(self) -> bool:
        return True

    def user_functions(self) -> tuple[Any, ...]:
        return (*self.keys, *self.times, self.spec.emit)

    def join(
        self, slots: dict[Any, dict[Any, Any]], new: NewRows, watermark: int
    ) -> list[tuple[Any, Any]]:
        """The epoch's pairs (input 0 record, input 1 record or version; None for a missing
        side): add the new rows to their keys' slots, pair what they make, and drop (and pair,
        for outer joins) what the `watermark` lets leave; a slot left empty is deleted. Pairs
        in a deterministic order; `emit` makes them rows."""
        raise NotImplementedError

    def unmatched(self, keyless: tuple[list[Any], list[Any]]) -> list[tuple[Any, Any]]:
        """The pairs of the epoch's records whose key is None (per input), which match
        nothing: what the join emits for a record without a match."""
        raise NotImplementedError

    def entry(self, side: int, ts: int, record: Any) -> tuple[Any, ...]:
        """What a record of input `side` at event time `ts` adds to its key's new rows (a
        join that calls a user function on each record, like ``is_delete``, calls it here,
        where a failure is judged per record)."""
        return (ts, record)

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        raise TypeError(f"{self.what} {self.name!r} has two inputs: run it with run_inputs")

    def run_inputs(
        self,
        inputs: Sequence[tuple[Sequence[Chunk], Sequence[int] | None]],
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        assert state is not None and time is not None and len(inputs) == 2
        # the highest watermark this subtask cleaned at (the `exclude` policy can move the
        # reader's back; a row that left never comes back), as windows keep theirs
        floor = state.lists.setdefault(FIRED_WATERMARK, [MIN_WATERMARK])
        if time.start_of(KEY_SCOPE) < floor[0]:
            time.start[KEY_SCOPE] = floor[0]
        start = time.start_of(KEY_SCOPE)
        new: NewRows = {}
        keyless: tuple[list[Any], list[Any]] = ([], [])
        slots = state.keyed.setdefault(KEY_SCOPE, {})
        for side, (chunks, origins) in enumerate(inputs):
            self._arrived(
                side, chunks, origins, start, new, keyless, slots, state, dead_letters, time
            )
        watermark = max(floor[0], time.end.get(KEY_SCOPE, MIN_WATERMARK))
        pairs = self.join(slots, new, watermark) + self.unmatched(keyless)
        if not slots:
            del state.keyed[KEY_SCOPE]
        floor[0] = watermark
        rows = self._emitted(pairs, dead_letters, time.key_split)
        if not rows:
            return [], []
        return [(time.key_split, rows)], [start]

    def _emitted(
        self, pairs: list[tuple[Any, Any]], dead: DeadLetters | None, split: str
    ) -> list[Any]:
        """`emit` of every pair; a pair it raises on is a dead letter (its record: the two
        sides by name, its index: the pair's among the epoch's) or fails the unit."""
        emit = self.spec.emit
        rows = []
        for n, (a, b) in enumerate(pairs):
            try:
                rows.append(emit(a, b))
            except Exception as exc:
                record = {self.sides[0]: a, self.sides[1]: b}
                error = function_error(f"{self.what} {self.name!r}", "emit", emit, record, exc)
                if dead is None:
                    raised_on(error, split)
                    raise error from exc
                dead.add(self.name, split, n, record, error)
        return rows

    def _arrived(
        self,
        side: int,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        start: int,
        new: NewRows,
        keyless: tuple[list[Any], list[Any]],
        slots: dict[Any, dict[Any, Any]],
        state: OperatorState,
        dead: DeadLetters | None,
        time: EpochTime,
    ) -> None:
        """Sort one side's records of the epoch into `new` by key, with their event times
        (into `keyless` for a None key); late records and records without a usable event
        time or key are set aside."""
        name = self.sides[side]
        key_of = self.keys[side]
        # both sides' exchange readers read a split named n<N>-p<q>: a dead letter names its
        # reader, so it shows that reader's position
        source = self.input_ids[side] if len(self.input_ids) == 2 else None
        what = f"{self.what} {self.name!r}"
        owner = f"{what} ({name} side)"
        judge = Lateness(
            owner,
            self.times[side],
            self.fields[side],
            self.on_late,
            lambda ts, origin: _late(what, name, ts, origin),
        )
        seen: dict[str, int] = {}
        for n, (split, data) in enumerate(chunks):
            origin = max(origins[n] if origins is not None else MIN_WATERMARK, start)
            rows = records_of(data)
            base = seen.get(split, 0)
            seen[split] = base + len(rows)
            for i, record, ts in judge.on_time(
                rows, split=split, base=base, origin=origin, dead=dead, time=time,
                operator=self.name, source=source,
            ):  # fmt: skip
                try:
                    key = read_key(key_of, record, owner)
                    if key is not None and key not in slots:
                        self._keep_key(state, key, owner, record)
                    row = self.entry(side, ts, record)
                except UserFunctionError as exc:
                    if dead is None:
                        raised_on(exc, split)
                        raise
                    dead.add(self.name, split, base + i, record, exc, source=source)
                    continue
                if key is None:  # as SQL: matches nothing
                    keyless[side].append(record)
                    continue
                if key not in slots:
                    slots[key] = {}
                state.check(record, f"the {name} rows")
                entry = new.get(key)
                if entry is None:
                    entry = new[key] = ([], [])
                entry[side].append(row)

    def _keep_key(self, state: OperatorState, key: Any, owner: str, record: Any) -> None:
        """Refuse, as that record's failure, a key the state cannot keep."""
        try:
            state.codec.check(key, what="a join key", operator=self.name)
        except StateTypeError as exc:
            raise UserFunctionError(
                f"{owner}: the key {key!r:.100} of record {record!r:.200} cannot be kept: {exc}"
            ) from None


class IntervalJoin(KeyedJoin):
    """The interval join operator (`KeyedStream.interval_join` adds it): input 0 is the left
    side, input 1 the right; `spec` is an `IntervalJoinSpec`."""

    kind = "interval_join"
    what = "interval join"
    spec: IntervalJoinSpec

    def join(
        self, slots: dict[Any, dict[Any, Any]], new: NewRows, watermark: int
    ) -> list[tuple[Any, Any]]:
        pairs: list[tuple[Any, Any]] = []
        for key, (left, right) in new.items():
            pairs += self.spec.match(slots[key], left=left, right=right)
        leaving: list[tuple[bytes, list[tuple[Any, Any]]]] = []
        for key in list(slots):
            slot = slots[key]
            unmatched = self.spec.leave(slot, watermark=watermark)
            if unmatched:
                leaving.append((key_bytes(key), unmatched))
            if not slot:
                del slots[key]
        leaving.sort(key=lambda item: item[0])  # a deterministic order, key by key
        pairs += [p for _, unmatched in leaving for p in unmatched]
        return pairs

    def unmatched(self, keyless: tuple[list[Any], list[Any]]) -> list[tuple[Any, Any]]:
        left, right = keyless
        out: list[tuple[Any, Any]] = []
        if self.spec.how in ("left", "outer"):
            out += [(r, None) for r in left]
        if self.spec.how in ("right", "outer"):
            out += [(None, r) for r in right]
        return out


def build_interval_join(
    graph: Build,
    left: Any,
    right: Any,
    *,
    between: tuple[Any, Any],
    how: str,
    emit: Callable[[Any, Any], Any] | None,
    partitions: int | None,
    on_late: str,
    event_time: Callable[[Any], Any] | str | None,
    other_event_time: Callable[[Any], Any] | str | None,
    name: str | None,
) -> str:
    """Add an interval join of keyed streams `left` and `right` (`KeyedStream.interval_join`
    says what it does); its vertex id. `GraphError` naming the join for any argument it
    cannot run with."""
    vid = graph.vertex_id("interval_join", name)
    what = f"interval join {vid!r}"
    sides = (graph.keyed(left, what), graph.keyed(right, what))
    if how not in HOW:
        raise GraphError(f"{what}: how={how!r}; use one of {', '.join(map(repr, HOW))}")
    graph.late_policy(what, on_late)
    if not isinstance(between, tuple | list) or len(between) != 2:
        raise GraphError(
            f"{what}: between={between!r}; give (lower, upper), e.g. ('0 s', '15 min')"
        )
    lower = join_bound_ms(between[0], f"{what}: lower bound")
    upper = join_bound_ms(between[1], f"{what}: upper bound")
    if lower > upper:
        raise GraphError(
            f"{what}: between={tuple(between)!r} has its lower bound above its upper one; "
            "give (lower, upper) with lower <= upper"
        )
    spec = IntervalJoinSpec(between=(lower, upper), how=how, emit=emit)
    return add_join(
        graph,
        sides,
        lambda keys, times, fields: IntervalJoin(spec, keys, times, fields=fields, on_late=on_late),
        vid=vid,
        times=((event_time, f"{what} (left side)"), (other_event_time, f"{what} (right side)")),
        partitions=partitions,
        schema=join_schema(graph, sides, emit, ("left", "right"), how, what),
    )


def join_schema(
    graph: Build,
    sides: tuple[Keyed, Keyed],
    emit: Callable[[Any, Any], Any] | None,
    names: tuple[str, str],
    how: str,
    what: str,
) -> pa.Schema | None:
    """The schema of a join's rows (`regional.dataflow.stream_schemas`): a join on a column's
    (`JoinColumns`), the default emit's struct per side (`names`), None for the user's
    `emit`. `GraphError` naming `what` and both schemas when the sides' key columns differ
    in type."""
    schemas = (graph.schema_of(sides[0].vertex_id), graph.schema_of(sides[1].vertex_id))
    join_key_types(
        schemas[0], schemas[1], (key_columns(sides[0].key), key_columns(sides[1].key)), what
    )
    if isinstance(emit, JoinColumns):
        return emit.schema
    if emit is None:
        return nested_join_schema(schemas[0], schemas[1], names, how)
    return None


def add_join(
    graph: Build,
    sides: tuple[Keyed, Keyed],
    make: Callable[..., Operator],
    *,
    vid: str,
    times: tuple[tuple[Any, str], tuple[Any, str]],
    partitions: int | None,
    schema: pa.Schema | None = None,
) -> str:
    """Add a join of two keyed inputs: each side's event time (given, else its sources';
    `times` pairs it with the side's name in errors), both sides partitioned alike
    (`Build.co_partition`), and the operator `make(keys, time functions, time fields)` on
    the two reader vertices; its vertex id."""
    found = [
        graph.event_time_of(side.vertex_id, given, what)
        for side, (given, what) in zip(sides, times, strict=True)
    ]
    for side, time, (_, what) in zip(sides, found, times, strict=True):
        side_schema = graph.schema_of(side.vertex_id)
        if side_schema is not None and time.field is not None:
            event_time_column(side_schema, time.field, what)
    ids = graph.co_partition(sides[0], sides[1], partitions=partitions, name=vid)
    op = make(
        (sides[0].key, sides[1].key),
        (found[0].fn, found[1].fn),
        (found[0].field, found[1].field),
    )
    op.output_schema = schema
    return graph.add(op, vid, ids)
