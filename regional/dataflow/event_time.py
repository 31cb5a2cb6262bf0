"""Event time: timestamps, and watermark arithmetic per split, per subtask and per exchange
reader (DESIGN §4 rule 15). Pure: the clock is an argument.

A watermark W (ms since the Unix epoch) says "records with an event time below W are behind":
`metadata.watermarks.MIN_WATERMARK` is "nothing known", `MAX_WATERMARK` "the input has ended".

* **Split.** ``W = max event time read from the split - max_out_of_orderness`` (`advance_split`);
  it only grows, lives in the split state and falls back with its unit; a finished split drops
  out (its watermark is +inf).
* **Subtask.** The minimum over the splits it reads (`subtask_watermark`): +inf once its
  input ended, and with an `idle_timeout` (processing time; off by default) a split that
  delivered nothing for that long no longer holds it back.
* **Exchange reader.** The minimum over the upstream writer subtasks of each writer's latest
  watermark mark the reader's cursor has reached (`reader_watermark`, from
  `metadata.watermarks`, which the inspector shares); a writer that committed nothing yet
  holds it at -inf.

>>> bound = span_ms("5 s", "max_out_of_orderness")
>>> s = advance_split(None, [10_000, 12_000, 11_000], bound, now_ms=1)
>>> s.watermark
7000
>>> advance_split(s, [3_000], bound, now_ms=2).watermark  # never goes back
7000
>>> subtask_watermark({"a": s, "b": SplitWatermark(2_000, 0)}, now_ms=2)
2000
>>> subtask_watermark({}, now_ms=0, ended=True) == MAX_WATERMARK
True

**Supported event times** (DESIGN §4 rule 15): from `EARLIEST_EVENT_TIME` (0002-01-01) up to
`LATEST_EVENT_TIME` (9998-12-31T23:59:59.999), UTC; every span (window size and slide,
session gap, lateness, out-of-orderness, idle timeout) is at most `MAX_SPAN_MS` (365 days).
Then every watermark, window bound and timer of a record is a `datetime` (years 1 to 9999:
what Python, Spark and Parquet readers hold), an Arrow `timestamp("ms")`, and far from the
int64 ends that mean -inf and +inf. A record outside them, or whose event time is no
datetime or int, cannot be placed: with `on_error="dead-letter"` it is a dead letter, else
its unit declines with an `EventTimeError` naming the source, the function and the record.
"""

from __future__ import annotations

import datetime as dt
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pyarrow as pa

from metadata.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    SplitWatermark,
    reader_watermark,
    released_writers,
)
from regional.errors import RegionalError
from regional.policy import parse_duration
from regional.sources.base import Batch

