"""Deleting off the critical path: a background thread that carries out plans one after
another (`cleaner.run.execute`: phases in order, only the planned files, idempotent),
taking them from a bounded queue.

`submit` hands a plan over and returns at once, unless `max_queued` plans are already waiting
(then it waits: a producer faster than storage slows down instead of queueing without bound).
`drain` waits until every submitted plan is carried out; `close` drains and stops the thread
(a later `submit` starts a new one). Before each plan `ready()` is asked whether to go on
(the runtime checks its lease there): False skips the plan, an exception stops the worker.
An exception on the worker (from `ready`, or from a plan's `progress` callback) stops it:
the plans still queued are dropped, and the exception is raised again by the next `submit` or
`drain`, in the caller's thread. Dropped and failed deletions are garbage a later full scan
finds. Plans are deleted in submission order, so a later plan never overtakes an earlier one.

>>> import tempfile, pathlib
>>> from cleaner.incremental import CleaningStep
>>> from cleaner.plan import Action, FileDecision, Reason
>>> from metadata.storage import JobStorage
>>> root = tempfile.mkdtemp()
>>> storage = JobStorage(root, "job")
>>> storage.write_new_file("chk-1/u0-a0.state", b"x")
>>> step = CleaningStep((FileDecision("chk-1/u0-a0.state", 1, Action.DELETE, Reason.SUBSUMED,
...     "file of dropped checkpoint 1", 1, (), 1),))
>>> deleter = BackgroundDeleter(storage)
>>> deleter.submit(step)
>>> deleter.close()
>>> storage.exists("chk-1/u0-a0.state"), deleter.totals.deleted
(False, 1)
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import cast

import msgspec

from cleaner.model import RetentionInputError
from cleaner.run import CleanProgress, Deleter, DeletionStatus, PlannedDeletions, execute

__all__ = ["BackgroundDeleter", "DeleterTotals"]

log = logging.getLogger(__name__)


class DeleterTotals(msgspec.Struct):
    """What the worker did since it was created: plans carried out and skipped, files deleted
    (or already gone) and failed or refused, seconds spent deleting, and seconds `submit`
    waited for room in the queue (time the producer lost to back-pressure)."""

    plans: int = 0
    skipped_plans: int = 0
    deleted: int = 0
    failed: int = 0
    busy_s: float = 0.0
    waited_s: float = 0.0


_STOP = object()
#: A queued plan and its progress callback.
_Item = tuple[PlannedDeletions, Callable[[CleanProgress], None] | None]


class BackgroundDeleter:
    """Carries out submitted plans on one background thread (see the module docstring).
    `max_workers` deletions of one plan run at once (`execute`'s bound)."""

    def __init__(
        self,
        storage: Deleter,
        *,
        max_queued: int = 8,
        max_workers: int = 4,
        ready: Callable[[], bool] | None = None,
        name: str = "regional-clean",
    ) -> None:
        if max_queued < 1:
            raise RetentionInputError(
                f"max-queued must be at least 1 (got {max_queued}): it bounds the plans waiting"
            )
        self.storage = storage
        self.max_workers = max_workers
        self.ready = ready
        self.name = name
        self.totals = DeleterTotals()
        self._queue: queue.Queue[_Item | object] = queue.Queue(maxsize=max_queued)
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    def submit(
        self,
        plan: PlannedDeletions,
        *,
        progress: Callable[[CleanProgress], None] | None = None,
    ) -> None:
        """Queue `plan` (nothing to do for an empty one); waits while the queue is full.
        Raises what stopped the worker, if it stopped."""
        self._raise_failure()
        if not plan.deletions:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name=self.name, daemon=True)
            self._thread.start()
        started = time.perf_counter()
        self._queue.put((plan, progress))
        self.totals.waited_s += time.perf_counter() - started

    def drain(self) -> None:
        """Wait until every submitted plan is carried out (or dropped); raises what stopped
        the worker, if it stopped."""
        if self._thread is not None:
            self._queue.join()
        self._raise_failure()

    def close(self) -> None:
        """Drain and stop the thread. Never raises: what stopped the worker stays for the
        next `submit` or `drain`."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._queue.put(_STOP)
        thread.join()

    def _raise_failure(self) -> None:
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def _work(self) -> None:
        stopped = False  # after a failure: drop what is queued, until told to stop
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                if stopped:
                    continue
                try:
                    self._carry_out(*cast(_Item, item))
                except BaseException as exc:  # raised again in the caller's thread
                    self._failure = exc
                    stopped = True
            finally:
                self._queue.task_done()

    def _carry_out(
        self, plan: PlannedDeletions, progress: Callable[[CleanProgress], None] | None
    ) -> None:
        if self.ready is not None and not self.ready():
            self.totals.skipped_plans += 1
            return
        started = time.perf_counter()
        try:
            report = execute(plan, self.storage, max_workers=self.max_workers, progress=progress)
        finally:
            self.totals.busy_s += time.perf_counter() - started
        self.totals.plans += 1
        done = report.count(DeletionStatus.DELETED) + report.count(DeletionStatus.ALREADY_GONE)
        self.totals.deleted += done
        failed = (DeletionStatus.FAILED, DeletionStatus.REFUSED)
        bad = [o for o in report.outcomes if o.status in failed]
        self.totals.failed += len(bad)
        if bad:
            log.warning(
                "%d of %d deletions not done, left for the next full scan; first: %s: %s",
                len(bad),
                len(report.outcomes),
                bad[0].path,
                bad[0].detail,
            )
