"""Operator state: keyed state (value, map) and subtask-level list state.

On a forward chain keyed state is scoped by the *split* the record came from, then by key: a
region restored with another parallelism moves each split's keyed state with the split (DESIGN
§4 rule 12), and a split's state is a deterministic function of the records read from it (rule
13). After a durable keyed exchange (`regional.dataflow.exchange`) it is scoped by key alone (split
id
`KEY_SCOPE`): every record of a key reaches one subtask, and a restore with another parallelism
moves each key to the subtask its hash names (`regional.runtime.rescale.redistribute_keys`). List
state
belongs to the subtask and is split evenly on rescale.

State is encoded by `regional.dataflow.state_codec.StateCodec` (msgpack; no pickle unless the
pipeline
opts in), so it holds int (64 bits), float, str, bytes, bool, None, list, dict, tuple, set,
frozenset, datetime, date, time, Decimal and declared msgspec Structs. `ValueState.update`,
`MapState[k] = v` and a new key are checked at once (`StateTypeError` names the operator, the
state, the type and where it sits); list state and values changed in place at the snapshot.

>>> state = OperatorState()
>>> ctx = state.context("file-1", "alice")
>>> count = ctx.value_state("count", 0)
>>> count.update(count.value() + 1); count.value()
1
>>> ctx.map_state("pages")["home"] = 2
>>> count.update(object())
Traceback (most recent call last):
...
regional.dataflow.state_codec.StateTypeError: state 'count' of operator 'operator' holds ...
>>> restored = OperatorState.from_bytes(state.to_bytes())
>>> restored.context("file-1", "alice").value_state("count").value()
1
>>> restored.context("file-2", "alice").value_state("count", 0).value()
0

**Finished splits.** `retain_splits` drops the keyed state of every split its unit's sources no
longer read; the task calls it at every snapshot, so a split's keyed state leaves with the
snapshot of the checkpoint in which the split finished (and stays in every earlier one).

**TTL.** `value_state(name, default, ttl=...)` and `map_state(name, ttl=...)` (a `timedelta` or
seconds) keep the processing time of each update next to the value; an entry not updated for
`ttl` reads as absent and is dropped at the snapshot. The update time and the ttl live in the
same slot under the tuple key ``(name, "ttl")`` (state names are str, so it never collides);
the snapshot format is unchanged. The clock is `OperatorState(clock=...)` (ms; tests fake it).

>>> now = [0]
>>> state = OperatorState(clock=lambda: now[0])
>>> seen = state.context("file-1", "bob").value_state("seen", False, ttl=60)
>>> seen.update(True); now[0] = 59_999; seen.value()
True
>>> now[0] = 60_000; seen.value()
False
>>> len(OperatorState.from_bytes(state.to_bytes()).keyed)  # expired: dropped at the snapshot
0
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable, Collection, Iterator, MutableMapping
from typing import Any

from regional.dataflow.state_codec import HEADER_MSGPACK_TTL, INT_RANGE, StateCodec

__all__ = [
    "KEY_SCOPE",
    "TTL",
    "KeyedContext",
    "MapState",
    "OperatorState",
    "ValueState",
    "ttl_ms",
]

#: The second item of the slot key under which a TTL'd state keeps its update times.
TTL = "ttl"
#: The split id under which key-scoped state lives (an operator after a keyed exchange keeps
#: state per key across every split: `keyed[KEY_SCOPE][key]`).
KEY_SCOPE = ""

_DEFAULT_CODEC = StateCodec()
#: Values that need no check (int needs its range checked).
_FAST = frozenset({str, float, bool, bytes, type(None)})
_INT_MIN, _INT_MAX = INT_RANGE


def ttl_ms(ttl: dt.timedelta | float | None, name: str) -> int | None:
    """A state's time to live in milliseconds (None: forever); `ValueError` naming the state
    unless it is a positive `timedelta` or number of seconds.

    >>> ttl_ms(dt.timedelta(hours=1), "seen"), ttl_ms(0.5, "seen"), ttl_ms(None, "seen")
    (3600000, 500, None)
    """
    if ttl is None:
        return None
    seconds = ttl.total_seconds() if isinstance(ttl, dt.timedelta) else ttl
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not seconds > 0:
        raise ValueError(
            f"state {name!r}: ttl={ttl!r}; give a positive datetime.timedelta or number of "
            "seconds, or leave it out to keep entries until they are cleared"
        )
    return max(1, round(seconds * 1000))


def _check(state: OperatorState, value: Any, name: str, at: str = "") -> None:
    t = type(value)
    if t not in _FAST and not (t is int and _INT_MIN <= value <= _INT_MAX):
        state.check(value, name, at=at)


class ValueState:
    """One value per (split, key): `value()`, `update(v)`, `clear()`. With `ttl` (ms), a value
    not updated for that long reads as the default."""

    __slots__ = ("_default", "_name", "_slot", "_state", "_ttl")

    def __init__(
        self,
        state: OperatorState,
        slot: dict[Any, Any],
        name: str,
        default: Any,
        ttl: int | None = None,
    ) -> None:
        self._state = state
        self._slot = slot
        self._name = name
        self._default = default
        self._ttl = ttl

    def value(self) -> Any:
        """The stored value, or the default given when the state was opened (also when the
        value expired)."""
        if self._ttl is not None:
            stamp = self._slot.get((self._name, TTL))
            if stamp is not None and self._state.clock() - stamp[0] >= self._ttl:
                return self._default
        return self._slot.get(self._name, self._default)

    def update(self, value: Any) -> None:
        """Keep `value`; `StateTypeError` if the state's encoding cannot keep it."""
        t = type(value)  # `_check`, inlined: this runs for every record of a stateful function
        if t not in _FAST and not (t is int and _INT_MIN <= value <= _INT_MAX):
            self._state.check(value, self._name)
        self._slot[self._name] = value
        if self._ttl is not None:
            self._slot[self._name, TTL] = [self._state.clock(), self._ttl]
            self._state.ttl_seen = True

    def clear(self) -> None:
        """Remove the value: `value()` reads the default again."""
        self._slot.pop(self._name, None)
        self._slot.pop((self._name, TTL), None)


