"""The cleaner's vocabulary: what the planner takes (pending checkpoints, restore base, listed
files) and what it returns (a `RetentionPlan` of checkpoint and file decisions with reasons).

Plain frozen msgspec Structs and StrEnums, so a plan can be encoded as JSON or msgpack as is.
`cleaner.plan` re-exports everything here.
"""

from __future__ import annotations

import enum
from typing import Literal, NamedTuple, Protocol

import msgspec

from metadata.errors import RegionalError

__all__ = [
    "Action",
    "CheckpointDecision",
    "FileDecision",
    "ListedFile",
    "MissingFile",
    "PendingFiles",
    "Reason",
    "RefusedPath",
    "RestoreBase",
    "RetentionInputError",
    "RetentionPlan",
    "StoredFile",
    "deletion_order",
]


class RetentionInputError(RegionalError):
    """The planner was given inconsistent input (e.g. `num_retained` < 1)."""

    exit_code = 2


class StoredFile(Protocol):
    """What the planner needs of a listed file (`metadata.storage.FileEntry` fits): `link` is
    set for a symbolic link the listing did not follow (its target), `outside_root` when that
    target is outside the job root."""

    @property
    def path(self) -> str: ...

    @property
    def size(self) -> int: ...

    @property
    def link(self) -> str | None: ...

    @property
    def outside_root(self) -> bool: ...


class ListedFile(NamedTuple):
    """A plain listed file: `path` relative to the job root, `size` in bytes; `link` and
    `outside_root` as in `StoredFile` (a symbolic link, never followed nor deleted)."""

    path: str
    size: int
    link: str | None = None
    outside_root: bool = False


class Action(enum.StrEnum):
    """`keep`, `delete`, or for a checkpoint `keep-files`: its metadata goes, referenced files
    stay."""

    KEEP = "keep"
    KEEP_FILES = "keep-files"
    DELETE = "delete"


class Reason(enum.StrEnum):
    """Why something is kept or deleted (the `reason` column of the retention view)."""

    RETAINED = "retained"  # within num-retained (its own files)
    REFERENCED = "referenced"  # named by a kept checkpoint's fallback state
    PENDING = "pending"  # a checkpoint in progress
    DAMAGED = "damaged"  # metadata does not decode: kept for inspection
    NOT_OWNED = "not-owned"  # written by or before a no-claim restore base
    SAVEPOINT = "savepoint"  # user-owned
    UNKNOWN = "unknown"  # a shape the cleaner does not own
    SUBSUMED = "subsumed"  # a dropped checkpoint's metadata and files
    STALE_ATTEMPT = "stale-attempt"  # a unit attempt file its checkpoint does not reference
    ABORTED = "aborted"  # state of a checkpoint that never completed
    STAGED = "staged"  # another file of a failed attempt (e.g. a staged sink file)
    ORPHAN = "orphan"  # left by a crash or interrupted clean; unreferenced shared file
    EVENT_LOG = "event-log"  # one of the newest files of the event log (`events/`)
    EXPIRED_EVENT = "expired-event"  # an event file older than the newest N
    LEASE = "lease"  # the driver's lease of the job root (`_lease/`, `metadata.lease`)
    OUTSIDE_ROOT = (
        "outside-root"  # a symbolic link out of the job root, or a checkpoint holding one
    )
    LINK = "symlink"  # a link to a directory inside the root (not followed), or its checkpoint
    BACKLOG = "exchange-backlog"  # an exchange segment a kept checkpoint's reader has not read
    CONSUMED = "consumed"  # an exchange segment every kept checkpoint's reader has passed
    EXCHANGE = "exchange"  # an exchange's staged segment or commit record (its writer's)


class PendingFiles(msgspec.Struct, frozen=True):
    """A checkpoint in progress: its whole `chk-<id>/` directory is live, and so is every path
    in `files` (owner files its fallback state will reference, shared files it uploaded)."""

    checkpoint_id: int
    files: tuple[str, ...] = ()


class RestoreBase(msgspec.Struct, frozen=True):
    """The checkpoint of this job root the job was restored from, and the restore mode."""

    checkpoint_id: int
    mode: Literal["claim", "no-claim"] = "claim"


