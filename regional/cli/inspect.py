"""`regional inspect ROOT [--job JOB] VIEW [--json]`: what the checkpoints of a job hold.

Views (each a `pyarrow.Table` from `metadata.inspect` / `metadata.validate` /
`cleaner.views` / `metadata.events`, rendered here): `checkpoints`, `show ID`, `refs`, `lag`,
`validate`, `summary`, `diff A B`, `retention` (what a clean would do), `events` (the job's
event log), `state` (each stateful operator's state size, `regional.report.state`), `report
--html FILE` (all of it as one HTML page, `regional.report.summary`; `-`:
stdout). `--job` may be left out when ROOT holds one job. `checkpoints` and `retention`
depend on `num-retained`: the one the job recorded in its latest checkpoint unless
`--num-retained N` or `--policy FILE` says otherwise (`regional.cli.retention`); the text output
says which applies and why (`--json` keeps the view's rows unchanged for `checkpoints`; the
`retention` rows start with a `num-retained` row). Exit codes: 0 fine, 1 `validate` found a
problem (or storage failed), 2 bad usage (no such root, job or checkpoint, `--num-retained`
outside 1 to 1,000,000, a bad `--policy` file, a directory that is not a job root).
Checkpoints whose metadata does not decode are reported on stderr (and as rows by `validate`),
and so are event files that do not.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import pyarrow as pa

from cleaner.run import scan
from metadata.errors import StorageError
from metadata.events import events_table, read_events
from metadata.exchange import backlog_table
from metadata.inspect import LAG_HELP, Inspector
from metadata.model import CheckpointMetadata, SubtaskState
from metadata.retention import recorded_num_retained
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from metadata.validate import validate_job, validate_table
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK, watermarks_table
from regional.cli import retention
from regional.cli.clean import retention_output
from regional.cli.dead_letter_tables import (
    committed_dead_letters,
    no_dead_letter_sink,
    operator_exchanges,
)
from regional.cli.render import print_table, say
from regional.dataflow.state_codec import StateCodec, StateDecodeError
from regional.graph.unit_names import UnitNames, split_text
from regional.report.dead_letters import dead_letter_view
from regional.report.html import human_span, render_html
from regional.report.state import state_view, stateful_subtasks
from regional.report.summary import ReportError, build_report
from regional.runtime.inspection import (
    checkpoint_unit_names,
    job_inspector,
    source_last_assigned,
)

__all__ = ["register"]

_VIEWS: dict[str, str] = {
    "checkpoints": "history, newest first, with references and retention",
    "show": "the units and subtasks of one checkpoint",
    "refs": "which checkpoint takes which units' state from which owner",
    "lag": "per unit and what it reads, how far its state is behind the newest checkpoint "
    "(checkpoint ids since its owner) and whether it is stuck",
    "validate": "check files, sizes, checksums and references; which checkpoint a restore uses",
    "summary": "counts and min/median/max of duration and size",
    "diff": "per subtask, what changed between two checkpoints",
    "retention": "what a clean would keep or delete, per checkpoint and file, with the reason",
    "events": "the event log: every checkpoint outcome with the coordinator's metrics",
    "report": "one self-contained HTML page: timeline, unit x checkpoint grid, lag, bytes, aborts",
    "exchange": "per keyed-exchange partition: the newest checkpoint's cursor and what is unread",
    "watermarks": "per event-time split and exchange partition: the watermark and what holds it",
    "dead-letters": "the committed dead letters by operator and reason (late, bad event time, "
    "undecodable, user function error), with samples and where each was read",
    "state": "per stateful operator of the newest checkpoint: the checkpoints owning its state, "
    "its bytes and keys (--subtasks: per subtask)",
}


def _common(suppress: bool) -> argparse.ArgumentParser:
    """Options accepted before and after VIEW (`SUPPRESS` keeps the view level from resetting
    what was given before it)."""
    default = argparse.SUPPRESS if suppress else None
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--job", default=default, help="job id (needed when ROOT holds several)")
    p.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if suppress else False,
        help="print a JSON array with one object per row",
    )
    retention.add_arguments(p, suppress=suppress)
    return p


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `inspect` with one subcommand per view."""
    parser = subparsers.add_parser(
        "inspect",
        parents=[_common(suppress=False)],
        help="inspect the checkpoints of a job",
        description="Show what the checkpoints under ROOT hold, reference and keep alive. "
        "ROOT is the checkpoint root: a local path or a URI (file://, s3://, hdfs://, gs://).",
    )
    parser.add_argument("root", metavar="ROOT", help="checkpoint root")
    views = parser.add_subparsers(dest="view", metavar="VIEW", required=True)
    for name, text in _VIEWS.items():
        view = views.add_parser(name, parents=[_common(suppress=True)], help=text, description=text)
        if name == "show":
            view.add_argument("checkpoint_id", metavar="ID", type=int, help="checkpoint id")
        elif name == "diff":
            view.add_argument("a", metavar="A", type=int, help="older checkpoint id")
            view.add_argument("b", metavar="B", type=int, help="newer checkpoint id")
        elif name == "report":
            view.add_argument(
                "--html",
                metavar="FILE",
                required=True,
                help="where to write the page ('-': standard output)",
            )
        elif name == "dead-letters":
            view.add_argument(
                "--samples",
                metavar="N",
                type=_samples,
                default=1,
                help="sample records per operator and reason, 1 to 100 (default 1)",
            )
        elif name == "state":
            view.add_argument(
                "--no-keys",
                action="store_true",
                help="bytes from the metadata only, without reading the state files",
            )
            view.add_argument(
                "--subtasks",
                action="store_true",
                help="one row per stateful subtask (its unit and owner checkpoint), not per "
                "operator",
            )
        elif name == "validate":
            view.add_argument(
                "--no-checksums",
                action="store_true",
                help="check existence and sizes only, without reading the state files",
            )
    parser.set_defaults(handler=inspect_command)


