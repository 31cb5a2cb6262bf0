"""Event-time windows: assignment (tumbling, sliding, session), session merging, aggregates and
the late-data rule. Pure.

Times are ms since the Unix epoch; a window is ``[start, end)``. Windows align like Spark SQL's
`window(ts, size, slide)` (to the Unix epoch, plus an optional offset), so results compare
one to one with ``groupBy(window(...), key)``.

**Closing and lateness.** A window *closes* when the watermark reaches its end plus the allowed
lateness (``end + allowed_lateness <= watermark``); its one final row is emitted then. A record
is *late* when every window it belongs to has closed: it is counted and dropped (or
dead-lettered), never added to a window that already emitted its row.

>>> Tumbling("1 min").assign(90_000)
[Window(start=60000, end=120000)]
>>> Sliding("1 min", "30 s").assign(90_000)
[Window(start=60000, end=120000), Window(start=90000, end=150000)]
>>> is_late(Tumbling("1 min").assign(90_000), watermark=120_000, lateness=0)
True
>>> merge_sessions([(0, 10, 1), (30, 40, 1)], (5, 35, 1), lambda a, b: a + b)
[(0, 40, 3)]
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from regional.dataflow.event_time import span_ms

__all__ = [
    "Aggregate",
    "Session",
    "Sliding",
    "Tumbling",
    "Window",
    "WindowAssigner",
    "closed",
    "count",
    "count_distinct",
    "is_late",
    "max_of",
    "mean_of",
    "merge_sessions",
    "min_of",
    "reduce_with",
    "sum_of",
]


class Window(NamedTuple):
    """The event-time interval ``[start, end)`` (ms)."""

    start: int
    end: int


class Tumbling:
    """Fixed, non-overlapping windows of `size` (``"1 min"``, a timedelta or seconds)."""

    session = False

    def __init__(self, size: Any, offset: Any = 0) -> None:
        self.size = span_ms(size, "Tumbling(size)", allow_zero=False)
        self.offset = span_ms(offset, "Tumbling(offset)") % self.size

    def assign(self, ts: int) -> list[Window]:
        """The one window holding event time `ts` (ms)."""
        start = ts - (ts - self.offset) % self.size
        return [Window(start, start + self.size)]

    def __repr__(self) -> str:
        return f"Tumbling({self.size} ms)"


class Sliding:
    """Windows of `size` starting every `slide` (hopping); a record belongs to about
    size/slide of them."""

    session = False

    def __init__(self, size: Any, slide: Any, offset: Any = 0) -> None:
        self.size = span_ms(size, "Sliding(size)", allow_zero=False)
        self.slide = span_ms(slide, "Sliding(slide)", allow_zero=False)
        if self.slide > self.size:
            raise ValueError(
                f"Sliding(size={size!r}, slide={slide!r}): the slide is longer than the size, "
                "so some records would be in no window; use a slide <= size"
            )
        self.offset = span_ms(offset, "Sliding(offset)") % self.slide

    def assign(self, ts: int) -> list[Window]:
        """Every window holding event time `ts` (ms), the earliest first."""
        last = ts - (ts - self.offset) % self.slide
        out = []
        start = last
        while start > ts - self.size:
            out.append(Window(start, start + self.size))
            start -= self.slide
        return out[::-1]

    def __repr__(self) -> str:
        return f"Sliding({self.size} ms every {self.slide} ms)"


class Session:
    """Per key, records at most `gap` apart form one session ``[first, last + gap)`` (like
    Spark SQL's `session_window(ts, gap)`). A session closes once the watermark is past its end
    plus the allowed lateness (``end + lateness < watermark``); a record is late when it is
    behind the watermark by more than the allowed lateness (``ts + lateness < watermark``), so
    no on-time record can touch a closed session."""

    session = True

    def __init__(self, gap: Any) -> None:
        self.gap = span_ms(gap, "Session(gap)", allow_zero=False)

    def assign(self, ts: int) -> list[Window]:
        """The session of one record at `ts` (ms), before merging with the key's others."""
        return [Window(ts, ts + self.gap)]

    def __repr__(self) -> str:
        return f"Session(gap {self.gap} ms)"


WindowAssigner = Tumbling | Sliding | Session


def closed(window: Window, watermark: int, lateness: int) -> bool:
    """True once `window` has emitted its final row (or would have): the watermark reached its
    end plus the allowed lateness."""
    return window.end + lateness <= watermark


def is_late(windows: Iterable[Window], watermark: int, lateness: int) -> bool:
    """True when every window of a record has closed at `watermark` (the record is late)."""
    return all(closed(w, watermark, lateness) for w in windows)


Span = tuple[int, int, Any]


def merge_sessions(
    sessions: Sequence[Sequence[Any]], new: Sequence[Any], merge: Callable[[Any, Any], Any]
) -> list[Span]:
    """`sessions` (disjoint, by start) with `new` added: every session overlapping or
    touching it merges into one (accumulators combined with `merge`, in start order), as Spark
    SQL's `session_window` and Flink merge them; the result stays sorted."""
    start, end, acc = new
    keep: list[Span] = []
    overlapping: list[Span] = []
    for s in sessions:
        (overlapping if s[0] <= end and start <= s[1] else keep).append((s[0], s[1], s[2]))
    if overlapping:
        parts = sorted([*overlapping, (start, end, acc)], key=lambda s: (s[0], s[1]))
        acc = parts[0][2]
        for p in parts[1:]:
            acc = merge(acc, p[2])
        start = min(p[0] for p in parts)
        end = max(p[1] for p in parts)
    keep.append((start, end, acc))
    return sorted(keep, key=lambda s: (s[0], s[1]))


class Aggregate(NamedTuple):
    """An incremental aggregate: `init()` -> accumulator, `add(acc, record)` -> acc,
    `merge(a, b)` -> acc (sessions), `result(acc)` -> the emitted value. Accumulators are state:
    they must be values the pipeline's state codec keeps (numbers, str, lists, dicts, ...)."""

    init: Callable[[], Any]
    add: Callable[[Any, Any], Any]
    merge: Callable[[Any, Any], Any]
    result: Callable[[Any], Any]
    #: a built-in the window and running-aggregate operators may compute over Arrow columns
    #: instead of record by record, with the same accumulators: "count", "sum", "min", "max"
    #: or "mean" (None for any other aggregate: always record by record)
    columnar: str | None = None
    #: the field a built-in reads (None for `count`)
    field: str | None = None
    #: which built-in this is ("count", "sum", "min", "max", "mean", "count_distinct"; None
    #: for any other aggregate): on a stream with a schema it says the output column's type
    kind: str | None = None
    #: the output column's name on a stream with a schema (`alias`); None: the built-in's
    #: default, ``count``, ``sum_<field>``, ``count_distinct_<field>``...
    column: str | None = None

    def alias(self, name: str) -> Aggregate:
        """This aggregate with its output column named `name` (as Spark's ``.alias``).

        >>> count().alias("clicks").output_column
        'clicks'
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"alias({name!r}): give the output column's name")
        return self._replace(column=name)

    @property
    def output_column(self) -> str:
        """The name of the column this aggregate fills on a stream with a schema: its alias,
        else ``count``, or ``<kind>_<field>`` (``sum_amount``), else ``value``."""
        if self.column is not None:
            return self.column
        if self.kind == "count" or self.kind is None:
            return self.kind or "value"
        return f"{self.kind}_{self.field}"


def _identity(x: Any) -> Any:
    return x


def count() -> Aggregate:
    """The number of records.

    >>> a = count(); a.result(a.add(a.add(a.init(), "x"), "y"))
    2
    """
    return Aggregate(
        lambda: 0,
        lambda acc, _r: acc + 1,
        lambda a, b: a + b,
        _identity,
        columnar="count",
        kind="count",
    )


def sum_of(field: str) -> Aggregate:
    """The sum of `record[field]`; None values are skipped (as SQL's ``sum``), 0 when every
    value was (SQL gives NULL there).

    >>> a = sum_of("v"); a.result(a.add(a.add(a.add(a.init(), {"v": 3}), {"v": None}), {"v": 1}))
    4
    """

    def add(acc: Any, record: Any) -> Any:
        v = record[field]
        return acc if v is None else acc + v

    return Aggregate(
        lambda: 0, add, lambda a, b: a + b, _identity, columnar="sum", field=field, kind="sum"
    )


def min_of(field: str) -> Aggregate:
    """The smallest `record[field]`; None values are skipped (as SQL's ``min``), None when
    every value was.

    >>> a = min_of("v"); a.result(a.add(a.add(a.add(a.init(), {"v": 3}), {"v": None}), {"v": 1}))
    1
    """

    def add(acc: Any, record: Any) -> Any:
        v = record[field]
        return acc if v is None else v if acc is None or v < acc else acc

    def merge(a: Any, b: Any) -> Any:
        return a if b is None else b if a is None or b < a else a

    return Aggregate(_none, add, merge, _identity, columnar="min", field=field, kind="min")


def max_of(field: str) -> Aggregate:
    """The largest `record[field]`; None values are skipped, None when every value was.

    >>> a = max_of("v"); a.result(a.add(a.add(a.init(), {"v": 3}), {"v": 5}))
    5
    """

    def add(acc: Any, record: Any) -> Any:
        v = record[field]
        return acc if v is None else v if acc is None or v > acc else acc

    def merge(a: Any, b: Any) -> Any:
        return a if b is None else b if a is None or b > a else a

    return Aggregate(_none, add, merge, _identity, columnar="max", field=field, kind="max")


def mean_of(field: str) -> Aggregate:
    """The mean of `record[field]` (a float); None values are skipped, None when every value
    was. The accumulator is ``[sum, count]``.

    >>> a = mean_of("v"); a.result(a.add(a.add(a.add(a.init(), {"v": 1}), {"v": 2}), {"v": None}))
    1.5
    """

    def add(acc: list[Any], record: Any) -> list[Any]:
        v = record[field]
        return acc if v is None else [acc[0] + v, acc[1] + 1]

    def merge(a: list[Any], b: list[Any]) -> list[Any]:
        return [a[0] + b[0], a[1] + b[1]]

    def result(acc: list[Any]) -> float | None:
        return acc[0] / acc[1] if acc[1] else None

    return Aggregate(lambda: [0, 0], add, merge, result, columnar="mean", field=field, kind="mean")


def _none() -> None:
    return None


def count_distinct(field: str, *, exact: bool = True) -> Aggregate:
    """The number of distinct non-None values of `record[field]` (SQL's ``COUNT(DISTINCT
    field)``). Exact: the accumulator is the set of values seen (state grows with them), so
    the count is the same whichever units fell back when. ``exact=False`` (an approximate
    sketch) is not available: no sketch library is a dependency; it raises `ValueError`.

    >>> a = count_distinct("u")
    >>> a.result(a.add(a.add(a.add(a.init(), {"u": "x"}), {"u": "x"}), {"u": None}))
    1
    """
    if not exact:
        raise ValueError(
            f"count_distinct({field!r}, exact=False): approximate distinct counts need a "
            "sketch library regional does not ship; use exact=True (a set per window and key "
            "in state)"
        )

    def add(acc: set[Any], record: Any) -> set[Any]:
        v = record[field]
        if v is not None:
            acc.add(v)
        return acc

    def merge(a: set[Any], b: set[Any]) -> set[Any]:
        return a | b

    return Aggregate(set, add, merge, len, field=field, kind="count_distinct")


def reduce_with(fn: Callable[[Any, Any], Any]) -> Aggregate:
    """`fn(a, b)` folded over the records (the first record is the start); the accumulator is
    ``[record]`` until reduced, so a None record is kept as one.

    >>> a = reduce_with(max); a.result(a.add(a.add(a.init(), 3), 5))
    5
    """

    def add(acc: Any, record: Any) -> Any:
        return [record] if not acc else [fn(acc[0], record)]

    def merge(a: Any, b: Any) -> Any:
        return a if not b else b if not a else [fn(a[0], b[0])]

    return Aggregate(list, add, merge, lambda acc: acc[0] if acc else None)
