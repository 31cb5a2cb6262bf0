"""The split enumerator: the source's operator coordinator (DESIGN §4 rule 7).

It hands out splits to the subtasks of one source vertex, each split at most once at a time, and
records in which epoch each assignment happened (epoch Y = the work that checkpoint Y captures).
When a subtask restarts from its owner checkpoint X (a fallback in Y or an aborted Y), the splits
it was given after X go back to the front of the unassigned queue; its state in X knows nothing
of them. Until the next checkpoint they are kept for that subtask (another subtask with a free
slot does not take them), so a split that fails its unit every epoch stays with that unit: the
unit is the one that falls back, gets stuck and is named (DESIGN §4 rule 5), instead of the
split hopping from unit to unit and resetting every streak. Splits are static (given at
construction) or discovered while running (`discover`).

>>> e = SplitEnumerator("src", ["a", "b", "c"])
>>> e.assign(0), e.assign(1)
('a', 'b')
>>> _ = e.snapshot(1)
>>> e.assign(0)
'c'
>>> e.notify_aborted(2, {0: 1})   # subtask 0 restarts from checkpoint 1: "c" comes back
>>> e.unassigned
('c',)
>>> e.assign(1), e.assign(0)      # ... kept for subtask 0 until the next checkpoint
(None, 'c')
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from itertools import compress, repeat
from operator import gt

import msgspec

from metadata.errors import MetadataError
from metadata.format import DECODE_FAILURES
from metadata.model import SubtaskState
from regional.coordinator.operator_coordinator import RegionalCompletion, SubtaskOwners

__all__ = ["SplitEnumerator", "last_assigned"]


class _State(msgspec.Struct, array_like=True):
    epoch: int
    unassigned: list[str]
    owner: dict[str, int]  # split -> subtask index
    assigned_in: dict[str, int]  # split -> epoch of its assignment


def last_assigned(data: bytes) -> dict[int, tuple[str, ...]] | None:
    """Per subtask index, the splits a snapshot records it was given last (those of the latest
    epoch it was given any, in assignment order): what a source subtask read last once its
    splits finished, since a finished split leaves the subtask's state (DESIGN §4 rule 4) but
    not the enumerator's. None when `data` is not a split enumerator's snapshot (a commit
    coordinator's, or damaged).

    >>> e = SplitEnumerator("src", ["a", "b", "c"])
    >>> e.assign(0), e.assign(1)
    ('a', 'b')
    >>> _ = e.snapshot(1)
    >>> e.assign(0)
    'c'
    >>> last_assigned(e.snapshot(2))
    {0: ('c',), 1: ('b',)}
    """
    try:
        state = msgspec.msgpack.decode(data, type=_State)
    except DECODE_FAILURES:
        return None
    latest: dict[int, int] = {}
    for split, index in state.owner.items():
        latest[index] = max(latest.get(index, 0), state.assigned_in.get(split, 0))
    out: dict[int, list[str]] = {}
    for split, index in state.owner.items():  # in assignment order
        if state.assigned_in.get(split, 0) == latest[index]:
            out.setdefault(index, []).append(split)
    return {index: tuple(splits) for index, splits in sorted(out.items())}


class SplitEnumerator:
    """Assigns the splits of source vertex `vertex_id` to its subtasks."""

    def __init__(self, vertex_id: str, splits: Iterable[str] = ()) -> None:
        self._vertex_id = vertex_id
        self._epoch = 1  # the checkpoint the current work belongs to
        self._unassigned: deque[str] = deque()
        self._owner: dict[str, int] = {}  # split -> subtask index
        self._assigned_in: dict[str, int] = {}  # split -> epoch of its assignment
        self._by_subtask: dict[int, list[str]] = {}  # index -> splits, in assignment order
        # the latest epoch in which each subtask holding splits got one, and the same by epoch:
        # an abort's reset (`SubtaskOwners`) looks only at subtasks given splits after its
        # default owner and at its other subtasks, not at every subtask
        self._latest: dict[int, int] = {}
        self._holders: dict[int, set[int]] = {}
        #: split -> the subtask it came back from (kept for it until the next snapshot)
        self._kept: dict[str, int] = {}
        self.discover(splits)

    @property
    def vertex_id(self) -> str:
        return self._vertex_id

    @property
    def unassigned(self) -> tuple[str, ...]:
        """Splits waiting for a subtask, in the order they will be handed out."""
        return tuple(self._unassigned)

    def discover(self, splits: Iterable[str]) -> tuple[str, ...]:
        """Add newly found splits (dynamic discovery); ids already known are ignored."""
        known = set(self._unassigned) | self._owner.keys()
        new = tuple(dict.fromkeys(s for s in splits if s not in known))
        self._unassigned.extend(new)
        return new

    def assign(self, index: int) -> str | None:
        """The next unassigned split for subtask `index` (first one that came back from it,
        never one kept for another subtask), or None when there is none."""
        if not self._unassigned:
            return None
        if self._kept:
            split = next((s for s in self._unassigned if self._kept.get(s, index) == index), None)
            if split is None:
                return None
            self._unassigned.remove(split)
            self._kept.pop(split, None)
        else:
            split = self._unassigned.popleft()
        self._owner[split] = index
        self._assigned_in[split] = self._epoch
        self._by_subtask.setdefault(index, []).append(split)
        latest = self._latest.get(index)
        self._hold(index, self._epoch if latest is None else max(latest, self._epoch))
        return split

    @property
    def num_known(self) -> int:
        """How many splits it knows: handed out (still read or finished) or unassigned."""
        return len(self._owner) + len(self._unassigned)

    @property
    def owners(self) -> dict[str, int]:
        """Every handed-out split (still read or finished) and the subtask index that owns it."""
        return dict(self._owner)

    def owner_of(self, split_id: str) -> int | None:
        """The subtask index the split is assigned to, or None."""
        return self._owner.get(split_id)

    # --- operator coordinator -------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> bytes:
        self._epoch = checkpoint_id + 1
        self._kept = {}
        return self._encode({})

    def snapshot_for_fallback(self, checkpoint_id: int, fallback: Mapping[int, int]) -> bytes:
        self._epoch = checkpoint_id + 1
        self._kept = {}
        return self._encode(fallback)

    def check_fallback(self, state: SubtaskState, owner: int) -> str | None:
        for split in state.split_states:
            holder = self._owner.get(split.split_id)
            if holder != state.index or self._assigned_in[split.split_id] > owner:
                return (
                    f"split {split.split_id!r} in the state of subtask ({self._vertex_id!r}, "
                    f"{state.index}) in checkpoint {owner} is now assigned to subtask {holder}"
                )
        return None

    def restore(self, data: bytes) -> None:
        """Reload from a snapshot; `MetadataError` if it does not decode or is inconsistent.
        Split ids stay opaque here: the sources that join them into paths check them."""
        try:
            state = msgspec.msgpack.decode(data, type=_State)
        except DECODE_FAILURES as exc:
            raise MetadataError(
                f"the checkpointed snapshot of source {self._vertex_id!r}'s split enumerator "
                f"does not decode ({exc}); the checkpoint is damaged, restore another one"
            ) from None
        if stray := sorted(state.owner.keys() - state.assigned_in.keys()):
            raise MetadataError(
                f"the checkpointed snapshot of source {self._vertex_id!r}'s split enumerator "
                f"owns split {stray[0]!r} without its epoch; the checkpoint is damaged"
            )
        self._epoch = state.epoch
        self._kept = {}
        self._unassigned = deque(state.unassigned)
        self._owner = state.owner
        self._assigned_in = state.assigned_in
        self._by_subtask = {}
        for split, index in sorted(state.owner.items(), key=lambda kv: state.assigned_in[kv[0]]):
            self._by_subtask.setdefault(index, []).append(split)
        self._index_holders()

    def reassign(self, owners: Mapping[str, int]) -> None:
        """Move splits to other subtasks (a restore with another parallelism): `owners` maps a
        split to its new subtask index; splits it does not name keep theirs."""
        for split, index in owners.items():
            if split in self._owner:
                self._owner[split] = index
        self._by_subtask = {}
        for split, index in sorted(self._owner.items(), key=lambda kv: self._assigned_in[kv[0]]):
            self._by_subtask.setdefault(index, []).append(split)
        self._index_holders()

    def notify_complete(self, checkpoint_id: int) -> None:
        return None

    def notify_regional_complete(self, checkpoint_id: int, info: RegionalCompletion) -> None:
        self._reset(info.fallback)

    def notify_aborted(self, checkpoint_id: int, reset: Mapping[int, int]) -> None:
        self._reset(reset)

    # --- internals --------------------------------------------------------------------------

    def _returned(self, reset: Mapping[int, int]) -> list[tuple[str, int]]:
        """(split, index) given to a resetting subtask after its owner: subtasks in the order of
        `reset`, each one's splits in assignment order. A `SubtaskOwners` reset is read in
        O(its other subtasks + subtasks given splits after its default owner), any other in a
        scan in C; only the subtasks whose latest split came after their owner are looked at."""
        indices: Iterable[int]
        owners: Iterable[int]
        if isinstance(reset, SubtaskOwners):
            default, others, order = reset.default, reset.others, reset.order
            late = [held for epoch, held in self._holders.items() if epoch > default]
            candidates = set(others).union(*late)
            indices = sorted(filter(order.__contains__, candidates), key=order.__getitem__)
            owners = list(map(others.get, indices, repeat(default)))
        else:
            indices, owners = reset.keys(), reset.values()
        # only subtasks given a split after their owner return any (a scan in C)
        later = map(gt, map(self._latest.get, indices, repeat(0)), owners)
        items = compress(zip(indices, owners, strict=True), later)
        out = []
        epoch, by_subtask = self._assigned_in, self._by_subtask
        for index, owner in items:
            for split in by_subtask.get(index, ()):
                if epoch[split] > owner:
                    out.append((split, index))
        return out

    def _reset(self, reset: Mapping[int, int]) -> None:
        returned = self._returned(reset)
        for split, index in returned:
            del self._owner[split]
            del self._assigned_in[split]
            self._by_subtask[index].remove(split)
        for index in {index for _, index in returned}:
            held = self._by_subtask[index]
            self._hold(index, max(map(self._assigned_in.__getitem__, held)) if held else None)
        self._unassigned.extendleft(reversed([s for s, _ in returned]))
        self._kept.update(returned)

    def _hold(self, index: int, latest: int | None) -> None:
        """Subtask `index`'s latest assignment epoch is now `latest` (None: it holds none)."""
        before = self._latest.get(index)
        if before == latest:
            return
        if before is not None:
            bucket = self._holders[before]
            bucket.discard(index)
            if not bucket:
                del self._holders[before]
        if latest is None:
            del self._latest[index]
        else:
            self._latest[index] = latest
            self._holders.setdefault(latest, set()).add(index)

    def _index_holders(self) -> None:
        """Rebuild `_latest` and `_holders` from `_by_subtask` (after a restore or reassign)."""
        epoch = self._assigned_in
        self._latest = {
            i: max(map(epoch.__getitem__, held)) for i, held in self._by_subtask.items() if held
        }
        self._holders = {}
        for index, latest in self._latest.items():
            self._holders.setdefault(latest, set()).add(index)

    def _encode(self, fallback: Mapping[int, int]) -> bytes:
        returned = [s for s, _ in self._returned(fallback)]
        owner, assigned_in = self._owner, self._assigned_in
        if returned:
            owner, assigned_in = dict(owner), dict(assigned_in)
            for split in returned:
                del owner[split], assigned_in[split]
        unassigned = returned + list(self._unassigned)
        return msgspec.msgpack.encode(_State(self._epoch, unassigned, owner, assigned_in))
