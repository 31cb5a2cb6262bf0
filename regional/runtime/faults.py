"""Injected faults for tests, demos and benchmarks: units that fail, hang, stall or crash at a
checkpoint, and a driver that crashes at a step of carrying out a checkpoint.

In production nothing here runs: `Faults()` is empty, the task side gets no `UnitFaults` hook
(`None`), and the driver's crash points are a dictionary look-up that never matches.

>>> f = Faults(units={(2, 1): "fail"}, crash_at=(3, "after-metadata"))
>>> f.unit_faults().kinds
{(2, 1): 'fail'}
>>> Faults(units={(2, 1): "explode"})
Traceback (most recent call last):
...
ValueError: fault 'explode' for unit 1 at checkpoint 2: use fail, hang, stall or crash
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import msgspec

from regional.coordinator.messages import UnitWork
from regional.errors import RegionalError

__all__ = [
    "CRASH_STEPS",
    "UNIT_FAULTS",
    "DriverCrash",
    "Faults",
    "InjectedFault",
    "UnitFaults",
]

#: Where `Faults.crash_at` can stop the driver: after every unit answered (before the metadata
#: write), after the metadata write, after every sink committed the checkpoint, in the middle
#: of cleaning.
CRASH_STEPS = ("after-acks", "after-metadata", "after-commit", "mid-clean")

#: fail: raise in the unit after its sources read (like user code failing on data); hang: block
#: until the unit's timeout (SIGALRM breaks it); stall: a C-level loop the timeout cannot break
#: (the driver cancels the job at the epoch deadline); crash: kill the Python worker, losing its
#: Spark task and every unit packed into it.
UNIT_FAULTS = ("fail", "hang", "stall", "crash")


class DriverCrash(RegionalError):
    """The driver stopped at an injected crash point (tests and demos)."""


class InjectedFault(RuntimeError):
    """A fault injected on purpose (tests and demos)."""


class UnitFaults(msgspec.Struct, frozen=True):
    """The task-side hook: which unit attempts of which checkpoints misbehave, and how."""

    kinds: dict[tuple[int, int], str]

    def before_unit(self, work: UnitWork) -> None:
        """Called before a unit restores: crash, stall or hang here."""
        what = self.kinds.get((work.checkpoint_id, work.unit_id))
        if what == "crash":
            os._exit(3)  # the Python worker dies: its task (and the task's other units) is lost
        if what == "stall":  # a C-level loop: SIGALRM cannot interrupt it
            sum(range(10**13))
        if what == "hang":
            while True:  # interruptible by SIGALRM, like a stuck user function
                time.sleep(0.05)

    def after_sources(self, work: UnitWork) -> None:
        """Called once the unit's sources read: an injected failure raises here."""
        if self.kinds.get((work.checkpoint_id, work.unit_id)) == "fail":
            raise InjectedFault(
                f"unit {work.unit_id} fails checkpoint {work.checkpoint_id} (injected fault)"
            )


@dataclasses.dataclass(frozen=True)
class Faults:
    """Injected faults, off by default. `units` maps (checkpoint id, unit id) to one of
    `UNIT_FAULTS`; `crash_at` is (checkpoint id, step in `CRASH_STEPS`); `hard` crashes by
    ending the driver process (`os._exit`) instead of raising `DriverCrash`."""

    units: dict[tuple[int, int], str] = dataclasses.field(default_factory=dict)
    crash_at: tuple[int, str] | None = None
    hard: bool = False

    def __post_init__(self) -> None:
        for (cid, unit), what in self.units.items():
            if what not in UNIT_FAULTS:
                raise ValueError(
                    f"fault {what!r} for unit {unit} at checkpoint {cid}: use fail, hang, stall "
                    "or crash"
                )
        if self.crash_at is not None and self.crash_at[1] not in CRASH_STEPS:
            raise ValueError(
                f"crash step {self.crash_at[1]!r}: use one of {', '.join(CRASH_STEPS)}"
            )

    def unit_faults(self) -> UnitFaults | None:
        """The task-side hook, or None when no unit fault is injected (production)."""
        return UnitFaults(dict(self.units)) if self.units else None

    def crash_point(self, checkpoint_id: int, step: str) -> None:
        """Stop the driver here if `crash_at` names this point."""
        if self.crash_at != (checkpoint_id, step):
            return
        message = f"driver crashed at checkpoint {checkpoint_id}, {step} (injected)"
        if self.hard:
            sys.stdout.flush()
            os._exit(70)
        raise DriverCrash(message)
