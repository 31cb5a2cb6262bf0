"""The report of one job as a single HTML page (`regional inspect ROOT report --html FILE`).

Two pure steps. `build_report` turns what storage holds — the completed checkpoints' metadata,
the event log and the cleaner's retention plan — into Arrow tables with fixed schemas, from the
inspector views (`metadata.inspect.checkpoints_table`, `show_table`, `metadata.events.
events_table`, `cleaner.views.retention_table` / `retention_totals`).
`regional.report.html.render_html` turns those tables into one self-contained page (inline CSS
and SVG, no script, every stored string escaped: job ids, causes and split names come from
files anyone with write access to the root may have written).

The module lives in `regional` because it reads both `metadata` and `cleaner` views, and only
`regional` may import both (DESIGN §3: `metadata` imports nothing of ours, `cleaner` only
`metadata`).

The event log is the history: the cleaner deletes the `_metadata` of subsumed checkpoints, so
usually only the retained checkpoints still have one. Where a checkpoint's `_metadata` is still
stored it wins (exact owner ids); otherwise the owner of a fallback unit is derived from the
events (the last completed checkpoint the unit was fresh in; unknown before the oldest event).

Large jobs: the grid shows the newest `GRID_CHECKPOINTS` attempts and, of the units that fell
back or failed in them, the `GRID_UNITS` with the most such cells; the page says how many
always-fresh and how many further units it leaves out.

>>> from metadata.events import CheckpointEvent, Outcome
>>> events = [
...     CheckpointEvent(job_id="j", checkpoint_id=1, kind=Outcome.GLOBAL, trigger_time_ms=0,
...         time_ms=20, fresh_units=3),
...     CheckpointEvent(job_id="j", checkpoint_id=2, kind=Outcome.REGIONAL, trigger_time_ms=100,
...         time_ms=130, fresh_units=2, fallback_units=(1,), causes={1: "declined: boom"},
...         unit_lag={1: 1}),
...     CheckpointEvent(job_id="j", checkpoint_id=3, kind=Outcome.ABORTED, trigger_time_ms=200,
...         time_ms=210, fresh_units=0, fallback_units=(0, 1), abort_rule="3c-failure-ratio",
...         message="checkpoint 3 aborted (rule 3c)", unit_lag={1: 1}),
... ]
>>> report = build_report([], events, job_id="j")
>>> report.grid.select(["checkpoint_id", "unit_id", "status", "owner_checkpoint_id"]).to_pylist()
[{'checkpoint_id': 2, 'unit_id': 1, 'status': 'fallback', 'owner_checkpoint_id': 1},
 {'checkpoint_id': 3, 'unit_id': 0, 'status': 'failed', 'owner_checkpoint_id': None},
 {'checkpoint_id': 3, 'unit_id': 1, 'status': 'failed', 'owner_checkpoint_id': None}]
>>> report.grid_units, report.always_fresh_units
((0, 1), 1)
>>> from regional.report.html import render_html
>>> page = render_html(report)
>>> page.startswith("<!doctype html>") and "3c-failure-ratio" in page
True
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import cast

import pyarrow as pa

from cleaner.model import RetentionPlan
from cleaner.views import RETENTION_SCHEMA, TOTALS_SCHEMA, retention_table, retention_totals
from metadata.events import CheckpointEvent, Outcome, events_table
from metadata.inspect import checkpoints_table, show_table
from metadata.model import CheckpointMetadata
from regional.errors import RegionalError
from regional.graph.unit_names import UnitNames
from regional.report.dead_letters import (
    DEAD_LETTER_VIEW_SCHEMA,
    REASON_COUNTS_SCHEMA,
    dead_letter_view,
    reason_counts,
)

__all__ = [
    "ABORTS_SCHEMA",
    "GRID_CHECKPOINTS",
    "GRID_SCHEMA",
    "GRID_UNITS",
    "LAG_HISTORY_SCHEMA",
    "STUCK_SCHEMA",
    "TIMELINE_SCHEMA",
    "Report",
    "ReportError",
    "build_report",
]

#: The newest checkpoint attempts the unit x checkpoint grid shows.
GRID_CHECKPOINTS = 50
#: At most this many units (those that fell back or failed most often) get a grid row.
GRID_UNITS = 100

_TS = pa.timestamp("ms", tz="UTC")

TIMELINE_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),  # global | regional | savepoint | aborted
        pa.field("trigger_time", _TS, nullable=False),
        pa.field("duration_ms", pa.int64(), nullable=False),
        pa.field("num_fallback_units", pa.int64(), nullable=False),  # fell back, or failed
        pa.field("abort_rule", pa.string()),
        pa.field("has_metadata", pa.bool_(), nullable=False),  # its _metadata is still stored
        pa.field("records_in", pa.int64()),  # from the event log (null without an event)
        pa.field("records_per_s", pa.float64()),  # records_in / duration
        pa.field("records_dead_lettered", pa.int64()),
    ]
)
STUCK_SCHEMA = pa.schema(
    [
        pa.field("unit_id", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),  # `unit 3 (events:3)`
        pa.field("since", _TS, nullable=False),
        pa.field("owner_checkpoint_id", pa.int64(), nullable=False),
        pa.field("fallbacks", pa.int64(), nullable=False),
        pa.field("cause", pa.string(), nullable=False),
    ]
)
#: Every stuck episode of the job: a unit stuck after one or more checkpoint attempts in a row.
EPISODE_SCHEMA = pa.schema(
    [
        pa.field("unit_id", pa.int64(), nullable=False),
        pa.field("name", pa.string(), nullable=False),
        pa.field("first_checkpoint_id", pa.int64(), nullable=False),
        pa.field("last_checkpoint_id", pa.int64(), nullable=False),
        pa.field("since", _TS, nullable=False),
        pa.field("cause", pa.string(), nullable=False),
        # "recovered at checkpoint N", "still stuck", or "until a driver restart"
        pa.field("ended", pa.string(), nullable=False),
    ]
)
#: Every driver restart the event log shows: as the new driver recorded it in its first
#: event (`metadata.events.DriverStart`), or, for events written before drivers recorded it,
#: where the outcome counters start again from zero.
RESTART_SCHEMA = pa.schema(
    [
        pa.field("first_checkpoint_id", pa.int64(), nullable=False),  # the new driver's first
        pa.field("restored_from", pa.int64()),  # the checkpoint restored (None: initial state)
        pa.field("discarded", pa.list_(pa.int64()), nullable=False),  # attempts thrown away
        pa.field("trigger_time", _TS, nullable=False),
        pa.field("notes", pa.list_(pa.string()), nullable=False),  # what the restore changed
    ]
)
#: Per checkpoint attempt that set records aside: dead letters and late records.
DEAD_LETTER_HISTORY_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("records_dead_lettered", pa.int64(), nullable=False),
        pa.field("records_late", pa.int64(), nullable=False),
    ]
)
#: Per checkpoint attempt that recorded a consumer lag: the records behind, in all and by source
#: (`CheckpointEvent.records_behind`), and the age of the oldest record not read yet over all
#: splits (`CheckpointEvent.seconds_behind`; null when no source told it).
BACKLOG_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("records_behind", pa.int64(), nullable=False),
        pa.field("by_source", pa.map_(pa.string(), pa.int64()), nullable=False),
        pa.field("seconds_behind", pa.float64()),
    ]
)
#: Per checkpoint attempt, what went wrong without failing it (`CheckpointEvent.warnings`: a
#: failed compaction, an operator whose input stalled while its state grew).
WARNINGS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("warning", pa.string(), nullable=False),
    ]
)
GRID_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("unit_id", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),  # fallback | failed
        pa.field("owner_checkpoint_id", pa.int64()),  # fallback: whose state it re-uses
        pa.field("cause", pa.string()),
    ]
)
LAG_HISTORY_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("max_lag", pa.int64(), nullable=False),
        pa.field("mean_lag", pa.float64(), nullable=False),
        pa.field("units_behind", pa.int64(), nullable=False),
    ]
)
ABORTS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("trigger_time", _TS, nullable=False),
        pa.field("abort_rule", pa.string()),
        pa.field("failed_units", pa.list_(pa.int64()), nullable=False),
        pa.field(
            "causes",
            pa.list_(pa.struct([("unit_id", pa.int64()), ("cause", pa.string())])),
            nullable=False,
        ),
        pa.field("message", pa.string(), nullable=False),
    ]
)


class ReportError(RegionalError):
    """The report cannot be written where it was asked for (bad usage: exit 2)."""

    exit_code = 2


#: Per completed checkpoint of an event-time job: the lowest watermark of a fresh unit, the unit
#: holding it, its lag behind the checkpoint's trigger (processing time), the late records.
WATERMARK_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("watermark_ms", pa.int64(), nullable=False),
        pa.field("watermark_unit", pa.int64()),
        pa.field("lag_ms", pa.int64()),  # trigger time - watermark (null at +/-infinity)
        pa.field("records_late", pa.int64(), nullable=False),
    ]
)


@dataclasses.dataclass(frozen=True)
class Report:
    """Everything the page shows, as tables (schemas above and `cleaner.views`).

    `timeline` and `lag` are oldest first; `grid` holds the fallback and failed cells of the
    `grid_checkpoints` x `grid_units` grid (every other cell is fresh, or empty in an aborted
    column); `always_fresh_units` were fresh in every grid column, `hidden_units` fell back or
    failed there but did not fit. `notes` are warnings shown at the top (e.g. skipped files);
    `retention_note` says which `num-retained` the plan used.
    """

    job_id: str
    num_units: int
    timeline: pa.Table
    grid: pa.Table
    grid_checkpoints: tuple[int, ...]
    grid_units: tuple[int, ...]
    always_fresh_units: int
    hidden_units: int
    lag: pa.Table
    aborts: pa.Table
    retention: pa.Table
    totals: pa.Table
    notes: tuple[str, ...] = ()
    retention_note: str = ""
    #: the units stuck after the newest event (`STUCK_SCHEMA`), and unit -> its name
    stuck: pa.Table = dataclasses.field(default_factory=STUCK_SCHEMA.empty_table)
    unit_names: dict[int, str] = dataclasses.field(default_factory=dict)
    watermarks: pa.Table = dataclasses.field(default_factory=WATERMARK_SCHEMA.empty_table)
    #: history: every stuck episode, driver restart and attempt that set records aside
    episodes: pa.Table = dataclasses.field(default_factory=EPISODE_SCHEMA.empty_table)
    restarts: pa.Table = dataclasses.field(default_factory=RESTART_SCHEMA.empty_table)
    dead_letters: pa.Table = dataclasses.field(
        default_factory=DEAD_LETTER_HISTORY_SCHEMA.empty_table
    )
    warnings: pa.Table = dataclasses.field(default_factory=WARNINGS_SCHEMA.empty_table)
    backlog: pa.Table = dataclasses.field(default_factory=BACKLOG_SCHEMA.empty_table)
    #: the committed dead letters (`regional.report.dead_letters`): per (operator, reason,
    #: error type) one sample row, the counts per (operator, reason), and a line saying why
    #: there is nothing to count (no dead-letter sink, a table that could not be read);
    #: `committed_dead_letters_read` is False when the caller read no dead-letter table
    committed_dead_letters: pa.Table = dataclasses.field(
        default_factory=DEAD_LETTER_VIEW_SCHEMA.empty_table
    )
    dead_letter_counts: pa.Table = dataclasses.field(
        default_factory=REASON_COUNTS_SCHEMA.empty_table
    )
    dead_letter_note: str = ""
    committed_dead_letters_read: bool = False


def _backlog(events: Iterable[CheckpointEvent]) -> pa.Table:
    """The consumer lag, in records and in time, after every event that recorded one
    (`BACKLOG_SCHEMA`), oldest first."""
    rows = []
    for e in events:
        if e.records_behind:
            by_source = {v: sum(s.values()) for v, s in sorted(e.records_behind.items())}
            ages = [t for s in e.seconds_behind.values() for t in s.values()]
            rows.append(
                {
                    "checkpoint_id": e.checkpoint_id,
                    "records_behind": sum(by_source.values()),
                    "by_source": list(by_source.items()),
                    "seconds_behind": max(ages, default=None),
                }
            )
    return pa.Table.from_pylist(rows, schema=BACKLOG_SCHEMA)


def _warnings(events: Iterable[CheckpointEvent]) -> pa.Table:
    """Every event's warnings (`WARNINGS_SCHEMA`), oldest first."""
    rows = [{"checkpoint_id": e.checkpoint_id, "warning": w} for e in events for w in e.warnings]
    return pa.Table.from_pylist(rows, schema=WARNINGS_SCHEMA)


