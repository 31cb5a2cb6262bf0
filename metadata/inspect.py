"""Inspector views: what every checkpoint holds and references, as `pyarrow.Table`s.

About 500 lines: one function and one fixed schema per view, which read best side by side.

Each view is a pure function of the completed checkpoints (ascending by id) with a fixed schema
(the `*_SCHEMA` constants, documented on each function); the CLI (`regional inspect`) and
`metadata.spark` only render them. `Inspector` bundles a store and `num_retained`, pyiceberg
style (`Inspector(store).checkpoints()`); `validate` lives in `metadata.validate` because it
reads files. Which checkpoints are retained is decided by `metadata.retention`, the rule the
coordinator and the cleaner use; by default with the `num-retained` the job recorded.

"Owner" of a subtask's state in checkpoint Y: `ref_checkpoint_id` for a fallback subtask, else Y.

>>> from metadata.model import CheckpointMetadata, SubtaskState, UnitState
>>> c1 = CheckpointMetadata(checkpoint_id=1, job_id="j", kind="global", trigger_time_ms=0,
...     completion_time_ms=40, subtasks=(SubtaskState("map", 0, 0), SubtaskState("map", 1, 1)))
>>> c2 = CheckpointMetadata(checkpoint_id=2, job_id="j", kind="regional", trigger_time_ms=100,
...     completion_time_ms=130, units=(UnitState(1, 1, "timeout"),),
...     subtasks=(SubtaskState("map", 0, 0), SubtaskState("map", 1, 1, ref_checkpoint_id=1)))
>>> t = checkpoints_table([c1, c2], num_retained=1)
>>> t.select(["checkpoint_id", "kind", "retained", "referenced_by"]).to_pylist()
[{'checkpoint_id': 2, 'kind': 'regional', 'retained': True, 'referenced_by': []},
 {'checkpoint_id': 1, 'kind': 'global', 'retained': False, 'referenced_by': [2]}]
>>> lag_table([c1, c2]).select(["unit_id", "checkpoints_behind", "time_behind_ms"]).to_pylist()
[{'unit_id': 0, 'checkpoints_behind': 0, 'time_behind_ms': 0},
 {'unit_id': 1, 'checkpoints_behind': 1, 'time_behind_ms': 100}]
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa

from metadata.errors import MetadataError
from metadata.events import CheckpointEvent, Outcome
from metadata.model import CheckpointKind, CheckpointMetadata, ForcedGlobal, SubtaskState
from metadata.retention import DEFAULT_NUM_RETAINED, NumRetained, recorded_num_retained, retain
from metadata.store import CompletedCheckpointStore

__all__ = [
    "CHECKPOINTS_SCHEMA",
    "DEFAULT_NUM_RETAINED",
    "DIFF_SCHEMA",
    "LAG_HELP",
    "LAG_SCHEMA",
    "REFS_SCHEMA",
    "REGIONAL_DISABLED_REASON",
    "SHOW_SCHEMA",
    "SUMMARY_SCHEMA",
    "CheckpointNotFoundError",
    "Inspector",
    "InspectorInputError",
    "checkpoints_table",
    "consumer_lag",
    "diff_table",
    "fallback_unit_ids",
    "is_forced_global",
    "lag_table",
    "owner_of",
    "records_behind",
    "referenced_by",
    "refs_table",
    "retained_ids",
    "show_table",
    "summary_table",
    "unit_ids",
]

_TS = pa.timestamp("ms", tz="UTC")
_IDS = pa.list_(pa.int64())

CHECKPOINTS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("trigger_time", _TS, nullable=False),
        pa.field("complete_time", _TS, nullable=False),
        pa.field("duration_ms", pa.int64(), nullable=False),
        pa.field("num_units", pa.int64(), nullable=False),
        pa.field("num_fallback_units", pa.int64(), nullable=False),
        pa.field("num_subtasks", pa.int64(), nullable=False),
        pa.field("num_fallback_subtasks", pa.int64(), nullable=False),
        pa.field("oldest_ref_checkpoint_id", pa.int64()),
        pa.field("state_bytes", pa.int64(), nullable=False),
        pa.field("retained", pa.bool_(), nullable=False),
        pa.field("referenced_by", _IDS, nullable=False),
        pa.field("reasons", pa.list_(pa.string()), nullable=False),
    ]
)
SHOW_SCHEMA = pa.schema(
    [
        pa.field("unit_id", pa.int64(), nullable=False),
        pa.field("vertex_id", pa.string(), nullable=False),
        pa.field("subtask_index", pa.int64(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("owner_checkpoint_id", pa.int64(), nullable=False),
        pa.field("attempt", pa.int64(), nullable=False),
        pa.field("files", pa.list_(pa.string()), nullable=False),
        pa.field("state_bytes", pa.int64(), nullable=False),
        pa.field("num_splits", pa.int64(), nullable=False),
        pa.field("num_committables", pa.int64(), nullable=False),
        pa.field("reason", pa.string()),
    ]
)
REFS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("owner_checkpoint_id", pa.int64(), nullable=False),
        pa.field("units", _IDS, nullable=False),
        pa.field("num_subtasks", pa.int64(), nullable=False),
        pa.field("state_bytes", pa.int64(), nullable=False),
        pa.field("owner_completed", pa.bool_(), nullable=False),
    ]
)
LAG_SCHEMA = pa.schema(
    [
        pa.field("unit_id", pa.int64(), nullable=False),
        pa.field("unit_name", pa.string()),
        pa.field("reads", pa.string()),
        pa.field("records_behind", pa.int64()),
        pa.field("seconds_behind", pa.float64()),
        pa.field("status", pa.string(), nullable=False),
        pa.field("owner_checkpoint_id", pa.int64(), nullable=False),
        pa.field("checkpoints_behind", pa.int64(), nullable=False),
        pa.field("time_behind_ms", pa.int64()),
        pa.field("stuck_since", pa.timestamp("ms", tz="UTC")),
        pa.field("reason", pa.string()),
    ]
)
#: What the columns of the `lag` view mean (printed under it by `regional inspect ROOT lag`).
LAG_HELP = (
    "checkpoints_behind: checkpoint ids since the checkpoint that wrote the unit's state "
    "(its owner), aborted attempts included: the unit committed nothing in any of them; the "
    "same number as the events' unit_lag and the regional_unit_lag metric. time_behind: the "
    "newest checkpoint's trigger time minus its owner's (time_behind_ms with --json). status: "
    "fresh, fallback, or stuck (over max-unit-fallbacks; stuck_since: when, on the driver's "
    "clock, from the event log). records_behind: consumer lag, the records between where its "
    "sources read next and their splits' ends; seconds_behind: the age of the oldest of them "
    "at the latest checkpoint (a Kafka record's timestamp, a file's modification time)."
)
SUMMARY_SCHEMA = pa.schema(
    [
        pa.field("metric", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("min", pa.int64()),
        pa.field("median", pa.float64()),
        pa.field("max", pa.int64()),
    ]
)
DIFF_SCHEMA = pa.schema(
    [
        pa.field("vertex_id", pa.string(), nullable=False),
        pa.field("subtask_index", pa.int64(), nullable=False),
        pa.field("unit_id", pa.int64()),
        pa.field("change", pa.string(), nullable=False),
        pa.field("owner_a", pa.int64()),
        pa.field("owner_b", pa.int64()),
        pa.field("state_bytes_a", pa.int64()),
        pa.field("state_bytes_b", pa.int64()),
    ]
)


def _table(rows: Sequence[Mapping[str, object]], schema: pa.Schema) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=schema)


def owner_of(md: CheckpointMetadata, subtask: SubtaskState) -> int:
    """The checkpoint that physically wrote `subtask`'s state in `md`."""
    ref = subtask.ref_checkpoint_id
    return md.checkpoint_id if ref is None else ref


