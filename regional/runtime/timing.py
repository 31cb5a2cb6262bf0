"""Where an epoch's wall time goes on the driver: `EpochTiming`, one per epoch
(`JobDriver.last_timing`), added up by an `EpochStopwatch` while the epoch runs.

>>> watch = EpochStopwatch()
>>> with watch.part("metadata"):
...     pass
>>> t = watch.timing(7)
>>> t.checkpoint_id, t.metadata_s >= 0, t.total_s >= t.metadata_s
(7, True, True)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator
from operator import attrgetter

import msgspec

__all__ = ["PARTS", "TASK_PARTS", "EpochStopwatch", "EpochTiming"]

#: The parts of an epoch, in the order they happen.
PARTS = ("plan", "dispatch", "feed", "metadata", "commit", "discard", "clean", "event")
#: The phases of a unit inside the dispatch (task seconds, from the acks).
TASK_PARTS = ("restore", "process", "snapshot", "upload")
_TASK_SECONDS = tuple(attrgetter(f"{name}_s") for name in TASK_PARTS)


class EpochTiming(msgspec.Struct, frozen=True, kw_only=True):
    """Seconds of one epoch on the driver: planning the units' work (`plan_s`: split discovery,
    restore states), the dispatcher's run (`dispatch_s`: on Spark the whole job, i.e. task
    start, restore, processing, snapshot and upload in the tasks), feeding the answers to the
    coordinator (`feed_s`), writing metadata (`metadata_s`), committing to sinks
    (`commit_s`), deleting failed attempts' files (`discard_s`), cleaning on the epoch's path
    (`clean_s`: planning deletions and handing them to the background worker, or the full
    scan of a driver's first clean), writing the event (`event_s`); `total_s` from the trigger
    to the event (the rest is the coordinator's own work and bookkeeping).

    Inside the dispatch, the acked units' task seconds per phase, summed over units (tasks run
    in parallel, so the sums may exceed `dispatch_s`; `regional.coordinator.messages.Ack`):
    `task_restore_s`, `task_process_s`, `task_snapshot_s`, `task_upload_s`; and how many of
    their operator subtasks restored hot state or decoded bytes (`task_state_hits`,
    `task_state_misses`: DESIGN §6)."""

    checkpoint_id: int
    plan_s: float = 0.0
    dispatch_s: float = 0.0
    feed_s: float = 0.0
    metadata_s: float = 0.0
    commit_s: float = 0.0
    discard_s: float = 0.0
    clean_s: float = 0.0
    event_s: float = 0.0
    total_s: float = 0.0
    task_restore_s: float = 0.0
    task_process_s: float = 0.0
    task_snapshot_s: float = 0.0
    task_upload_s: float = 0.0
    task_state_hits: int = 0
    task_state_misses: int = 0


class EpochStopwatch:
    """Adds up seconds per part (`PARTS`) from its creation (the epoch's trigger) on."""

    def __init__(self) -> None:
        self._started = time.perf_counter()
        self._seconds = dict.fromkeys(PARTS, 0.0)
        self._tasks = dict.fromkeys(TASK_PARTS, 0.0)
        self._state_hits = self._state_misses = 0

    def add_tasks(self, answers: Iterable[object]) -> None:
        """Add the task seconds per phase of the acks among `answers` (the answers that have
        them), in answer order."""
        timed = [a for a in answers if hasattr(a, "restore_s")]
        for name, seconds in zip(TASK_PARTS, _TASK_SECONDS, strict=True):
            self._tasks[name] = sum(map(seconds, timed), self._tasks[name])
        self._state_hits += sum(getattr(a, "state_hits", 0) for a in timed)
        self._state_misses += sum(getattr(a, "state_misses", 0) for a in timed)

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        """Time the block as part `name` (one of `PARTS`; `KeyError` naming it otherwise)."""
        if name not in self._seconds:
            raise KeyError(f"epoch part {name!r} is not one of {', '.join(PARTS)}")
        started = time.perf_counter()
        try:
            yield
        finally:
            self._seconds[name] += time.perf_counter() - started

    def timing(self, checkpoint_id: int) -> EpochTiming:
        """The parts so far, and the total since the stopwatch started."""
        return EpochTiming(
            checkpoint_id=checkpoint_id,
            total_s=time.perf_counter() - self._started,
            **{f"{name}_s": s for name, s in self._seconds.items()},
            **{f"task_{name}_s": s for name, s in self._tasks.items()},
            task_state_hits=self._state_hits,
            task_state_misses=self._state_misses,
        )
