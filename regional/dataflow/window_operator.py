"""The window operator: `keyed.window(Tumbling("1 min"), aggregate=count())` over one epoch.

Window state is keyed state of the operator (`regional.dataflow.state.OperatorState`): per
(scope, key) the open windows and their accumulators, so it is snapshotted, falls back,
restores and rescales like any keyed state. Per epoch:

1. every record is assigned its windows (`regional.dataflow.windows`); a record whose windows
   are all closed at its origin watermark (`regional.dataflow.epoch_time`) is **late**: counted,
   and with ``on_late="dead-letter"`` written to the dead-letter sink with the reason; otherwise
   it is added to its windows that are still open (for sessions: merged into the key's
   sessions; a session record is late when it is more than the allowed lateness behind);
2. at the end of the epoch, every window whose end plus the allowed lateness the scope's
   watermark reached emits **one final row** (``emit(key, window, value)``) and leaves the
   state, in (end, start, key) order.

With an aggregate that is commutative and associative (count, sum, min, max, ...) the rows are
the same whichever units fell back when (DESIGN §4 rule 15).

A built-in aggregate in tumbling or sliding windows keyed and timed by fields takes an Arrow
batch at once (`_fold_batch`: window starts and lateness with numpy, one group-by through
`regional.dataflow.columnar_aggregates`), with the same verdicts, dead letters and
accumulators as step 1 (DESIGN §4 rule 22).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from metadata.watermarks import MIN_WATERMARK, format_watermark
from regional.dataflow.columnar_aggregates import (
    MISSING,
    can_fold,
    columnar,
    fold,
    fold_all,
    value_columns,
)
from regional.dataflow.dead_letters import DeadLetters, set_aside
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.event_time import EventTimeError, column_millis, record_time, span_ms
from regional.dataflow.failures import UserFunctionError
from regional.dataflow.keys import FieldKey, key_columns, read_key
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.stream_schemas import as_schema_rows
from regional.dataflow.windows import (
    Aggregate,
    Sliding,
    Tumbling,
    Window,
    WindowAssigner,
    closed,
    is_late,
    merge_sessions,
)
from regional.sources.base import Batch

__all__ = [
    "FIRED_WATERMARK",
    "ON_LATE",
    "LateRecord",
    "WindowSpec",
    "default_emit",
    "run_windows",
]

#: What `window(on_late=...)` does with a late record: count it and drop it, or also write it
#: to the pipeline's dead-letter sink.
ON_LATE = ("drop", "dead-letter")
_WINDOWS = "w"  # slot entry: {start: [end, acc]} (tumbling, sliding)
_SESSIONS = "s"  # slot entry: [[start, end, acc], ...] (sessions)
#: List state of a key-scoped window operator: ``[the highest watermark it fired at]``. A
#: rescale gives every new subtask the lowest of the old ones (`regional.runtime.rescale`).
FIRED_WATERMARK = "\x00fired-watermark"
_ENCODE = msgspec.msgpack.Encoder()


class LateRecord(Exception):
    """A record behind the watermark (the error of its dead letter)."""


def _utc(ms: int) -> dt.datetime:
    return dt.datetime(1970, 1, 1, tzinfo=dt.UTC) + dt.timedelta(milliseconds=ms)


def default_emit(key: Any, window: Window, value: Any) -> dict[str, Any]:
    """The default result row: ``{key, window_start, window_end, value}`` (UTC datetimes)."""
    return {
        "key": key,
        "window_start": _utc(window.start),
        "window_end": _utc(window.end),
        "value": value,
    }


class WindowSpec:
    """A window operator's definition (`KeyedStream.window` builds it)."""

    def __init__(
        self,
        assigner: WindowAssigner,
        aggregate: Aggregate,
        *,
        time_of: Callable[[Any], Any],
        time_field: str | None = None,
        allowed_lateness: Any = 0,
        on_late: str = "drop",
        emit: Callable[[Any, Window, Any], Any] | None = None,
        schema: pa.Schema | None = None,
    ) -> None:
        #: the rows' schema when keyed by columns of a stream with one (rows are then a batch)
        self.schema = schema
        self.assigner = assigner
        self.aggregate = aggregate
        self.time_of = time_of
        self.time_field = time_field
        self.lateness = span_ms(allowed_lateness, "allowed_lateness")
        self.on_late = on_late
        self.emit = emit or default_emit

    def ts(self, record: Any, operator: str = "", where: str = "") -> int:
        """The event time of `record`; `EventTimeError` naming window `operator` and `where`
        the record is (`regional.dataflow.event_time.record_time`)."""
        owner = f"window {operator!r}"
        return record_time(self.time_of, record, owner=owner, where=where, field=self.time_field)


def _late_reason(op: str, ts: int, origin: int, lateness: int) -> LateRecord:
    return LateRecord(
        f"window operator {op!r}: event time {format_watermark(ts)} is behind the watermark "
        f"{format_watermark(origin)} by more than the allowed lateness of {lateness} ms: every "
        "window of the record had closed; raise allowed_lateness or max_out_of_orderness to "
        "keep such records"
    )


