"""Staleness and failure limits (DESIGN §4 rule 5): tier 1 / tier 2 at job level,
`max-unit-fallbacks` at unit level (stuck units), `tolerable-failed-checkpoints` for
consecutive aborts.

A unit that fell back in `max-unit-fallbacks` checkpoints in a row is **stuck**. With
`on-unit-fallback-limit = "isolate"` (the default) a stuck unit never stops the healthy ones:
it stays on its owner's state while checkpoints complete around it, and once it has been stuck
longer than `max-stuck-time` (milliseconds on the driver's clock, given in by the caller: the
limits stay pure) the job fails naming it. With `"force-fresh"` it must be fresh in the next
checkpoint instead (rule 3a aborts that checkpoint if it fails again).

>>> from regional.policy import RegionPolicy
>>> lim = Limits(RegionPolicy(max_consecutive_regional=1, max_unit_fallbacks=2,
...     max_stuck_time=60), tolerable=0)
>>> lim.completed(fallback_units=[4], now_ms=0); lim.tier1_reason() is not None, lim.stuck
(True, {})
>>> lim.completed(fallback_units=[4], now_ms=1_000); lim.stuck, lim.units_at_limit()
({4: 1000}, frozenset())
>>> lim.overdue(61_000), lim.overdue(61_001)
([], [4])
>>> force = Limits(RegionPolicy(max_unit_fallbacks=2, on_unit_fallback_limit="force-fresh"), 0)
>>> force.completed([4], now_ms=0); force.completed([4], now_ms=1); force.unit_limit_reason(4)
'it fell back in the last 2 checkpoints (max-unit-fallbacks = 2)'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from itertools import repeat
from operator import add

from regional.coordinator.verdict import name_units
from regional.policy import RegionPolicy

__all__ = ["Limits"]


class Limits:
    """Counters behind the forced-global, stuck-unit and job-failure rules."""

    def __init__(self, region: RegionPolicy, tolerable: int) -> None:
        self.max_consecutive_regional = region.max_consecutive_regional
        self.max_unit_fallbacks = region.max_unit_fallbacks
        self.isolate = region.on_unit_fallback_limit == "isolate"
        #: how long a unit may stay stuck (ms; None: unlimited), in isolate mode
        self.max_stuck_ms = (
            None if region.max_stuck_time is None else round(region.max_stuck_time * 1000)
        )
        self.tolerable = tolerable
        #: consecutive regional completions since the last global one (tier 1)
        self.consecutive_regional = 0
        #: unit -> consecutive checkpoints it fell back in (units at 0 are absent)
        self.streak: dict[int, int] = {}
        #: stuck unit -> since when (driver ms; isolate mode only). A unit restored stuck is
        #: stuck since the first time the limits see a clock (`note_time`)
        self.stuck: dict[int, int] = {}
        #: consecutive aborted checkpoints, and how often each unit failed in them
        self.consecutive_aborts = 0
        self.fault_counts: Counter[int] = Counter()

    def tier1_reason(self) -> str | None:
        """Why the next checkpoint must be global at job level (tier 1), or None."""
        k = self.max_consecutive_regional
        if k is None or self.consecutive_regional < k:
            return None
        if k == 0:
            return "max-consecutive-regional = 0: regional checkpoints are off"
        return (
            f"tier 1: {self.consecutive_regional} consecutive regional checkpoints "
            f"(max-consecutive-regional = {k})"
        )

    def unit_limit_reason(self, unit_id: int) -> str | None:
        """Why `unit_id` is over its fallback limit (stuck), or None."""
        m = self.max_unit_fallbacks
        if m == 0:
            return "max-unit-fallbacks = 0: units may never fall back"
        if self.streak.get(unit_id, 0) >= m:
            return f"it fell back in the last {m} checkpoints (max-unit-fallbacks = {m})"
        return None

    def units_at_limit(self) -> frozenset[int]:
        """Units that must be fresh in the next checkpoint: those over `max-unit-fallbacks`
        in force-fresh mode; none in isolate mode (they are stuck instead)."""
        m = self.max_unit_fallbacks
        if self.isolate:
            return frozenset()
        return frozenset(u for u, n in self.streak.items() if n >= m)

    def note_time(self, now_ms: int) -> None:
        """Start the clock of units that are stuck without one (restored stuck)."""
        m = self.max_unit_fallbacks
        if self.isolate and m > 0 and len(self.stuck) < len(self.streak):
            for u, n in self.streak.items():
                if n >= m:
                    self.stuck.setdefault(u, now_ms)

    def overdue(self, now_ms: int) -> list[int]:
        """The stuck units stuck for longer than `max-stuck-time` at `now_ms`, ascending."""
        bound = self.max_stuck_ms
        if bound is None or not self.stuck:
            return []
        return sorted(u for u, since in self.stuck.items() if now_ms - since > bound)

    def completed(
        self, fallback_units: Iterable[int], *, now_ms: int = 0, savepoint: bool = False
    ) -> None:
        """A checkpoint completed at `now_ms` (regional when `fallback_units` is not empty)."""
        fallback = list(fallback_units)
        streaks = map(add, map(self.streak.get, fallback, repeat(0)), repeat(1))  # in C
        self.streak = dict(zip(fallback, streaks, strict=True))
        if self.stuck:  # a unit that was fresh is no longer stuck
            self.stuck = {u: t for u, t in self.stuck.items() if u in self.streak}
        self.note_time(now_ms)
        if not savepoint:
            self.consecutive_regional = self.consecutive_regional + 1 if fallback else 0
        self.consecutive_aborts = 0
        self.fault_counts.clear()

    def governed_by_stuck_time(self, failed_units: Iterable[int]) -> bool:
        """Whether an abort whose failed units are `failed_units` is left to `max-stuck-time`
        (every one of them is stuck and the bound is finite): such aborts (a final or forced
        global checkpoint a stuck unit cannot pass) do not count towards
        `tolerable-failed-checkpoints`, so the job fails with the stuck-unit error instead."""
        units = list(failed_units)
        return bool(units) and self.max_stuck_ms is not None and all(u in self.stuck for u in units)

    def aborted(
        self,
        failed_units: Iterable[int],
        *,
        tier1: bool,
        counted: bool,
        name: Callable[[int], str] = "unit {}".format,
    ) -> str | None:
        """A checkpoint was aborted. Tier 2: a failed tier-1 checkpoint resets the job-level
        counter. Returns the job-failure message once the aborts exceed the tolerance (the
        units that failed most often named by `name`: `unit 3 (events:3)`)."""
        if tier1:
            self.consecutive_regional = 0
        if not counted:
            return None
        self.consecutive_aborts += 1
        self.fault_counts.update(list(failed_units))
        if self.consecutive_aborts <= self.tolerable:
            return None
        worst = [f"{name(u)} {n}x" for u, n in self.fault_counts.most_common(10)]
        faulty = name_units(self.fault_counts) if self.fault_counts else "none"
        return (
            f"{self.consecutive_aborts} consecutive checkpoints aborted (tolerable-failed-"
            f"checkpoints = {self.tolerable}); {faulty} failed; most often: "
            f"{', '.join(worst) or 'none'}; fix those units or raise "
            "checkpointing.tolerable-failed-checkpoints"
        )

    def at_fault(self) -> tuple[int, ...]:
        return tuple(sorted(self.fault_counts))
