"""Retention and garbage collection of checkpoint files: a pure planner and an executor.
Imports only `metadata` (DESIGN §3). The planner is imported here; the executor and the views
(which touch storage and Arrow) on first use.

>>> from cleaner import plan_retention, scan, execute, retention_table  # the public surface
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cleaner.plan import (
    Action,
    CheckpointDecision,
    FileDecision,
    ListedFile,
    PendingFiles,
    Reason,
    RestoreBase,
    RetentionInputError,
    RetentionPlan,
    plan_retention,
)

if TYPE_CHECKING:
    from cleaner.run import (
        CleanProgress,
        CleanReport,
        DeletionOutcome,
        DeletionStatus,
        execute,
        scan,
    )
    from cleaner.views import retention_table, retention_totals

_LAZY = {
    **dict.fromkeys(
        ("CleanProgress", "CleanReport", "DeletionOutcome", "DeletionStatus", "execute", "scan"),
        "cleaner.run",
    ),
    **dict.fromkeys(("retention_table", "retention_totals"), "cleaner.views"),
}

__all__ = [
    "Action",
    "CheckpointDecision",
    "CleanProgress",
    "CleanReport",
    "DeletionOutcome",
    "DeletionStatus",
    "FileDecision",
    "ListedFile",
    "PendingFiles",
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


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'cleaner' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
