"""What a running job reports about itself: a frozen snapshot of its metrics (`JobDriver.metrics`
now; `JobDriver.published_metrics` as of the latest epoch, what the metrics endpoint serves) and
the record of every checkpoint outcome (`metadata.events.CheckpointEvent`: progress callbacks,
the run summary and the event log). Pure: the driver passes in the times and the outcome.

A reader of the metrics (`runtime.prometheus`) sees a `MetricsSource`, never the driver: the
snapshot it published and its clock.

>>> from regional.coordinator import CoordinatorMetrics
>>> m = CoordinatorMetrics(regional_checkpoint_count=3, global_checkpoint_count=1)
>>> m.oldest_ref_checkpoint_id = {1: None, 2: 1, 3: 1, 4: 1}
>>> m.unit_lag = {3: 3}
>>> s = metrics_snapshot(m, latest_completed_id=4, commit_lag=0)
>>> s.oldest_ref_checkpoint_id, s.unit_lag, s.max_unit_lag, s.regional_checkpoint_count
(1, {3: 3}, 3, 3)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import msgspec

from metadata.events import CheckpointEvent, DriverStart, Outcome, StuckUnit
from regional.coordinator import CoordinatorMetrics
from regional.report.dead_letters import REASONS, reason_of
from regional.sources.base import seconds_behind

__all__ = ["MetricsSnapshot", "MetricsSource", "checkpoint_event", "metrics_snapshot"]


class MetricsSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """The coordinator's metrics at one moment (flink_regional.md §1.3).

    `oldest_ref_checkpoint_id` is the oldest owner the latest completed checkpoint's fallback
    state refers to (None when it is global); `unit_lag` maps each unit whose state is behind
    the latest completed checkpoint to how many checkpoint ids behind it is (the latest
    completed id minus its owner's, the lag of `regional inspect ROOT lag`; units at 0 left
    out); `commit_lag` counts completed checkpoints whose output is not committed yet;
    `records_dead_lettered` the records user functions failed on that completed checkpoints
    sent to the dead-letter sink (`on_error="dead-letter"`); `records_late` the records that
    completed checkpoints judged late: by windows, interval and temporal joins and
    `drop_duplicates`, once per operator that judged each (`CheckpointEvent.records_late`).
    Counters run since the driver started (a restored job starts them at 0).

    What the job adds to the coordinator's: `job_id`; `records_in`, the records acked units'
    sources read from the job's input since the driver started (not what the keyed exchanges'
    readers read); `stuck_units` (DESIGN §4 rule 5), each with what it reads and
    since when; `event_time`, whether the pipeline has event time (then `records_late` means
    something); and of the latest checkpoint outcome, `watermark_ms` (the lowest watermark of a
    unit fresh in it) with `watermark_unit`, and `last_checkpoint_seconds` (from its trigger to
    its outcome; None before the first). `operator_records`: per operator vertex, the records
    it took in, gave out and judged late in completed checkpoints (units that fell back left
    out); `dead_letters_by_reason`: the dead letters of completed checkpoints by reason
    (`regional.report.dead_letters.reason_of`). `stalled_inputs`: the (operator, input)
    pairs in a stall episode now (`regional.runtime.stalled_inputs`). `records_behind`: the
    consumer lag, per source vertex and split (`CheckpointEvent.records_behind`), and
    `seconds_behind` the same in time where the source tells it
    (`CheckpointEvent.seconds_behind`).
    """

    latest_completed_id: int | None
    regional_checkpoint_count: int
    global_checkpoint_count: int
    savepoint_count: int
    aborted_by_rule: dict[str, int]
    oldest_ref_checkpoint_id: int | None
    unit_lag: dict[int, int]
    commit_lag: int
    commit_failures: int
    records_dead_lettered: int = 0
    records_late: int = 0
    job_id: str = ""
    records_in: int = 0
    stuck_units: tuple[StuckUnit, ...] = ()
    event_time: bool = False
    watermark_ms: int | None = None
    watermark_unit: int | None = None
    last_checkpoint_seconds: float | None = None
    operator_records: dict[str, tuple[int, int, int]] = {}
    dead_letters_by_reason: dict[str, int] = {}
    stalled_inputs: tuple[tuple[str, str], ...] = ()
    records_behind: dict[str, dict[str, int]] = {}
    seconds_behind: dict[str, dict[str, float]] = {}

    @property
    def max_unit_lag(self) -> int:
        return max(self.unit_lag.values(), default=0)

    @property
    def aborted_count(self) -> int:
        return sum(self.aborted_by_rule.values())


class MetricsSource(Protocol):
    """Where a job's metrics are read (`JobDriver`): the snapshot it published after its latest
    epoch, and its clock (stuck units have been stuck until now)."""

    def published_metrics(self) -> MetricsSnapshot: ...

    def now_ms(self) -> int: ...


def metrics_snapshot(
    metrics: CoordinatorMetrics,
    *,
    latest_completed_id: int | None,
    commit_lag: int,
    records_dead_lettered: int = 0,
    records_late: int = 0,
    job_id: str = "",
    records_in: int = 0,
    stuck_units: tuple[StuckUnit, ...] = (),
    event_time: bool = False,
    last_event: CheckpointEvent | None = None,
    operator_records: Mapping[str, Sequence[int]] | None = None,
    dead_letter_types: Mapping[str, int] | None = None,
    stalled_inputs: Iterable[tuple[str, str]] = (),
    records_behind: Mapping[str, Mapping[str, int]] | None = None,
    unread_since: Mapping[str, Mapping[str, int]] | None = None,
    now_ms: int = 0,
) -> MetricsSnapshot:
    """Copy the coordinator's live metrics, and what the job adds to them (`last_event`: its
    latest checkpoint outcome), into a `MetricsSnapshot`; the consumer lag in time is that of
    `now_ms` (`seconds_behind` of `records_behind` and `unread_since`)."""
    oldest = (
        None
        if latest_completed_id is None
        else metrics.oldest_ref_checkpoint_id.get(latest_completed_id)
    )
    return MetricsSnapshot(
        latest_completed_id=latest_completed_id,
        regional_checkpoint_count=metrics.regional_checkpoint_count,
        global_checkpoint_count=metrics.global_checkpoint_count,
        savepoint_count=metrics.savepoint_count,
        aborted_by_rule={str(rule): n for rule, n in sorted(metrics.aborted_by_rule.items())},
        oldest_ref_checkpoint_id=oldest,
        unit_lag=dict(sorted(metrics.unit_lag.items())),
        commit_lag=commit_lag,
        commit_failures=metrics.commit_failures,
        records_dead_lettered=records_dead_lettered,
        records_late=records_late,
        job_id=job_id,
        records_in=records_in,
        stuck_units=stuck_units,
        event_time=event_time,
        watermark_ms=None if last_event is None else last_event.watermark_ms,
        watermark_unit=None if last_event is None else last_event.watermark_unit,
        last_checkpoint_seconds=None if last_event is None else last_event.seconds,
        operator_records={
            v: (int(c[0]), int(c[1]), int(c[2]))
            for v, c in sorted((operator_records or {}).items())
        },
        dead_letters_by_reason=_by_reason(dead_letter_types or {}),
        stalled_inputs=tuple(sorted(stalled_inputs)),
        records_behind={v: dict(s) for v, s in (records_behind or {}).items()},
        seconds_behind=_seconds_behind(records_behind or {}, unread_since or {}, now_ms),
    )


def _seconds_behind(
    records: Mapping[str, Mapping[str, int]], since: Mapping[str, Mapping[str, int]], now_ms: int
) -> dict[str, dict[str, float]]:
    """Per source vertex and split, its consumer lag in time at `now_ms` where it is known."""
    out: dict[str, dict[str, float]] = {}
    for vertex_id, splits in records.items():
        times = since.get(vertex_id, {})
        for split, n in splits.items():
            age = seconds_behind(n, times.get(split), now_ms)
            if age is not None:
                out.setdefault(vertex_id, {})[split] = age
    return out


def _by_reason(types: Mapping[str, int]) -> dict[str, int]:
    """Dead-letter counts by error type, summed by reason (`reason_of`), in `REASONS` order."""
    out = dict.fromkeys(REASONS, 0)
    for error_type, n in types.items():
        out[reason_of(error_type)] += n
    return {r: n for r, n in out.items() if n}


def checkpoint_event(
    job_id: str,
    checkpoint_id: int,
    outcome: Outcome,
    metrics: MetricsSnapshot,
    *,
    trigger_time_ms: int,
    time_ms: int,
    fresh_units: int,
    fallback_units: tuple[int, ...] = (),
    causes: Mapping[int, str] | None = None,
    abort_rule: str | None = None,
    message: str = "",
    records_in: int = 0,
    tracebacks: Mapping[int, str] | None = None,
    records_dead_lettered: int = 0,
    stuck: tuple[StuckUnit, ...] = (),
    unit_reads: Mapping[int, tuple[str, ...]] | None = None,
    records_late: int = 0,
    watermark: tuple[int | None, int | None] = (None, None),
    warnings: tuple[str, ...] = (),
    started: DriverStart | None = None,
    records_exchanged: int = 0,
) -> CheckpointEvent:
    """The record of one checkpoint outcome with the metrics right after it.

    `fallback_units` fell back (completed) or failed (aborted), with `causes` (one line) and
    `tracebacks` per unit; `stuck` the units stuck after it; `unit_reads` what the units in
    either read (their names); `warnings` what went wrong without failing it; `started` how
    the driver started (its first event only).
    `oldest_ref_checkpoint_id` is the checkpoint's own (None for an aborted checkpoint, which
    references nothing)."""
    completed = outcome is not Outcome.ABORTED
    return CheckpointEvent(
        job_id=job_id,
        checkpoint_id=checkpoint_id,
        kind=outcome,
        trigger_time_ms=trigger_time_ms,
        time_ms=time_ms,
        fresh_units=fresh_units,
        fallback_units=fallback_units,
        causes=dict(causes or {}),
        abort_rule=abort_rule,
        message=message,
        records_in=records_in,
        commit_lag=metrics.commit_lag,
        oldest_ref_checkpoint_id=metrics.oldest_ref_checkpoint_id if completed else None,
        unit_lag=metrics.unit_lag,
        regional_checkpoint_count=metrics.regional_checkpoint_count,
        global_checkpoint_count=metrics.global_checkpoint_count,
        savepoint_count=metrics.savepoint_count,
        aborted_by_rule=metrics.aborted_by_rule,
        tracebacks=dict(tracebacks or {}),
        records_dead_lettered=records_dead_lettered,
        stuck=stuck,
        unit_reads=dict(unit_reads or {}),
        records_late=records_late,
        watermark_ms=watermark[0],
        watermark_unit=watermark[1],
        warnings=warnings,
        started=started,
        records_exchanged=records_exchanged,
        records_behind=metrics.records_behind,
        seconds_behind=metrics.seconds_behind,
    )
