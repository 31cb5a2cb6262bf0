"""The port between the driver and whatever runs units (DESIGN §3): a `TaskDispatcher` runs one
epoch's `UnitWork` and returns a `Dispatch` of the answers that arrived. `SparkDispatcher`
(`regional.runtime.spark`) and `InProcessDispatcher` (`regional.runtime.local`) implement it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from regional.coordinator.messages import AckBatch, Answer, UnitWork

__all__ = ["Dispatch", "TaskDispatcher"]


class Dispatch(msgspec.Struct, frozen=True):
    """What a dispatcher got back: the answers that arrived, and `error` when the batch itself
    failed (a lost worker took units with it; units without an answer were lost). `batches`:
    acks that arrived packed (`AckBatch`, e.g. one per Spark task); they count as arriving
    before `answers`."""

    answers: list[Answer]
    error: str | None = None
    batches: list[AckBatch] = msgspec.field(default_factory=list)

    def arrived(self) -> list[Answer | AckBatch]:
        """What the coordinator is handed (`CheckpointCoordinator.on_answers`), in order."""
        return [*self.batches, *self.answers]


class TaskDispatcher(Protocol):
    """Runs unit work somewhere (Spark tasks, a simulation) and returns what answered.

    `run` must return by `deadline_ms` (driver clock) with the answers that arrived; units
    still running then are cancelled and are declined by the coordinator as timed out. With
    `isolated`, every unit runs on its own, so a crash loses only that unit (retries).
    """

    def start(self) -> None:
        """Prepare workers before a run (e.g. warm up Python workers); may be a no-op."""
        ...

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch: ...