class MapState(MutableMapping[Any, Any]):
    """A dict per (split, key). With `ttl` (ms), an entry not set for that long is absent."""

    def __init__(
        self, state: OperatorState, slot: dict[Any, Any], name: str, ttl: int | None = None
    ) -> None:
        self._state = state
        self._slot = slot
        self._name = name
        self._ttl = ttl

    def _map(self) -> dict[Any, Any]:
        return self._slot.setdefault(self._name, {})

    def _updated(self) -> dict[Any, int]:
        """Entry -> its update time (ms), for a map state with a ttl (made when missing)."""
        entry = self._slot.get((self._name, TTL))
        if entry is None or entry[0] != self._ttl:
            entry = self._slot[self._name, TTL] = [self._ttl, entry[1] if entry else {}]
            self._state.ttl_seen = True
        updated: dict[Any, int] = entry[1]
        return updated

    def _live(self, key: Any) -> bool:
        """False for an entry whose ttl ran out (an entry set without a ttl never expires)."""
        entry = self._slot.get((self._name, TTL))
        if self._ttl is None or entry is None or (updated := entry[1].get(key)) is None:
            return True
        return bool(self._state.clock() - updated < self._ttl)

    def __getitem__(self, key: Any) -> Any:
        value = self._map()[key]
        if not self._live(key):
            raise KeyError(key)
        return value

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(key) not in _FAST:
            self._state.check(key, self._name, at="<key>")
        _check(self._state, value, self._name, at=f"[{key!r}]")
        self._map()[key] = value
        if self._ttl is not None:
            self._updated()[key] = self._state.clock()

    def __delitem__(self, key: Any) -> None:
        live = self._live(key)
        del self._map()[key]
        if (entry := self._slot.get((self._name, TTL))) is not None:
            entry[1].pop(key, None)
        if not live:
            raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:
        return (k for k in list(self._slot.get(self._name, {})) if self._live(k))

    def __len__(self) -> int:
        if self._ttl is None:
            return len(self._slot.get(self._name, {}))
        return sum(1 for _ in self)


