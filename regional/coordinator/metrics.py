"""Coordinator metrics (flink_regional.md §1.3): counts of completions and of aborts by rule,
each checkpoint's `oldest_ref_checkpoint_id`, and per-unit lag (checkpoints behind).

>>> m = CoordinatorMetrics()
>>> m.unit_lag = {3: 2}
>>> m.lag_of(3), m.lag_of(4), m.max_unit_lag, m.mean_unit_lag(4)
(2, 0, 2, 0.5)
"""

from __future__ import annotations

import dataclasses
from collections import Counter

from regional.coordinator.decisions import Rule

__all__ = ["CoordinatorMetrics"]


@dataclasses.dataclass
class CoordinatorMetrics:
    """Read by the runtime's progress display and the inspector; updated by the coordinator."""

    regional_checkpoint_count: int = 0
    global_checkpoint_count: int = 0
    savepoint_count: int = 0
    aborted_by_rule: Counter[Rule] = dataclasses.field(default_factory=Counter)
    #: completed checkpoint id -> its oldest owner reference (None when global)
    oldest_ref_checkpoint_id: dict[int, int | None] = dataclasses.field(default_factory=dict)
    #: unit -> latest completed id minus the id that wrote its state (units at 0 absent)
    unit_lag: dict[int, int] = dataclasses.field(default_factory=dict)
    commit_failures: int = 0

    def lag_of(self, unit_id: int) -> int:
        return self.unit_lag.get(unit_id, 0)

    @property
    def max_unit_lag(self) -> int:
        return max(self.unit_lag.values(), default=0)

    def mean_unit_lag(self, num_units: int) -> float:
        return sum(self.unit_lag.values()) / num_units if num_units else 0.0
