"""`regional clean ROOT [--job JOB] [--dry-run] [--json] [--num-retained N] [--policy FILE]
[--num-retained-events N]`: delete what no retained checkpoint needs, and old events.

Plans with `cleaner.run.scan` and deletes with `cleaner.run.execute`; prints one row per
checkpoint and per file with the action and its reason (`cleaner.views.retention_table`, plus
a `status` column after a real run), then which `num-retained` applied and why, and byte
totals. `--dry-run` deletes nothing. `num-retained` is the one the job recorded in its latest
checkpoint unless `--num-retained` or `--policy` says otherwise (`regional.cli.retention`);
with `--json` it is the first row (`row` = ``num-retained``).

The CLI cannot see a running job's coordinator, so a checkpoint directory without `_metadata`
that is newer than every completed checkpoint is kept as possibly in progress (reason
`pending`); the runtime's cleaner, which knows the live set, deletes aborted ones. Exit codes:
0 done, 1 something was refused (a metadata path outside the job root) or failed to delete,
2 bad input (no such root or job, `--num-retained` outside 1 to 1,000,000, a bad `--policy`
file).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import pyarrow as pa

from cleaner.plan import RetentionPlan
from cleaner.run import CleanReport, DeletionStatus, execute, scan
from cleaner.views import retention_table
from metadata.layout import DEFAULT_RETAINED_EVENTS
from metadata.retention import NumRetained
from metadata.storage import JobSelectionError, JobStorage
from regional.cli import retention
from regional.cli.render import print_table, say

__all__ = ["live_text", "register", "retention_output", "totals_text"]


def _at_least(least: int) -> Callable[[str], int]:
    """argparse type: an int of at least `least`."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"must be at least {least} (got {value})")
        return value

    return parse


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `clean`."""
    p = subparsers.add_parser(
        "clean",
        help="delete checkpoint files no retained checkpoint needs",
        description="Delete subsumed checkpoints, aborted and stale attempts and orphans under "
        "ROOT/JOB, keeping every file a retained checkpoint references. ROOT is a local path "
        "or a URI (file://, s3://, hdfs://, gs://).",
    )
    p.add_argument("root", metavar="ROOT", help="checkpoint root")
    p.add_argument("--job", help="job id (needed when ROOT holds several)")
    p.add_argument("--dry-run", action="store_true", help="show the plan, delete nothing")
    p.add_argument("--json", action="store_true", help="print a JSON array, one object per row")
    retention.add_arguments(p)
    p.add_argument(
        "--num-retained-events",
        type=_at_least(0),
        metavar="N",
        default=DEFAULT_RETAINED_EVENTS,
        help=f"newest event-log files to keep (default {DEFAULT_RETAINED_EVENTS})",
    )
    p.add_argument(
        "--max-workers",
        type=_at_least(1),
        metavar="N",
        default=8,
        help="deletions in flight at once (default 8; object stores like more)",
    )
    p.set_defaults(handler=run)


def _with_status(table: pa.Table, report: CleanReport | None) -> pa.Table:
    if report is None:
        return table
    status = {o.path: o for o in report.outcomes}
    col = []
    for row, path, action in zip(
        table.column("row").to_pylist(),
        table.column("path").to_pylist(),
        table.column("action").to_pylist(),
        strict=True,
    ):
        outcome = status.get(path) if row == "file" and action == "delete" else None
        col.append(outcome.status.value if outcome is not None else None)
    table = table.append_column(pa.field("status", pa.string()), pa.array(col, pa.string()))
    # A refused or failed deletion's error replaces the plan's detail.
    details = table.column("detail").to_pylist()
    for i, (row, path) in enumerate(
        zip(table.column("row").to_pylist(), table.column("path").to_pylist(), strict=True)
    ):
        o = status.get(path)
        if row == "file" and o is not None and o.detail:
            details[i] = o.detail
    idx = table.schema.get_field_index("detail")
    return table.set_column(idx, table.schema.field(idx), pa.array(details, pa.string()))


def live_text(live: int, physical: int) -> str:
    """The `live / physical bytes` line: how much of the kept state files kept checkpoints
    still reference (a merged file stays whole while any segment of it is referenced).

    >>> live_text(300, 400)
    'state files kept: live / physical bytes = 300 / 400 (75.0%)'
    """
    share = f"{100 * live / physical:.1f}%" if physical else "-"
    return f"state files kept: live / physical bytes = {live} / {physical} ({share})"


def totals_text(
    plan: RetentionPlan, report: CleanReport | None, num_retained: NumRetained | None = None
) -> str:
    """The lines under the plan table: which `num-retained` applied and why (when given), the
    retained checkpoints, kept and deleted bytes, and what file-level retention saves."""
    n_del = len(plan.deletions)
    lines = [] if num_retained is None else [retention.note(num_retained)]
    lines += [
        f"retained checkpoints: {', '.join(map(str, plan.retained_ids)) or 'none'}",
        f"kept: {len(plan.files) - n_del} files, {plan.kept_bytes} bytes; "
        f"{'to delete' if report is None else 'planned for deletion'}: {n_del} files, "
        f"{plan.deleted_bytes} bytes",
        f"file-level retention keeps {plan.saved_bytes} bytes less than keeping every "
        f"referenced checkpoint whole ({plan.whole_checkpoint_bytes} bytes)",
        live_text(plan.live_bytes, plan.physical_bytes),
    ]
    if report is not None:
        lines.append(
            f"deleted: {report.count(DeletionStatus.DELETED)} files, {report.deleted_bytes} "
            f"bytes; already gone: {report.count(DeletionStatus.ALREADY_GONE)}; skipped (in "
            f"progress): {report.count(DeletionStatus.SKIPPED_LIVE)}; refused: "
            f"{report.count(DeletionStatus.REFUSED)}; failed: {report.count(DeletionStatus.FAILED)}"
        )
    if plan.refused:
        lines.append(
            f"refused: {len(plan.refused)} metadata paths resolve outside the job root "
            "(rows 'refused'); the metadata holding them was tampered with"
        )
    return "\n".join(lines)


def retention_output(
    plan: RetentionPlan, report: CleanReport | None, num_retained: NumRetained, *, as_json: bool
) -> None:
    """Print the plan (and the run's outcomes): as a table with the totals under it, or as JSON
    rows led by the `num-retained` row."""
    table = _with_status(retention_table(plan), report)
    if as_json:
        first = pa.Table.from_pylist([retention.retention_row(num_retained)], schema=table.schema)
        table = pa.concat_tables([first, table])
    print_table(table, as_json=as_json)
    if not as_json:
        say(totals_text(plan, report, num_retained))


def run(args: argparse.Namespace) -> int:
    """Plan, print, and (unless --dry-run) delete; see the module docstring for exit codes."""
    retention.check_option(args)
    if not args.root.strip():  # not the working directory by accident
        raise JobSelectionError("checkpoint root is empty; give a local path or a URI")
    storage = JobStorage.open(args.root, args.job)
    num_retained = retention.in_force(args, lambda: retention.recorded_in(storage))
    plan = scan(
        storage,
        num_retained=num_retained.value,
        live_unknown=True,
        num_retained_events=args.num_retained_events,
    )
    report = None
    if not args.dry_run:
        report = execute(plan, storage, max_workers=args.max_workers)
    retention_output(plan, report, num_retained, as_json=args.json)
    failed = report is not None and not report.ok
    return 1 if plan.refused or failed else 0
