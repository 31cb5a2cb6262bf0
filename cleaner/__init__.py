"""Retention and garbage collection of checkpoint files: a pure planner and an executor.
Imports only `metadata` (DESIGN §3).

>>> from cleaner import plan_retention, scan, execute, retention_table  # the public surface
"""

from cleaner.plan import (
    Action,
    CheckpointDecision,
    FileDecision,
    ListedFile,
    PendingCheckpoint,
    Reason,
    RestoreBase,
    RetentionInputError,
    RetentionPlan,
    plan_retention,
)
from cleaner.run import CleanProgress, CleanReport, DeletionOutcome, DeletionStatus, execute, scan
from cleaner.views import retention_table, retention_totals

__all__ = [
    "Action",
    "CheckpointDecision",
    "CleanProgress",
    "CleanReport",
    "DeletionOutcome",
    "DeletionStatus",
    "FileDecision",
    "ListedFile",
    "PendingCheckpoint",
    "Reason",
    "RestoreBase",
    "RetentionInputError",
    "RetentionPlan",
    "execute",
    "plan_retention",
    "retention_table",
    "retention_totals",
    "scan",
]
