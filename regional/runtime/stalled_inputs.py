"""A stalled input, said out loud (issue 45): an operator that keeps records until a watermark
passes them (a join, a window, `drop_duplicates`, timers) keeps growing its state while one
of its inputs' watermark does not move, and nothing else says so.

The rule (`StallWatch.observe`, pure): after each completed checkpoint, for every watched
operator and each of its inputs, an input is **stalled** when its watermark (the lowest of
the units that feed it, as of the latest checkpoint each was fresh in) has not changed over
the last `checkpoints` completed checkpoints (the policy's `event-time.stall-after`, default
`STALL_CHECKPOINTS`) and is not +inf
(an input that ended holds nothing back), while the operator's state bytes grew over the same
checkpoints without ever shrinking. It is reported once per episode; the episode ends when
that input's watermark moves, and a later stall is a new one.

>>> watch = StallWatch({"paid": {"orders": frozenset({0}), "payments": frozenset({1})}}, 2)
>>> for cid, size, payments in ((1, 100, 5), (2, 200, 5), (3, 300, 5), (4, 400, 5)):
...     for s in watch.observe(cid, {"paid": size}, {0: cid * 1000, 1: payments}):
...         print(s.message())
operator 'paid' keeps growing its state (100 -> 300 bytes over checkpoints 1-3) while its \
input 'payments' has not advanced its watermark since checkpoint 1 \
(1970-01-01T00:00:00.005Z): what the other inputs send waits in state for it; check that \
input's source (a partition without data: give the source an idle-timeout)
>>> sorted(watch.stalled)
[('paid', 'payments')]
>>> watch.observe(5, {"paid": 100}, {0: 5000, 1: 4000}), sorted(watch.stalled)
([], [])
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Iterable, Mapping

from metadata.model import CheckpointMetadata
from metadata.watermarks import MAX_WATERMARK, format_watermark
from regional.dataflow.pipeline import Pipeline
from regional.graph.regions import RegionPlan

__all__ = [
    "STALL_CHECKPOINTS",
    "StallWatch",
    "StalledInput",
    "operator_state_bytes",
    "watched_inputs",
]

#: How many completed checkpoints an input's watermark may stay put while its operator's
#: state grows before the stall is reported: the default of the policy key
#: `event-time.stall-after` (`regional.policy.EventTimePolicy`).
STALL_CHECKPOINTS = 5


@dataclasses.dataclass(frozen=True)
class StalledInput:
    """Operator `operator`'s input `input` has kept its `watermark` since checkpoint `since`
    while the operator's state grew from `bytes_from` to `bytes_to` over checkpoints `since`
    to `until`."""

    operator: str
    input: str
    since: int
    until: int
    watermark: int
    bytes_from: int
    bytes_to: int

    def message(self) -> str:
        """One line for the progress, the event log and the report."""
        return (
            f"operator {self.operator!r} keeps growing its state ({self.bytes_from} -> "
            f"{self.bytes_to} bytes over checkpoints {self.since}-{self.until}) while its "
            f"input {self.input!r} has not advanced its watermark since checkpoint "
            f"{self.since} ({format_watermark(self.watermark)}): what the other inputs send "
            "waits in state for it; check that input's source (a partition without data: "
            "give the source an idle-timeout)"
        )


class StallWatch:
    """The stall rule of the module docstring over the checkpoints it is shown. `inputs`:
    operator -> input name -> the units whose watermarks make that input's watermark."""

    def __init__(
        self,
        inputs: Mapping[str, Mapping[str, frozenset[int]]],
        checkpoints: int = STALL_CHECKPOINTS,
    ) -> None:
        if checkpoints < 1:
            raise ValueError(
                f"checkpoints must be at least 1, not {checkpoints} (the policy key "
                "event-time.stall-after)"
            )
        self.inputs = inputs
        self.checkpoints = checkpoints
        keep = checkpoints + 1
        self._sizes: dict[str, deque[tuple[int, int]]] = {op: deque(maxlen=keep) for op in inputs}
        self._marks: dict[tuple[str, str], deque[int]] = {
            (op, name): deque(maxlen=keep) for op, named in inputs.items() for name in named
        }
        #: the (operator, input) pairs in a stall episode now (reported once)
        self.stalled: set[tuple[str, str]] = set()

    def observe(
        self,
        checkpoint_id: int,
        state_bytes: Mapping[str, int],
        unit_watermarks: Mapping[int, int],
    ) -> list[StalledInput]:
        """Take a completed checkpoint's operator state sizes and unit watermarks; returns the
        stalls that start with it."""
        found: list[StalledInput] = []
        for op, named in self.inputs.items():
            sizes = self._sizes[op]
            sizes.append((checkpoint_id, state_bytes.get(op, 0)))
            growing = len(sizes) == sizes.maxlen and all(
                a[1] <= b[1] for a, b in itertools.pairwise(sizes)
            )
            growing = growing and sizes[-1][1] > sizes[0][1]
            for name, units in named.items():
                marks = self._marks[op, name]
                known = [unit_watermarks[u] for u in units if u in unit_watermarks]
                if not known:
                    continue
                mark = min(known)
                if marks and mark != marks[-1]:
                    self.stalled.discard((op, name))  # it moved: the episode is over
                    marks.clear()
                marks.append(mark)
                still = len(marks) == marks.maxlen and mark < MAX_WATERMARK
                if still and growing and (op, name) not in self.stalled:
                    self.stalled.add((op, name))
                    found.append(
                        StalledInput(
                            op, name, sizes[0][0], sizes[-1][0], mark, sizes[0][1], sizes[-1][1]
                        )
                    )
        return found


def operator_state_bytes(
    checkpoint: CheckpointMetadata, operators: Iterable[str]
) -> dict[str, int]:
    """The state bytes of each of `operators` in `checkpoint` (fresh and fallen-back
    subtasks)."""
    return {op: sum(s.state_bytes for s in checkpoint.subtasks_of(op)) for op in operators}


def watched_inputs(pipeline: Pipeline, plan: RegionPlan) -> dict[str, dict[str, frozenset[int]]]:
    """The operators the rule watches (those that keep records until a watermark passes them:
    stateful and `timed`) and, per input, the units whose watermarks make its watermark: for
    an input read from a keyed exchange, the units of the exchange's writer; on a forward
    chain, the units of the source it starts at. An input is named by the source it starts
    at (``orders``), else by its vertex."""
    specs = pipeline.vertices
    out: dict[str, dict[str, frozenset[int]]] = {}

    def start(vertex: str) -> tuple[str, str]:
        """(the source or exchange reader an input starts at, the source naming it)."""
        seen = vertex
        while True:
            spec = specs[seen]
            if spec.source is not None or not spec.inputs:
                break
            seen = spec.inputs[0]
        spec = specs[seen]
        name = seen
        if spec.exchange_from is not None:
            name = start(spec.exchange_from)[1]
        return seen, name

    for spec in specs.values():
        op = spec.operator
        if op is None or not (op.stateful and op.timed):
            continue
        named: dict[str, frozenset[int]] = {}
        for k, vertex in enumerate(spec.inputs):
            head, name = start(vertex)
            feeds = specs[head].exchange_from or head
            units = frozenset(plan.unit_of(feeds, i) for i in range(specs[feeds].parallelism))
            if name in named:
                name = f"{name} (input {k})"
            named[name] = units
        out[spec.id] = named
    return out