def unit_ids(md: CheckpointMetadata) -> set[int]:
    """Every unit of `md` (from its unit records and its subtasks)."""
    return {u.unit_id for u in md.units} | md.subtask_table.unit_ids()


def fallback_unit_ids(md: CheckpointMetadata) -> set[int]:
    """The units of `md` that fell back (from its unit records and its subtasks)."""
    return {u.unit_id for u in md.fallback_units} | md.subtask_table.unit_ids(fallback=True)


#: The reason the coordinator records when regional checkpoints are off: global by
#: configuration, not forced.
REGIONAL_DISABLED_REASON = "regional checkpoints are disabled"


def is_forced_global(md: CheckpointMetadata) -> bool:
    """A global checkpoint every unit had to be fresh in (a staleness limit, the end of bounded
    input, a restore, a savepoint): `forced_global` says why (format 1.2 on); configuration
    (regional checkpoints off) does not count. Older metadata is judged by its reasons: an
    ordinary global checkpoint records none, one taken because regional checkpoints are off
    only `REGIONAL_DISABLED_REASON`.

    >>> from metadata.model import CheckpointMetadata
    >>> def md(*reasons, forced=()):
    ...     return CheckpointMetadata(checkpoint_id=1, job_id="j", kind="global",
    ...         trigger_time_ms=0, completion_time_ms=0, reasons=reasons, forced_global=forced)
    >>> is_forced_global(md()), is_forced_global(md(forced=(ForcedGlobal.REGIONAL_DISABLED,)))
    (False, False)
    >>> is_forced_global(md("after 10 consecutive regional checkpoints",
    ...     forced=(ForcedGlobal.CONSECUTIVE_REGIONAL,)))
    True
    >>> is_forced_global(md("unit 3 fell back in 3 consecutive checkpoints"))  # format 1.1
    True
    """
    if md.forced_global:  # format 1.2 on: the coordinator recorded why
        return any(f is not ForcedGlobal.REGIONAL_DISABLED for f in md.forced_global)
    return md.kind == CheckpointKind.GLOBAL and any(  # older metadata: its reason texts
        r != REGIONAL_DISABLED_REASON for r in md.reasons
    )


