"""The operator coordinator protocol (DESIGN §4 rule 7): driver-side objects per operator.

The checkpoint coordinator calls them at fixed points: `snapshot` / `snapshot_for_fallback` when
checkpoint Y is decided (every unit answered), `check_fallback` while deciding whether a unit's
earlier state is usable (rule 3 d), once Y's metadata is durable `notify_complete` (Y was global:
every unit fresh) or `notify_regional_complete` (some units fell back, DESIGN §4 rule 6), and
`notify_aborted` when Y is aborted. `fallback` / `reset` map a subtask index to the checkpoint
whose state that subtask restarts from (its owner; 0 = its initial state).

An abort's `reset` names every subtask of the vertex; the checkpoint coordinator hands it over as
`SubtaskOwners`, which is built in O(subtasks not at the common owner), so a coordinator that
knows the type can read it in that time too:

>>> reset = SubtaskOwners({2: 0, 0: 1, 1: 2}, default=7, others={1: 3})
>>> dict(reset), reset.default, dict(reset.others)
({2: 7, 0: 7, 1: 3}, 7, {1: 3})
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol, runtime_checkable

import msgspec

from metadata.model import SubtaskState
from regional.coordinator.decisions import Commit
from regional.errors import CheckpointAbortedError

__all__ = [
    "CommitQueue",
    "FallbackUnsupportedError",
    "OperatorCoordinator",
    "RegionalCompletion",
    "SubtaskOwners",
]


class RegionalCompletion(msgspec.Struct, frozen=True):
    """What an operator coordinator learns of a regional checkpoint Y (DESIGN §4 rule 6).

    `fallback`: this operator's subtask index -> the checkpoint whose state it restarts from
    (empty when all of this operator's subtasks were fresh); `fallback_units`: the same per
    fallback unit, over the whole job.
    """

    fallback: Mapping[int, int]
    fallback_units: Mapping[int, int]


class SubtaskOwners(Mapping[int, int]):
    """Every subtask index of a vertex -> the checkpoint it restarts from: `default` for all but
    `others` (index -> owner). `order` maps each index to its place in iteration order (the
    order of the vertex's units); read-only, and O(1) to build from those three."""

    __slots__ = ("default", "order", "others")

    def __init__(self, order: Mapping[int, int], *, default: int, others: Mapping[int, int]):
        self.order = order
        self.default = default
        self.others = others

    def __getitem__(self, index: int) -> int:
        if index not in self.order:
            raise KeyError(index)
        return self.others.get(index, self.default)

    def __iter__(self) -> Iterator[int]:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)

    def __repr__(self) -> str:
        return (
            f"SubtaskOwners({len(self.order)} subtasks, default={self.default}, "
            f"others={dict(self.others)!r})"
        )


class FallbackUnsupportedError(CheckpointAbortedError):
    """An operator coordinator cannot produce a snapshot with some subtasks fallen back."""


@runtime_checkable
class OperatorCoordinator(Protocol):
    """A driver-side coordinator of operator (vertex) `vertex_id`."""

    @property
    def vertex_id(self) -> str: ...

    def snapshot(self, checkpoint_id: int) -> bytes:
        """The coordinator's state for checkpoint `checkpoint_id` (every subtask fresh)."""
        ...

    def snapshot_for_fallback(self, checkpoint_id: int, fallback: Mapping[int, int]) -> bytes:
        """Its state for `checkpoint_id` when the subtasks in `fallback` restart from their
        owners' state. Raises `FallbackUnsupportedError` if it cannot (rule 3 e)."""
        ...

    def check_fallback(self, state: SubtaskState, owner: int) -> str | None:
        """Why `state` (a subtask's state in checkpoint `owner`) cannot be re-used now, or None."""
        ...

    def restore(self, data: bytes) -> None:
        """Reset to a snapshot taken by `snapshot` or `snapshot_for_fallback`."""
        ...

    def notify_complete(self, checkpoint_id: int) -> None:
        """Global checkpoint `checkpoint_id` is durable: every subtask was fresh."""
        ...

    def notify_regional_complete(self, checkpoint_id: int, info: RegionalCompletion) -> None:
        """Regional checkpoint `checkpoint_id` is durable: the units in `info` fell back."""
        ...

    def notify_aborted(self, checkpoint_id: int, reset: Mapping[int, int]) -> None:
        """Checkpoint `checkpoint_id` was aborted; subtasks in `reset` restart from their owner."""
        ...


@runtime_checkable
class CommitQueue(OperatorCoordinator, Protocol):
    """An operator coordinator that commits a sink's output (the commit coordinator, rule 8):
    the checkpoint coordinator queues completed checkpoints' committables and pumps commits."""

    @property
    def queued(self) -> tuple[int, ...]:
        """Identifiers queued or in flight, oldest first."""
        ...

    def checkpoint_complete(
        self,
        checkpoint_id: int,
        committables: tuple[bytes, ...],
        *,
        recommit: bool = False,
        fallback: Mapping[int, int] | None = None,
    ) -> None: ...

    def next_commit(self) -> Commit | None: ...

    def commit_succeeded(self, checkpoint_id: int) -> None: ...

    def commit_failed(self, checkpoint_id: int) -> None: ...