def run_windows(
    spec: WindowSpec,
    operator: str,
    key_fn: Callable[[Any], Any],
    scope_kind: str,
    chunks: Sequence[tuple[str, Batch]],
    origins: Sequence[int],
    state: OperatorState,
    time: EpochTime,
    dead: DeadLetters | None,
    records: Callable[[Batch], list[Any]],
) -> tuple[list[tuple[str, Batch]], list[int]]:
    """One epoch of a window operator: add the records, then fire the closed windows. Returns
    the output chunks and their origin watermarks; late records are counted in `time.late`."""
    agg = spec.aggregate
    lateness = spec.lateness
    session = spec.assigner.session
    # after an exchange: the highest watermark this subtask fired at (the `exclude` policy can
    # move the reader's watermark back; a window never fires twice)
    floor = (
        state.lists.setdefault(FIRED_WATERMARK, [MIN_WATERMARK]) if scope_kind == "key" else None
    )
    if floor is not None and time.start_of(KEY_SCOPE) < floor[0]:
        time.start[KEY_SCOPE] = floor[0]
    seen: dict[str, int] = {}
    columnar = _columnar_key(spec, key_fn)
    for (split, data), origin in zip(chunks, origins, strict=True):
        scope = split if scope_kind == "split" else KEY_SCOPE
        slots = state.keyed.setdefault(scope, {})
        # never behind what already fired (equal to the origin under `hold`, see above)
        origin = max(origin, time.start_of(scope))
        if columnar is not None and isinstance(data, pa.RecordBatch):
            base = seen.get(split, 0)
            if _fold_batch(spec, operator, columnar, data, split, base, origin, slots, state,
                           time, dead):  # fmt: skip
                seen[split] = base + data.num_rows
                continue
        rows = records(data)
        base = seen.get(split, 0)
        seen[split] = base + len(rows)
        for i, record in enumerate(rows):
            try:
                ts = spec.ts(record, operator)
            except EventTimeError:  # again, naming where the record is (only now: slow)
                try:
                    spec.ts(record, operator, f"split {split!r}, record {base + i} this epoch")
                except EventTimeError as exc:
                    if dead is None:
                        raise
                    dead.add(operator, split, base + i, record, exc)
                continue
            windows = spec.assigner.assign(ts)
            late = ts + lateness < origin if session else is_late(windows, origin, lateness)
            if late:
                time.late += 1
                if dead is not None and spec.on_late == "dead-letter":
                    dead.add(
                        operator,
                        split,
                        base + i,
                        record,
                        _late_reason(operator, ts, origin, lateness),
                    )
                continue
            try:
                key = read_key(key_fn, record, f"window {operator!r}")
            except UserFunctionError as exc:
                set_aside(dead, exc, operator, split, base + i, record)
                continue
            slot = slots.get(key)
            if slot is None:
                state.codec.check(key, what=f"the key of split {scope!r}", operator=operator)
                slot = slots[key] = {}
            if session:
                (w,) = windows
                new = [w.start, w.end, agg.add(agg.init(), record)]
                slot[_SESSIONS] = [
                    list(s) for s in merge_sessions(slot.get(_SESSIONS, []), new, agg.merge)
                ]
                continue
            open_windows = slot.setdefault(_WINDOWS, {})
            for w in windows:
                if closed(w, origin, lateness):
                    continue
                entry = open_windows.get(w.start)
                acc = agg.add(agg.init() if entry is None else entry[1], record)
                open_windows[w.start] = [w.end, acc]
    out = _fire(spec, state, time, scope_kind)
    if floor is not None:
        floor[0] = max(floor[0], time.end.get(KEY_SCOPE, MIN_WATERMARK))
    return out


def _columnar_key(spec: WindowSpec, key_fn: Callable[[Any], Any]) -> str | tuple[str, ...] | None:
    """The key column (or columns) when the windows can be computed over Arrow columns: a
    built-in aggregate (`regional.dataflow.columnar_aggregates`) in tumbling or sliding
    windows, keyed by a field (`key_by("user")`) or fields (`key_by(["user", "country"])`:
    the key is the tuple) and timed by a field (``event_time="ts"``); None otherwise (the
    record-wise path; sessions always take it)."""
    columns = key_columns(key_fn)
    if (
        not columnar(spec.aggregate)
        or type(spec.assigner) not in (Tumbling, Sliding)
        or columns is None
        or spec.time_field is None
    ):
        return None
    return columns[0] if isinstance(key_fn, FieldKey) else columns