def inspect_command(args: argparse.Namespace) -> int:
    """Open the job under `args.root`, compute the chosen view and print it."""
    retention.check_option(args)
    storage = JobStorage.open(args.root, args.job)
    storage.check_job_root()  # not some other directory (`inspect /etc --job apt`): exit 2
    if args.view == "validate":
        return _validate(storage, args)
    if args.view == "retention":
        return _retention(storage, args)
    if args.view == "report":
        return _report(storage, args)
    if args.view == "exchange":
        return _exchange(storage, args)
    if args.view == "watermarks":
        return _watermarks(storage, args)
    if args.view == "dead-letters":
        return _dead_letters(storage, args)
    if args.view == "state":
        return _state(storage, args)
    if args.view == "events":
        events, problems = read_events(storage)
        for p in problems:
            say(f"warning: event {p.path} skipped: {p.problem}", file=sys.stderr)
        print_table(events_table(events), as_json=args.json)
        return 0
    store = CompletedCheckpointStore.load(storage)
    for d in store.damaged:
        say(f"warning: checkpoint {d.checkpoint_id} skipped: {d.error}", file=sys.stderr)
    num_retained = None
    if args.view == "checkpoints":
        num_retained = retention.in_force(
            args, lambda: recorded_num_retained(reversed(store.all()))
        )
    events = read_events(storage)[0] if args.view in ("show", "diff", "lag") else []
    newest = store.latest()
    # `lag` names the units and counts their consumer lag as the Python view does
    inspector = (
        job_inspector(storage, store=store, events=events)
        if args.view == "lag"
        else Inspector(
            store,
            num_retained=None if num_retained is None else num_retained.value,
            events=events,
        )
    )
    table: pa.Table
    if args.view == "show":
        table = inspector.show(args.checkpoint_id)
    elif args.view == "diff":
        table = inspector.diff(args.a, args.b)
    else:
        table = getattr(inspector, args.view)()
    if args.view == "lag" and newest is not None and not args.json:
        table = _lag_reads_for_people(table, checkpoint_unit_names(newest))
    if args.view == "lag" and not args.json:
        table = _time_behind_for_people(table)
    print_table(table, as_json=args.json)
    if args.view == "lag" and not args.json:
        say(LAG_HELP)
    if num_retained is not None and not args.json:
        say(retention.note(num_retained))
    return 0


