"""What `regional run` shows while a job runs: one plain line per checkpoint outcome (stdout is
not a terminal), a live `rich` view of the running epoch on a terminal, or one JSON object per
outcome with `--json` (the `metadata.events.CheckpointEvent`, as the event log stores it).

Every view takes the outcomes (`__call__`, the driver's `progress`) and the running epoch
(`epoch_started`, `unit_answered`: the driver's `EpochWatch`), so `regional run` wires any of
them the same way.

>>> import io
>>> from metadata.events import CheckpointEvent, Outcome
>>> event = CheckpointEvent(job_id="clicks", checkpoint_id=2, kind=Outcome.REGIONAL,
...     trigger_time_ms=1000, time_ms=1500, fresh_units=3, fallback_units=(1,), records_in=35)
>>> print(checkpoint_line(event))
checkpoint    2  regional  fresh   3  fallback 1           commit lag 0  records      35   0.50 s
>>> from metadata.events import StuckUnit
>>> stuck = StuckUnit(unit_id=1, splits=("events:1",), since_ms=500, owner_checkpoint_id=0,
...     fallbacks=3, cause="declined: ValueError: boom")
>>> event = CheckpointEvent(job_id="clicks", checkpoint_id=5, kind=Outcome.REGIONAL,
...     trigger_time_ms=180_000, time_ms=180_500, fresh_units=3, fallback_units=(1,),
...     causes={1: "declined: ValueError: boom"}, unit_reads={1: ("events:1",)},
...     stuck=(stuck,))
>>> print(checkpoint_line(event))  # doctest: +NORMALIZE_WHITESPACE
checkpoint    5  regional  fresh   3  fallback 1           commit lag 0  records       0   0.50 s
    unit 1 (events:1): declined: ValueError: boom
    stuck: unit 1 (events:1) for 3 min (on its initial state; 3 fallbacks in a row)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import TextIO

import msgspec
from rich.console import Console
from rich.live import Live
from rich.text import Text

from metadata.events import CheckpointEvent, Outcome
from metadata.watermarks import format_watermark
from regional.cli.render import say, terminal_text
from regional.coordinator.messages import Ack, Answer
from regional.graph.unit_names import UnitNames
from regional.report.html import human_span

__all__ = ["JsonProgress", "LiveProgress", "PlainProgress", "checkpoint_line"]


def checkpoint_line(
    r: CheckpointEvent,
    previous_watermark: int | None = None,
    names: UnitNames | None = None,
) -> str:
    """One line per checkpoint outcome, then the abort's explanation, why each unit fell
    back or failed and the units stuck (one line per unit, at most 5 of each, named by what
    they read: `names`, the pipeline's units' names, ``orders[1] (unit 1)``, else as the
    event names them; the tracebacks are in the event log). A job watermark lower than the
    `previous_watermark` shown says why it may be."""
    mentions = {} if names is None else {u: names.mention(u) for u in _mentioned(r)}
    fallback = ",".join(map(str, r.fallback_units)) or "-"
    line = (
        f"checkpoint {r.checkpoint_id:>4}  {r.kind:<8}  "
        f"fresh {r.fresh_units:>3}  fallback {fallback:<10}  "
        f"commit lag {r.commit_lag}  records {r.records_in:>7}  {r.seconds:5.2f} s"
    )
    if r.watermark_ms is not None:  # event time: the lowest unit watermark, and late records
        unit = r.watermark_unit
        held = f"unit {unit}" if names is None or unit is None else names.mention(unit)
        line += f"  watermark {format_watermark(r.watermark_ms)} ({held})"
        if previous_watermark is not None and r.watermark_ms < previous_watermark:
            line += (
                f" back from {format_watermark(previous_watermark)}: a unit's watermark is the "
                "lowest of its splits', and a split it was just given holds it until its "
                "records arrive"
            )
        if r.records_late:
            line += f"  late {r.records_late}"
    if r.records_behind:  # consumer lag: what the sources have not read yet
        line += f"  behind {sum(n for s in r.records_behind.values() for n in s.values())}"
        ages = [t for s in r.seconds_behind.values() for t in s.values()]
        if ages:  # and in time: the age of the oldest record not read yet
            line += f" ({human_span(round(max(ages) * 1000))})"
    if r.kind == Outcome.ABORTED:
        line += f"\n    {r.message}"
    causes = r.cause_lines(mentions)
    for cause in causes[:5]:
        line += f"\n    {cause}"
    if len(causes) > 5:
        line += f"\n    +{len(causes) - 5} more (regional inspect ROOT events)"
    for warning in r.warnings[:5]:
        line += f"\n    warning: {warning}"
    stuck = r.stuck_lines(names=mentions)
    for s in stuck[:5]:
        line += f"\n    {s}"
    if len(stuck) > 5:
        line += f"\n    +{len(stuck) - 5} more stuck (regional inspect ROOT lag)"
    return line


def _mentioned(r: CheckpointEvent) -> set[int]:
    """The units a progress line names: those with a cause, and the stuck ones."""
    return set(r.causes) | {s.unit_id for s in r.stuck}


class _Quiet:
    """No live view of the running epoch, and nothing to start or stop."""

    def epoch_started(self, checkpoint_id: int, units: Sequence[int]) -> None:
        return None

    def unit_answered(self, answer: Answer) -> None:
        return None

    def __enter__(self) -> _Quiet:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None


class PlainProgress(_Quiet):
    """`checkpoint_line` per outcome on `out` (flushed: a pipe or a log file sees it at once),
    units named by `names` (the pipeline's, `regional.graph.unit_names`) when given."""

    def __init__(self, out: TextIO, names: UnitNames | None = None) -> None:
        self.out = out
        self.names = names
        self._watermark: int | None = None  # the last one shown

    def __call__(self, event: CheckpointEvent) -> None:
        say(checkpoint_line(event, self._watermark, self.names), file=self.out)
        self._watermark = event.watermark_ms if event.watermark_ms is not None else self._watermark


class JsonProgress(_Quiet):
    """One JSON object per outcome on `out` (a `CheckpointEvent`, msgspec-encoded)."""

    def __init__(self, out: TextIO) -> None:
        self.out = out

    def __call__(self, event: CheckpointEvent) -> None:
        self.out.write(msgspec.json.encode(event).decode() + "\n")
        self.out.flush()


class LiveProgress:
    """A `rich` view for a terminal: every outcome as a line (as `PlainProgress`), and below
    them the running epoch: units answered / pending / falling back (declined), records/s and
    commit lag. `now` is the monotonic clock for records/s (tests pass a fake one)."""

    def __init__(
        self,
        console: Console,
        *,
        now: Callable[[], float] = time.monotonic,
        names: UnitNames | None = None,
    ) -> None:
        self.console = console
        self.names = names
        self._now = now
        self.checkpoint_id: int | None = None
        self._units: tuple[int, ...] = ()
        self._answers: dict[int, Answer] = {}  # unit -> its latest answer this epoch
        self._started = 0.0
        self._commit_lag = 0
        self._rate: float | None = None  # records/s of the last outcome
        self._watermark: int | None = None  # the last job watermark shown
        self._live = Live(
            console=console, get_renderable=self.render, refresh_per_second=4, transient=True
        )

    def __enter__(self) -> LiveProgress:
        self._live.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._live.stop()

    def epoch_started(self, checkpoint_id: int, units: Sequence[int]) -> None:
        self.checkpoint_id = checkpoint_id
        self._units = tuple(units)
        self._answers = {}
        self._started = self._now()

    def unit_answered(self, answer: Answer) -> None:
        """Count a unit's answer (the same answer may be reported twice: live, then at the
        end of the epoch; a retried unit's newer attempt replaces its failed one)."""
        if answer.checkpoint_id != self.checkpoint_id:
            return
        old = self._answers.get(answer.unit)
        if old is None or old.attempt <= answer.attempt:
            self._answers[answer.unit] = answer

    def __call__(self, event: CheckpointEvent) -> None:
        line = checkpoint_line(event, self._watermark, self.names)
        self.console.print(Text(terminal_text(line, lines=True)))
        self._watermark = event.watermark_ms if event.watermark_ms is not None else self._watermark
        self._commit_lag = event.commit_lag
        self._rate = event.records_in / event.seconds if event.seconds > 0 else None
        self.checkpoint_id = None
        self._live.refresh()

    def render(self) -> Text:
        """The running epoch on one line (between epochs: the commit lag and the last rate)."""
        rate = self._rate
        if self.checkpoint_id is None:
            head = "between checkpoints"
        else:
            acks = [a for a in self._answers.values() if isinstance(a, Ack)]
            declined = len(self._answers) - len(acks)
            elapsed = self._now() - self._started
            if acks and elapsed > 0:
                rate = sum(a.records_in - a.records_exchanged for a in acks) / elapsed
            head = (
                f"checkpoint {self.checkpoint_id} running: units answered "
                f"{len(self._answers)}/{len(self._units)}, pending "
                f"{len(self._units) - len(self._answers)}, falling back {declined}"
            )
        shown = "-" if rate is None else f"{rate:,.0f}"
        return Text(f"{head}  records/s {shown}  commit lag {self._commit_lag}")
