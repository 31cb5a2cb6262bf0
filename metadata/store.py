"""`CompletedCheckpointStore`: the in-memory view of the completed checkpoints a job keeps.

The coordinator adds each checkpoint once its `_metadata` is durable and removes the ones the
cleaner drops; on start it is rebuilt from storage with `CompletedCheckpointStore.load`, which
skips (and reports in `damaged`) any `_metadata` that does not decode. Damaged checkpoints are
never deleted automatically (DESIGN §8).

>>> from metadata.model import CheckpointMetadata
>>> def md(cid):
...     return CheckpointMetadata(checkpoint_id=cid, job_id="j", kind="global",
...                               trigger_time_ms=cid, completion_time_ms=cid)
>>> store = CompletedCheckpointStore([md(3), md(1)])
>>> store.add(md(4))
>>> store.ids(), store.latest().checkpoint_id
((1, 3, 4), 4)
>>> store.remove(1).checkpoint_id, store.ids()
(1, (3, 4))
>>> store.get(2)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.errors.MetadataError: checkpoint 2 is not in the store ...
"""

from __future__ import annotations

import bisect
import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import msgspec

from metadata.errors import MetadataError, StorageError
from metadata.layout import metadata_path
from metadata.model import CheckpointMetadata

if TYPE_CHECKING:
    from metadata.storage import JobStorage

__all__ = ["CompletedCheckpointStore", "DamagedCheckpoint"]

log = logging.getLogger(__name__)


class DamagedCheckpoint(msgspec.Struct, frozen=True):
    """A checkpoint whose `_metadata` exists but cannot be used; `error` says why."""

    checkpoint_id: int
    path: str
    error: str


class CompletedCheckpointStore:
    """Completed checkpoints by id, ascending; `damaged` lists the ones `load` skipped."""

    def __init__(
        self,
        checkpoints: Iterable[CheckpointMetadata] = (),
        *,
        damaged: Iterable[DamagedCheckpoint] = (),
    ) -> None:
        self._by_id: dict[int, CheckpointMetadata] = {}
        self._ids: list[int] = []
        self.damaged: tuple[DamagedCheckpoint, ...] = tuple(damaged)
        for md in checkpoints:
            self.add(md)

    @classmethod
    def load(cls, storage: JobStorage) -> CompletedCheckpointStore:
        """Rebuild the store from every `chk-<id>/_metadata` of `storage`.

        A file that does not decode is skipped with a `logging.warning` and listed in `damaged`.
        """
        good: list[CheckpointMetadata] = []
        damaged: list[DamagedCheckpoint] = []
        for cid in storage.list_checkpoint_ids():
            try:
                good.append(storage.read_metadata(cid))
            except (MetadataError, StorageError) as exc:
                log.warning(
                    "skipping damaged checkpoint %d of job %s: %s", cid, storage.job_id, exc
                )
                damaged.append(DamagedCheckpoint(cid, metadata_path(cid), str(exc)))
        return cls(good, damaged=damaged)

    def add(self, md: CheckpointMetadata) -> None:
        """Add a completed checkpoint; its id must not be in the store yet."""
        cid = md.checkpoint_id
        if cid in self._by_id:
            raise MetadataError(
                f"checkpoint {cid} is already in the store; a checkpoint id completes once"
            )
        self._by_id[cid] = md
        bisect.insort(self._ids, cid)

    def remove(self, checkpoint_id: int) -> CheckpointMetadata:
        """Remove and return a checkpoint (e.g. after the cleaner dropped it)."""
        md = self.get(checkpoint_id)
        del self._by_id[checkpoint_id]
        self._ids.remove(checkpoint_id)
        return md

    def get(self, checkpoint_id: int) -> CheckpointMetadata:
        """The checkpoint with this id; `MetadataError` naming the ids held if absent."""
        try:
            return self._by_id[checkpoint_id]
        except KeyError:
            held = ", ".join(map(str, self._ids)) or "none"
            raise MetadataError(
                f"checkpoint {checkpoint_id} is not in the store (completed checkpoints: {held})"
            ) from None

    def latest(self) -> CheckpointMetadata | None:
        """The newest completed checkpoint, or None when there is none."""
        return self._by_id[self._ids[-1]] if self._ids else None

    def all(self) -> tuple[CheckpointMetadata, ...]:
        """Every checkpoint, ascending by id."""
        return tuple(self._by_id[i] for i in self._ids)

    def ids(self) -> tuple[int, ...]:
        """Every checkpoint id, ascending."""
        return tuple(self._ids)

    def __contains__(self, checkpoint_id: object) -> bool:
        return checkpoint_id in self._by_id

    def __len__(self) -> int:
        return len(self._ids)

    def __iter__(self) -> Iterator[CheckpointMetadata]:
        return iter(self.all())