def _watermarks(events: Iterable[CheckpointEvent]) -> pa.Table:
    """The events that carry a watermark (`WATERMARK_SCHEMA`), oldest first."""
    rows = [
        {
            "checkpoint_id": e.checkpoint_id,
            "watermark_ms": e.watermark_ms,
            "watermark_unit": e.watermark_unit,
            "lag_ms": (
                e.trigger_time_ms - e.watermark_ms if -(2**62) < e.watermark_ms < 2**62 else None
            ),
            "records_late": e.records_late,
        }
        for e in events
        if e.watermark_ms is not None
    ]
    return pa.Table.from_pylist(rows, schema=WATERMARK_SCHEMA)


# --- the tables ------------------------------------------------------------------------------


def _timeline(completed: Sequence[CheckpointMetadata], events: pa.Table) -> pa.Table:
    """Every attempt known from `_metadata` (`checkpoints_table`) or the event log
    (`events_table`). Duration: completion minus trigger from `_metadata`, else trigger to the
    outcome carried out. Kind: the event's (it knows savepoints and aborts), else the metadata's."""
    rows: dict[int, dict[str, object]] = {}
    for e in events.to_pylist():
        rows[e["checkpoint_id"]] = {
            "checkpoint_id": e["checkpoint_id"],
            "kind": e["kind"],
            "trigger_time": e["trigger_time"],
            "duration_ms": e["duration_ms"],
            "num_fallback_units": len(e["fallback_units"]),
            "abort_rule": e["abort_rule"],
            "has_metadata": False,
            "records_in": e["records_in"],
            "records_per_s": e["records_in"] / (e["duration_ms"] / 1000)
            if e["duration_ms"] > 0
            else None,
            "records_dead_lettered": e["records_dead_lettered"],
        }
    for c in checkpoints_table(completed, num_retained=1).to_pylist():
        row = rows.setdefault(
            c["checkpoint_id"],
            {
                "kind": c["kind"],
                "abort_rule": None,
                "records_in": None,
                "records_per_s": None,
                "records_dead_lettered": None,
            },
        )
        row.update(
            checkpoint_id=c["checkpoint_id"],
            trigger_time=c["trigger_time"],
            duration_ms=c["duration_ms"],
            num_fallback_units=c["num_fallback_units"],
            has_metadata=True,
        )
    return pa.Table.from_pylist([rows[k] for k in sorted(rows)], schema=TIMELINE_SCHEMA)


