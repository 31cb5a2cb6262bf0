"""Operator state: split-scoped keyed state (value, map) and subtask-level list state.

Keyed state is scoped by the *split* the record came from, then by key: a region restored with
another parallelism moves each split's keyed state with the split (DESIGN §4 rule 12), and a
split's state is a deterministic function of the records read from it (rule 13). List state
belongs to the subtask and is split evenly on rescale.

State values are pickled into the subtask's snapshot, so they may be any picklable object.

>>> state = OperatorState()
>>> ctx = state.context("file-1", "alice")
>>> count = ctx.value_state("count", 0)
>>> count.update(count.value() + 1); count.value()
1
>>> ctx.map_state("pages")["home"] = 2
>>> restored = OperatorState.from_bytes(state.to_bytes())
>>> restored.context("file-1", "alice").value_state("count").value()
1
>>> restored.context("file-2", "alice").value_state("count", 0).value()
0
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator, MutableMapping
from typing import Any

__all__ = ["KeyedContext", "MapState", "OperatorState", "ValueState"]


class ValueState:
    """One value per (split, key): `value()`, `update(v)`, `clear()`."""

    def __init__(self, slot: dict[str, Any], name: str, default: Any) -> None:
        self._slot = slot
        self._name = name
        self._default = default

    def value(self) -> Any:
        """The stored value, or the default given when the state was opened."""
        return self._slot.get(self._name, self._default)

    def update(self, value: Any) -> None:
        self._slot[self._name] = value

    def clear(self) -> None:
        self._slot.pop(self._name, None)


class MapState(MutableMapping[Any, Any]):
    """A dict per (split, key)."""

    def __init__(self, slot: dict[str, Any], name: str) -> None:
        self._slot = slot
        self._name = name

    def _map(self) -> dict[Any, Any]:
        return self._slot.setdefault(self._name, {})

    def __getitem__(self, key: Any) -> Any:
        return self._map()[key]

    def __setitem__(self, key: Any, value: Any) -> None:
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
        self._slot = state.keyed.setdefault(split_id, {}).setdefault(key, {})

    def value_state(self, name: str, default: Any = None) -> ValueState:
        """The value state `name` of the current (split, key)."""
        return ValueState(self._slot, name, default)

    def map_state(self, name: str) -> MapState:
        """The map state `name` of the current (split, key)."""
        return MapState(self._slot, name)

    def list_state(self, name: str) -> list[Any]:
        """The subtask-level list state `name` (not scoped by split or key)."""
        return self._state.lists.setdefault(name, [])


class OperatorState:
    """All state of one operator subtask: `keyed[split][key][name]` and `lists[name]`."""

    def __init__(
        self,
        keyed: dict[str, dict[Any, dict[str, Any]]] | None = None,
        lists: dict[str, list[Any]] | None = None,
    ) -> None:
        self.keyed = keyed if keyed is not None else {}
        self.lists = lists if lists is not None else {}

    def context(self, split_id: str, key: Any) -> KeyedContext:
        """The state context of one record read from `split_id` with key `key`."""
        return KeyedContext(self, split_id, key)

    def to_bytes(self) -> bytes:
        """The snapshot of this state (pickle protocol 5)."""
        return pickle.dumps((self.keyed, self.lists), protocol=5)

    @classmethod
    def from_bytes(cls, data: bytes) -> OperatorState:
        """Restore a snapshot taken by `to_bytes` (empty bytes: empty state)."""
        if not data:
            return cls()
        keyed, lists = pickle.loads(data)
        return cls(keyed, lists)
