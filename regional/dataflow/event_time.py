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
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from metadata.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    SplitWatermark,
    reader_watermark,
    released_writers,
)
from regional.policy import parse_duration

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "EventTime",
    "SplitWatermark",
    "advance_split",
    "reader_watermark",
    "released_writers",
    "span_ms",
    "subtask_watermark",
    "to_millis",
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def to_millis(value: Any, what: str = "an event time") -> int:
    """Milliseconds since the Unix epoch of `value`: a `datetime` (naive means UTC), a `date`,
    or an int of milliseconds. `TypeError` naming `what` for anything else.

    >>> to_millis(dt.datetime(2026, 1, 1, 0, 0, 1)), to_millis(1500)
    (1767225601000, 1500)
    """
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        delta = value - _EPOCH
        return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000
    if isinstance(value, dt.date):
        return (value - _EPOCH.date()).days * 86_400_000
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(
        f"{what} is {value!r} ({type(value).__name__}); the event_time function must return a "
        "datetime (naive = UTC) or an int of milliseconds since the Unix epoch"
    )


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
    ms = round(seconds * 1000) if seconds == seconds else -1
    if ms < 0 or (ms == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise ValueError(
            f'{what}={value!r}; give a duration of {least}: "500 ms", "5 s", "1 min", a '
            "datetime.timedelta or a number of seconds"
        )
    return ms


class EventTime:
    """How a source's records carry event time: `fn(record)` -> a timestamp (`to_millis`), and
    the allowed out-of-orderness (ms) subtracted from the largest one seen. `idle_timeout_ms`
    (None: off) releases a split that delivered nothing for that long (processing time)."""

    def __init__(
        self,
        fn: Callable[[Any], Any],
        max_out_of_orderness: Any = 0,
        idle_timeout: Any = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(
                f"event_time={fn!r} is not callable; give a function of a record, e.g. "
                "lambda r: r['ts']"
            )
        self.fn = fn
        self.bound_ms = span_ms(max_out_of_orderness, "max_out_of_orderness")
        self.idle_timeout_ms = (
            None
            if idle_timeout is None
            else span_ms(idle_timeout, "idle_timeout", allow_zero=False)
        )

    def of(self, record: Any) -> int:
        """The event time of `record` (ms)."""
        return to_millis(self.fn(record), f"the event time of {record!r:.200}")


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