def _cells(
    completed: Sequence[CheckpointMetadata], events: Sequence[CheckpointEvent]
) -> dict[int, dict[int, tuple[str, int | None, str | None]]]:
    """checkpoint id -> unit -> (status, owner, cause) of every fallback and failed cell."""
    cells: dict[int, dict[int, tuple[str, int | None, str | None]]] = {}
    behind: dict[int, int | None] = {}  # unit -> owner, for units whose state is behind
    previous: int | None = None  # the newest completed checkpoint seen so far
    for e in sorted(events, key=lambda e: e.checkpoint_id):
        if e.kind is Outcome.ABORTED:
            cells[e.checkpoint_id] = {
                u: ("failed", None, e.causes.get(u) or e.message or None) for u in e.fallback_units
            }
            continue
        owners = {u: behind.get(u, previous) for u in e.fallback_units}
        cells[e.checkpoint_id] = {
            u: ("fallback", owners[u], e.causes.get(u)) for u in e.fallback_units
        }
        behind, previous = owners, e.checkpoint_id
    causes = {e.checkpoint_id: e.causes for e in events}
    for md in completed:  # `_metadata` knows the owners exactly
        own: dict[int, tuple[str, int | None, str | None]] = {}
        for s in show_table(md).to_pylist():
            if s["status"] == "fallback":
                u, owner = s["unit_id"], s["owner_checkpoint_id"]
                if u in own and own[u][1] is not None:
                    owner = min(owner, own[u][1])
                cause = causes.get(md.checkpoint_id, {}).get(u) or s["reason"]
                own[u] = ("fallback", owner, cause)
        cells[md.checkpoint_id] = own
    return cells