def retained_ids(checkpoints: Sequence[CheckpointMetadata], num_retained: int) -> frozenset[int]:
    """The newest `num_retained` non-savepoint checkpoints plus every savepoint (user-owned):
    `metadata.retention.retain(...).kept`."""
    return retain(checkpoints, num_retained).kept


def referenced_by(
    checkpoints: Iterable[CheckpointMetadata], among: Iterable[int] | None = None
) -> dict[int, tuple[int, ...]]:
    """owner id -> ids (ascending) of the checkpoints in `among` (default: all) that refer to it."""
    keep = None if among is None else set(among)
    refs: dict[int, set[int]] = defaultdict(set)
    for md in checkpoints:
        if keep is None or md.checkpoint_id in keep:
            for owner in md.referenced_checkpoint_ids:
                refs[owner].add(md.checkpoint_id)
    return {owner: tuple(sorted(ids)) for owner, ids in refs.items()}


def checkpoints_table(
    checkpoints: Sequence[CheckpointMetadata], *, num_retained: int | None = None
) -> pa.Table:
    """History, newest first: one row per completed checkpoint.

    Columns (`CHECKPOINTS_SCHEMA`): `checkpoint_id`; `kind` (global, regional, savepoint);
    `trigger_time`, `complete_time` (UTC); `duration_ms`; `num_units`, `num_fallback_units`;
    `num_subtasks`, `num_fallback_subtasks`; `oldest_ref_checkpoint_id` (null if nothing fell
    back); `state_bytes` (fresh and fallback state it needs); `retained` (among the newest
    `num_retained`, or a savepoint); `referenced_by` (retained checkpoints that refer to it);
    `reasons` (why regional, why forced global). `num_retained` None: the value the newest
    checkpoint recorded (`metadata.retention.recorded_num_retained`).
    """
    if num_retained is None:
        num_retained = recorded_num_retained(reversed(checkpoints)).value
    kept = retain(checkpoints, num_retained)
    retained, refs = kept.kept, kept.referenced_by
    rows = []
    for md in sorted(checkpoints, key=lambda c: c.checkpoint_id, reverse=True):
        rows.append(
            {
                "checkpoint_id": md.checkpoint_id,
                "kind": str(md.kind),
                "trigger_time": md.trigger_time_ms,
                "complete_time": md.completion_time_ms,
                "duration_ms": md.completion_time_ms - md.trigger_time_ms,
                "num_units": len(unit_ids(md)),
                "num_fallback_units": len(fallback_unit_ids(md)),
                "num_subtasks": len(md.subtasks),
                "num_fallback_subtasks": md.subtask_table.fallback_count(),
                "oldest_ref_checkpoint_id": md.oldest_ref_checkpoint_id,
                "state_bytes": md.state_bytes,
                "retained": md.checkpoint_id in retained,
                "referenced_by": list(refs.get(md.checkpoint_id, ())),
                "reasons": list(md.reasons),
            }
        )
    return _table(rows, CHECKPOINTS_SCHEMA)