def _lag_reads_for_people(lag: pa.Table, names: UnitNames) -> pa.Table:
    """The lag view with its `reads` in the sources' terms (``by-customer partition 1``,
    ``events partition 3``); `--json` keeps the split ids."""
    shown: list[str | None] = []
    for unit, reads in zip(
        lag.column("unit_id").to_pylist(), lag.column("reads").to_pylist(), strict=True
    ):
        if reads is None:
            shown.append(None)
            continue
        text, finished = reads, reads.endswith(" (finished)")
        if finished:
            text = text[: -len(" (finished)")]
        parts = ", ".join(names.reads_text(unit, split) for split in text.split(", "))
        shown.append(parts + (" (finished)" if finished else ""))
    i = lag.schema.get_field_index("reads")
    return lag.set_column(i, pa.field("reads", pa.string()), pa.array(shown, pa.string()))


def _time_behind_for_people(lag: pa.Table) -> pa.Table:
    """The lag view with `time_behind_ms` as `time_behind` and `seconds_behind` (the consumer
    lag in time) in people's units (`human_span`, as the report shows lag: ``1 d 17 h``,
    ``4.2 s``); `--json` keeps the milliseconds and seconds."""
    i = lag.schema.get_field_index("time_behind_ms")
    spans = [None if ms is None else human_span(ms) for ms in lag.column(i).to_pylist()]
    lag = lag.set_column(i, pa.field("time_behind", pa.string()), pa.array(spans, pa.string()))
    i = lag.schema.get_field_index("seconds_behind")
    ages = [None if s is None else human_span(round(s * 1000)) for s in lag.column(i).to_pylist()]
    return lag.set_column(i, pa.field("seconds_behind", pa.string()), pa.array(ages, pa.string()))


def _retention(storage: JobStorage, args: argparse.Namespace) -> int:
    """The cleaner's plan, without deleting anything (what `regional clean --dry-run` shows)."""
    num_retained = retention.in_force(args, lambda: retention.recorded_in(storage))
    plan = scan(storage, num_retained=num_retained.value, live_unknown=True)
    retention_output(plan, None, num_retained, as_json=args.json)
    return 1 if plan.refused else 0


def _report(storage: JobStorage, args: argparse.Namespace) -> int:
    """Every view the report needs, rendered to one HTML page (`regional.report.summary`)."""
    num_retained = retention.in_force(args, lambda: retention.recorded_in(storage))
    store = CompletedCheckpointStore.load(storage)
    events, problems = read_events(storage)
    plan = scan(storage, num_retained=num_retained.value, live_unknown=True)
    notes = [f"checkpoint {d.checkpoint_id} skipped: {d.error}" for d in store.damaged]
    notes += [f"event {p.path} skipped: {p.problem}" for p in problems]
    for note in notes:
        say(f"warning: {note}", file=sys.stderr)
    newest = store.latest()
    dead_letters, exchanges, note = None, None, ""
    if newest is not None:
        committed = committed_dead_letters(newest)
        dead_letters, exchanges = committed.rows, operator_exchanges(newest)
        note = "; ".join(committed.unread) if committed.tables else no_dead_letter_sink(newest)
    report = build_report(
        store.all(),
        events,
        plan,
        job_id=storage.job_id,
        notes=notes,
        retention_note=retention.note(num_retained),
        names=None if newest is None else checkpoint_unit_names(newest),
        dead_letters=dead_letters,
        dead_letter_exchanges=exchanges,
        dead_letter_note=note,
    )
    page = render_html(report)
    if args.html == "-":
        sys.stdout.write(page)
        return 0
    try:
        Path(args.html).write_text(page, encoding="utf-8")
    except OSError as exc:
        raise ReportError(
            f"cannot write the report to {args.html!r} ({exc.strerror or exc}); "
            "pass --html with a path in an existing, writable directory, or '-' for stdout"
        ) from None
    say(
        f"report of job {storage.job_id} written to {args.html} ({len(report.timeline)} "
        f"checkpoint attempts, {len(page.encode()) // 1024 + 1} KiB)"
    )
    return 0


def _newest(storage: JobStorage, missing: str) -> CheckpointMetadata | None:
    """The newest completed checkpoint, after a warning per damaged one skipped; None (and a
    line saying `missing`) when there is none."""
    store = CompletedCheckpointStore.load(storage)
    for d in store.damaged:
        say(f"warning: checkpoint {d.checkpoint_id} skipped: {d.error}", file=sys.stderr)
    newest = store.latest()
    if newest is None:
        say(f"no completed checkpoint: {missing}")
    return newest