def _num_units(completed: Sequence[CheckpointMetadata], events: Sequence[CheckpointEvent]) -> int:
    """Units of the newest checkpoint: from its `_metadata`, else its event."""
    newest_md = max(completed, key=lambda c: c.checkpoint_id, default=None)
    newest_ev = max(
        (e for e in events if e.kind is not Outcome.ABORTED),
        key=lambda e: e.checkpoint_id,
        default=None,
    )
    newer_event = newest_ev is not None and (
        newest_md is None or newest_ev.checkpoint_id > newest_md.checkpoint_id
    )
    if newest_md is not None and not newer_event:
        return len({u.unit_id for u in newest_md.units} | newest_md.subtask_table.unit_ids())
    if newest_ev is not None:
        return newest_ev.fresh_units + len(newest_ev.fallback_units)
    return 0


def _lag_history(events: pa.Table, num_units: int) -> pa.Table:
    """Per event (`events_table`): the most and the mean checkpoints behind over all units."""
    rows = []
    for e in events.to_pylist():
        lags = [x["lag"] for x in e["unit_lag"]]
        rows.append(
            {
                "checkpoint_id": e["checkpoint_id"],
                "kind": e["kind"],
                "max_lag": e["max_unit_lag"],
                "mean_lag": sum(lags) / num_units if num_units else 0.0,
                "units_behind": sum(1 for x in lags if x > 0),
            }
        )
    return pa.Table.from_pylist(rows, schema=LAG_HISTORY_SCHEMA)


