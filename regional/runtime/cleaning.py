"""The runtime's cleaning (DESIGN §4 rule 11), off the epoch's critical path.

A driver's first clean is a full scan: it reads every `_metadata`, lists the job root and
plans with `cleaner.plan` (what `regional clean` does). It runs once the driver's first
checkpoint completed (after its restore): until then the coordinator's state may name files
that no stored metadata references (the state a restore staged under `chk-<id>/`), which a
scan would take for garbage. From then on the driver says what it wrote, and
`cleaner.incremental` plans the same deletions without listing or reading anything:
`completed` for each checkpoint's metadata, `event_written` for each event file. `clean`
(after the driver carried out an epoch's decisions) hands what is due to a
`cleaner.background.BackgroundDeleter`: the epoch goes on while a thread deletes, a bounded
queue makes a producer faster than storage wait, and the driver drains the queue when it
stops. Before each plan the worker checks the lease: a lost lease stops the worker (and the
driver, at its next `clean` or `drain`), an expired one skips the plan. A crash, a skipped
plan or a failed deletion only leaves garbage, which the next full scan (a driver's start,
`regional clean`) finds.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from cleaner.background import BackgroundDeleter, DeleterTotals
from cleaner.incremental import CleaningStep, IncrementalPlanner, merge_steps
from cleaner.model import RestoreBase
from cleaner.run import CleanProgress, plan_root, read_root
from metadata.errors import StorageError
from metadata.lease import JobLease, LeaseLostError
from metadata.model import CheckpointMetadata
from metadata.storage import JobStorage

__all__ = ["JobCleaning"]

log = logging.getLogger(__name__)


class JobCleaning:
    """Cleans `storage`'s job root for a driver holding `lease`, keeping `num_retained`
    checkpoints: a full scan first, incremental plans after (see the module docstring).
    `max_queued` plans may wait for the worker; `max_workers` deletions run at once."""

    def __init__(
        self,
        storage: JobStorage,
        lease: JobLease,
        *,
        num_retained: int,
        max_queued: int = 8,
        max_workers: int = 2,
    ) -> None:
        self.storage = storage
        self.lease = lease
        self.num_retained = num_retained
        self.deleter = BackgroundDeleter(
            storage, max_queued=max_queued, max_workers=max_workers, ready=self._lease_held
        )
        self.full_scans = 0
        self._scan_due = False  # a checkpoint completed since the start or `rescan`
        self._planner: IncrementalPlanner | None = None
        self._due: list[CleaningStep] = []

    @property
    def totals(self) -> DeleterTotals:
        """What the background worker did so far."""
        return self.deleter.totals

    def completed(self, md: CheckpointMetadata) -> None:
        """Checkpoint `md`'s metadata is durable (before the first full scan: the scan is due,
        and reads it)."""
        if self._planner is None:
            self._scan_due = True
        else:
            self._due.append(self._planner.completed(md))

    def event_written(self, path: str) -> None:
        """The driver wrote event file `path`."""
        if self._planner is not None:
            self._due.append(self._planner.event_written(path))

    def segments_published(self, paths: list[str]) -> None:
        """A commit published these keyed-exchange segments (paths relative to the job root);
        before the first full scan, that scan will list them."""
        if self._planner is not None:
            self._due.append(self._planner.segments_published(paths))

    def rescan(self) -> None:
        """Plan the next clean from a full scan again (after a restore replaced the state)."""
        self._planner = None
        self._scan_due = False
        self._due = []

    def clean(
        self,
        restore_base: RestoreBase | None,
        progress: Callable[[CleanProgress], None] | None = None,
    ) -> None:
        """Hand what is due to the worker (the first time a checkpoint completed: scan and plan
        in full). Raises `LeaseLostError`, or what stopped the worker; a full scan storage
        cannot serve now is postponed to the next call."""
        if self._planner is None:
            if self._scan_due:
                self._full_scan(restore_base, progress)
        elif self._due:
            step, self._due = merge_steps(self._due), []
            self.deleter.submit(step, progress=progress)

    def drain(self) -> None:
        """Wait until every deletion handed over is done; raises what stopped the worker."""
        self.deleter.drain()

    def close(self) -> None:
        """Drain and stop the worker (never raises; a failure stays for `drain`)."""
        self.deleter.close()

    def _full_scan(
        self, restore_base: RestoreBase | None, progress: Callable[[CleanProgress], None] | None
    ) -> None:
        try:
            self.lease.check()
            root = read_root(self.storage)
            plan = plan_root(root, num_retained=self.num_retained, restore_base=restore_base)
        except LeaseLostError:
            raise
        except StorageError as exc:
            log.warning("job %s: cleaning postponed: %s", self.storage.job_id, exc)
            return
        self.full_scans += 1
        self.deleter.submit(plan, progress=progress)
        self._planner = IncrementalPlanner.after_scan(
            plan, root.completed, restore_base=restore_base
        )

    def _lease_held(self) -> bool:
        """The worker's check before each plan: go on, skip (lease expired), or stop (lost)."""
        try:
            self.lease.check()
        except LeaseLostError:
            raise
        except StorageError as exc:
            job = self.storage.job_id
            log.warning("job %s: deletions skipped, left for the next scan: %s", job, exc)
            return False
        return True