class _NoTimers:
    """`ctx.timers` of a `process` without `on_timer`: every use says how to get timers."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        raise TypeError(
            f"ctx.timers.{name}: this process has no timer callback; give one: "
            "keyed.process(fn, on_timer=lambda ctx, ts: ...)"
        )


_NO_TIMERS = _NoTimers()


class KeyedContext:
    """What a stateful function sees for one record: its `split_id`, its `key`, and state
    (and `timers`, in a `process(fn, on_timer=...)`: `regional.dataflow.timers`)."""

    def __init__(self, state: OperatorState, split_id: str, key: Any) -> None:
        self.split_id = split_id
        self.key = key
        self.timers: Any = _NO_TIMERS
        self._state = state
        slots = state.keyed.get(split_id)
        if slots is None:
            slots = state.keyed[split_id] = {}
        slot = slots.get(key)
        if slot is None:
            if type(key) not in _FAST:
                state.codec.check(
                    key,
                    what=f"the key of split {split_id!r}",
                    operator=state.operator,
                )
            slot = slots[key] = {}
        self._slot: dict[Any, Any] = slot
        self._opened: dict[str, ValueState] = {}  # value states without ttl, by name

    def value_state(
        self, name: str, default: Any = None, *, ttl: dt.timedelta | float | None = None
    ) -> ValueState:
        """The value state `name` of the current (split, key); with `ttl` (a `timedelta` or
        seconds of processing time) a value not updated for that long reads as `default`."""
        if ttl is None:  # the hot path: the same state object for every record of the key
            opened = self._opened.get(name)
            if opened is not None and opened._default is default and opened._ttl is None:
                return opened
            opened = self._opened[name] = ValueState(self._state, self._slot, name, default)
            return opened
        return ValueState(self._state, self._slot, name, default, ttl_ms(ttl, name))

    def map_state(self, name: str, *, ttl: dt.timedelta | float | None = None) -> MapState:
        """The map state `name` of the current (split, key); with `ttl` an entry not set for
        that long is absent."""
        return MapState(self._state, self._slot, name, ttl_ms(ttl, name))

    def list_state(self, name: str) -> list[Any]:
        """The subtask-level list state `name` (not scoped by split or key)."""
        return self._state.lists.setdefault(name, [])


class OperatorState:
    """All state of one operator subtask: `keyed[split][key][name]` and `lists[name]`.

    `operator` (the vertex id) is named in errors; `codec` is the pipeline's
    (`Pipeline.state_codec`: its declared Struct classes, pickle or not); `clock` gives the
    processing time in ms for TTL'd state (the system clock unless given)."""

    def __init__(
        self,
        keyed: dict[str, dict[Any, dict[Any, Any]]] | None = None,
        lists: dict[str, list[Any]] | None = None,
        *,
        operator: str = "operator",
        codec: StateCodec | None = None,
        clock: Callable[[], int] | None = None,
        ttl_seen: bool | None = None,
    ) -> None:
        self.keyed = keyed if keyed is not None else {}
        self.lists = lists if lists is not None else {}
        self._contexts: dict[tuple[str, Any], KeyedContext] = {}  # see `context`
        self.operator = operator
        self.codec = codec if codec is not None else _DEFAULT_CODEC
        self.clock: Callable[[], int] = clock or _system_ms
        #: some slot may hold TTL update times (then the snapshot expires entries first)
        self.ttl_seen = (
            ttl_seen
            if ttl_seen is not None
            else any(
                type(name) is tuple
                for slots in self.keyed.values()
                for s in slots.values()
                for name in s
            )
        )

    def check(self, value: Any, name: str, *, at: str = "") -> None:
        """`StateTypeError` unless state `name` can keep `value` (at `at` inside it)."""
        self.codec.check(value, what=f"state {name!r}", operator=self.operator, at=at)

    def context(self, split_id: str, key: Any) -> KeyedContext:
        """The state context of one record read from `split_id` with key `key`: the same
        object for every record of the (split, key) while its slot lives (no allocation per
        record on the hot path); a new one once the slot was dropped (a fired window, a
        finished split, expired entries)."""
        slots = self.keyed.get(split_id)
        slot = None if slots is None else slots.get(key)
        if slot is not None:
            ctx = self._contexts.get((split_id, key))
            if ctx is not None and ctx._slot is slot:
                return ctx
        ctx = self._contexts[split_id, key] = KeyedContext(self, split_id, key)
        return ctx

    def retain_splits(self, live: Collection[str]) -> int:
        """Drop the keyed state of every split not in `live` (the splits the unit's sources
        still read: the others finished, and no record of them will come again); returns how
        many splits were dropped."""
        gone = [split for split in self.keyed if split not in live]
        for split in gone:
            del self.keyed[split]
        return len(gone)

    def expire(self) -> bool:
        """Drop TTL'd entries not updated for their ttl, and slots, keys and splits left
        empty by that; True if TTL'd entries remain."""
        now = self.clock()
        remain = False
        for split in list(self.keyed):
            slots = self.keyed[split]
            for key in list(slots):
                slot = slots[key]
                for ttl_key in [k for k in slot if type(k) is tuple and k[1:] == (TTL,)]:
                    name = ttl_key[0]
                    a, b = slot[ttl_key]
                    if isinstance(b, dict):  # map state: [ttl, {entry: updated}]
                        entries = slot.get(name, {})
                        for entry in [e for e, t in b.items() if now - t >= a]:
                            entries.pop(entry, None)
                            del b[entry]
                        if not entries:
                            slot.pop(name, None)
                            del slot[ttl_key]
                    elif now - a >= b:  # value state: [updated, ttl]
                        slot.pop(name, None)
                        del slot[ttl_key]
                    remain = remain or ttl_key in slot
                if not slot:
                    del slots[key]
            if not slots:
                del self.keyed[split]
        return remain

    def to_bytes(self) -> bytes:
        """The snapshot of this state (expired TTL'd entries dropped), encoded by its codec."""
        ttl = self.ttl_seen and self.expire()
        return self.codec.encode(self.keyed, self.lists, operator=self.operator, ttl=ttl)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        operator: str = "operator",
        codec: StateCodec | None = None,
        source: str = "a state segment",
        clock: Callable[[], int] | None = None,
    ) -> OperatorState:
        """Restore a snapshot taken by `to_bytes` (empty bytes: empty state); `source` (the
        state file) is named in a `StateDecodeError`."""
        codec = codec if codec is not None else _DEFAULT_CODEC
        keyed, lists = codec.decode(data, operator=operator, source=source)
        ttl_seen = codec.pickled is not None or data[:5] == HEADER_MSGPACK_TTL
        return cls(keyed, lists, operator=operator, codec=codec, clock=clock, ttl_seen=ttl_seen)


def _system_ms() -> int:
    return int(time.time() * 1000)