def _aborts(events: Iterable[CheckpointEvent]) -> pa.Table:
    """The aborted attempts, oldest first, with the rule, the failed units and why."""
    rows = [
        {
            "checkpoint_id": e.checkpoint_id,
            "trigger_time": e.trigger_time_ms,
            "abort_rule": e.abort_rule,
            "failed_units": list(e.fallback_units),
            "causes": [{"unit_id": u, "cause": c} for u, c in sorted(e.causes.items())],
            "message": e.message,
        }
        for e in events
        if e.kind is Outcome.ABORTED
    ]
    return pa.Table.from_pylist(rows, schema=ABORTS_SCHEMA)


def _stuck(events: Sequence[CheckpointEvent], names: Mapping[int, str]) -> pa.Table:
    """The units stuck after the newest event, with what they read, since when and why."""
    newest = events[-1] if events else None
    rows = [
        {
            "unit_id": s.unit_id,
            "name": names.get(s.unit_id, s.name),
            "since": s.since_ms,
            "owner_checkpoint_id": s.owner_checkpoint_id,
            "fallbacks": s.fallbacks,
            "cause": s.cause,
        }
        for s in (newest.stuck if newest is not None else ())
    ]
    return pa.Table.from_pylist(rows, schema=STUCK_SCHEMA)


def _outcomes(e: CheckpointEvent) -> int:
    """How many outcomes the driver that wrote `e` had carried out by then (its counters)."""
    return (
        e.regional_checkpoint_count
        + e.global_checkpoint_count
        + e.savepoint_count
        + sum(e.aborted_by_rule.values())
    )


