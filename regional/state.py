"""Operator state: split-scoped keyed state (value, map) and subtask-level list state.

Keyed state is scoped by the *split* the record came from, then by key: a region restored with
another parallelism moves each split's keyed state with the split (DESIGN §4 rule 12), and a
split's state is a deterministic function of the records read from it (rule 13). List state
belongs to the subtask and is split evenly on rescale.

State is encoded by `regional.state_codec.StateCodec` (msgpack; no pickle unless the pipeline
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
regional.state_codec.StateTypeError: state 'count' of operator 'operator' holds a value of ...
>>> restored = OperatorState.from_bytes(state.to_bytes())
>>> restored.context("file-1", "alice").value_state("count").value()
1
>>> restored.context("file-2", "alice").value_state("count", 0).value()
0
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from typing import Any

from regional.state_codec import INT_RANGE, StateCodec

__all__ = ["KeyedContext", "MapState", "OperatorState", "ValueState"]

_DEFAULT_CODEC = StateCodec()
#: Values that need no check (int needs its range checked).
_FAST = frozenset({str, float, bool, bytes, type(None)})
_INT_MIN, _INT_MAX = INT_RANGE


class ValueState:
    """One value per (split, key): `value()`, `update(v)`, `clear()`."""

    def __init__(self, state: OperatorState, slot: dict[str, Any], name: str, default: Any) -> None:
        self._state = state
        self._slot = slot
        self._name = name
        self._default = default

    def value(self) -> Any:
        """The stored value, or the default given when the state was opened."""
        return self._slot.get(self._name, self._default)

    def update(self, value: Any) -> None:
        """Keep `value`; `StateTypeError` if the state's encoding cannot keep it."""
        t = type(value)
        if t not in _FAST and not (t is int and _INT_MIN <= value <= _INT_MAX):
            self._state.check(value, self._name)
        self._slot[self._name] = value

    def clear(self) -> None:
        self._slot.pop(self._name, None)


class MapState(MutableMapping[Any, Any]):
    """A dict per (split, key)."""

    def __init__(self, state: OperatorState, slot: dict[str, Any], name: str) -> None:
        self._state = state
        self._slot = slot
        self._name = name

    def _map(self) -> dict[Any, Any]:
        return self._slot.setdefault(self._name, {})

    def __getitem__(self, key: Any) -> Any:
        return self._map()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
        if type(key) not in _FAST:
            self._state.check(key, self._name, at="<key>")
        t = type(value)
        if t not in _FAST and not (t is int and _INT_MIN <= value <= _INT_MAX):
            self._state.check(value, self._name, at=f"[{key!r}]")
        self._map()[key] = value

    def __delitem__(self, key: Any) -> None:
        del self._map()[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._map())

    def __len__(self) -> int:
        return len(self._slot.get(self._name, {}))


class KeyedContext:
    """What a stateful function sees for one record: its `split_id`, its `key`, and state."""

    def __init__(self, state: OperatorState, split_id: str, key: Any) -> None:
        self.split_id = split_id
        self.key = key
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
        self._slot: dict[str, Any] = slot

    def value_state(self, name: str, default: Any = None) -> ValueState:
        """The value state `name` of the current (split, key)."""
        return ValueState(self._state, self._slot, name, default)

    def map_state(self, name: str) -> MapState:
        """The map state `name` of the current (split, key)."""
        return MapState(self._state, self._slot, name)

    def list_state(self, name: str) -> list[Any]:
        """The subtask-level list state `name` (not scoped by split or key)."""
        return self._state.lists.setdefault(name, [])


class OperatorState:
    """All state of one operator subtask: `keyed[split][key][name]` and `lists[name]`.

    `operator` (the vertex id) is named in errors; `codec` is the pipeline's
    (`Pipeline.state_codec`: its declared Struct classes, pickle or not)."""

    def __init__(
        self,
        keyed: dict[str, dict[Any, dict[str, Any]]] | None = None,
        lists: dict[str, list[Any]] | None = None,
        *,
        operator: str = "operator",
        codec: StateCodec | None = None,
    ) -> None:
        self.keyed = keyed if keyed is not None else {}
        self.lists = lists if lists is not None else {}
        self.operator = operator
        self.codec = codec if codec is not None else _DEFAULT_CODEC

    def check(self, value: Any, name: str, *, at: str = "") -> None:
        """`StateTypeError` unless state `name` can keep `value` (at `at` inside it)."""
        self.codec.check(value, what=f"state {name!r}", operator=self.operator, at=at)

    def context(self, split_id: str, key: Any) -> KeyedContext:
        """The state context of one record read from `split_id` with key `key`."""
        return KeyedContext(self, split_id, key)

    def to_bytes(self) -> bytes:
        """The snapshot of this state, encoded by its codec."""
        return self.codec.encode(self.keyed, self.lists, operator=self.operator)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        operator: str = "operator",
        codec: StateCodec | None = None,
        source: str = "a state segment",
    ) -> OperatorState:
        """Restore a snapshot taken by `to_bytes` (empty bytes: empty state); `source` (the
        state file) is named in a `StateDecodeError`."""
        codec = codec if codec is not None else _DEFAULT_CODEC
        keyed, lists = codec.decode(data, operator=operator, source=source)
        return cls(keyed, lists, operator=operator, codec=codec)