def show_table(md: CheckpointMetadata) -> pa.Table:
    """One checkpoint's subtasks, by unit: one row per subtask.

    Columns (`SHOW_SCHEMA`): `unit_id`, `vertex_id`, `subtask_index`; `status` (fresh |
    fallback); `owner_checkpoint_id` (the checkpoint that wrote the state); `attempt`; `files`
    (distinct state files, relative to the job root); `state_bytes`; `num_splits`;
    `num_committables`; `reason` (why the unit fell back, null when fresh).
    """
    reasons = {u.unit_id: u.reason for u in md.units}
    rows = []
    for s in sorted(md.subtasks, key=lambda s: (s.unit_id, s.vertex_id, s.index)):
        rows.append(
            {
                "unit_id": s.unit_id,
                "vertex_id": s.vertex_id,
                "subtask_index": s.index,
                "status": "fallback" if s.is_fallback else "fresh",
                "owner_checkpoint_id": owner_of(md, s),
                "attempt": s.attempt,
                "files": list(dict.fromkeys(h.path for h in s.handles)),
                "state_bytes": s.state_bytes,
                "num_splits": len(s.split_states),
                "num_committables": len(s.committables),
                "reason": reasons.get(s.unit_id) if s.is_fallback else None,
            }
        )
    return _table(rows, SHOW_SCHEMA)


def refs_table(checkpoints: Sequence[CheckpointMetadata]) -> pa.Table:
    """Who keeps whom alive: one row per (checkpoint, owner it refers to), newest first.

    Columns (`REFS_SCHEMA`): `checkpoint_id`; `owner_checkpoint_id`; `units` (the units whose
    state it takes from that owner); `num_subtasks`; `state_bytes`; `owner_completed` (the
    owner's own metadata is still present; when false only its referenced files remain).
    """
    present = {c.checkpoint_id for c in checkpoints}
    rows = []
    for md in sorted(checkpoints, key=lambda c: c.checkpoint_id, reverse=True):
        by_owner: dict[int, list[SubtaskState]] = defaultdict(list)
        for s in md.subtasks:
            if s.ref_checkpoint_id is not None:
                by_owner[s.ref_checkpoint_id].append(s)
        for owner in sorted(by_owner):
            subtasks = by_owner[owner]
            rows.append(
                {
                    "checkpoint_id": md.checkpoint_id,
                    "owner_checkpoint_id": owner,
                    "units": sorted({s.unit_id for s in subtasks}),
                    "num_subtasks": len(subtasks),
                    "state_bytes": sum(s.state_bytes for s in subtasks),
                    "owner_completed": owner in present,
                }
            )
    return _table(rows, REFS_SCHEMA)


