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
from regional.errors import GraphError

__all__ = [
    "Aggregate",
    "Session",
    "Sliding",
    "Tumbling",
    "Window",
    "WindowAssigner",
    "closed",
    "combine",
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
    #: the aggregates of a combined one (`combine`: ``aggregate=[count(), sum_of("v")]``),
    #: whose accumulator is the list of theirs and whose result is ``{column: value}``
    parts: tuple[Aggregate, ...] = ()
    #: the built-in's call as a user writes it, for messages (``sum_of('amount')``)
    call: str | None = None

    def alias(self, name: str) -> Aggregate:
        """This aggregate with its output column named `name` (as Spark's ``.alias``).

        >>> count().alias("clicks").output_column
        'clicks'
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"alias({name!r}): give the output column's name")
        return self._replace(column=name)

    def __str__(self) -> str:
        """The aggregate as a user wrote it, for messages: ``sum_of('amount').alias('t')``."""
        if self.parts:
            return "[" + ", ".join(str(p) for p in self.parts) + "]"
        text = self.call or "Aggregate(...)"
        return text if self.column is None else f"{text}.alias({self.column!r})"

    @property
    def output_column(self) -> str:
        """The name of the column this aggregate fills on a stream with a schema: its alias,
        else ``count``, or ``<kind>_<field>`` (``sum_amount``), else ``value``."""
        if self.column is not None:
            return self.column
        if self.kind == "count" or self.kind is None or self.parts:
            return "value" if self.kind is None or self.parts else self.kind
        return f"{self.kind}_{self.field}"


#: The default precision of `count_distinct(exact=False)`: 2**12 registers (DataSketches'
#: default), a relative error within 3.2% at 2 standard deviations.
DEFAULT_LG_K = 12


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
        call="count()",
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
        lambda: 0, add, lambda a, b: a + b, _identity, columnar="sum", field=field, kind="sum",
        call=f"sum_of({field!r})",
    )  # fmt: skip


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

    return Aggregate(_none, add, merge, _identity, columnar="min", field=field, kind="min",
                     call=f"min_of({field!r})")  # fmt: skip


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

    return Aggregate(_none, add, merge, _identity, columnar="max", field=field, kind="max",
                     call=f"max_of({field!r})")  # fmt: skip


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

    return Aggregate(lambda: [0, 0], add, merge, result, columnar="mean", field=field,
                     kind="mean", call=f"mean_of({field!r})")  # fmt: skip


def _none() -> None:
    return None


def count_distinct(field: str, *, exact: bool = True, lg_k: int = DEFAULT_LG_K) -> Aggregate:
    """The number of distinct non-None values of `record[field]` (SQL's ``COUNT(DISTINCT
    field)``).

    Exact (the default): the accumulator is the set of values seen (state grows with them), so
    the count is the same whichever units fell back when.

    ``exact=False``: an estimate, as Spark's ``approx_count_distinct``, from an HLL sketch
    (Apache DataSketches, the extra ``regional-checkpoints[sketches]``) of ``2**lg_k``
    registers (`lg_k` from 7 to 21; state per window and key is about ``2**lg_k`` bytes at
    most, whatever the number of values). The estimate depends only on the set of values, not
    on their order or on how sketches were merged, so a replayed or rescaled run gives the same
    number; its relative error is within `relative_error(lg_k)` (3.2% at the default lg_k=12)
    in 95.4% of cases (2 standard deviations), exact while a sketch has seen few values
    (`regional.dataflow.distinct_sketches`). Its default column is
    ``approx_count_distinct_<field>``.

    >>> a = count_distinct("u")
    >>> a.result(a.add(a.add(a.add(a.init(), {"u": "x"}), {"u": "x"}), {"u": None}))
    1
    """
    if not exact:
        from regional.dataflow.distinct_sketches import approximate_distinct

        return approximate_distinct(field, lg_k)

    def add(acc: set[Any], record: Any) -> set[Any]:
        v = record[field]
        if v is not None:
            acc.add(v)
        return acc

    def merge(a: set[Any], b: set[Any]) -> set[Any]:
        return a | b

    return Aggregate(set, add, merge, len, field=field, kind="count_distinct",
                     call=f"count_distinct({field!r})")  # fmt: skip


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


def combine(aggregates: Sequence[Aggregate], what: str) -> Aggregate:
    """Several aggregates computed together (``aggregate=[count(), sum_of("amount")]``, as
    PySpark's ``.agg(F.count(...), F.sum(...))``): the accumulator is the list of theirs, the
    result ``{output column: value}`` in their order. One aggregate is returned as it is.
    `GraphError` naming `what` for an empty list, something that is no aggregate, or two
    aggregates filling the same output column (naming both).

    >>> a = combine([count(), max_of("v").alias("top")], "window 'w'")
    >>> a.result(a.add(a.add(a.init(), {"v": 3}), {"v": 5}))
    {'count': 2, 'top': 5}
    >>> combine([sum_of("v"), count().alias("sum_v")], "window 'w'")
    Traceback (most recent call last):
    ...
    regional.errors.GraphError: window 'w': sum_of('v') and count().alias('sum_v') both \
fill the column 'sum_v'; name one otherwise with .alias('...')
    """
    parts = list(aggregates)
    for agg in parts:
        if not isinstance(agg, Aggregate) or agg.parts:
            called = " (call it: count(), not count)" if callable(agg) else ""
            raise GraphError(
                f"{what}: {agg!r} in the list of aggregates is no aggregate{called}; give "
                "count(), sum_of('field'), min_of('field'), max_of('field'), mean_of('field'), "
                "count_distinct('field') or an Aggregate(init, add, merge, result)"
            )
    if not parts:
        raise GraphError(
            f"{what}: the list of aggregates is empty; give at least one, e.g. count()"
        )
    if len(parts) == 1:
        return parts[0]
    by_column: dict[str, Aggregate] = {}
    for agg in parts:
        first = by_column.setdefault(agg.output_column, agg)
        if first is not agg:
            raise GraphError(
                f"{what}: {first} and {agg} both fill the column {agg.output_column!r}; name "
                "one otherwise with .alias('...')"
            )
    several = tuple(parts)

    def init() -> list[Any]:
        return [p.init() for p in several]

    def add(acc: list[Any], record: Any) -> list[Any]:
        return [p.add(a, record) for p, a in zip(several, acc, strict=True)]

    def merge(a: list[Any], b: list[Any]) -> list[Any]:
        return [p.merge(x, y) for p, x, y in zip(several, a, b, strict=True)]

    def result(acc: list[Any]) -> dict[str, Any]:
        return {p.output_column: p.result(a) for p, a in zip(several, acc, strict=True)}

    return Aggregate(init, add, merge, result, parts=several)
