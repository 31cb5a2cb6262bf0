"""Staleness and failure limits (DESIGN §4 rule 5): tier 1 / tier 2 at job level,
`max-unit-fallbacks` at unit level, `tolerable-failed-checkpoints` for consecutive aborts.

>>> from regional.policy import RegionPolicy
>>> lim = Limits(RegionPolicy(max_consecutive_regional=1, max_unit_fallbacks=2), tolerable=0)
>>> lim.completed(fallback_units=[4]); lim.tier1_reason() is not None, lim.unit_limit_reason(4)
(True, None)
>>> lim.completed(fallback_units=[4]); lim.unit_limit_reason(4)
'it fell back in the last 2 checkpoints (max-unit-fallbacks = 2)'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from itertools import repeat
from operator import add

from regional.coordinator.verdict import name_units
from regional.policy import RegionPolicy

__all__ = ["Limits"]


class Limits:
    """Counters behind the forced-global and job-failure rules."""

    def __init__(self, region: RegionPolicy, tolerable: int) -> None:
        self.max_consecutive_regional = region.max_consecutive_regional
        self.max_unit_fallbacks = region.max_unit_fallbacks
        self.tolerable = tolerable
        #: consecutive regional completions since the last global one (tier 1)
        self.consecutive_regional = 0
        #: unit -> consecutive checkpoints it fell back in (units at 0 are absent)
        self.streak: dict[int, int] = {}
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
        """Why `unit_id` must be fresh in the next checkpoint (unit level), or None."""
        m = self.max_unit_fallbacks
        if m == 0:
            return "max-unit-fallbacks = 0: units may never fall back"
        if self.streak.get(unit_id, 0) >= m:
            return f"it fell back in the last {m} checkpoints (max-unit-fallbacks = {m})"
        return None

    def units_at_limit(self) -> frozenset[int]:
        """Units that must be fresh in the next checkpoint (for max-unit-fallbacks > 0)."""
        m = self.max_unit_fallbacks
        return frozenset(u for u, n in self.streak.items() if n >= m)

    def completed(self, fallback_units: Iterable[int], *, savepoint: bool = False) -> None:
        """A checkpoint completed (regional when `fallback_units` is not empty)."""
        fallback = list(fallback_units)
        streaks = map(add, map(self.streak.get, fallback, repeat(0)), repeat(1))  # in C
        self.streak = dict(zip(fallback, streaks, strict=True))
        if not savepoint:
            self.consecutive_regional = self.consecutive_regional + 1 if fallback else 0
        self.consecutive_aborts = 0
        self.fault_counts.clear()

    def aborted(self, failed_units: Iterable[int], *, tier1: bool, counted: bool) -> str | None:
        """A checkpoint was aborted. Tier 2: a failed tier-1 checkpoint resets the job-level
        counter. Returns the job-failure message once the aborts exceed the tolerance."""
        if tier1:
            self.consecutive_regional = 0
        if not counted:
            return None
        self.consecutive_aborts += 1
        self.fault_counts.update(list(failed_units))
        if self.consecutive_aborts <= self.tolerable:
            return None
        worst = [f"{u} ({n}x)" for u, n in self.fault_counts.most_common(10)]
        faulty = name_units(self.fault_counts) if self.fault_counts else "none"
        return (
            f"{self.consecutive_aborts} consecutive checkpoints aborted (tolerable-failed-"
            f"checkpoints = {self.tolerable}); {faulty} failed; most often: "
            f"{', '.join(worst) or 'none'}; fix those units or raise "
            "checkpointing.tolerable-failed-checkpoints"
        )

    def at_fault(self) -> tuple[int, ...]:
        return tuple(sorted(self.fault_counts))