class CheckpointDecision(msgspec.Struct, frozen=True):
    """One checkpoint: kept, kept for its referenced files only, or deleted, and why.

    `referenced_by` maps to the kept checkpoints whose fallback state points at this one, and
    `units` are the fallback units concerned."""

    checkpoint_id: int
    kind: str | None
    action: Action
    reason: Reason
    detail: str
    referenced_by: tuple[int, ...] = ()
    units: tuple[int, ...] = ()
    kept_bytes: int = 0
    deleted_bytes: int = 0


class FileDecision(msgspec.Struct, frozen=True, gc=False):
    """One listed file: kept (with the kept checkpoints that reference it) or deleted.

    `phase` orders deletions: 0 metadata of dropped checkpoints, 1 other checkpoint files,
    2 orphaned shared files and expired events (None for kept files)."""

    path: str
    size: int
    action: Action
    reason: Reason
    detail: str
    checkpoint_id: int | None = None
    kept_by: tuple[int, ...] = ()
    phase: int | None = None


class RefusedPath(msgspec.Struct, frozen=True):
    """A path in a checkpoint's metadata that resolves outside the job root: never touched."""

    checkpoint_id: int
    path: str
    error: str


class MissingFile(msgspec.Struct, frozen=True):
    """A file referenced by kept checkpoints but absent from the listing."""

    path: str
    referenced_by: tuple[int, ...]


class RetentionPlan(msgspec.Struct, frozen=True):
    """The whole decision. `whole_checkpoint_bytes` is what keeping every referenced checkpoint
    whole (Flink's rule: newest N plus the transitive closure of their references) would keep.
    `live_bytes` / `physical_bytes`: of the listed state files kept checkpoints reference, the
    bytes of referenced segments and the files' sizes (`metadata.liveness`; DESIGN §4 rule 16:
    a merged file is kept whole while any segment of it is referenced)."""

    num_retained: int
    checkpoints: tuple[CheckpointDecision, ...]
    files: tuple[FileDecision, ...]
    retained_ids: tuple[int, ...]
    subsumed_ids: tuple[int, ...]
    referenced_ids: tuple[int, ...]
    refused: tuple[RefusedPath, ...] = ()
    missing: tuple[MissingFile, ...] = ()
    kept_bytes: int = 0
    deleted_bytes: int = 0
    whole_checkpoint_bytes: int = 0
    live_bytes: int = 0
    physical_bytes: int = 0

    @property
    def deletions(self) -> tuple[FileDecision, ...]:
        """The files to delete, in deletion order (phase, then oldest checkpoint, then path)."""
        dels = [f for f in self.files if f.action is Action.DELETE]
        dels.sort(key=deletion_order)
        return tuple(dels)

    @property
    def dropped_ids(self) -> tuple[int, ...]:
        """Completed checkpoints whose `_metadata` this plan deletes (subsumed or kept for
        referenced files only): remove them from the completed-checkpoint store."""
        return tuple(
            c.checkpoint_id
            for c in self.checkpoints
            if c.kind is not None and c.action is not Action.KEEP
        )

    @property
    def saved_bytes(self) -> int:
        """Bytes deleted that whole-checkpoint retention would have kept."""
        return self.whole_checkpoint_bytes - self.kept_bytes

    def checkpoint(self, checkpoint_id: int) -> CheckpointDecision:
        """The decision for one checkpoint id (KeyError naming the id if it is not in the plan)."""
        for c in self.checkpoints:
            if c.checkpoint_id == checkpoint_id:
                return c
        raise KeyError(f"checkpoint {checkpoint_id} is not in the retention plan")


def deletion_order(f: FileDecision) -> tuple[int, float, str]:
    """The sort key of deletions: phase, then oldest checkpoint (files outside `chk-<id>/`
    last), then path. Every plan, full or incremental, deletes in this order."""
    return (
        f.phase if f.phase is not None else -1,
        float("inf") if f.checkpoint_id is None else f.checkpoint_id,
        f.path,
    )