def _fold_batch(
    spec: WindowSpec,
    operator: str,
    key_column: str | tuple[str, ...],
    batch: pa.RecordBatch,
    split: str,
    base: int,
    origin: int,
    slots: dict[Any, Any],
    state: OperatorState,
    time: EpochTime,
    dead: DeadLetters | None,
) -> bool:
    """Add one Arrow batch to its tumbling or sliding windows with Arrow and numpy kernels,
    with the accumulators, lateness verdicts and dead letters of the record-wise path; False
    (nothing done) when the batch is not foldable (`can_fold`) or holds an event time the
    record-wise path would reject, so that path runs instead and names the record."""
    time_column = spec.time_field
    assert time_column is not None
    if time_column not in batch.schema.names or not can_fold(spec.aggregate, batch, key_column):
        return False
    ms = column_millis(batch.column(time_column))
    if ms is None:
        return False
    assigner = spec.assigner
    assert isinstance(assigner, Tumbling | Sliding)
    size, lateness = assigner.size, spec.lateness
    slide = assigner.slide if isinstance(assigner, Sliding) else size
    last = ms - (ms - assigner.offset) % slide  # the latest window's start (`assign`)
    late = last + size + lateness <= origin  # every window closed (`is_late`)
    if late.any():
        at = np.flatnonzero(late)
        time.late += len(at)
        if dead is not None and spec.on_late == "dead-letter":
            for i, record in zip(at, batch.take(pa.array(at)).to_pylist(), strict=True):
                ts = int(ms[i])
                dead.add(operator, split, base + int(i), record,
                         _late_reason(operator, ts, origin, lateness))  # fmt: skip
    # every (record, window) pair, record by record and each record's windows earliest
    # first (the order `assign` gives), without the windows closed at the origin
    per = -(-size // slide)  # the most windows a record is in
    starts = last[:, None] - slide * np.arange(per - 1, -1, -1, dtype=np.int64)[None, :]
    live = (starts > (ms - size)[:, None]) & (starts + size + lateness > origin)
    rows, _ = np.nonzero(live)
    if not len(rows):
        return True
    take = None if len(rows) == batch.num_rows and per == 1 else pa.array(rows)
    keys: pa.Array | tuple[pa.Array, ...] = (
        batch.column(key_column)
        if isinstance(key_column, str)
        else tuple(batch.column(c) for c in key_column)
    )
    values = value_columns(spec.aggregate, batch)
    if take is not None:
        keys = keys.take(take) if isinstance(keys, pa.Array) else tuple(k.take(take) for k in keys)
        values = [None if v is None else v.take(take) for v in values]

    def current(key: Any, start: int | None) -> Any:
        slot = slots.get(key)
        entry = None if slot is None else slot.get(_WINDOWS, {}).get(start)
        return MISSING if entry is None else entry[1]

    agg = spec.aggregate
    groups = (
        fold_all(agg, keys, values, starts[live], current)
        if agg.parts
        else fold(agg, keys, values[0], starts[live], current)
    )
    for key, start, acc in groups:
        assert start is not None
        slot = slots.get(key)
        if slot is None:
            state.codec.check(key, what="the key of a window", operator=operator)
            slot = slots[key] = {}
        slot.setdefault(_WINDOWS, {})[start] = [start + size, acc]
    return True


def _fire(
    spec: WindowSpec, state: OperatorState, time: EpochTime, scope_kind: str
) -> tuple[list[tuple[str, Batch]], list[int]]:
    """Emit and drop every window whose end plus the lateness its scope's watermark reached."""
    out: list[tuple[str, Batch]] = []
    origins: list[int] = []
    agg, lateness = spec.aggregate, spec.lateness
    for scope, slots in state.keyed.items():
        watermark = time.end.get(scope)
        if watermark is None:
            continue
        fired: list[tuple[int, int, bytes, Any, Any]] = []
        for key in list(slots):
            slot = slots[key]
            if (sessions := slot.get(_SESSIONS)) is not None:
                left = []
                for s in sessions:
                    if s[1] + lateness < watermark:  # see `Session`
                        fired.append((s[1], s[0], _ENCODE.encode(key), key, s[2]))
                    else:
                        left.append(s)
                if left:
                    slot[_SESSIONS] = left
                else:
                    del slot[_SESSIONS]
            if (windows := slot.get(_WINDOWS)) is not None:
                for start in [s for s, (end, _) in windows.items() if end + lateness <= watermark]:
                    end, acc = windows.pop(start)
                    fired.append((end, start, _ENCODE.encode(key), key, acc))
                if not windows:
                    del slot[_WINDOWS]
            if not slot:
                del slots[key]
        if fired:
            fired.sort(key=lambda f: (f[0], f[1], f[2]))
            rows = [
                spec.emit(key, Window(start, end), agg.result(acc))
                for end, start, _, key, acc in fired
            ]
            split = scope if scope_kind == "split" else time.key_split
            out.append((split, as_schema_rows(rows, spec.schema)))
            origins.append(time.start_of(scope))
    for scope in [s for s, slots in state.keyed.items() if not slots]:
        del state.keyed[scope]
    return out, origins
