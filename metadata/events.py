"""The event log of a job: one JSON line per checkpoint outcome, under `<job root>/events/`.

Object stores have no append, so the log is one small object per event, named by
`metadata.layout.event_path` (`events/<id, 12 digits>-<trigger ms>.json`) and written once as
a new object (`JobStorage.write_new_file`); no object is ever read, modified and rewritten.
Listing `events/` in name order gives the log in checkpoint order, and concatenating the
files gives a JSON-lines stream (`cat <job root>/events/*.json`). The cleaner keeps the newest
`metadata.layout.DEFAULT_RETAINED_EVENTS` files and deletes older ones (`cleaner.plan`, reason
`expired-event`).

Each event is a `CheckpointEvent`: the outcome (kind, fallback units and why, abort rule,
duration) and the coordinator's metrics right after it (`oldest_ref_checkpoint_id`, per-unit
lag, completion counts, aborts by rule). The encoding is additive: readers ignore fields they do
not know, and fields added later get defaults. `events_table` is the inspector view
(`regional inspect ROOT events`).

>>> e = CheckpointEvent(job_id="j", checkpoint_id=2, kind=Outcome.REGIONAL, trigger_time_ms=1000,
...     time_ms=1250, fresh_units=7, fallback_units=(3,), causes={3: "declined: boom"},
...     oldest_ref_checkpoint_id=1, unit_lag={3: 1}, regional_checkpoint_count=1,
...     global_checkpoint_count=1)
>>> line = encode_event(e); line.endswith(b"\\n") and b"\\n" not in line[:-1]
True
>>> decode_event(line, source="events/x.json") == e
True
>>> row = events_table([e]).to_pylist()[0]
>>> row["kind"], row["duration_ms"], row["fallback_units"], row["unit_lag"], row["causes"]
('regional', 250, [3], [{'unit_id': 3, 'lag': 1}], [{'unit_id': 3, 'cause': 'declined: boom'}])
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from typing import Annotated

import msgspec
import pyarrow as pa

from metadata.errors import MetadataError, StorageError
from metadata.format import DECODE_FAILURES
from metadata.layout import EVENTS_DIR, event_checkpoint_id, event_path
from metadata.model import Count, EpochMs, Int64
from metadata.storage import JobStorage, Problem
from metadata.unit_names import unit_name

__all__ = [
    "EVENTS_SCHEMA",
    "MAX_EVENT_FILE_BYTES",
    "CheckpointEvent",
    "DriverStart",
    "Outcome",
    "StuckUnit",
    "decode_event",
    "encode_event",
    "events_table",
    "read_events",
    "write_event",
]


#: The largest event file read (64 MiB): an event is one checkpoint's outcome, under 1 MiB even
#: with 10,000 units; a bigger file is reported as damaged, not read until memory runs out.
MAX_EVENT_FILE_BYTES = 64 * 1024 * 1024

#: A counter of events or checkpoints: small enough that a view's sum of them fits int64.
_Tally = Annotated[int, msgspec.Meta(ge=0, le=2**53)]
_Seconds = Annotated[float, msgspec.Meta(ge=0)]


class Outcome(enum.StrEnum):
    """How one checkpoint attempt ended: completed as one of the `CheckpointKind`s, or aborted."""

    GLOBAL = "global"
    REGIONAL = "regional"
    SAVEPOINT = "savepoint"
    ABORTED = "aborted"


class StuckUnit(msgspec.Struct, frozen=True, kw_only=True):
    """A unit over `max-unit-fallbacks` (stuck, DESIGN §4 rule 5) after a checkpoint: what it
    reads (`splits`), since when (`since_ms`, the driver's clock), the checkpoint whose state
    it runs on (`owner_checkpoint_id`; 0: its initial state), how many checkpoints in a row it
    fell back in, and its last cause (one line)."""

    unit_id: Count
    splits: tuple[str, ...] = ()
    since_ms: EpochMs
    owner_checkpoint_id: Int64
    fallbacks: Count
    cause: str = ""

    @property
    def name(self) -> str:
        """`unit 3 (events:3)` (`metadata.unit_names.unit_name`)."""
        return unit_name(self.unit_id, self.splits)


class DriverStart(msgspec.Struct, frozen=True, kw_only=True):
    """How the driver that wrote an event started, in the first event it writes: the
    checkpoint it restored (`restored_from`; None: the initial state), where it read it
    (`location`: a `chk-<id>` directory or a savepoint), and what the restore changed or threw
    away (`notes`: sink commits rolled back, staged files of lost attempts deleted, rescaled
    vertices, dropped state). The attempts after `restored_from` and before the event's
    checkpoint were discarded: their work is done again."""

    restored_from: Int64 | None = None
    location: str = ""
    notes: tuple[str, ...] = ()


class CheckpointEvent(
    msgspec.Struct, frozen=True, kw_only=True, tag="checkpoint", tag_field="event"
):
    """What one checkpoint attempt ended with, and the coordinator's metrics right after: the
    one record of a checkpoint outcome (progress callbacks, `RunSummary`, the event log).

    `kind` is the `Outcome`. `fallback_units` fell back (regional) or
    failed (aborted), with `causes` per unit (one line: e.g. the user's exception) and
    `tracebacks` per unit whose task sent one (its last 4096 characters); `abort_rule` is the
    DESIGN §4 rule that aborted it (e.g. ``3c-failure-ratio``) and `message` the coordinator's
    explanation. `records_dead_lettered` counts the records user functions failed on that went
    to the pipeline's dead-letter sink (`on_error="dead-letter"`) in this checkpoint. With event
    time, `records_late` counts the records judged late in it by every operator that judges
    lateness: windows (an event time behind the watermark past the window's allowed lateness),
    interval and temporal joins and `drop_duplicates` (an event time below the record's origin
    watermark), once per operator that judged the record (a record late for a window and a
    join counts twice), whether it was dropped or dead-lettered (`on_late`); `watermark_ms` is the
    job's watermark after it: the lowest over every unit of its watermark as of the latest
    checkpoint it was fresh in (a unit that fell back keeps its owner's), held by unit
    `watermark_unit`. Metrics:
    `oldest_ref_checkpoint_id` (the oldest owner this checkpoint's fallback state refers to;
    None when nothing fell back), `unit_lag` (unit -> checkpoint ids its state is behind:
    since the checkpoint that wrote it, aborted attempts included; units at 0 left out), and
    counters since the driver started (they restart at 0 after a restore): completions by kind
    and aborts by rule.

    `stuck` lists the units stuck after this outcome (`StuckUnit`: what each reads, since
    when, its cause); `unit_reads` names what each unit in `fallback_units` and `stuck` reads
    (`unit_label`). Both were added later: older events decode with them empty. `warnings`
    (added later too) says what went wrong without failing the checkpoint, e.g. a compaction
    of fallback segments that failed (`checkpointing.file-merging.min-live-share`).
    `started` (added later, None in older events and in every event but a driver's first)
    says how the driver that wrote it started (`DriverStart`): the report's driver restarts.
    `records_in` counts the records the sources read from the job's input;
    `records_exchanged` (added later, 0 in older events, whose `records_in` counted them too)
    the records the keyed exchanges' readers read in it. `records_behind` (added later, empty
    in older events): the consumer lag after it, per source vertex and split, the records
    between the position the job's next read starts at and the split's end (a Kafka
    partition's end offset, a file's rows) as the source said when the split was last read.
    `seconds_behind` (added later, empty in older events): the same lag in time at `time_ms`,
    the age of the oldest record not read yet (`regional.sources.base.seconds_behind`; 0
    when none is behind), for the splits whose source tells when its records were appended.
    `replays` (added later) has one line per replay batch of fixed dead letters the job began
    to read in this checkpoint's epoch: which source, how many records, who replayed them when,
    and their dead-letter ids (`regional.sources.replay`, DESIGN §4 rule 25).
    """

    job_id: str
    checkpoint_id: Int64
    kind: Outcome
    trigger_time_ms: EpochMs
    time_ms: EpochMs  # when the outcome was carried out (metadata durable, committed, cleaned)
    fresh_units: Count
    fallback_units: tuple[Count, ...] = ()
    causes: dict[Count, str] = {}
    abort_rule: str | None = None
    message: str = ""
    records_in: Count = 0
    commit_lag: Int64 = 0
    oldest_ref_checkpoint_id: Int64 | None = None
    unit_lag: dict[Count, _Tally] = {}
    regional_checkpoint_count: Count = 0
    global_checkpoint_count: Count = 0
    savepoint_count: Count = 0
    aborted_by_rule: dict[str, _Tally] = {}
    tracebacks: dict[Count, str] = {}
    records_dead_lettered: Count = 0
    stuck: tuple[StuckUnit, ...] = ()
    unit_reads: dict[Count, tuple[str, ...]] = {}
    records_late: Count = 0
    watermark_ms: Int64 | None = None
    watermark_unit: Count | None = None
    warnings: tuple[str, ...] = ()
    started: DriverStart | None = None
    records_exchanged: Count = 0
    records_behind: dict[str, dict[str, _Tally]] = {}
    seconds_behind: dict[str, dict[str, _Seconds]] = {}
    replays: tuple[str, ...] = ()

    def unit_label(self, unit_id: int) -> str:
        """`unit 3 (events:3)`: the unit and what it reads, as far as this event knows."""
        return unit_name(unit_id, self.unit_reads.get(unit_id, ()))

    def cause_lines(self, names: Mapping[int, str] | None = None) -> list[str]:
        """One line per failed or fallen-back unit and why, for progress lines and reports:
        ``unit 3 (events:3): declined: ValueError: boom`` (the first line of each cause); a
        unit in `names` (unit -> name, from the pipeline) is named by it instead."""
        names = names or {}
        return [
            f"{names.get(u) or self.unit_label(u)}: {(c.splitlines() or [''])[0]}"
            for u, c in sorted(self.causes.items())
        ]

    def stuck_lines(
        self, now_ms: int | None = None, names: Mapping[int, str] | None = None
    ) -> list[str]:
        """One line per stuck unit: ``stuck: unit 3 (events:3) for 2 min (on checkpoint 4's
        state; 5 fallbacks in a row): declined: ValueError: boom`` (the cause left out when
        `cause_lines` shows it already); how long is measured to `now_ms` (default: this
        event's time); a unit in `names` is named by it instead."""
        at = self.time_ms if now_ms is None else now_ms
        names = names or {}
        return [
            f"stuck: {names.get(s.unit_id) or s.name} for {_elapsed(at - s.since_ms)} (on "
            + (
                f"checkpoint {s.owner_checkpoint_id}'s state"
                if s.owner_checkpoint_id
                else "its initial state"
            )
            + f"; {s.fallbacks} fallbacks in a row)"
            + ("" if s.unit_id in self.causes else f": {(s.cause.splitlines() or [''])[0]}")
            for s in self.stuck
        ]

    @property
    def seconds(self) -> float:
        """From the trigger until the outcome was carried out."""
        return (self.time_ms - self.trigger_time_ms) / 1000

    @property
    def path(self) -> str:
        """Where the event is stored, relative to the job root."""
        return event_path(self.checkpoint_id, self.trigger_time_ms)


def _elapsed(ms: int) -> str:
    """`"42 s"`, `"3 min"`, `"2 h"`: how long, rounded down to its largest unit."""
    s = max(0, ms) // 1000
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h"


_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder(CheckpointEvent)


def encode_event(event: CheckpointEvent) -> bytes:
    """One JSON line (compact, newline-terminated)."""
    return _ENCODER.encode(event) + b"\n"


def decode_event(data: bytes, *, source: str) -> CheckpointEvent:
    """Decode one event file; `MetadataError` naming `source` if it is not a checkpoint event
    (the only error that leaves: invalid UTF-8, nesting too deep and numbers out of range
    included, see `metadata.format`)."""
    try:
        return _DECODER.decode(data)
    except DECODE_FAILURES as exc:
        raise MetadataError(
            f"event file {source} is not a checkpoint event ({exc}); it was damaged or written "
            "by a newer regional: skip it or delete it by hand"
        ) from None


def write_event(storage: JobStorage, event: CheckpointEvent) -> str:
    """Store `event` as its own new object under the job root; returns its relative path."""
    storage.write_new_file(event.path, encode_event(event))
    return event.path


def read_events(storage: JobStorage) -> tuple[list[CheckpointEvent], list[Problem]]:
    """Every event of the job in checkpoint order, and the files that did not decode (or that
    are symbolic links out of the job root: never read)."""
    events, problems = [], []
    for rel in storage.list_dir(EVENTS_DIR):
        cid = event_checkpoint_id(rel)
        if cid is None:
            continue  # not named like an event (e.g. a temporary file of a write in progress)
        try:
            data = storage.read_file(rel, limit=MAX_EVENT_FILE_BYTES)
            if data is None:
                continue  # deleted by the cleaner since the listing
            events.append(decode_event(data, source=storage.describe(rel)))
        except (StorageError, MetadataError) as exc:
            problems.append(Problem(cid, rel, str(exc)))
    return events, problems


_TS = pa.timestamp("ms", tz="UTC")

EVENTS_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("trigger_time", _TS, nullable=False),
        pa.field("duration_ms", pa.int64(), nullable=False),
        pa.field("records_in", pa.int64(), nullable=False),
        pa.field("fresh_units", pa.int64(), nullable=False),
        pa.field("fallback_units", pa.list_(pa.int64()), nullable=False),
        pa.field("abort_rule", pa.string()),
        pa.field("oldest_ref_checkpoint_id", pa.int64()),
        pa.field("max_unit_lag", pa.int64(), nullable=False),
        pa.field(
            "unit_lag",
            pa.list_(pa.struct([("unit_id", pa.int64()), ("lag", pa.int64())])),
            nullable=False,
        ),
        pa.field("regional_checkpoint_count", pa.int64(), nullable=False),
        pa.field("global_checkpoint_count", pa.int64(), nullable=False),
        pa.field("aborted_count", pa.int64(), nullable=False),
        pa.field("commit_lag", pa.int64(), nullable=False),
        pa.field(
            "causes",
            pa.list_(pa.struct([("unit_id", pa.int64()), ("cause", pa.string())])),
            nullable=False,
        ),
        pa.field("message", pa.string(), nullable=False),
        pa.field("records_dead_lettered", pa.int64(), nullable=False),
        pa.field(
            "stuck",
            pa.list_(
                pa.struct(
                    [
                        ("unit_id", pa.int64()),
                        ("name", pa.string()),
                        ("since", _TS),
                        ("owner_checkpoint_id", pa.int64()),
                        ("fallbacks", pa.int64()),
                        ("cause", pa.string()),
                    ]
                )
            ),
            nullable=False,
        ),
    ]
)


def events_table(events: Iterable[CheckpointEvent]) -> pa.Table:
    """The `events` view, one row per event in the order given (`read_events`: by checkpoint).

    Columns (`EVENTS_SCHEMA`): `checkpoint_id`; `kind` (global, regional, savepoint, aborted);
    `trigger_time`; `duration_ms` (trigger to outcome carried out); `records_in`;
    `fresh_units`; `fallback_units` (fell back, or failed when aborted); `abort_rule`;
    `oldest_ref_checkpoint_id`; `max_unit_lag` and `unit_lag` (unit_id, lag) after the
    outcome; `regional_checkpoint_count`, `global_checkpoint_count`, `aborted_count` (since the
    driver started); `commit_lag`; `causes` (unit_id, cause: one line per failed or
    fallen-back unit); `message` (the coordinator's explanation: why it aborted, why it was
    global, why the job failed; then the event's `warnings` and `replays`); `records_dead_lettered`;
    `stuck` (unit_id, name: the unit and what it reads, since, owner_checkpoint_id, fallbacks
    in a row, cause: one row per unit stuck after the outcome). Tracebacks stay in the event files.
    """
    rows = [
        {
            "checkpoint_id": e.checkpoint_id,
            "kind": str(e.kind),
            "trigger_time": e.trigger_time_ms,
            "duration_ms": max(0, e.time_ms - e.trigger_time_ms),
            "records_in": e.records_in,
            "fresh_units": e.fresh_units,
            "fallback_units": list(e.fallback_units),
            "abort_rule": e.abort_rule,
            "oldest_ref_checkpoint_id": e.oldest_ref_checkpoint_id,
            "max_unit_lag": max(e.unit_lag.values(), default=0),
            "unit_lag": [{"unit_id": u, "lag": n} for u, n in sorted(e.unit_lag.items())],
            "regional_checkpoint_count": e.regional_checkpoint_count,
            "global_checkpoint_count": e.global_checkpoint_count,
            "aborted_count": sum(e.aborted_by_rule.values()),
            "commit_lag": e.commit_lag,
            "causes": [{"unit_id": u, "cause": c} for u, c in sorted(e.causes.items())],
            "message": "; ".join(m for m in (e.message, *e.warnings, *e.replays) if m),
            "records_dead_lettered": e.records_dead_lettered,
            "stuck": [
                {
                    "unit_id": s.unit_id,
                    "name": s.name,
                    "since": s.since_ms,
                    "owner_checkpoint_id": s.owner_checkpoint_id,
                    "fallbacks": s.fallbacks,
                    "cause": s.cause,
                }
                for s in e.stuck
            ],
        }
        for e in events
    ]
    return pa.Table.from_pylist(rows, schema=EVENTS_SCHEMA)
