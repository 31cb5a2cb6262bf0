"""Deduplication within a watermark (DESIGN §4 rule 19): `key_by(k).drop_duplicates(within=...)`,
like Spark's ``dropDuplicatesWithinWatermark``.

Per key (per split and key on a forward chain, per key after a keyed exchange), the operator
keeps the event time of the record it let through last, f:

* a record of the key whose event time is at most ``f + within`` is a **duplicate**: dropped;
* any other record goes through, and its time becomes the key's f;
* a record below its origin watermark is **late** (`regional.dataflow.epoch_time`): its
  first might have left the state already, so it is never let through: counted, and with
  ``on_late="dead-letter"`` a dead letter;
* a key's f leaves the state once the watermark W passes ``f + within``: every record still to
  come that is not late has a time at or above its origin watermark, itself at least W, so it
  could not be a duplicate of f any more.

A record whose key function raises or gives an unhashable key is that record's failure: a dead
letter with ``on_error="dead-letter"`` (naming the operator, the function and the reason), else
its unit declines naming them. A None key is a key like any other (as in SQL's DISTINCT).

Which records go through depends only on the records of the key in the order they arrive:
the same after any fallback for records of one input split (a split's records keep their
order), and for exact duplicates (a redelivered event) from any split. Two *different* records
of a key within `within` from two splits: the one that arrives first goes through, and a
fallback can change which that is.

>>> d = Dedup(within_ms=10)
>>> slot = {}
>>> tuple(d.through(slot, ts) for ts in (100, 105, 110, 111, 125))
(True, False, False, True, True)
>>> d.expired(slot, watermark=136)
True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from metadata.watermarks import MIN_WATERMARK, format_watermark
from regional.dataflow.building import Build, Keyed
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.failures import UserFunctionError, raised_on
from regional.dataflow.keys import read_key
from regional.dataflow.on_time import Lateness
from regional.dataflow.operators import Chunk, Operator, records_of
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.state_codec import StateTypeError
from regional.dataflow.stream_schemas import event_time_column
from regional.dataflow.window_operator import FIRED_WATERMARK, LateRecord
from regional.errors import GraphError

__all__ = ["Dedup", "DropDuplicates", "build_drop_duplicates"]

_FIRST = "f"  # slot entry: the event time of the record let through last


class Dedup:
    """The rule on one key's slot: `through` decides a record, `expired` drops what the
    watermark lets go."""

    def __init__(self, *, within_ms: int) -> None:
        self.within = within_ms

    def through(self, slot: dict[str, Any], ts: int) -> bool:
        """True when a record at `ts` goes through (and becomes the key's kept one)."""
        first = slot.get(_FIRST)
        if first is not None and ts <= first + self.within:
            return False
        slot[_FIRST] = ts
        return True

    def expired(self, slot: dict[str, Any], *, watermark: int) -> bool:
        """Drop the key's kept time once no record still to come can be its duplicate; True
        when the slot is empty then."""
        first = slot.get(_FIRST)
        if first is not None and first + self.within < watermark:
            del slot[_FIRST]
        return not slot


def _late(op: str, ts: int, origin: int) -> LateRecord:
    return LateRecord(
        f"drop_duplicates {op!r}: event time {format_watermark(ts)} is behind the watermark "
        f"{format_watermark(origin)}, so the record it might duplicate may have left the "
        "state; raise max_out_of_orderness of the source to keep such records"
    )


def _keep_key(
    state: OperatorState, key: Any, scope: str, owner: str, operator: str, record: Any
) -> None:
    """Refuse, as that record's failure, a key the state cannot keep."""
    try:
        state.codec.check(key, what=f"the key of split {scope!r}", operator=operator)
    except StateTypeError as exc:
        raise UserFunctionError(
            f"{owner}: the key {key!r:.100} of record {record!r:.200} cannot be kept: {exc}"
        ) from None


class DropDuplicates(Operator):
    """The deduplication operator (`KeyedStream.drop_duplicates` adds it)."""

    kind = "drop_duplicates"
    stateful = True

    def __init__(
        self,
        dedup: Dedup,
        key: Callable[[Any], Any],
        time_of: Callable[[Any], Any],
        *,
        field: str | None = None,
        on_late: str = "drop",
        name: str = "",
        scope: str = "split",
    ) -> None:
        super().__init__(name=name, scope=scope)
        self.dedup = dedup
        self.key = key
        self.time_of = time_of
        self.field = field
        self.on_late = on_late

    @property
    def timed(self) -> bool:
        return True

    def user_functions(self) -> tuple[Any, ...]:
        return (self.key, self.time_of)

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        assert state is not None and time is not None and origins is not None
        keyed = self.scope == "key"
        floor = state.lists.setdefault(FIRED_WATERMARK, [MIN_WATERMARK]) if keyed else None
        if floor is not None and time.start_of(KEY_SCOPE) < floor[0]:
            time.start[KEY_SCOPE] = floor[0]
        owner = f"drop_duplicates {self.name!r}"
        judge = Lateness(
            owner,
            self.time_of,
            self.field,
            self.on_late,
            lambda ts, origin: _late(self.name, ts, origin),
        )
        out: list[Chunk] = []
        out_origins: list[int] = []
        seen: dict[str, int] = {}
        for (split, data), origin in zip(chunks, origins, strict=True):
            scope = self.scope_of(split)
            origin = max(origin, time.start_of(scope))
            slots = state.keyed.setdefault(scope, {})
            rows = records_of(data)
            base = seen.get(split, 0)
            seen[split] = base + len(rows)
            kept = []
            for i, record, ts in judge.on_time(
                rows, split=split, base=base, origin=origin, dead=dead_letters, time=time,
                operator=self.name,
            ):  # fmt: skip
                try:
                    key = read_key(self.key, record, owner)
                    slot = slots.get(key)
                    if slot is None:
                        _keep_key(state, key, scope, owner, self.name, record)
                except UserFunctionError as exc:
                    if dead_letters is None:
                        raised_on(exc, split)
                        raise
                    dead_letters.add(self.name, split, base + i, record, exc)
                    continue
                if slot is None:
                    slot = slots[key] = {}
                if self.dedup.through(slot, ts):
                    kept.append(record)
            if kept:
                out.append((split, kept))
                out_origins.append(origin)
        for scope in list(state.keyed):
            watermark = time.end.get(scope)
            if watermark is None:
                continue
            if floor is not None:
                watermark = max(watermark, floor[0])
            slots = state.keyed[scope]
            for key in [
                k for k, slot in slots.items() if self.dedup.expired(slot, watermark=watermark)
            ]:
                del slots[key]
            if not slots:
                del state.keyed[scope]
        if floor is not None:
            floor[0] = max(floor[0], time.end.get(KEY_SCOPE, MIN_WATERMARK))
        return out, out_origins


def build_drop_duplicates(
    graph: Build,
    keyed: Keyed,
    *,
    within: Any,
    event_time: Callable[[Any], Any] | str | None,
    on_late: str,
    name: str | None,
) -> str:
    """Add deduplication of `keyed`'s records within `within` of event time
    (`KeyedStream.drop_duplicates` says what it does); its vertex id. `GraphError` naming the
    operator for any argument it cannot run with."""
    from regional.dataflow.event_time import span_ms

    what = f"drop_duplicates {name or '(unnamed)'!r}"
    graph.late_policy(what, on_late)
    try:
        within_ms = span_ms(within, "within")
    except ValueError as exc:
        raise GraphError(f"{what}: {exc}") from None
    time = graph.event_time_of(keyed.vertex_id, event_time, what)
    schema = graph.schema_of(keyed.vertex_id)
    if schema is not None and time.field is not None:
        event_time_column(schema, time.field, what)
    op = DropDuplicates(
        Dedup(within_ms=within_ms),
        keyed.key,
        time.fn,
        field=time.field,
        on_late=on_late,
        scope=graph.key_scope(keyed.vertex_id, keyed.key, name),
    )
    op.output_schema = graph.schema_of(keyed.vertex_id)  # the records it lets through
    return graph.add(op, name, (keyed.vertex_id,))