def lag_table(
    checkpoints: Sequence[CheckpointMetadata],
    events: Sequence[CheckpointEvent] = (),
    last_assigned: Mapping[tuple[str, int], Sequence[str]] | None = None,
    names: Mapping[int, str] | None = None,
) -> pa.Table:
    """Per unit of the newest checkpoint: how far its state is behind (empty without one).

    One notion of lag (`LAG_HELP`): checkpoint ids since the unit's owner. Columns
    (`LAG_SCHEMA`): `unit_id`; `unit_name` (from `names`, unit -> its name by the one naming
    rule, `regional.graph.unit_names`, which the caller derives from the newest checkpoint;
    null without it); `reads` (the splits in its state; once they finished, the ones it read
    last, marked ``(finished)``: from an older checkpoint or an event that still names them,
    else from `last_assigned`, (source vertex, subtask index) -> the splits its enumerator
    gave it last, which the caller decodes from the newest checkpoint's coordinator
    snapshots); `records_behind` (`records_behind`: its consumer lag) and `seconds_behind`
    (the same in time, `consumer_lag`: the age of its oldest unread record); `status` (fresh |
    fallback | stuck: in the stuck list of the newest event, `events` in checkpoint order);
    `owner_checkpoint_id`; `checkpoints_behind` (newest id minus owner id, so aborted
    attempts count too); `time_behind_ms` (newest trigger time minus the owner's; null when
    the owner's metadata is gone); `stuck_since`; `reason` (why it fell back in the newest
    one).
    """
    ordered = sorted(checkpoints, key=lambda c: c.checkpoint_id)
    if not ordered:
        return _table([], LAG_SCHEMA)
    newest = ordered[-1]
    by_id = {c.checkpoint_id: c for c in ordered}
    assigned = dict(last_assigned or {})
    owners: dict[int, int] = {}
    reads: dict[int, set[str]] = defaultdict(set)
    for s in newest.subtasks:
        owners[s.unit_id] = min(owners.get(s.unit_id, newest.checkpoint_id), owner_of(newest, s))
        reads[s.unit_id].update(split.split_id for split in s.split_states)
    for u in newest.units:
        owners.setdefault(u.unit_id, u.ref_checkpoint_id or newest.checkpoint_id)
    reasons = {u.unit_id: u.reason for u in newest.units}
    last = events[-1] if events else None
    stuck = (
        {s.unit_id: s for s in last.stuck}
        if last is not None and last.checkpoint_id >= newest.checkpoint_id
        else {}
    )
    finished = _finished_reads(
        ordered,
        events,
        [u for u in owners if not reads.get(u)],
        _units_last_assigned(newest, assigned),
    )
    behind, ages = consumer_lag(newest, events, assigned)
    rows = []
    for unit in sorted(owners):
        owner = owners[unit]
        owner_md = by_id.get(owner)
        st = stuck.get(unit)
        splits = sorted(reads.get(unit, ())) or (list(st.splits) if st is not None else [])
        text = ", ".join(splits) or None
        if text is None and finished.get(unit):
            text = f"{', '.join(finished[unit])} (finished)"
        rows.append(
            {
                "unit_id": unit,
                "unit_name": None if names is None else names.get(unit),
                "reads": text,
                "records_behind": behind.get(unit),
                "seconds_behind": ages.get(unit),
                "status": "fresh"
                if owner == newest.checkpoint_id
                else "stuck"
                if st is not None
                else "fallback",
                "owner_checkpoint_id": owner,
                "checkpoints_behind": newest.checkpoint_id - owner,
                "time_behind_ms": None
                if owner_md is None
                else newest.trigger_time_ms - owner_md.trigger_time_ms,
                "stuck_since": None if st is None else st.since_ms,
                "reason": reasons.get(unit) if owner != newest.checkpoint_id else None,
            }
        )
    return _table(rows, LAG_SCHEMA)


