"""The `retention` inspector view: a retention plan as an Arrow table, plus its byte totals.

`regional inspect ROOT retention` and `regional clean --dry-run` render these tables; the
schemas are fixed (`RETENTION_SCHEMA`, `TOTALS_SCHEMA`).

Rows of `retention_table`, in order: one per checkpoint (`row` = ``checkpoint``), one per
listed file in deletion-then-path order (``file``), one per metadata path refused because it
resolves outside the job root (``refused``), one per referenced file missing from storage
(``missing``).

>>> from cleaner.plan import ListedFile, plan_retention
>>> plan = plan_retention([], [ListedFile("shared/x", 5), ListedFile("notes.txt", 1)],
...     num_retained=1)
>>> retention_table(plan).select(["row", "path", "action", "reason"]).to_pylist()[0]
{'row': 'file', 'path': 'shared/x', 'action': 'delete', 'reason': 'orphan'}
>>> retention_totals(plan).to_pylist()[0]["deleted_bytes"]
5
"""

from __future__ import annotations

import pyarrow as pa

from cleaner.plan import Action, RetentionPlan

__all__ = ["RETENTION_SCHEMA", "TOTALS_SCHEMA", "retention_table", "retention_totals"]

RETENTION_SCHEMA = pa.schema(
    [
        pa.field("row", pa.string(), nullable=False),  # checkpoint | file | refused | missing
        pa.field("checkpoint_id", pa.int64()),
        pa.field("path", pa.string()),
        pa.field("action", pa.string(), nullable=False),  # keep | keep-files | delete | ...
        pa.field("reason", pa.string(), nullable=False),
        pa.field("kept_by", pa.list_(pa.int64())),  # kept checkpoints referencing it
        pa.field("units", pa.list_(pa.int64())),  # fallback units (checkpoint rows)
        pa.field("kept_bytes", pa.int64(), nullable=False),
        pa.field("deleted_bytes", pa.int64(), nullable=False),
        pa.field("detail", pa.string(), nullable=False),
    ]
)

TOTALS_SCHEMA = pa.schema(
    [
        pa.field("retained", pa.list_(pa.int64())),
        pa.field("subsumed", pa.list_(pa.int64())),
        pa.field("kept_files", pa.int64()),
        pa.field("kept_bytes", pa.int64()),
        pa.field("deleted_files", pa.int64()),
        pa.field("deleted_bytes", pa.int64()),
        pa.field("whole_checkpoint_bytes", pa.int64()),
        pa.field("saved_bytes", pa.int64()),
        pa.field("refused", pa.int64()),
        pa.field("missing", pa.int64()),
        pa.field("live_bytes", pa.int64()),  # referenced segments of kept state files
        pa.field("physical_bytes", pa.int64()),  # those files' sizes (DESIGN §4 rule 16)
    ]
)


def retention_table(plan: RetentionPlan) -> pa.Table:
    """Every keep/delete decision of `plan` with its reason (schema `RETENTION_SCHEMA`)."""
    rows: list[dict[str, object]] = []
    for c in plan.checkpoints:
        rows.append(
            {
                "row": "checkpoint",
                "checkpoint_id": c.checkpoint_id,
                "path": f"chk-{c.checkpoint_id}/",
                "action": c.action.value,
                "reason": c.reason.value,
                "kept_by": list(c.referenced_by),
                "units": list(c.units),
                "kept_bytes": c.kept_bytes,
                "deleted_bytes": c.deleted_bytes,
                "detail": c.detail,
            }
        )
    deletions = plan.deletions
    kept = [f for f in plan.files if f.action is not Action.DELETE]
    for f in (*deletions, *kept):
        deleted = f.action is Action.DELETE
        rows.append(
            {
                "row": "file",
                "checkpoint_id": f.checkpoint_id,
                "path": f.path,
                "action": f.action.value,
                "reason": f.reason.value,
                "kept_by": list(f.kept_by),
                "units": [],
                "kept_bytes": 0 if deleted else f.size,
                "deleted_bytes": f.size if deleted else 0,
                "detail": f.detail,
            }
        )
    for r in plan.refused:
        rows.append(
            {
                "row": "refused",
                "checkpoint_id": r.checkpoint_id,
                "path": r.path,
                "action": "refuse",
                "reason": "outside-root",
                "kept_by": [],
                "units": [],
                "kept_bytes": 0,
                "deleted_bytes": 0,
                "detail": r.error,
            }
        )
    for m in plan.missing:
        rows.append(
            {
                "row": "missing",
                "checkpoint_id": None,
                "path": m.path,
                "action": "report",
                "reason": "missing",
                "kept_by": list(m.referenced_by),
                "units": [],
                "kept_bytes": 0,
                "deleted_bytes": 0,
                "detail": "referenced by a kept checkpoint but not in storage; "
                "run `regional inspect ROOT validate`",
            }
        )
    return pa.Table.from_pylist(rows, schema=RETENTION_SCHEMA)


def retention_totals(plan: RetentionPlan) -> pa.Table:
    """One row of totals for `plan` (schema `TOTALS_SCHEMA`)."""
    deleted = sum(1 for f in plan.files if f.action is Action.DELETE)
    row = {
        "retained": list(plan.retained_ids),
        "subsumed": list(plan.subsumed_ids),
        "kept_files": len(plan.files) - deleted,
        "kept_bytes": plan.kept_bytes,
        "deleted_files": deleted,
        "deleted_bytes": plan.deleted_bytes,
        "whole_checkpoint_bytes": plan.whole_checkpoint_bytes,
        "saved_bytes": plan.saved_bytes,
        "refused": len(plan.refused),
        "missing": len(plan.missing),
        "live_bytes": plan.live_bytes,
        "physical_bytes": plan.physical_bytes,
    }
    return pa.Table.from_pylist([row], schema=TOTALS_SCHEMA)
