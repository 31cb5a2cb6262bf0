"""The port between the driver and whatever runs units (DESIGN §3): a `TaskDispatcher` runs one
epoch's `UnitWork` and returns a `Dispatch` of the answers that arrived. `SparkDispatcher`
(`regional.runtime.spark`) and `InProcessDispatcher` (`regional.runtime.local`) implement it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from regional.coordinator.messages import AckBatch, Answer, UnitWork

__all__ = ["Dispatch", "TaskDispatcher", "spread_over_tasks"]


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


def spread_over_tasks(works: Sequence[UnitWork], tasks: int) -> list[list[UnitWork]]:
    """`works` for `tasks` tasks: every stage (the units of one shape, which a task runs in one
    pass) spread over the tasks in contiguous slices of near-equal size, rotated from stage to
    stage so that stages smaller than the task count do not all land on one task. Sliced as one
    list, one task would get one stage and another the next: an upstream stage's units are
    cheap, a keyed stage's after an exchange are not, and one core would idle.

    >>> from metadata.model import SubtaskState
    >>> def work(unit, *vertices):
    ...     return UnitWork(1, 1, unit, tuple(SubtaskState(v, unit, unit) for v in vertices), ())
    >>> works = [work(u, "src", "out") for u in range(4)] + [work(u, "ex", "sum") for u in (4, 5)]
    >>> [[w.unit_id for w in task] for task in spread_over_tasks(works, 2)]
    [[0, 1, 4], [2, 3, 5]]
    """
    stages: dict[tuple[str, ...], list[UnitWork]] = {}
    for work in works:
        stages.setdefault(tuple(s.vertex_id for s in work.restore), []).append(work)
    slices: list[list[UnitWork]] = [[] for _ in range(tasks)]
    start = 0
    for stage in stages.values():
        n = len(stage)
        for i in range(tasks):
            slices[(start + i) % tasks] += stage[i * n // tasks : (i + 1) * n // tasks]
        start = (start + n) % tasks
    return slices