def records_behind(
    checkpoint: CheckpointMetadata,
    events: Sequence[CheckpointEvent],
    last_assigned: Mapping[tuple[str, int], Sequence[str]] | None = None,
) -> dict[int, int]:
    """Per unit of `checkpoint` that reads a source split, its consumer lag: the records
    between where its sources' next read starts and their splits' ends, as the newest event
    that recorded one says (`CheckpointEvent.records_behind`: live, the latest epoch; after
    the job ended, the last one). A unit's splits are those in its state and, for a source
    subtask whose splits finished, those in `last_assigned` ((vertex, index) -> the splits its
    enumerator gave it last). Units that read no source split (an exchange reader's), or whose
    sources do not say (older events), are left out."""
    return consumer_lag(checkpoint, events, last_assigned)[0]


def consumer_lag(
    checkpoint: CheckpointMetadata,
    events: Sequence[CheckpointEvent],
    last_assigned: Mapping[tuple[str, int], Sequence[str]] | None = None,
) -> tuple[dict[int, int], dict[int, float]]:
    """Per unit, its consumer lag in records (`records_behind`) and in time: the age of the
    oldest record its splits have not read yet at that event's time, the largest of their
    `CheckpointEvent.seconds_behind` (units none of whose splits' sources tell it left out)."""
    newest = next((e for e in reversed(events) if e.records_behind), None)
    behind = {} if newest is None else newest.records_behind
    ages = {} if newest is None else newest.seconds_behind
    splits: dict[int, set[tuple[str, str]]] = defaultdict(set)
    units: dict[tuple[str, int], int] = {}
    for s in checkpoint.subtasks:
        units[s.vertex_id, s.index] = s.unit_id
        if s.vertex_id in behind:
            splits[s.unit_id].update((s.vertex_id, x.split_id) for x in s.split_states)
    for (vertex, index), assigned in (last_assigned or {}).items():
        unit = units.get((vertex, index))
        if unit is not None and vertex in behind:
            splits[unit].update((vertex, split) for split in assigned)
    out: dict[int, int] = {}
    seconds: dict[int, float] = {}
    for unit, held in splits.items():
        known = [behind[v][x] for v, x in held if x in behind[v]]
        if known:
            out[unit] = sum(known)
        timed = [ages[v][x] for v, x in held if x in ages.get(v, {})]
        if timed:
            seconds[unit] = max(timed)
    return out, seconds


def _units_last_assigned(
    checkpoint: CheckpointMetadata, last_assigned: Mapping[tuple[str, int], Sequence[str]]
) -> dict[int, list[str]]:
    """`last_assigned` per unit of `checkpoint` (a unit may hold several source subtasks)."""
    units = {(s.vertex_id, s.index): s.unit_id for s in checkpoint.subtasks}
    out: dict[int, list[str]] = {}
    for key, splits in last_assigned.items():
        if (unit := units.get(key)) is not None:
            out.setdefault(unit, []).extend(splits)
    return out


def _finished_reads(
    ordered: Sequence[CheckpointMetadata],
    events: Sequence[CheckpointEvent],
    units: Sequence[int],
    last_assigned: Mapping[int, Sequence[str]],
) -> dict[int, list[str]]:
    """For `units` whose state holds no split in the newest checkpoint (their splits finished:
    a final checkpoint holds none), the splits they read last: from the newest older
    checkpoint that still held some, else from the newest event that named them, else from
    `last_assigned` (the splits the enumerator gave them last)."""
    out: dict[int, list[str]] = {}
    todo = set(units)
    for md in reversed(ordered[:-1]):
        if not todo:
            break
        found: dict[int, set[str]] = defaultdict(set)
        for sub in md.subtasks:
            if sub.unit_id in todo:
                found[sub.unit_id].update(split.split_id for split in sub.split_states)
        for unit, splits in found.items():
            if splits:
                out[unit] = sorted(splits)
                todo.discard(unit)
    for event in reversed(events):
        if not todo:
            break
        for unit in [u for u in todo if event.unit_reads.get(u)]:
            out[unit] = sorted(event.unit_reads[unit])
            todo.discard(unit)
    for unit in todo:
        if last_assigned.get(unit):
            out[unit] = sorted(last_assigned[unit])
    return out


