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

A unit may be named as the CLI and the report show it (`regional.graph.unit_names`:
``orders[1]``, ``orders⨝payments[3]``, ``paid[3]``); the names are resolved against the
pipeline's units when the task-side hook is made:

>>> from regional.dataflow.pipeline import Pipeline
>>> from regional.sinks.memory import InMemoryTableSink
>>> from regional.sources.generator import GeneratorSource
>>> p = Pipeline("demo")
>>> _ = p.source(GeneratorSource(2, lambda s, n: {"n": n}), parallelism=2, name="orders"
...     ).sink(InMemoryTableSink(), name="out")
>>> Faults(units={(2, "orders[1]"): "fail"}).unit_faults(p).kinds
{(2, 1): 'fail'}
>>> Faults(units={(2, "payments[0]"): "fail"}).unit_faults(p)  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
regional.graph.unit_names.UnitNameError: no unit named 'payments[0]'; the job's units are ...
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from typing import TYPE_CHECKING

import msgspec

from regional.coordinator.messages import UnitWork
from regional.errors import RegionalError
from regional.graph.unit_names import names_of_plan

if TYPE_CHECKING:
    from regional.dataflow.pipeline import Pipeline

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
    """Injected faults, off by default. `units` maps (checkpoint id, unit) to one of
    `UNIT_FAULTS`, the unit given by its id or its name (``orders[1]``: resolved by
    `unit_faults`); `crash_at` is (checkpoint id, step in `CRASH_STEPS`); `hard` crashes by
    ending the driver process (`os._exit`) instead of raising `DriverCrash`."""

    units: dict[tuple[int, int | str], str] = dataclasses.field(default_factory=dict)
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

    def unit_faults(self, pipeline: Pipeline | None = None) -> UnitFaults | None:
        """The task-side hook, or None when no unit fault is injected (production). Units
        named by name are resolved against `pipeline`'s units (needed only then); an unknown
        name raises `UnitNameError` listing the names the pipeline's units have."""
        if not self.units:
            return None
        kinds: dict[tuple[int, int], str] = {}
        named = [unit for _, unit in self.units if not isinstance(unit, int)]
        if named and pipeline is None:
            raise ValueError(
                f"fault for unit {named[0]!r}: a unit named by name needs the pipeline to "
                "resolve it; call faults.unit_faults(pipeline)"
            )
        names = names_of_plan(pipeline.regions()) if named and pipeline is not None else None
        for (cid, unit), what in self.units.items():
            if names is not None:
                kinds[cid, names.resolve(unit)] = what
            else:
                assert isinstance(unit, int)  # a name needs the pipeline: refused above
                kinds[cid, unit] = what
        return UnitFaults(kinds)

    def crash_point(self, checkpoint_id: int, step: str) -> None:
        """Stop the driver here if `crash_at` names this point."""
        if self.crash_at != (checkpoint_id, step):
            return
        message = f"driver crashed at checkpoint {checkpoint_id}, {step} (injected)"
        if self.hard:
            sys.stdout.flush()
            os._exit(70)
        raise DriverCrash(message)
