"""The checkpoint coordinator (DESIGN §4 rules 2–12): pure, driven by the runtime's events."""

from __future__ import annotations

from regional.coordinator.checkpoint_coordinator import (
    CheckpointCoordinator,
    CoordinatorStateError,
)
from regional.coordinator.decisions import (
    INITIAL_STATE_ID,
    AbortCheckpoint,
    Commit,
    Decision,
    DiscardAttempt,
    FailJob,
    FinishJob,
    NotifyComplete,
    NotifyFallback,
    NotifySubsumed,
    Rule,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.coordinator.layout import JobLayout, UnitPlan
from regional.coordinator.limits import Limits
from regional.coordinator.metrics import CoordinatorMetrics
from regional.coordinator.pending import PendingCheckpoint
from regional.coordinator.verdict import Verdict, evaluate

__all__ = [
    "INITIAL_STATE_ID",
    "AbortCheckpoint",
    "CheckpointCoordinator",
    "Commit",
    "CoordinatorMetrics",
    "CoordinatorStateError",
    "Decision",
    "DiscardAttempt",
    "FailJob",
    "FinishJob",
    "JobLayout",
    "Limits",
    "NotifyComplete",
    "NotifyFallback",
    "NotifySubsumed",
    "PendingCheckpoint",
    "Rule",
    "TriggerCheckpoint",
    "UnitPlan",
    "Verdict",
    "WriteMetadata",
    "evaluate",
]