def summary_table(checkpoints: Sequence[CheckpointMetadata], *, num_damaged: int = 0) -> pa.Table:
    """Counts and distributions over the completed checkpoints.

    Columns (`SUMMARY_SCHEMA`): `metric`, `count`, and for the distributions `min`, `median`,
    `max`. Rows: `completed`, `global`, `regional`, `forced_global` (global with reasons, a
    subset of `global`), `savepoint`, `damaged` (metadata that does not decode), then
    `duration_ms` and `state_bytes`.
    """

    def count(metric: str, n: int) -> dict[str, object]:
        return {"metric": metric, "count": n, "min": None, "median": None, "max": None}

    def dist(metric: str, values: list[int]) -> dict[str, object]:
        if not values:
            return count(metric, 0)
        return {
            "metric": metric,
            "count": len(values),
            "min": min(values),
            "median": float(statistics.median(values)),
            "max": max(values),
        }

    kinds = [c.kind for c in checkpoints]
    rows = [
        count("completed", len(checkpoints)),
        count("global", kinds.count(CheckpointKind.GLOBAL)),
        count("regional", kinds.count(CheckpointKind.REGIONAL)),
        count("forced_global", sum(is_forced_global(c) for c in checkpoints)),
        count("savepoint", kinds.count(CheckpointKind.SAVEPOINT)),
        count("damaged", num_damaged),
        dist("duration_ms", [c.completion_time_ms - c.trigger_time_ms for c in checkpoints]),
        dist("state_bytes", [c.state_bytes for c in checkpoints]),
    ]
    return _table(rows, SUMMARY_SCHEMA)


def diff_table(a: CheckpointMetadata, b: CheckpointMetadata) -> pa.Table:
    """Per subtask, what changed from checkpoint `a` to checkpoint `b`.

    Columns (`DIFF_SCHEMA`): `vertex_id`, `subtask_index`, `unit_id` (in `b`, else in `a`);
    `change`: `fresh` (new state in `b`), `fell_back` (`b` re-uses state from an owner other
    than `a`'s), `unchanged_owner` (`b` re-uses exactly `a`'s state owner), `added` / `removed`
    (the subtask exists in one checkpoint only); `owner_a`, `owner_b`; `state_bytes_a`,
    `state_bytes_b`.
    """
    in_a = {(s.vertex_id, s.index): s for s in a.subtasks}
    in_b = {(s.vertex_id, s.index): s for s in b.subtasks}
    rows = []
    for key in sorted(in_a.keys() | in_b.keys()):
        sa, sb = in_a.get(key), in_b.get(key)
        owner_a = None if sa is None else owner_of(a, sa)
        owner_b = None if sb is None else owner_of(b, sb)
        if sb is None:
            change = "removed"
        elif sa is None:
            change = "added"
        elif not sb.is_fallback:
            change = "fresh"
        elif owner_b == owner_a:
            change = "unchanged_owner"
        else:
            change = "fell_back"
        rows.append(
            {
                "vertex_id": key[0],
                "subtask_index": key[1],
                "unit_id": (sb or sa).unit_id,  # type: ignore[union-attr]
                "change": change,
                "owner_a": owner_a,
                "owner_b": owner_b,
                "state_bytes_a": None if sa is None else sa.state_bytes,
                "state_bytes_b": None if sb is None else sb.state_bytes,
            }
        )
    return _table(rows, DIFF_SCHEMA)


class InspectorInputError(MetadataError):
    """A view was asked for with bad input (e.g. `num_retained` < 1): exit code 2."""

    exit_code = 2


class CheckpointNotFoundError(InspectorInputError):
    """A checkpoint id that the user asked for is not there (bad input: exit 2)."""