def _exchange(storage: JobStorage, args: argparse.Namespace) -> int:
    """The committed backlog of every exchange partition after the newest checkpoint's cursors
    (`metadata.exchange.backlog_table`)."""
    newest = _newest(storage, "no reader cursors to measure a backlog from")
    if newest is None:
        return 0
    table = backlog_table(storage, newest)
    print_table(table, as_json=args.json)
    if not args.json:
        if table.num_rows == 0:
            say(f"checkpoint {newest.checkpoint_id} has no keyed exchange")
        else:
            records, size = sum(table["records"].to_pylist()), sum(table["bytes"].to_pylist())
            say(
                f"checkpoint {newest.checkpoint_id}: {records} record(s), {size} byte(s) "
                "committed and not read yet"
            )
    return 0


def _watermarks(storage: JobStorage, args: argparse.Namespace) -> int:
    """The watermarks of the newest checkpoint and what holds them back
    (`metadata.watermarks.watermarks_table`)."""
    newest = _newest(storage, "no watermark to show")
    if newest is None:
        return 0
    earlier = [c for c in CompletedCheckpointStore.load(storage).all() if c is not newest]
    # splits that finished before every earlier checkpoint: only a job reading with event time
    # (its events record a watermark) shows them
    timed = any(e.watermark_ms is not None for e in read_events(storage)[0])
    table = watermarks_table(
        storage, newest, earlier, source_last_assigned(newest) if timed else None
    )
    table = _watermarks_named(table, checkpoint_unit_names(newest), for_people=not args.json)
    print_table(table if args.json else _watermarks_for_people(table), as_json=args.json)
    if not args.json and table.num_rows == 0:
        say(f"checkpoint {newest.checkpoint_id} has no source read with event time")
    return 0


def watermark_ms_for_people(ms: int) -> str:
    """A `watermark_ms` in the text output: the milliseconds, or what the int64 ends stand
    for, `ended` (+inf: the input ended, every window may fire) and `none yet` (-inf: no
    record read). `--json` keeps the numbers.

    >>> [watermark_ms_for_people(ms) for ms in (1008700, 2**63 - 1, -(2**63))]
    ['1008700', 'ended', 'none yet']
    """
    if ms >= MAX_WATERMARK:
        return "ended"
    if ms <= MIN_WATERMARK:
        return "none yet"
    return str(ms)


_UNIT_MENTION = re.compile(r"\(unit (\d+)\)")


def _watermarks_named(table: pa.Table, names: UnitNames, *, for_people: bool) -> pa.Table:
    """The watermarks view with each row's unit name (`unit_name`, after `unit`); for people,
    exchange partitions in the reader's terms (``paid-left partition 1``) and the writers in
    `held_by` by their units' names (``writer 1 (files[1])``)."""
    units = table.column("unit").to_pylist()
    table = table.add_column(
        table.schema.get_field_index("unit") + 1,
        pa.field("unit_name", pa.string()),
        pa.array([names[u] if u >= 0 else None for u in units], pa.string()),
    )
    if not for_people:
        return table
    splits = [
        split_text(split, vertex) if kind == "exchange" else split
        for kind, vertex, split in zip(
            table.column("kind").to_pylist(),
            table.column("vertex").to_pylist(),
            table.column("split").to_pylist(),
            strict=True,
        )
    ]
    held = [
        _UNIT_MENTION.sub(lambda m: f"({names[int(m[1])]})", text)
        for text in table.column("held_by").to_pylist()
    ]
    table = table.set_column(
        table.schema.get_field_index("split"), pa.field("split", pa.string()), pa.array(splits)
    )
    return table.set_column(
        table.schema.get_field_index("held_by"), pa.field("held_by", pa.string()), pa.array(held)
    )


def _watermarks_for_people(table: pa.Table) -> pa.Table:
    """The watermarks view with `watermark_ms` as `watermark_ms_for_people` says it."""
    i = table.schema.get_field_index("watermark_ms")
    shown = [watermark_ms_for_people(ms) for ms in table.column(i).to_pylist()]
    return table.set_column(i, pa.field("watermark_ms", pa.string()), pa.array(shown, pa.string()))


