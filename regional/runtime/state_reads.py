"""How a task reads the operator state its units restore: segments of checkpoint storage.

`state_reader` gives an operator subtask's restored state bytes (the segments the coordinator
named for it, joined) and where they are, for errors. State files several of the task's units
restore from (a merged file of the task that ran them last epoch) are read whole once and their
segments sliced from memory (`RestoreReads`), so a task makes one read per physical file, not
one per unit (on an object store: requests scale with tasks, not regions).
"""

from __future__ import annotations

from collections.abc import Sequence

from metadata.model import StateHandle, SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import UnitWork
from regional.dataflow.state_provider import StateBytes

__all__ = ["RestoreReads", "state_reader"]


class RestoreReads:
    """The state files several units of a task restore from: each is read whole once and its
    segments sliced from memory."""

    def __init__(self, works: Sequence[UnitWork]) -> None:
        uses: dict[str, int] = {}
        for w in works:
            for s in w.restore:
                for h in s.handles:
                    uses[h.path] = uses.get(h.path, 0) + 1
        self._shared = {path for path, n in uses.items() if n > 1}
        self._files: dict[str, bytes] = {}

    def cache_for(self, handle: StateHandle) -> dict[str, bytes] | None:
        """The whole-file cache to read `handle` through, or None to read its segment alone."""
        return self._files if handle.path in self._shared else None


def state_reader(storage: JobStorage, reads: RestoreReads | None) -> StateBytes:
    """An operator subtask's restored state bytes and where they are (for errors), read
    through the task's whole-file cache (`reads`) where several units share a file."""

    def state_of(subtask: SubtaskState) -> tuple[bytes, str]:
        data = b"".join(
            storage.read_segment(h, whole_files=reads.cache_for(h))
            if reads is not None
            else storage.read_segment(h)
            for h in subtask.handles
        )
        return data, ", ".join(storage.describe(h.path) for h in subtask.handles)

    return state_of