class Inspector:
    """The views over one job's completed checkpoints (`store`), pyiceberg style.

    `num_retained` decides the `retained` column; by default the `num-retained` recorded in the
    job's newest checkpoint that records one, else `DEFAULT_NUM_RETAINED`. `num_retained_in_force`
    says which value applies and where it came from. `events` (the job's event log) let `show`
    and `diff` say why a checkpoint id that holds nothing was aborted and give `lag` its
    `records_behind`; `last_assigned` ((source vertex, subtask index) -> the splits its
    enumerator gave it last) lets `lag` name what a unit whose splits finished read; `names`
    (unit -> its name) fills `lag`'s `unit_name`. `metadata` decodes neither the enumerators'
    snapshots nor the naming rule: `regional.runtime.inspection.job_inspector` builds an
    Inspector with all three, as `regional inspect ROOT lag` shows it.
    """

    def __init__(
        self,
        store: CompletedCheckpointStore,
        *,
        num_retained: int | None = None,
        events: Iterable[CheckpointEvent] = (),
        last_assigned: Mapping[tuple[str, int], Sequence[str]] | None = None,
        names: Mapping[int, str] | None = None,
    ) -> None:
        if num_retained is None:
            in_force = recorded_num_retained(reversed(store.all()))
        elif num_retained < 1:
            raise InspectorInputError(
                f"num-retained must be at least 1 (got {num_retained}); the latest completed "
                "checkpoint is always retained"
            )
        else:
            in_force = NumRetained(num_retained, "option", "given")
        self.store = store
        self.events = list(events)
        self.last_assigned = dict(last_assigned or {})
        self.names = None if names is None else dict(names)
        self.aborted = {e.checkpoint_id: e for e in self.events if e.kind == Outcome.ABORTED}
        self.num_retained_in_force = in_force
        self.num_retained = in_force.value

    def _get(self, checkpoint_id: int) -> CheckpointMetadata:
        if checkpoint_id not in self.store:
            held = ", ".join(map(str, self.store.ids())) or "none"
            if (event := self.aborted.get(checkpoint_id)) is not None:
                causes = "; ".join(event.cause_lines()) or event.message
                raise CheckpointNotFoundError(
                    f"checkpoint {checkpoint_id} was aborted ({event.abort_rule}), so it holds "
                    f"no state (completed: {held}): {causes}; the coordinator's message and "
                    f"the tracebacks are in its event, {event.path} under the job root "
                    "(`regional inspect ROOT events`)"
                )
            raise CheckpointNotFoundError(
                f"checkpoint {checkpoint_id} not found (completed: {held})"
            )
        return self.store.get(checkpoint_id)

    def checkpoints(self) -> pa.Table:
        """See `checkpoints_table`."""
        return checkpoints_table(self.store.all(), num_retained=self.num_retained)

    def show(self, checkpoint_id: int) -> pa.Table:
        """See `show_table`; raises `MetadataError` (exit 2) for an unknown id."""
        return show_table(self._get(checkpoint_id))

    def refs(self) -> pa.Table:
        """See `refs_table`."""
        return refs_table(self.store.all())

    def lag(self) -> pa.Table:
        """See `lag_table`."""
        return lag_table(self.store.all(), self.events, self.last_assigned, self.names)

    def summary(self) -> pa.Table:
        """See `summary_table` (damaged = the store's skipped checkpoints)."""
        return summary_table(self.store.all(), num_damaged=len(self.store.damaged))

    def diff(self, a: int, b: int) -> pa.Table:
        """See `diff_table`; raises `MetadataError` (exit 2) for an unknown id."""
        return diff_table(self._get(a), self._get(b))

    def tables(self) -> Mapping[str, pa.Table]:
        """Every view that needs no argument, by name."""
        return {
            "checkpoints": self.checkpoints(),
            "refs": self.refs(),
            "lag": self.lag(),
            "summary": self.summary(),
        }
