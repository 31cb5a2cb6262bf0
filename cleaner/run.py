"""The cleaner's imperative shell: scan a job root into a `RetentionPlan`, then carry it out.

`scan` reads what storage holds (metadata first, then the listing, so that a checkpoint that
completes in between shows up as an unknown `_metadata` and is kept). `execute` deletes the
plan's files through the storage's `delete_file`:

* in the plan's phases (metadata of dropped checkpoints, then their files oldest first, then
  orphaned shared files), each phase finished before the next starts, with at most
  `max_workers` deletions in flight (object stores like concurrency, but bounded);
* only the planned paths, one file at a time: never a directory or a prefix, so a file
  written after the listing is never touched;
* confined to the job root: a path that `metadata.layout.check_relative` rejects, or that the
  storage refuses because it leads out of the root through a symbolic link
  (`OutsideRootError`), is reported as `refused` and never deleted;
* idempotently: a file that is already gone counts as success, so re-running a plan, or
  re-planning after a crash mid-run, finishes the job;
* never racing a checkpoint in progress: `live()` is asked for the pending checkpoints before
  every phase, and files under their directories or named by them are skipped.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Protocol

import msgspec

from cleaner.plan import (
    FileDecision,
    PendingFiles,
    RestoreBase,
    RetentionInputError,
    RetentionPlan,
    StoredFile,
    plan_retention,
)
from metadata.errors import MetadataError, OutsideRootError, StorageError
from metadata.layout import DEFAULT_RETAINED_EVENTS, check_relative, checkpoint_id_of
from metadata.model import CheckpointMetadata

__all__ = [
    "CleanProgress",
    "CleanReport",
    "Deleter",
    "DeletionOutcome",
    "DeletionStatus",
    "JobReader",
    "PlannedDeletions",
    "RootListing",
    "execute",
    "plan_root",
    "read_root",
    "scan",
]


class PlannedDeletions(Protocol):
    """What `execute` carries out: a full `RetentionPlan`, or an incremental step
    (`cleaner.incremental.CleaningStep`), with its deletions in deletion order."""

    @property
    def deletions(self) -> tuple[FileDecision, ...]: ...


class Deleter(Protocol):
    """What `execute` needs of storage (`metadata.storage.JobStorage` fits): delete one file,
    given relative to the job root; False if it was already gone; StorageError if refused."""

    def delete_file(self, relpath: str) -> bool: ...


class JobReader(Deleter, Protocol):
    """What `scan` needs of storage (`metadata.storage.JobStorage` fits)."""

    def list_files(self) -> Sequence[StoredFile]: ...

    def list_checkpoint_ids(self) -> Sequence[int]: ...

    def read_metadata(self, checkpoint_id: int) -> CheckpointMetadata: ...


class DeletionStatus(enum.StrEnum):
    """What happened to one planned deletion."""

    DELETED = "deleted"
    ALREADY_GONE = "already-gone"
    SKIPPED_LIVE = "skipped-live"  # under a checkpoint in progress at run time
    REFUSED = "refused"  # resolves outside the job root
    FAILED = "failed"  # the storage raised; the next run retries


class DeletionOutcome(msgspec.Struct, frozen=True):
    """The outcome of one planned deletion, with the error text for refused/failed ones."""

    path: str
    size: int
    status: DeletionStatus
    detail: str = ""


class CleanProgress(msgspec.Struct, frozen=True):
    """Reported after every deletion: `done` of `total`, bytes freed so far, the last outcome."""

    done: int
    total: int
    deleted_bytes: int
    last: DeletionOutcome


class CleanReport(msgspec.Struct, frozen=True):
    """Every outcome, in completion order. `ok` is False if anything was refused or failed."""

    outcomes: tuple[DeletionOutcome, ...]

    @property
    def deleted_bytes(self) -> int:
        """Bytes freed by this run (files this run deleted)."""
        return sum(o.size for o in self.outcomes if o.status is DeletionStatus.DELETED)

    @property
    def ok(self) -> bool:
        """True when nothing was refused or failed (skipped live files are not failures)."""
        bad = (DeletionStatus.REFUSED, DeletionStatus.FAILED)
        return not any(o.status in bad for o in self.outcomes)

    def count(self, status: DeletionStatus) -> int:
        """How many deletions ended with `status`."""
        return sum(1 for o in self.outcomes if o.status is status)


class RootListing(msgspec.Struct, frozen=True):
    """What a full scan read: the metadata that decoded, the ids whose metadata did not
    (`damaged`), and the listing of the job root."""

    completed: tuple[CheckpointMetadata, ...]
    damaged: tuple[int, ...]
    files: tuple[StoredFile, ...]


def read_root(storage: JobReader, *, pending: Sequence[PendingFiles] = ()) -> RootListing:
    """Read every checkpoint's metadata (pending ones are skipped, damaged ones reported), then
    list the job root: a checkpoint completing in between shows up as an unknown `_metadata`
    and is kept."""
    pending_ids = {p.checkpoint_id for p in pending}
    completed: list[CheckpointMetadata] = []
    damaged: list[int] = []
    for cid in storage.list_checkpoint_ids():
        if cid in pending_ids:
            continue
        try:
            completed.append(storage.read_metadata(cid))
        except (MetadataError, OutsideRootError):  # a `_metadata` linked out of the root too
            damaged.append(cid)
    return RootListing(tuple(completed), tuple(damaged), tuple(storage.list_files()))


def scan(
    storage: JobReader,
    *,
    num_retained: int,
    pending: Sequence[PendingFiles] = (),
    restore_base: RestoreBase | None = None,
    live_unknown: bool = False,
    num_retained_events: int = DEFAULT_RETAINED_EVENTS,
) -> RetentionPlan:
    """Read every checkpoint's metadata (damaged ones are reported, never deleted), list the job
    root (`read_root`), and plan retention (`cleaner.plan.plan_retention`, with the kept state
    files' live / physical bytes). Pending checkpoints are not read. Listing comes after
    reading, so a checkpoint completing in between is kept."""
    return plan_root(
        read_root(storage, pending=pending),
        num_retained=num_retained,
        pending=pending,
        restore_base=restore_base,
        live_unknown=live_unknown,
        num_retained_events=num_retained_events,
        liveness_totals=True,
    )


def plan_root(
    root: RootListing,
    *,
    num_retained: int,
    pending: Sequence[PendingFiles] = (),
    restore_base: RestoreBase | None = None,
    live_unknown: bool = False,
    num_retained_events: int = DEFAULT_RETAINED_EVENTS,
    liveness_totals: bool = False,
) -> RetentionPlan:
    """`plan_retention` over what `read_root` read."""
    return plan_retention(
        root.completed,
        root.files,
        num_retained=num_retained,
        pending=pending,
        damaged=root.damaged,
        restore_base=restore_base,
        live_unknown=live_unknown,
        num_retained_events=num_retained_events,
        liveness_totals=liveness_totals,
    )


def _live_guard(live: Iterable[PendingFiles]) -> Callable[[str], str | None]:
    snapshot = tuple(live)
    ids = {p.checkpoint_id for p in snapshot}
    files = {f for p in snapshot for f in p.files}

    def why(path: str) -> str | None:
        cid = checkpoint_id_of(path)
        if cid is not None and cid in ids:
            return f"checkpoint {cid} is in progress; not deleted"
        if path in files:
            return "named by a checkpoint in progress; not deleted"
        return None

    return why


def _delete_one(storage: Deleter, d: FileDecision) -> DeletionOutcome:
    try:
        norm = check_relative(d.path)
        if norm != d.path:
            raise StorageError(
                f"path {d.path!r} is not in normal form ({norm!r}); refusing to delete it"
            )
    except StorageError as exc:
        return DeletionOutcome(d.path, d.size, DeletionStatus.REFUSED, str(exc))
    try:
        gone_before = not storage.delete_file(d.path)
    except OutsideRootError as exc:  # through a symbolic link out of the root: never
        return DeletionOutcome(d.path, d.size, DeletionStatus.REFUSED, str(exc))
    except Exception as exc:  # the storage refused or failed: report it, retry next run
        detail = f"{type(exc).__name__}: {exc}; re-run `regional clean` to retry"
        return DeletionOutcome(d.path, d.size, DeletionStatus.FAILED, detail)
    status = DeletionStatus.ALREADY_GONE if gone_before else DeletionStatus.DELETED
    return DeletionOutcome(d.path, d.size, status)


def execute(
    plan: PlannedDeletions,
    storage: Deleter,
    *,
    live: Callable[[], Iterable[PendingFiles]] | None = None,
    max_workers: int = 8,
    progress: Callable[[CleanProgress], None] | None = None,
) -> CleanReport:
    """Delete the plan's files (see the module docstring for the guarantees).

    `live` returns the checkpoints in progress *now* (the coordinator's pending set); it is
    called before each phase. `progress` is called from the calling thread after each
    deletion. Exceptions that are not `Exception`s (e.g. KeyboardInterrupt) stop the run
    (deletions not started are dropped); re-planning afterwards finishes it.
    """
    if max_workers < 1:
        raise RetentionInputError(
            f"max-workers must be at least 1 (got {max_workers}): it bounds the deletions in flight"
        )
    deletions = plan.deletions
    total = len(deletions)
    outcomes: list[DeletionOutcome] = []
    freed = 0
    phases = sorted({d.phase for d in deletions if d.phase is not None})
    pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="regional-clean")
    try:
        for phase in phases:
            guard = _live_guard(live() if live is not None else ())
            futures = []
            for d in deletions:
                if d.phase != phase:
                    continue
                reason = guard(d.path)
                if reason is not None:
                    outcome = DeletionOutcome(d.path, d.size, DeletionStatus.SKIPPED_LIVE, reason)
                    outcomes.append(outcome)
                    if progress is not None:
                        progress(CleanProgress(len(outcomes), total, freed, outcome))
                    continue
                futures.append(pool.submit(_delete_one, storage, d))
            for fut in as_completed(futures):
                outcome = fut.result()
                outcomes.append(outcome)
                if outcome.status is DeletionStatus.DELETED:
                    freed += outcome.size
                if progress is not None:
                    progress(CleanProgress(len(outcomes), total, freed, outcome))
    finally:  # on an interrupt, deletions not started yet are dropped, not run
        pool.shutdown(wait=True, cancel_futures=True)
    return CleanReport(tuple(outcomes))
