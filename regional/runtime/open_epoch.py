"""An open epoch (continuous mode with a `checkpoint_interval`, DESIGN §6): a task's units
read records as they arrive and run the plan over small batches until the checkpoint's
marker, with their state kept in memory, then snapshot once.

A checkpoint's epoch in micro-epoch mode is one batch per unit: read up to
`records_per_epoch` records from the unit's positions, walk the plan, snapshot. An open epoch
is the same walk run again and again, each round starting where the last one ended (`rounds`):

* round 1 restores each unit's state as the coordinator named it (`UnitWork.restore`: hot or
  decoded), reads the splits the enumerator assigned, and runs the unit's injected faults;
* every later round restores the state the round before left (`CarriedStates`: the same
  object, or the round's snapshot decoded when the object is spoken for, as for hot state)
  and reads from the positions the round before reached; `records_per_epoch` caps a round,
  not the epoch;
* rounds stop once `closed(wait)` says the marker came (asked between rounds, so the epoch
  always has its first round); rounds are paced: unless a unit read its whole budget (a
  backlog), the next round starts `round_s` after the last one started at the earliest
  (waiting for the marker meanwhile), and after a round that read nothing at least `idle_s`
  later, so a task whose reads are cheap (a Kafka round made
  ahead in one fetch: a few ms) does not spin its core on rounds of a few records each.

What a unit gives the checkpoint is its rounds merged (`merged`): the last round's positions,
snapshots and watermarks, every round's sink rows and dead letters, the counts added up. It is
exactly what as many micro-epochs over the same batches would give, without a checkpoint
between them, so the micro-epoch rules stay as they are: everything the rounds produce is held
in memory and staged only after the marker, for the checkpoint the marker closes; a unit that
fails in any round declines the whole checkpoint (`Passed.failed`) and so stages nothing; its
fallback restores its last completed checkpoint as in micro-epoch mode.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from metadata.model import SubtaskState
from regional.coordinator.messages import UnitWork
from regional.dataflow.failures import as_exception, split_of_failure
from regional.dataflow.operators import Operator
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import StateCodec
from regional.dataflow.state_provider import StateBytes, StateProvider, restored_state
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import run_unit_epoch
from regional.runtime.hot_state import HotState, restores_as_operator
from regional.runtime.scheduling import Passed, Timeout, UnitTimeout

if TYPE_CHECKING:
    from regional.runtime.faults import UnitFaults
    from regional.runtime.task_env import TaskEnv

__all__ = [
    "DEFAULT_IDLE_S",
    "DEFAULT_ROUND_S",
    "CarriedStates",
    "RoundTimedOut",
    "carried_work",
    "merged",
    "pause_after_round",
    "rounds",
]

#: How long a task waits after a round that read nothing before it reads again.
DEFAULT_IDLE_S = 0.005
#: How often a task's rounds start at most: a round's fixed cost (a pass over the task's units,
#: their snapshots) is paid at most 50 times a second, and a record waits at most this long
#: for the round that reads it (plus the read).
DEFAULT_ROUND_S = 0.02

#: Runs a round's units in passes where they can share one, with the given unit faults
#: (`regional.runtime.task.task_passes`): (env, works, state_of, timeout, faults) -> Passed.
PassRunner = Callable[
    ["TaskEnv", Sequence[UnitWork], "StateProvider | StateBytes", Timeout, "UnitFaults | None"],
    Passed,
]


class RoundTimedOut(Exception):
    """A unit's round ran past the unit's timeout (its `UnitTimeout`, as an answer)."""


class CarriedStates(StateProvider):
    """The operator states of the round before, by subtask (vertex id, index); a subtask not
    carried yet restores from `base` (round 1: as the coordinator named it). A carried state
    is handed out once (the round mutates it in place); asked again (a pass run again without
    a failed unit), its snapshot is decoded, as a hot state's would be."""

    def __init__(self, base: StateProvider | StateBytes) -> None:
        self.base = base
        self._states: dict[tuple[str, int], HotState] = {}
        self._blobs: dict[tuple[str, int], tuple[bytes, str]] = {}

    def keep(self, unit: int, restore: Sequence[SubtaskState], epoch: UnitEpoch) -> None:
        """Carry what unit `unit`'s round left (`epoch`) to its next round."""
        for s in restore:
            blob = epoch.snapshots.get(s.vertex_id)
            state = epoch.states.get(s.vertex_id)
            if blob is None or state is None:
                continue
            key = (s.vertex_id, s.index)
            self._states[key] = HotState.of(state, blob)
            where = f"the open epoch of unit {unit}, vertex {s.vertex_id!r} (in memory)"
            self._blobs[key] = (blob, where)

    def restore(
        self, operator: Operator, subtask: SubtaskState, codec: StateCodec
    ) -> OperatorState | None:
        key = (subtask.vertex_id, subtask.index)
        entry = self._states.pop(key, None)
        if entry is not None and restores_as_operator(operator):
            state = entry.restored(operator, codec)
            if state is not None:
                return state
        if key in self._blobs:
            blob, where = self._blobs[key]
            return operator.restore(blob, codec=codec, source=where)
        return restored_state(self.base, operator, subtask, codec)


