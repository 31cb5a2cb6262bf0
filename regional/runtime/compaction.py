"""Copying fallback units' live segments out of mostly-dead state files, before a checkpoint's
metadata is written (DESIGN §4 rule 16; docs/file-merging.md, "Space amplification").

`metadata.compaction.plan_compaction` decides which files; `compact` here does the I/O: it reads
the live segments of each planned file (each checked against its checksum), writes them back to
back as one new file of the completing checkpoint (`chk-<id>/compacted-<run>.state`), reads
that file back and compares it byte for byte, and returns the metadata with those handles
pointing at the copy. Any failure (an `OSError`, or a `StorageError`: a missing or corrupt
source, a failed upload) keeps the original handles and returns a warning instead: a copy is an
optimisation, never a reason to fail a checkpoint. The copy it may have left is deleted (best
effort; else the cleaner finds it: an unreferenced state file in its checkpoint's directory).

>>> import tempfile
>>> from metadata.model import CheckpointMetadata, SubtaskState
>>> storage = JobStorage(tempfile.mkdtemp(), "job")
>>> handles = storage.write_segments("chk-1/u0-a1-r.state", [b"a" * 90, b"live"])
>>> md = CheckpointMetadata(checkpoint_id=2, job_id="job", kind="regional", trigger_time_ms=0,
...     completion_time_ms=0, subtasks=(SubtaskState("op", 1, 1, 1, (handles[1],)),))
>>> done = compact(storage, md, min_live_share=0.5, run_id="r2")
>>> done.path, done.units, [h.path for s in done.metadata.subtasks for h in s.handles]
('chk-2/compacted-r2.state', (1,), ['chk-2/compacted-r2.state'])
>>> storage.read_segment(done.metadata.subtasks[0].handles[0])
b'live'
"""

from __future__ import annotations

import contextlib
import logging

import msgspec

from metadata.compaction import FileCompaction, plan_compaction, relocated
from metadata.errors import StorageError
from metadata.layout import compacted_file_path
from metadata.model import CheckpointMetadata, StateHandle
from metadata.storage import JobStorage

__all__ = ["Compacted", "compact"]

log = logging.getLogger(__name__)


class Compacted(msgspec.Struct, frozen=True):
    """What `compact` did for one checkpoint: the `metadata` to write (with the copies'
    handles), each old handle's copy (`moved`; empty when nothing was copied), the new file's
    `path`, the files copied out of (`files`), the units whose state moved, the bytes read and
    written, and a `warning` when a planned copy failed (the metadata is then unchanged)."""

    metadata: CheckpointMetadata
    moved: dict[StateHandle, StateHandle] = {}
    path: str | None = None
    files: tuple[FileCompaction, ...] = ()
    bytes_copied: int = 0
    warning: str | None = None

    @property
    def units(self) -> tuple[int, ...]:
        """The fallback units whose segments were copied, ascending."""
        return tuple(sorted({u for f in self.files for u in f.units})) if self.moved else ()


def compact(
    storage: JobStorage, md: CheckpointMetadata, *, min_live_share: float, run_id: str
) -> Compacted:
    """Copy the live segments `plan_compaction(md, min_live_share)` names into one new file of
    checkpoint `md` and return `md` pointing at the copies (see the module docstring). Never
    raises for storage trouble: it returns the unchanged metadata with a `warning`."""
    plans = plan_compaction(md, min_live_share)
    if not plans:
        return Compacted(md)
    cid = md.checkpoint_id
    rel = compacted_file_path(cid, run_id)
    handles = [h for plan in plans for h in plan.handles]
    try:
        segments = [storage.read_segment(h, checkpoint_id=cid) for h in handles]
        written = storage.write_segments(rel, segments)
        if storage.read_file(rel) != b"".join(segments):
            raise StorageError(f"{storage.describe(rel)} does not read back as written")
        for old, new in zip(handles, written, strict=True):
            if (old.length, old.checksum) != (new.length, new.checksum):
                raise StorageError(
                    f"{storage.describe(rel)}: the copy of {old.path} at {old.offset} differs"
                )
    except (OSError, StorageError) as exc:
        with contextlib.suppress(OSError, StorageError):
            storage.delete_file(rel)
        sources = ", ".join(p.path for p in plans)
        warning = (
            f"checkpoint {cid}: fallback segments of {sources} were not compacted ({exc}); "
            "the units keep re-using the old files, which stay until they recover"
        )
        log.warning("%s", warning)
        return Compacted(md, files=plans, warning=warning)
    moved = dict(zip(handles, written, strict=True))
    return Compacted(
        relocated(md, moved),
        moved,
        rel,
        plans,
        bytes_copied=sum(h.length for h in handles),
    )