def _samples(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 100:
        raise argparse.ArgumentTypeError(f"{text!r}: give a whole number from 1 to 100")
    return n


def _dead_letters(storage: JobStorage, args: argparse.Namespace) -> int:
    """The committed rows of the job's dead-letter sinks, as the newest checkpoint records
    them, counted by operator and reason (`regional.report.dead_letters`)."""
    newest = _newest(storage, "no dead-letter sink recorded yet")
    if newest is None:
        return 0
    committed = committed_dead_letters(newest)
    if not committed.tables:
        say(no_dead_letter_sink(newest))
        return 0
    for line in committed.unread:
        say(line)
    if committed.rows is None:
        return 0
    view = dead_letter_view(
        committed.rows, samples=args.samples, exchanges=operator_exchanges(newest)
    )
    print_table(view, as_json=args.json)
    if not args.json:
        where = ", ".join(t.location for t in committed.tables)
        say(
            f"{committed.rows.num_rows} dead letter(s) committed in {where}; a record late for "
            "several window operators, joins or drop_duplicates is counted once per operator "
            "that judged it"
        )
    return 0


def _state(storage: JobStorage, args: argparse.Namespace) -> int:
    """The state size of every stateful operator in the newest checkpoint
    (`regional.report.state`), per subtask with `--subtasks` (`--verbose` only adds
    tracebacks, as everywhere); keys counted from its state segments unless `--no-keys`."""
    newest = _newest(storage, "no state to show")
    if newest is None:
        return 0
    keys = None if args.no_keys else _key_counts(storage, newest)
    table = state_view(newest, keys, verbose=args.subtasks)
    print_table(table, as_json=args.json)
    if args.json:
        return 0
    size, n = sum(table["state_bytes"].to_pylist()), len(set(table["operator"].to_pylist()))
    line = f"checkpoint {newest.checkpoint_id}: {n} stateful operator(s), {size} byte(s) of state"
    if keys is None:
        line += "; keys not counted (--no-keys)"
    else:
        line += (
            "; keys: one per key and input split on a forward chain, one per key after a keyed "
            "exchange"
        )
        if any(k is None for k in keys.values()):
            line += "; '-': not counted (pickled state, or a segment that could not be read)"
    say(line)
    return 0


def _key_counts(
    storage: JobStorage, checkpoint: CheckpointMetadata
) -> dict[tuple[str, int], int | None]:
    """The keys of each stateful subtask of `checkpoint`, counted from its state segments
    (each physical file read once); a segment that cannot be read or decoded is a warning on
    stderr and no count."""
    codec = StateCodec()  # key_count needs no declared types and no secret
    by_file: dict[str, list[SubtaskState]] = {}
    for s in stateful_subtasks(checkpoint):
        by_file.setdefault(s.handles[0].path, []).append(s)
    counts: dict[tuple[str, int], int | None] = {}
    for subtasks in by_file.values():
        whole: dict[str, bytes] = {}  # this file's bytes, read once for its segments
        for s in subtasks:
            where = ", ".join(storage.describe(h.path) for h in s.handles)
            try:
                data = b"".join(
                    storage.read_segment(
                        h, checkpoint_id=checkpoint.checkpoint_id, whole_files=whole
                    )
                    for h in s.handles
                )
                counts[s.vertex_id, s.index] = codec.key_count(
                    data, operator=s.vertex_id, source=where
                )
            except (StorageError, StateDecodeError) as exc:
                say(
                    f"warning: keys of operator {s.vertex_id!r} subtask {s.index} not counted: "
                    f"{exc}; run `regional inspect ROOT validate` to check the checkpoint",
                    file=sys.stderr,
                )
                counts[s.vertex_id, s.index] = None
    return counts


def _validate(storage: JobStorage, args: argparse.Namespace) -> int:
    report = validate_job(storage, verify_checksums=not args.no_checksums)
    print_table(validate_table(report), as_json=args.json)
    for warning in report.warnings:
        say(f"warning: {warning}", file=sys.stderr)
    if report.restore_checkpoint_id is not None:
        line = f"a restore would use checkpoint {report.restore_checkpoint_id}"
    elif report.checked:
        line = "no checkpoint is restorable"
    else:
        line = "no completed checkpoint; a restore would start from the initial state"
    n = len(report.problems)
    line += f" ({len(report.checked)} checked, {n} problem{'' if n == 1 else 's'})"
    say(line, file=sys.stderr if args.json else sys.stdout)
    return 1 if report.problems else 0