def _restarts(events: Sequence[CheckpointEvent]) -> pa.Table:
    """The driver restarts in the event log (oldest first). A driver records how it started
    in its first event (`started`): the checkpoint it restored, and what the restore changed;
    the attempts after that checkpoint and before the new driver's first were discarded (their
    work is done again). The job's first start (the first event, from the initial state) is
    no restart. Events written before drivers recorded it: an event whose driver had carried
    out no more outcomes than the event before was written by a new driver (the counters start
    at zero after a restore); it is taken to have restored the newest checkpoint completed
    before, the attempts in between left no outcome."""
    rows = []
    completed: int | None = None
    for i, e in enumerate(events):
        prev = events[i - 1] if i else None
        if prev is not None and prev.kind is not Outcome.ABORTED:
            completed = prev.checkpoint_id
        if e.started is not None:
            restored = e.started.restored_from
            if prev is None and restored is None:
                continue  # the job's first start
            first = restored + 1 if restored is not None else 1
            notes = list(e.started.notes)
        elif prev is not None and _outcomes(e) <= _outcomes(prev):
            restored, first, notes = completed, prev.checkpoint_id + 1, []
        else:
            continue
        rows.append(
            {
                "first_checkpoint_id": e.checkpoint_id,
                "restored_from": restored,
                "discarded": list(range(first, e.checkpoint_id)),
                "trigger_time": e.trigger_time_ms,
                "notes": notes,
            }
        )
    return pa.Table.from_pylist(rows, schema=RESTART_SCHEMA)


def _episodes(
    events: Sequence[CheckpointEvent], restarts: pa.Table, names: Mapping[int, str]
) -> pa.Table:
    """Every stuck episode (`EPISODE_SCHEMA`): per unit, the attempts in a row after which it
    was stuck, and how the episode ended."""
    restarted = set(restarts.column("first_checkpoint_id").to_pylist())
    open_: dict[int, dict[str, object]] = {}
    rows: list[dict[str, object]] = []
    for e in events:
        stuck = {s.unit_id: s for s in e.stuck}
        for unit in [u for u in open_ if u not in stuck]:
            episode = open_.pop(unit)
            episode["ended"] = (
                "until a driver restart"
                if e.checkpoint_id in restarted
                else f"recovered at checkpoint {e.checkpoint_id}"
            )
            rows.append(episode)
        for unit, st in stuck.items():
            if unit not in open_:
                open_[unit] = {
                    "unit_id": unit,
                    "name": names.get(unit, st.name),
                    "first_checkpoint_id": e.checkpoint_id,
                    "since": st.since_ms,
                }
            open_[unit]["last_checkpoint_id"] = e.checkpoint_id
            open_[unit]["cause"] = st.cause
    for episode in open_.values():
        episode["ended"] = "still stuck"
        rows.append(episode)
    rows.sort(key=lambda r: (cast(int, r["first_checkpoint_id"]), cast(int, r["unit_id"])))
    return pa.Table.from_pylist(rows, schema=EPISODE_SCHEMA)


def _dead_letter_history(events: Sequence[CheckpointEvent]) -> pa.Table:
    """The attempts that set records aside (dead letters or late records), oldest first."""
    rows = [
        {
            "checkpoint_id": e.checkpoint_id,
            "kind": str(e.kind),
            "records_dead_lettered": e.records_dead_lettered,
            "records_late": e.records_late,
        }
        for e in events
        if e.records_dead_lettered or e.records_late
    ]
    return pa.Table.from_pylist(rows, schema=DEAD_LETTER_HISTORY_SCHEMA)


