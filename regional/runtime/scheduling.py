"""How a task schedules its units: passes over several units, their retries, unit timeouts.

A task runs its units that can share a pass (`regional.dataflow.walker`) in one pass
(`run_passes`); a unit a pass pins a failure on declines with it and the pass runs again
without it, up to `PASS_TRIES` times; whatever the passes did not run runs one unit at a time.
A unit running past its timeout is interrupted with SIGALRM (`alarms`, Python code only; the
driver's deadline cancel covers the rest), raising `UnitTimeout`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

from regional.coordinator.messages import UnitWork
from regional.dataflow.failures import failure_line
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state_provider import StateBytes, StateProvider
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import TaskUnit, UnitFailed
from regional.runtime.faults import UnitFaults

__all__ = ["PASS_TRIES", "Passed", "RunPass", "Timeout", "UnitTimeout", "alarms", "run_passes"]

#: the task's one log (`regional.runtime.task`): what its passes did is part of it
log = logging.getLogger("regional.runtime.task")

#: How often a task's pass runs again without a unit that failed in it (then: one by one).
PASS_TRIES = 3


class UnitTimeout(BaseException):
    """The unit ran past its timeout (raised by SIGALRM inside the unit). Not an `Exception`,
    so user code and dead-lettering (`on_error="dead-letter"`) never swallow it."""


def _alarm(signum: int, frame: Any) -> None:
    raise UnitTimeout


class Timeout(Protocol):
    """`timeout(share)`: a context that raises `UnitTimeout` inside it after `share` of a
    unit's timeout."""

    def __call__(self, share: float = ...) -> contextlib.AbstractContextManager[None]: ...


@contextlib.contextmanager
def alarms(seconds: float) -> Iterator[Timeout]:
    """For one task: installs the SIGALRM handler once (when on the main thread, as PySpark
    workers are) and yields `timeout(share=1.0)`, a context that raises `UnitTimeout` inside
    it after `share` of `seconds` (it only arms and disarms the timer: a unit pays two system
    calls)."""
    if seconds <= 0 or threading.current_thread() is not threading.main_thread():
        yield lambda share=1.0: contextlib.nullcontext()
        return

    @contextlib.contextmanager
    def timeout(share: float = 1.0) -> Iterator[None]:
        signal.setitimer(signal.ITIMER_REAL, seconds * share)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)

    old = signal.signal(signal.SIGALRM, _alarm)
    try:
        yield timeout
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclasses.dataclass
class Passed:
    """What the task's passes gave, by position in the task's works: the epochs they ran,
    each with its share of its pass's seconds, and the units that failed in one (each with
    the error it raised, as it would have alone)."""

    epochs: dict[int, tuple[UnitEpoch, float]] = dataclasses.field(default_factory=dict)
    failed: dict[int, Exception] = dataclasses.field(default_factory=dict)


#: Runs one pass (`regional.dataflow.walker.run_task_epoch`'s signature).
RunPass = Callable[..., list[UnitEpoch] | None]


def run_passes(
    pipeline: Pipeline,
    works: Sequence[UnitWork],
    state_of: StateProvider | StateBytes,
    timeout: Timeout,
    *,
    run_pass: RunPass,
    unit_timeout: float,
    faults: UnitFaults | None = None,
    tries: int = PASS_TRIES,
) -> Passed:
    """Run the task's units that can share a pass with `run_pass`: units of one shape, in
    groups of two or more, except units with injected `faults` and units that fell back at
    the previous checkpoint (they are the likely ones to fail again); `state_of` restores
    their operator state. A unit a pass pins a failure on declines with it and the pass runs
    again without it (up to `tries` times); a pass that fails otherwise (a timeout: half of
    `unit_timeout`) or cannot keep its units apart gives nothing: its units run one by
    one."""
    passed = Passed()
    if len(works) < 2:
        return passed
    shapes: dict[frozenset[str], list[int]] = {}
    for at, work in enumerate(works):
        if faults is not None and (work.checkpoint_id, work.unit_id) in faults.kinds:
            continue
        if any(
            s.ref_checkpoint_id is not None and s.ref_checkpoint_id < work.checkpoint_id - 1
            for s in work.restore
        ):
            continue
        shapes.setdefault(frozenset(s.vertex_id for s in work.restore), []).append(at)
    for group in shapes.values():
        ats = list(group)
        for _ in range(tries):
            if len(ats) < 2:
                break
            checkpoint_id = works[ats[0]].checkpoint_id
            units = [
                TaskUnit(
                    {s.vertex_id: s for s in works[at].restore},
                    works[at].new_splits,
                    works[at].ended,
                    state_of,
                )
                for at in ats
            ]
            started = time.perf_counter()
            try:
                with timeout(0.5):
                    epochs = run_pass(pipeline, units, checkpoint_id=checkpoint_id)
            except UnitFailed as failed:
                at = ats.pop(failed.unit)
                passed.failed[at] = failed.error
                log.info(
                    "checkpoint %d: unit %d failed in a pass over %d units (%s); the others "
                    "run again",
                    checkpoint_id,
                    works[at].unit_id,
                    len(ats) + 1,
                    failure_line(failed.error),
                )
                continue
            except (Exception, UnitTimeout) as exc:
                why = (
                    f"ran over {unit_timeout * 0.5:g} s, half a unit's timeout"
                    if isinstance(exc, UnitTimeout)
                    else failure_line(exc)
                )
                log.info(
                    "checkpoint %d: a pass over %d units failed (%s); running them one by one",
                    checkpoint_id,
                    len(ats),
                    why,
                )
                break
            if epochs is not None:
                share = (time.perf_counter() - started) / len(ats)
                passed.epochs.update(
                    (at, (epoch, share)) for at, epoch in zip(ats, epochs, strict=True)
                )
            break
    return passed
