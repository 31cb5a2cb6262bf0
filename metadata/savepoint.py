"""Savepoints and restore sources: self-contained copies of a checkpoint, and opening any
checkpoint or savepoint by its path (DESIGN §5).

A savepoint lives in `<job root>/savepoints/sp-<id>/`: its `_metadata` and every state file it
references, with paths relative to that directory. So the directory can be moved or copied
anywhere (another disk, another bucket) and still be restored. The cleaner never deletes it.

`open_checkpoint(path)` accepts a savepoint directory, a `chk-<id>` directory (its state paths
are relative to its job root, the parent directory, so it must stay inside it), or the
`_metadata` file of either; a local path or a `pyarrow.fs` URI. It checks that every referenced
file exists with its recorded size; checksums are verified when the state is read.

>>> import tempfile
>>> from metadata.model import CheckpointMetadata, SubtaskState
>>> storage = JobStorage(tempfile.mkdtemp(), "job")
>>> [h] = storage.write_segments("chk-3/u0-a1.state", [b"state"])
>>> md = CheckpointMetadata(checkpoint_id=3, job_id="job", kind="savepoint", trigger_time_ms=0,
...     completion_time_ms=0, subtasks=(SubtaskState("op", 0, 0, handles=(h,)),))
>>> where = write_savepoint(storage, md)
>>> where.endswith("job/savepoints/sp-3")
True
>>> source = open_checkpoint(where)
>>> source.metadata.subtasks[0].handles[0].path, source.storage.read_segment(
...     source.metadata.subtasks[0].handles[0])
('u0-a1.state', b'state')
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable

import msgspec

from metadata.errors import MetadataError, StorageError
from metadata.layout import METADATA_NAME, SAVEPOINTS_DIR, checkpoint_dir
from metadata.model import CheckpointKind, CheckpointMetadata, StateHandle
from metadata.storage import JobStorage, _redact, links_of, reference_problems, resolve_root

__all__ = [
    "CheckpointPathError",
    "CheckpointSource",
    "open_checkpoint",
    "savepoint_storage",
    "write_savepoint",
]


class CheckpointPathError(StorageError):
    """The path to restore from holds no usable checkpoint or savepoint (bad input: exit 2)."""

    exit_code = 2


class CheckpointSource(msgspec.Struct, frozen=True):
    """A checkpoint or savepoint opened by path: its directory (`location`), and `storage`
    rooted where its state paths are relative to (the savepoint directory, or the
    checkpoint's job root)."""

    location: str
    storage: JobStorage
    metadata: CheckpointMetadata


def savepoint_storage(storage: JobStorage, savepoint_id: int) -> JobStorage:
    """The storage of `savepoints/sp-<id>/` under `storage`'s job root (paths relative to it)."""
    return JobStorage(
        f"{storage.job_path}/{SAVEPOINTS_DIR}", f"sp-{savepoint_id}", filesystem=storage.filesystem
    )


def write_savepoint(
    storage: JobStorage,
    md: CheckpointMetadata,
    *,
    before_metadata: Callable[[JobStorage], None] | None = None,
) -> str:
    """Copy savepoint `md` (every subtask fresh, state under `chk-<id>/`) into
    `savepoints/sp-<id>/` with paths relative to it, metadata last; returns its location.
    `before_metadata` copies what else the savepoint needs into its storage (the unread
    backlog of keyed exchanges) before the metadata makes it restorable.

    Every segment is read back through its checksum before it is copied.
    """
    kind = CheckpointKind(md.kind)
    if kind is not CheckpointKind.SAVEPOINT or any(s.is_fallback for s in md.subtasks):
        raise MetadataError(
            f"checkpoint {md.checkpoint_id} ({kind}) is not a savepoint with every subtask "
            "fresh; only such a checkpoint can be written as a self-contained savepoint"
        )
    target = savepoint_storage(storage, md.checkpoint_id)
    by_file: dict[str, list[StateHandle]] = {}
    for s in md.subtasks:
        for h in s.handles:
            by_file.setdefault(h.path, []).append(h)
    moved: dict[StateHandle, StateHandle] = {}
    names: set[str] = set()
    for path, handles in by_file.items():
        name = posixpath.basename(path)
        if name in names:
            raise MetadataError(
                f"savepoint {md.checkpoint_id}: two state files are named {name!r}; the "
                "savepoint directory is flat, so state file names must be unique"
            )
        names.add(name)
        unique = sorted(set(handles), key=lambda h: h.offset)
        segments = [storage.read_segment(h, checkpoint_id=md.checkpoint_id) for h in unique]
        moved.update(zip(unique, target.write_segments(name, segments), strict=True))
    subtasks = tuple(
        msgspec.structs.replace(s, handles=tuple(moved[h] for h in s.handles)) for s in md.subtasks
    )
    if before_metadata is not None:
        before_metadata(target)
    target.write_metadata(msgspec.structs.replace(md, subtasks=subtasks), at=METADATA_NAME)
    return target.describe("")


def open_checkpoint(path: str) -> CheckpointSource:
    """The checkpoint or savepoint at `path` (see the module docstring). `CheckpointPathError`
    names the path when it holds none or a referenced file is missing; `MetadataError` when
    its metadata is damaged."""
    filesystem, full = resolve_root(path)
    shown = _redact(path)
    if posixpath.basename(full) == METADATA_NAME:
        full = posixpath.dirname(full)
    parent, name = posixpath.split(full.rstrip("/"))
    holder = JobStorage(parent or "/", name, filesystem=filesystem)
    if not holder.exists(METADATA_NAME):
        raise CheckpointPathError(
            f"{shown} holds no {METADATA_NAME}; give a savepoint directory (sp-<id>), a "
            f"checkpoint directory (chk-<id>) or its {METADATA_NAME} file"
        )
    md = holder.read_metadata_at(METADATA_NAME)
    if CheckpointKind(md.kind) is CheckpointKind.SAVEPOINT:
        storage = holder
    else:
        if name != checkpoint_dir(md.checkpoint_id):
            raise CheckpointPathError(
                f"{shown} holds checkpoint {md.checkpoint_id}, but its directory is named "
                f"{name!r}; a checkpoint's state paths are relative to its job root, so restore "
                f"it from <job root>/{checkpoint_dir(md.checkpoint_id)} (or take a savepoint, "
                "which can be moved)"
            )
        grand, job = posixpath.split(parent)
        storage = JobStorage(grand or "/", job, filesystem=filesystem)
    files = storage.list_files()
    problems = reference_problems(md, {f.path: f.size for f in files}, links_of(files))
    if problems:
        listed = "; ".join(f"{p.path}: {p.problem}" for p in problems[:3])
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise CheckpointPathError(
            f"{shown} (checkpoint {md.checkpoint_id}) cannot be restored: {listed}{more}; "
            "copy the whole directory, or restore from another checkpoint"
        )
    where = "" if storage is holder else checkpoint_dir(md.checkpoint_id)
    return CheckpointSource(storage.describe(where), storage, md)