__all__ = [
    "EARLIEST_EVENT_TIME",
    "LATEST_EVENT_TIME",
    "MAX_SPAN_MS",
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "EventTime",
    "EventTimeError",
    "SplitWatermark",
    "Stamped",
    "advance_split",
    "column_millis",
    "reader_watermark",
    "record_time",
    "released_writers",
    "span_ms",
    "subtask_watermark",
    "to_millis",
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
_DAY_MS = 86_400_000
#: The earliest supported event time: 0002-01-01T00:00:00Z, in ms since the Unix epoch.
EARLIEST_EVENT_TIME = (dt.date(2, 1, 1) - _EPOCH.date()).days * _DAY_MS
#: The latest supported event time: 9998-12-31T23:59:59.999Z.
LATEST_EVENT_TIME = (dt.date(9999, 1, 1) - _EPOCH.date()).days * _DAY_MS - 1
#: The longest span (window size, slide, gap, lateness, out-of-orderness, idle timeout): 365
#: days, so a window or watermark of a supported event time stays within years 1 to 9999.
MAX_SPAN_MS = 365 * _DAY_MS
_RANGE = "0002-01-01T00:00:00.000Z to 9998-12-31T23:59:59.999Z"


class EventTimeError(RegionalError):
    """A record's event time cannot be used: the `event_time` function raised, returned
    something that is no datetime or int, or a time outside the supported range. The message
    names the source (or window), the function, where the record was read, the record and the
    fix. With `on_error="dead-letter"` the record is a dead letter instead."""


def to_millis(value: Any, what: str = "an event time") -> int:
    """Milliseconds since the Unix epoch of `value`: a `datetime` (naive means UTC), a `date`,
    or an int of milliseconds, within the supported event times. `TypeError` naming `what`
    for any other type (bool and float too: round a float with int()), `ValueError` for a
    time outside the range.

    >>> to_millis(dt.datetime(2026, 1, 1, 0, 0, 1)), to_millis(1500)
    (1767225601000, 1500)
    >>> to_millis(2**63 - 1)
    Traceback (most recent call last):
    ...
    ValueError: an event time is 9223372036854775807 ms, outside the supported event times \
(0002-01-01T00:00:00.000Z to 9998-12-31T23:59:59.999Z)
    """
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - _EPOCH
        ms = (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    elif isinstance(value, dt.date):
        ms = (value - _EPOCH.date()).days * _DAY_MS
    elif isinstance(value, int) and not isinstance(value, bool):
        ms = value
    else:
        raise TypeError(
            f"{what} is {value!r:.100} ({type(value).__name__}); it must be a datetime "
            "(naive = UTC) or an int of milliseconds since the Unix epoch"
        )
    if not EARLIEST_EVENT_TIME <= ms <= LATEST_EVENT_TIME:
        raise ValueError(f"{what} is {ms} ms, outside the supported event times ({_RANGE})")
    return ms


def span_ms(value: Any, what: str, *, allow_zero: bool = True) -> int:
    """Milliseconds of a duration given as `"5 s"`, `"1 min"`, a `timedelta` or a number of
    seconds; `ValueError` naming `what` for anything else or a negative span.

    >>> span_ms("1 min", "size"), span_ms(dt.timedelta(milliseconds=250), "gap"), span_ms(2, "x")
    (60000, 250, 2000)
    """
    try:
        seconds = parse_duration(value)
    except ValueError:
        seconds = float("nan")
    ms = round(seconds * 1000) if seconds == seconds and abs(seconds) < 1e300 else -1
    if ms < 0 or ms > MAX_SPAN_MS or (ms == 0 and not allow_zero):
        least = "0" if allow_zero else "more than 0"
        raise ValueError(
            f'{what}={value!r}; give a duration of {least} to 365 days: "500 ms", "5 s", '
            '"1 min", "30 d", a datetime.timedelta or a number of seconds'
        )
    return ms


class Stamped(NamedTuple):
    """Records read from one split with their event times (`EventTime.stamp`): the `batches`
    of the records that have one, their `stamps` (ms, in record order), and the `rejected`
    ones as (index among the records read, record, why)."""

    batches: list[Batch]
    stamps: list[int]
    rejected: list[tuple[int, Any, EventTimeError]]


class EventTime:
    """How a source's records carry event time: a field name (`"ts"`: `record["ts"]`) or a
    function of a record, giving a timestamp (`to_millis`); the allowed out-of-orderness (ms)
    subtracted from the largest one seen. `idle_timeout_ms` (None: off) releases a split that
    delivered nothing for that long (processing time)."""

    def __init__(
        self,
        fn: Callable[[Any], Any] | str,
        max_out_of_orderness: Any = 0,
        idle_timeout: Any = None,
    ) -> None:
        self.field = fn if isinstance(fn, str) else None
        if isinstance(fn, str):
            fn = operator.itemgetter(fn)
        elif not callable(fn):
            raise TypeError(
                f"event_time={fn!r} is neither a field name nor a function; give the field "
                "holding the time, e.g. event_time='ts', or a function of a record, e.g. "
                "lambda r: r['ts']"
            )
        self.fn = fn
        self.bound_ms = span_ms(max_out_of_orderness, "max_out_of_orderness")
        self.idle_timeout_ms = (
            None
            if idle_timeout is None
            else span_ms(idle_timeout, "idle_timeout", allow_zero=False)
        )

    @property
    def identity(self) -> object:
        """What tells two sources' event times apart: the field name, or the function."""
        return ("field", self.field) if self.field is not None else self.fn

    def of(self, record: Any, owner: str = "the source", where: str = "") -> int:
        """The event time of `record` (ms); `EventTimeError` naming `owner` (e.g. "source
        'clicks'"), the function, `where` the record was read, the record and the fix."""
        return record_time(self.fn, record, owner=owner, where=where, field=self.field)

    def stamp(self, batches: Sequence[Batch], *, source: str, split: str, position: str) -> Stamped:
        """The event times of the records of `batches`, read from `split` of source vertex
        `source` from `position`; the records without a usable one are taken out."""
        kept: list[Batch] = []
        stamps: list[int] = []
        rejected: list[tuple[int, Any, EventTimeError]] = []
        index = 0
        for batch in batches:
            if (
                self.field is not None
                and isinstance(batch, pa.RecordBatch)
                and self.field in batch.schema.names
                and (ms := column_millis(batch.column(self.field))) is not None
            ):  # a column of good event times: no record needs reading one by one
                stamps += ms.tolist()
                kept.append(batch)
                index += batch.num_rows
                continue
            rows = batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch
            keep = []
            owner = f"source {source!r}"
            for record in rows:
                try:
                    stamps.append(self.of(record, owner))
                    keep.append(True)
                except EventTimeError:  # again, naming where it was read (only now: slow)
                    where = f"split {split!r}, record {index} read from position {position or 0}"
                    try:
                        self.of(record, owner, where)
                    except EventTimeError as exc:
                        rejected.append((index, record, exc))
                    keep.append(False)
                index += 1
            if all(keep):
                kept.append(batch)
            elif any(keep):
                kept.append(
                    batch.filter(pa.array(keep))
                    if isinstance(batch, pa.RecordBatch)
                    else [r for r, k in zip(rows, keep, strict=True) if k]
                )
        return Stamped(kept, stamps, rejected)


def column_millis(column: pa.Array | pa.ChunkedArray) -> np.ndarray | None:
    """A column's event times in ms (int64), when every one is an int of ms or an Arrow
    timestamp within the supported event times, as `to_millis` gives them (timestamps rounded
    down to the ms); None otherwise (then the records are read one by one, and the bad ones
    named).

    >>> column_millis(pa.array([1500, 2500])).tolist(), column_millis(pa.array([1, None]))
    ([1500, 2500], None)
    """
    if column.null_count:
        return None
    kind = column.type
    if pa.types.is_integer(kind):
        ms = np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.int64)
    elif pa.types.is_timestamp(kind):
        raw = np.asarray(column.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype=np.int64)
        per_ms = {"ms": 1, "us": 1000, "ns": 1_000_000}.get(kind.unit)
        ms = raw * 1000 if per_ms is None else raw // per_ms  # "s", else rounded down
    else:
        return None
    if len(ms) and (ms.min() < EARLIEST_EVENT_TIME or ms.max() > LATEST_EVENT_TIME):
        return None
    return ms


def record_time(
    fn: Callable[[Any], Any],
    record: Any,
    *,
    owner: str,
    where: str = "",
    field: str | None = None,
) -> int:
    """`to_millis(fn(record))`; `EventTimeError` (from the cause) naming `owner`, the function
    (or `field`), `where`, the record (cut to 200 characters) and the fix.

    >>> record_time(lambda r: r["ts"], {"n": 1}, owner="source 'clicks'", where="split 'a'")
    Traceback (most recent call last):
    ...
    regional.dataflow.event_time.EventTimeError: the event_time function <lambda> of source \
'clicks' raised KeyError: 'ts' on record {'n': 1} (split 'a'); fix the function or the record, \
or run the pipeline with on_error='dead-letter' to set such records aside
    """
    try:
        value = fn(record)
    except Exception as exc:
        error: Exception | None = exc
    else:
        if type(value) is int and EARLIEST_EVENT_TIME <= value <= LATEST_EVENT_TIME:
            return value  # the hot path: no message is built unless one is needed
        try:
            return to_millis(value)
        except (TypeError, ValueError):
            error = None  # named below, with the record
    what = (
        f"the event_time field {field!r} of {owner}"
        if field is not None
        else f"the event_time function {getattr(fn, '__qualname__', repr(fn))} of {owner}"
    )
    at = f"record {record!r:.200}" + (f" ({where})" if where else "")
    fix = "or run the pipeline with on_error='dead-letter' to set such records aside"
    if error is not None:
        if field is not None and isinstance(error, KeyError | IndexError | TypeError):
            raise EventTimeError(
                f"{what} is missing from {at}; give every record that field, {fix}"
            ) from error
        raise EventTimeError(
            f"{what} raised {type(error).__name__}: {error} on {at}; fix the function or the "
            f"record, {fix}"
        ) from error
    try:
        return to_millis(value, f"the event time of {at}")
    except (TypeError, ValueError) as exc:
        raise EventTimeError(
            f"{exc}, given by {what}; fix the function or the record, {fix}"
        ) from None


def advance_split(
    current: SplitWatermark | None, event_times: Iterable[int], bound_ms: int, now_ms: int
) -> SplitWatermark:
    """A split's watermark after it delivered records with `event_times` (empty: none) at
    processing time `now_ms`: the largest event time seen minus `bound_ms`, never lower than
    before."""
    wm = MIN_WATERMARK if current is None else current.watermark
    last = now_ms if current is None else current.last_record_ms  # idle from its assignment
    seen = max(event_times, default=None)
    if seen is None:
        return SplitWatermark(wm, last)
    return SplitWatermark(max(wm, seen - bound_ms), now_ms)


def subtask_watermark(
    splits: Mapping[str, SplitWatermark | None],
    *,
    now_ms: int,
    ended: bool = False,
    idle_timeout_ms: int | None = None,
) -> int:
    """The watermark of a subtask reading `splits` (None: a split with no record yet): their
    minimum, +inf when the input `ended` and no split is left, -inf with no split (nothing
    known). With `idle_timeout_ms`, a split whose last record is older than that (processing
    time) is left out, unless every split is idle."""
    if not splits:
        return MAX_WATERMARK if ended else MIN_WATERMARK
    marks = [MIN_WATERMARK if s is None else s.watermark for s in splits.values()]
    if idle_timeout_ms is not None:
        active = [
            m
            for m, s in zip(marks, splits.values(), strict=True)
            if s is None or now_ms - s.last_record_ms < idle_timeout_ms
        ]
        if active:
            return min(active)
    return min(marks)