def _unit_names(
    events: Sequence[CheckpointEvent], names: UnitNames | None = None
) -> dict[int, str]:
    """unit -> its name in running text: by `names` (``orders[1] (unit 1)``,
    `regional.graph.unit_names`) when the caller has them, else from what the events recorded
    each unit reads (`unit 3 (events:3)`, newest wins); units no event named are left out."""
    out: dict[int, str] = {}
    for e in events:
        for u in e.unit_reads:
            out[u] = e.unit_label(u) if names is None else names.mention(u)
        for st in e.stuck:
            out[st.unit_id] = st.name if names is None else names.mention(st.unit_id)
    return out


def build_report(
    completed: Sequence[CheckpointMetadata],
    events: Sequence[CheckpointEvent],
    plan: RetentionPlan | None = None,
    *,
    job_id: str,
    notes: Sequence[str] = (),
    retention_note: str = "",
    names: UnitNames | None = None,
    dead_letters: pa.Table | None = None,
    dead_letter_exchanges: Mapping[str, str] | None = None,
    dead_letter_note: str = "",
) -> Report:
    """The report's tables from the completed checkpoints (ascending), the event log and the
    cleaner's plan (None: no retention section rows); units named by `names` (the newest
    checkpoint's, `regional.graph.unit_names`) when given, else as the events name them.
    `dead_letters`: the committed rows of the job's dead-letter tables (`DEAD_LETTER_SCHEMA`,
    as `regional inspect ROOT dead-letters` reads them; exchange partitions named by
    `dead_letter_exchanges`, operator -> exchange), grouped by `dead_letter_view`;
    `dead_letter_note`: why some or all could not be read (no dead-letter sink, a format
    regional does not read)."""
    completed = sorted(completed, key=lambda c: c.checkpoint_id)
    events = sorted(events, key=lambda e: e.checkpoint_id)
    ev_table = events_table(events)
    timeline = _timeline(completed, ev_table)
    num_units = _num_units(completed, events)
    columns = tuple(timeline.column("checkpoint_id").to_pylist()[-GRID_CHECKPOINTS:])
    cells = _cells(completed, events)
    shown = set(columns)
    counts: Counter[int] = Counter(u for cid in shown for u in cells.get(cid, {}))
    ranked = sorted(counts, key=lambda u: (-counts[u], u))
    units = tuple(sorted(ranked[:GRID_UNITS]))
    in_grid = set(units)
    grid_rows = [
        {
            "checkpoint_id": cid,
            "unit_id": u,
            "status": status,
            "owner_checkpoint_id": owner,
            "cause": cause,
        }
        for cid in columns
        for u, (status, owner, cause) in sorted(cells.get(cid, {}).items())
        if u in in_grid
    ]
    restarts = _restarts(events)
    unit_names = _unit_names(events, names)
    groups = (
        DEAD_LETTER_VIEW_SCHEMA.empty_table()
        if dead_letters is None
        else dead_letter_view(dead_letters, samples=1, exchanges=dead_letter_exchanges)
    )
    return Report(
        job_id=job_id,
        num_units=max(num_units, max(counts, default=-1) + 1),
        timeline=timeline,
        grid=pa.Table.from_pylist(grid_rows, schema=GRID_SCHEMA),
        grid_checkpoints=columns,
        grid_units=units,
        always_fresh_units=max(0, num_units - len(counts)),
        hidden_units=len(ranked) - len(units),
        lag=_lag_history(ev_table, num_units),
        aborts=_aborts(events),
        retention=RETENTION_SCHEMA.empty_table() if plan is None else retention_table(plan),
        totals=TOTALS_SCHEMA.empty_table() if plan is None else retention_totals(plan),
        notes=tuple(notes),
        retention_note=retention_note,
        stuck=_stuck(events, unit_names),
        unit_names=unit_names,
        watermarks=_watermarks(events),
        episodes=_episodes(events, restarts, unit_names),
        restarts=restarts,
        dead_letters=_dead_letter_history(events),
        warnings=_warnings(events),
        backlog=_backlog(events),
        committed_dead_letters=groups,
        dead_letter_counts=reason_counts(groups),
        dead_letter_note=dead_letter_note,
        committed_dead_letters_read=dead_letters is not None or bool(dead_letter_note),
    )
