"""State that stays hot between epochs: decoded operator state kept in the worker process.

A unit's epoch restores its operator state, mutates it, snapshots it (the bytes go to
checkpoint storage) and, in a long-lived Python worker (Spark's `spark.python.worker.reuse`,
its default), could hand the same decoded state to the unit's next epoch instead of decoding
the bytes again. `HotStateCache` keeps such states, keyed by the **exact state** they encode:
the job (root and id), the operator vertex and the state handles of the uploaded, verified
snapshot (`metadata.model.StateHandle`: path, offset, length, size and the BLAKE2b checksum of
the bytes). `HotStates`, a `regional.dataflow.state_provider.StateProvider`, uses an entry only
when the coordinator names exactly those handles for the subtask this epoch; anything else (a
fallback to older state, a rescaled or compacted handle, another worker's unit) is a miss that
decodes the bytes. The rules that keep it exact:

* **taking is removing**: the epoch mutates the state in place, so a failed epoch (a decline,
  a timeout, a failure in a pass) never leaves a spoiled entry; its next restore misses;
* **kept only once acked**: a unit's post-snapshot states go in (`HotStates.keep`) only under
  the handles of its ack, after its upload was read back and verified and its sink files made
  durable;
* **the same codec**: an entry decoded with other declared state types is a miss; a hit is the
  state `Operator.restore` would give (a fresh `OperatorState` over the same values), for
  operators that restore and snapshot as `Operator` does (any other always decodes);
* **bounded**: an LRU whose entries are counted at their snapshot's size, within
  `budget_bytes` (decoded Python objects take several times that).

Counts of hits and misses go to each ack (`Ack.state_hits`, `Ack.state_misses`; a subtask with
no state to restore is neither; with hot state off both are 0).
"""

from __future__ import annotations

import dataclasses
import threading
from collections import OrderedDict

from metadata.model import StateHandle, SubtaskState
from regional.dataflow.operators import Operator
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import HEADER_MSGPACK_TTL, StateCodec
from regional.dataflow.state_provider import FromBytes, StateBytes, StateProvider

__all__ = [
    "DEFAULT_HOT_STATE_BYTES",
    "HotState",
    "HotStateCache",
    "HotStates",
    "process_cache",
    "restores_as_operator",
]

#: The default budget of a worker's hot state: 64 MiB of snapshots.
DEFAULT_HOT_STATE_BYTES = 64 * 2**20

#: (checkpoint root, job id, vertex id, the subtask's state handles)
HotKey = tuple[str, str, str, tuple[StateHandle, ...]]


@dataclasses.dataclass(frozen=True)
class HotState:
    """One operator subtask's decoded state as its snapshot left it: `size` is the snapshot's
    length in bytes, `ttl_seen` what decoding the snapshot would say (TTL'd entries remain, or
    the state is pickled), `codec` the codec it was encoded with."""

    state: OperatorState
    size: int
    ttl_seen: bool
    codec: StateCodec

    @classmethod
    def of(cls, state: OperatorState, blob: bytes) -> HotState:
        """The hot state of `state`, whose snapshot is `blob` (`OperatorState.from_bytes`)."""
        ttl_seen = state.codec.pickled is not None or blob[:5] == HEADER_MSGPACK_TTL
        return cls(state, len(blob), ttl_seen, state.codec)

    def restored(self, operator: Operator, codec: StateCodec) -> OperatorState | None:
        """The state `operator.restore` would decode from the snapshot, or None when `codec`
        is not the one it was encoded with (other state types or pickling)."""
        if codec is not self.codec and (
            codec.types != self.codec.types or codec.pickled != self.codec.pickled
        ):
            return None
        kept = self.state
        return OperatorState(
            kept.keyed, kept.lists, operator=operator.name, codec=codec, ttl_seen=self.ttl_seen
        )