def carried_work(work: UnitWork, epoch: UnitEpoch) -> UnitWork:
    """`work` for the unit's next round: its sources read on from where `epoch` left them
    (the splits assigned now are part of those positions), everything else as it was."""
    restore = tuple(
        msgspec.structs.replace(s, split_states=epoch.split_states[s.vertex_id])
        if s.vertex_id in epoch.split_states
        else s
        for s in work.restore
    )
    return msgspec.structs.replace(work, restore=restore, new_splits=())


def merged(before: UnitEpoch | None, after: UnitEpoch) -> UnitEpoch:
    """A unit's rounds so far (`before`) and its next one (`after`), as one epoch: positions,
    snapshots, states and watermarks of `after` (a sink's watermarks start where the epoch
    started); sink rows in round order; the counts and seconds added up."""
    if before is None:
        return after
    batches = {v: list(b) for v, b in before.sink_batches.items()}
    for vertex_id, more in after.sink_batches.items():
        batches.setdefault(vertex_id, []).extend(more)
    marks = dict(after.sink_watermarks)
    for vertex_id, (start, _) in before.sink_watermarks.items():
        if vertex_id in marks:
            marks[vertex_id] = (start, marks[vertex_id][1])
    return UnitEpoch(
        split_states={**before.split_states, **after.split_states},
        snapshots={**before.snapshots, **after.snapshots},
        states={**before.states, **after.states},
        sink_batches=batches,
        sink_watermarks=marks,
        records_in=before.records_in + after.records_in,
        records_out=before.records_out + after.records_out,
        dead_lettered=before.dead_lettered + after.dead_lettered,
        late=before.late + after.late,
        watermark=after.watermark if after.watermark is not None else before.watermark,
        restore_s=before.restore_s + after.restore_s,
        encode_s=after.encode_s,  # only the last round's snapshot is the checkpoint's
    )


def pause_after_round(
    read: int, took_s: float, *, full: bool = False, idle_s: float, round_s: float
) -> float:
    """How long to wait for the marker before the next round, after a round that read
    `read` records in `took_s` seconds: none when a unit read its whole budget (`full`: a
    backlog, read on at once), else until `round_s` after the round began, and at least
    `idle_s` after a round that read nothing.

    >>> pause_after_round(12, 0.004, idle_s=0.005, round_s=0.02)  # caught up, cheap: paced
    0.016
    >>> pause_after_round(0, 0.03, idle_s=0.005, round_s=0.02)  # idle: a short wait
    0.005
    >>> pause_after_round(20, 0.004, full=True, idle_s=0.005, round_s=0.02)  # a backlog
    0.0
    """
    if full:
        return 0.0
    return round(max(0.0 if read else idle_s, round_s - took_s), 6)


