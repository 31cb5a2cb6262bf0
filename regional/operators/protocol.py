"""The operator coordinator protocol (DESIGN §4 rule 7): driver-side objects per operator.

The checkpoint coordinator calls them at fixed points: `snapshot` / `snapshot_for_fallback` when
checkpoint Y is decided (every unit answered), `check_fallback` while deciding whether a unit's
earlier state is usable (rule 3 d), `notify_complete` once Y's metadata is durable, and
`notify_aborted` when Y is aborted. `fallback` / `reset` map a subtask index to the checkpoint
whose state that subtask restarts from (its owner; 0 = its initial state).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, runtime_checkable

from metadata.model import SubtaskState
from regional.errors import CheckpointAbortedError

__all__ = ["FallbackUnsupportedError", "OperatorCoordinator"]


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

    def notify_complete(self, checkpoint_id: int, fallback: Mapping[int, int]) -> None:
        """`checkpoint_id` is durable; the `fallback` subtasks fell back (empty: global)."""
        ...

    def notify_aborted(self, checkpoint_id: int, reset: Mapping[int, int]) -> None:
        """Checkpoint `checkpoint_id` was aborted; subtasks in `reset` restart from their owner."""
        ...