class HotStateCache:
    """An LRU of `HotState`s by exact state (`HotKey`) whose sizes add up to at most
    `budget_bytes`; thread-safe. `take` removes the entry it returns."""

    def __init__(self, budget_bytes: int = DEFAULT_HOT_STATE_BYTES) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[HotKey, HotState] = OrderedDict()
        self._budget = budget_bytes
        self.size = 0  # the sizes of the entries, added up

    @property
    def budget_bytes(self) -> int:
        return self._budget

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: HotKey) -> bool:
        return key in self._entries

    def resize(self, budget_bytes: int) -> None:
        """Set the budget, evicting the least recently kept entries beyond it."""
        with self._lock:
            self._budget = budget_bytes
            self._evict()

    def take(self, key: HotKey) -> HotState | None:
        """The entry of `key`, removed from the cache (the caller mutates it), or None."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is not None:
                self.size -= entry.size
            return entry

    def put(self, key: HotKey, entry: HotState) -> None:
        """Keep `entry` under `key` as the most recent; an entry larger than the whole budget
        is not kept."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self.size -= old.size
            if entry.size > self._budget:
                return
            self._entries[key] = entry
            self.size += entry.size
            self._evict()

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self.size = 0

    def _evict(self) -> None:
        while self.size > self._budget and self._entries:
            _, entry = self._entries.popitem(last=False)
            self.size -= entry.size


_PROCESS_CACHE = HotStateCache()


def process_cache(budget_bytes: int) -> HotStateCache:
    """This worker process's cache (it outlives tasks when Spark reuses the worker), with
    `budget_bytes` as its budget."""
    if _PROCESS_CACHE.budget_bytes != budget_bytes:
        _PROCESS_CACHE.resize(budget_bytes)
    return _PROCESS_CACHE


def restores_as_operator(operator: Operator) -> bool:
    """Whether `operator` restores and snapshots as `Operator` does (its state is the
    `OperatorState` its bytes decode to, and its snapshot encodes that state)."""
    kind = type(operator)
    return kind.restore is Operator.restore and kind.snapshot is Operator.snapshot


class HotStates(StateProvider):
    """The hot provider of one task: a subtask's state from `cache` when the coordinator
    names exactly the handles it was kept under (for the job at `root`/`job_id`), else
    decoded from the bytes `read` gives. Remembers, per subtask (vertex, index), whether its
    last restore was a hit (`outcomes`)."""

    def __init__(self, cache: HotStateCache, root: str, job_id: str, read: StateBytes) -> None:
        self.cache = cache
        self.root = root
        self.job_id = job_id
        self._bytes = FromBytes(read)
        #: per subtask: True if its last restore was hot, False if it decoded bytes
        self.outcomes: dict[tuple[str, int], bool] = {}

    def key(self, subtask: SubtaskState) -> HotKey:
        return (self.root, self.job_id, subtask.vertex_id, subtask.handles)

    def restore(
        self, operator: Operator, subtask: SubtaskState, codec: StateCodec
    ) -> OperatorState | None:
        if not operator.stateful or not subtask.handles:  # nothing to decode
            self.outcomes.pop((subtask.vertex_id, subtask.index), None)
            return self._bytes.restore(operator, subtask, codec)
        entry = self.cache.take(self.key(subtask))
        state = None
        if entry is not None and restores_as_operator(operator):
            state = entry.restored(operator, codec)
        hit = state is not None
        self.outcomes[subtask.vertex_id, subtask.index] = hit
        return state if hit else self._bytes.restore(operator, subtask, codec)

    def counts(self, restored: tuple[SubtaskState, ...]) -> tuple[int, int]:
        """(hits, misses) of the last restores of the subtasks `restored` (one unit's)."""
        hits = misses = 0
        for s in restored:
            outcome = self.outcomes.get((s.vertex_id, s.index))
            if outcome is not None:
                hits += outcome
                misses += not outcome
        return hits, misses

    def keep(self, acked: tuple[SubtaskState, ...], states: dict[str, HotState]) -> None:
        """Keep a unit's post-snapshot `states` (by vertex id) under the handles of its ack's
        subtask states `acked` (uploaded and verified)."""
        for s in acked:
            entry = states.get(s.vertex_id)
            if entry is not None and s.handles:
                self.cache.put(self.key(s), entry)