def rounds(
    env: TaskEnv,
    works: Sequence[UnitWork],
    state_of: StateProvider | StateBytes,
    timeout: Timeout,
    *,
    closed: Callable[[float], bool],
    passes: PassRunner,
    idle_s: float = DEFAULT_IDLE_S,
    round_s: float = DEFAULT_ROUND_S,
    clock: Callable[[], float] = time.monotonic,
) -> Passed:
    """Run `works`' open epoch (see the module doc) until `closed(wait)` (True once the
    marker came, waiting for it up to `wait` seconds), each round's units in passes by
    `passes` where they can share one: each unit's rounds merged, with the seconds they
    took, or the error it failed a round with (it runs no more rounds)."""
    carried = CarriedStates(state_of)
    current = list(works)
    epochs: dict[int, UnitEpoch] = {}
    seconds: dict[int, float] = dict.fromkeys(range(len(works)), 0.0)
    failed: dict[int, Exception] = {}
    first = True
    while True:
        live = [at for at in range(len(works)) if at not in failed]
        if not live:
            break
        began = clock()
        got = _round(
            env, [current[at] for at in live], carried, timeout, passes=passes, first=first
        )
        read = 0
        full = False  # a unit read its whole budget: records are waiting, no pause
        for i, at in enumerate(live):
            if i in got.failed:
                failed[at] = got.failed[i]
                epochs.pop(at, None)
                continue
            epoch, took = got.epochs[i]
            epochs[at] = merged(epochs.get(at), epoch)
            seconds[at] += took
            carried.keep(works[at].unit_id, current[at].restore, epoch)
            current[at] = carried_work(current[at], epoch)
            read += epoch.records_in
            full = full or epoch.records_in >= env.pipeline.records_per_epoch
        first = False
        pause = pause_after_round(read, clock() - began, full=full, idle_s=idle_s, round_s=round_s)
        if closed(pause):
            break
    return Passed({at: (e, seconds[at]) for at, e in epochs.items()}, failed)


def _round(
    env: TaskEnv,
    works: Sequence[UnitWork],
    state_of: StateProvider,
    timeout: Timeout,
    *,
    passes: PassRunner,
    first: bool,
) -> Passed:
    """One round of `works` (a batch each): in passes where they can share one, else one
    unit at a time; injected faults run in the first round only, as a micro-epoch runs them
    once per checkpoint."""
    faults = env.faults if first else None
    passed = passes(env, works, state_of, timeout, faults)
    for at, work in enumerate(works):
        if at in passed.epochs or at in passed.failed:
            continue
        started = time.perf_counter()
        try:
            with timeout():
                if faults is not None:
                    faults.before_unit(work)
                epoch = run_unit_epoch(
                    env.pipeline,
                    {s.vertex_id: s for s in work.restore},
                    checkpoint_id=work.checkpoint_id,
                    new_splits=work.new_splits,
                    ended=work.ended,
                    state_of=state_of,
                    now_ms=int(time.time() * 1000),
                    idle_timeout_ms=env.idle_timeout_ms,
                    exclude_after=env.exclude_after,
                    after_sources=None
                    if faults is None
                    else functools.partial(faults.after_sources, work),
                )
        except UnitTimeout:
            passed.failed[at] = RoundTimedOut(f"unit ran over {env.unit_timeout:g} s")
            continue
        except Exception as exc:
            passed.failed[at] = exc
            continue
        except BaseException as exc:
            failed_on = as_exception(exc)  # SystemExit of a user function: its unit's
            if split_of_failure(exc) is None or failed_on is None:  # not on a record
                raise
            passed.failed[at] = failed_on
            continue
        passed.epochs[at] = (epoch, time.perf_counter() - started)
    return passed
