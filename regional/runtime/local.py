"""Unit work run in this process (DESIGN §3): `InProcessDispatcher` is the `TaskDispatcher` that
runs an epoch's units with the task side Spark runs (`regional.runtime.task.run_units`), one
task after another, without Spark. Driver-level tests and the simulation (`runtime.sim`) use it,
so they exercise the record path production runs.

Like `SparkDispatcher`, it spreads each stage's units over `tasks` tasks in contiguous slices
of near-equal size (`regional.runtime.dispatch.spread_over_tasks`) and, with `pack_acks`,
hands each task's acks over as one `AckBatch`. The epoch deadline is kept as a cancelled Spark
job keeps it: a task that starts at or after the deadline is not run, and the answers of a task
that ends after it are lost; the coordinator declines those units as timed out.

"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from regional.coordinator.messages import AckBatch, Answer, UnitWork, packed
from regional.runtime.dispatch import Dispatch, spread_over_tasks
from regional.runtime.task import TaskEnv, run_units

__all__ = ["InProcessDispatcher", "round_robin", "wall_clock_ms"]


def wall_clock_ms() -> int:
    """The driver's clock (`driver.SystemClock`): milliseconds since the Unix epoch."""
    return int(time.time() * 1000)


def round_robin(works: Sequence[UnitWork], tasks: int) -> list[list[UnitWork]]:
    """`works` over `tasks` tasks by unit id: unit u in task u % tasks (no empty task), so each
    task's units interleave with the others'.

    >>> [[w.unit_id for w in t] for t in round_robin([UnitWork(1, 1, u, ()) for u in range(5)], 2)]
    [[0, 2, 4], [1, 3]]
    """
    out: list[list[UnitWork]] = [[] for _ in range(tasks)]
    for w in works:
        out[w.unit_id % tasks].append(w)
    return [t for t in out if t]


class InProcessDispatcher:
    """Runs unit work in this process through `run_units` (implements `TaskDispatcher`).

    `tasks`: how many tasks an epoch's units are spread over (each one `run_units` call, so
    units of one task share its passes and merged files, as in a Spark task); `pack_acks`:
    each task's acks arrive as one `AckBatch` (as `SparkDispatcher` hands them over), else
    every answer on its own, in unit order; `clock`: the driver's clock in milliseconds, which
    the deadline is read on (a simulation passes its own); `background_safe`: the driver may
    dispatch from its dispatch thread while it commits the previous epoch (pipelined commits,
    `JobDriver.run`), as it may with Spark; `interleaved`: unit u runs in task u % `tasks`
    (`round_robin`) instead of Spark's contiguous slices, so a task's units are not neighbours.
    With `isolated` (the driver's re-run of lost units), every unit runs as a task of its own.
    A batch never fails here (`Dispatch.error` stays None): the injected unit fault ``crash``
    ends this process, as it ends a Spark worker, so it is for Spark runs only.
    """

    def __init__(
        self,
        env: TaskEnv,
        *,
        tasks: int = 1,
        pack_acks: bool = False,
        clock: Callable[[], int] = wall_clock_ms,
        background_safe: bool = False,
        interleaved: bool = False,
    ) -> None:
        if tasks < 1:
            raise ValueError(f"an in-process dispatcher runs at least one task, not {tasks}")
        self.env = env
        self.tasks = tasks
        self.pack_acks = pack_acks
        self.clock = clock
        self.background_safe = background_safe
        self.interleaved = interleaved

    def start(self) -> None:
        """Nothing to prepare: the task side runs in this process."""

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        """Run `works` task by task until `deadline_ms`; the answers of the tasks that ended
        by then (the others' units go unanswered)."""
        if isolated:
            slices = [[w] for w in works]
        elif self.interleaved:
            slices = round_robin(works, self.tasks)
        else:
            slices = [s for s in spread_over_tasks(works, self.tasks) if s]
        answers: list[Answer] = []
        batches: list[AckBatch] = []
        for task in slices:
            if self.clock() >= deadline_ms:
                break  # cancelled before it started
            got = run_units(self.env, task)
            if self.clock() > deadline_ms:
                break  # cancelled while it ran: its answers are lost with it
            if self.pack_acks and not isolated:
                for item in packed(got):
                    if type(item) is AckBatch:
                        batches.append(item)
                    else:
                        answers.append(item)  # type: ignore[arg-type]  # a Decline
            else:
                answers += got
        return Dispatch(answers, batches=batches)
