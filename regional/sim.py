"""A deterministic simulator that drives the real `CheckpointCoordinator` (DESIGN §3).

N units, each a source subtask `("src", u)` reading splits from the real `SplitEnumerator` and a
sink subtask `("sink", u)` staging its records into an `InMemoryTableSink` committed through the
real `CommitCoordinator`. A fake clock, a fault schedule (declines, hangs past the timeout, late
acks from fenced attempts), driver crashes before any numbered coordinator step, and restore from
the latest durable metadata. Every decision is recorded. Used by the tests (invariants, crash +
restore equals a fault-free run) and by `benchmarks/coordinator.py`.

>>> from regional.policy import Policy
>>> run = Simulation(4, Policy(), faults={(2, 1): "decline"}).run(50)
>>> run.finished, sorted(run.committed_rows) == run.expected_rows
(True, True)
>>> run.kinds[:3]
['global', 'regional', 'global']
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Literal

from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    SplitState,
    StateHandle,
    SubtaskState,
    VertexInfo,
)
from regional.coordinator.checkpoint_coordinator import CheckpointCoordinator
from regional.coordinator.events import (
    AbortCheckpoint,
    Commit,
    Decision,
    DiscardAttempt,
    FailJob,
    FinishJob,
    NotifyComplete,
    NotifyFallback,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.coordinator.layout import JobLayout
from regional.errors import CommitError
from regional.operators.commit import CommitCoordinator, perform_commit
from regional.operators.memory_sink import InMemoryTableSink
from regional.operators.split_enumerator import SplitEnumerator
from regional.policy import Policy

__all__ = ["Fault", "RandomFaults", "SimResult", "Simulation", "kind_counts"]

#: decline: the unit fails its epoch; hang: it never answers (declined at its deadline);
#: late_ack: it hangs, then acks after the checkpoint was decided (a fenced, stale attempt).
Fault = Literal["decline", "hang", "late_ack"]
FaultSchedule = Callable[[int, int], Fault | None] | Mapping[tuple[int, int], Fault]

_HASH = b"\0" * 16


class RandomFaults:
    """Each unit fails each checkpoint with probability `p` (a third of failures hang),
    reproducibly from `seed`."""

    def __init__(self, p: float, seed: int = 0) -> None:
        self.p = p
        self._rng = random.Random(seed)

    def __call__(self, checkpoint_id: int, unit_id: int) -> Fault | None:
        x = self._rng.random()
        if x >= self.p:
            return None
        return "hang" if x < self.p / 3 else "decline"


@dataclasses.dataclass
class SimResult:
    """What a run did: every decision, the metadata written, the sink's rows, and measures."""

    decisions: list[Decision | TriggerCheckpoint]
    metadata: list[CheckpointMetadata]
    committed_rows: list[tuple[str, int]]
    expected_rows: list[tuple[str, int]]
    commit_log: list[tuple[str, int, tuple[str, ...]]]
    triggered: int = 0
    completed: int = 0
    finished: bool = False
    failed: str | None = None
    crashes: int = 0
    unit_epochs: int = 0
    redone_unit_epochs: int = 0
    lag_sum: int = 0
    lag_max: int = 0
    lag_samples: int = 0
    coordinator_seconds: float = 0.0

    @property
    def kinds(self) -> list[str]:
        """Kind of each completed checkpoint, in order."""
        return [m.kind.value for m in self.metadata]

    @property
    def mean_lag(self) -> float:
        return self.lag_sum / self.lag_samples if self.lag_samples else 0.0


class _Unit:
    __slots__ = ("epochs_since_durable", "pending", "pos", "split")

    def __init__(self) -> None:
        self.split: str | None = None
        self.pos = 0
        self.pending: list[bytes] = []
        self.epochs_since_durable = 0


class _Crash(Exception):
    pass


class Simulation:
    """Runs `num_units` units under `policy` until the job finishes, fails, or
    `max_checkpoints` were triggered.

    Input: `splits_per_unit * num_units` splits of `records_per_split` records, read
    `records_per_epoch` per unit and epoch (`bounded=False`: splits never run out).
    `crash_before`: coordinator step numbers (1, 2, ... counted over the whole run) before
    which the driver crashes; the run resumes by restoring the latest durable metadata in
    `restore_mode`. `shuffle_seed`: deliver answers in a random order. `stage_output=False`
    stages no sink files (benchmarks: keeps memory flat when nothing commits for long).
    """

    def __init__(
        self,
        num_units: int,
        policy: Policy,
        *,
        faults: FaultSchedule | None = None,
        crash_before: Iterable[int] = (),
        restore_mode: str = "claim",
        splits_per_unit: int = 2,
        records_per_split: int = 5,
        records_per_epoch: int = 3,
        bounded: bool = True,
        interval_ms: int = 1_000,
        shuffle_seed: int | None = None,
        fail_commits: int = 0,
        stage_output: bool = True,
        job_id: str = "sim",
    ) -> None:
        self.n = num_units
        self.policy = policy
        if faults is None:
            self._fault: Callable[[int, int], Fault | None] = lambda c, u: None
        elif isinstance(faults, Mapping):
            table = dict(faults)
            self._fault = lambda c, u: table.get((c, u))
        else:
            self._fault = faults
        self._crash_before = set(crash_before)
        self._restore_mode = restore_mode
        self._records_per_split = records_per_split
        self._records_per_epoch = records_per_epoch
        self._bounded = bounded
        self._interval = interval_ms
        self._rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self._job_id = job_id
        self._stage_output = stage_output
        self._splits = [f"s{k}" for k in range((splits_per_unit if bounded else 1) * num_units)]
        vertices = (VertexInfo("src", num_units, 128), VertexInfo("sink", num_units, 128))
        self.layout = JobLayout(
            units=tuple((("src", u), ("sink", u)) for u in range(num_units)),
            vertices=vertices,
            sources=frozenset({"src"}),
            bounded_sources=frozenset({"src"}) if bounded else frozenset(),
        )
        self.sink = InMemoryTableSink()
        self.sink.fail_next_commits = fail_commits
        self._step = 0
        self._now = 0
        self._max_id = 0

    # --- the driver -------------------------------------------------------------------------

    def run(self, max_checkpoints: int) -> SimResult:
        expected = (
            sorted((s, i) for s in self._splits for i in range(self._records_per_split))
            if self._bounded
            else []
        )
        self.result = SimResult([], [], [], expected, [])
        self._start(None)
        starting = False
        while self.result.triggered < max_checkpoints and not self._done():
            try:
                if starting:
                    self._start(self.result.metadata[-1] if self.result.metadata else None)
                    starting = False
                self._checkpoint()
            except _Crash:
                self.result.crashes += 1
                starting = True
        self.result.committed_rows = self.sink.rows()
        self.result.commit_log = list(self.sink.log)
        return self.result

    def _done(self) -> bool:
        return self.result.finished or self.result.failed is not None

    def _start(self, restore_from: CheckpointMetadata | None) -> None:
        """(Re)start the driver: a new coordinator; every unit restarts from its state."""
        self.enumerator = SplitEnumerator("src", [] if restore_from else self._splits)
        self.committer = CommitCoordinator("sink", commit_user=self._job_id)
        self.coordinator = CheckpointCoordinator(
            self.layout,
            self.policy,
            job_id=self._job_id,
            coordinators={"src": self.enumerator, "sink": self.committer},
        )
        old = getattr(self, "units", [])
        self.units = [_Unit() for _ in range(self.n)]
        for unit, before in zip(self.units, old, strict=False):
            unit.epochs_since_durable = before.epochs_since_durable
        if restore_from is not None:
            decisions = self._call(
                self.coordinator.restore,
                restore_from,
                mode=self._restore_mode,
                next_checkpoint_id=self._max_id + 1,
            )
            for u in range(self.n):
                self._restart(u, crashed=True)
            self._execute(decisions)

    def _call(self, method: Callable[..., object], *args: object, **kwargs: object) -> list:
        self._step += 1
        if self._step in self._crash_before:
            raise _Crash
        start = time.process_time()
        out = method(*args, **kwargs)
        self.result.coordinator_seconds += time.process_time() - start
        if isinstance(out, TriggerCheckpoint):
            return [out]
        return out  # type: ignore[return-value]

    def _checkpoint(self) -> None:
        self._now += self._interval
        if self._bounded and self._all_read():
            self.coordinator.on_source_finished("src")
        [trigger] = self._call(self.coordinator.trigger, self._now)
        cid, attempt = trigger.checkpoint_id, trigger.attempt
        self._max_id = max(self._max_id, cid)
        self.result.triggered += 1
        self.result.decisions.append(trigger)
        answers = []
        late = []
        for u in range(self.n):
            fault = self._fault(cid, u)
            states = self._epoch(u, cid, attempt)
            if fault is None:
                answers.append((u, states))
            elif fault == "decline":
                answers.append((u, None))
            elif fault == "late_ack":
                late.append((u, states))
        if self._rng is not None:
            self._rng.shuffle(answers)
        self._deliver(cid, attempt, answers, self._now + 10)
        if self.coordinator.pending_checkpoint_id == cid:
            self._execute(self._call(self.coordinator.on_tick, trigger.deadline_ms))
        for u, states in late:
            self._execute(
                self._call(self.coordinator.on_ack, cid, u, attempt, states, trigger.deadline_ms)
            )
        self._measure(cid)

    def _deliver(
        self,
        cid: int,
        attempt: int,
        answers: list[tuple[int, tuple[SubtaskState, ...] | None]],
        now_ms: int,
    ) -> None:
        """Hand the units' answers to the coordinator in one timed batch (the hot path), then
        carry out the decisions in order."""
        on_ack, on_decline = self.coordinator.on_ack, self.coordinator.on_decline
        out: list[Decision] = []
        crash_at = min((s for s in self._crash_before if s > self._step), default=None)
        start = time.process_time()
        for u, states in answers:
            self._step += 1
            if self._step == crash_at:
                self.result.coordinator_seconds += time.process_time() - start
                self._execute(out)
                raise _Crash
            if states is None:
                out += on_decline(cid, u, attempt, "injected", now_ms)
            else:
                out += on_ack(cid, u, attempt, states, now_ms)
        self.result.coordinator_seconds += time.process_time() - start
        self._execute(out)

    # --- the units --------------------------------------------------------------------------

    def _epoch(self, u: int, cid: int, attempt: int) -> tuple[SubtaskState, ...]:
        """Unit `u` processes one epoch and snapshots; returns its ack's subtask states."""
        unit = self.units[u]
        rows = []
        for _ in range(self._records_per_epoch):
            if unit.split is None:
                unit.split = self.enumerator.assign(u)
                unit.pos = 0
                if unit.split is None:
                    break
            rows.append((unit.split, unit.pos))
            unit.pos += 1
            if self._bounded and unit.pos == self._records_per_split:
                unit.split = None
        unit.epochs_since_durable += 1
        self.result.unit_epochs += 1
        if rows and self._stage_output:
            unit.pending.append(self.sink.stage(f"chk-{cid}/u{u}-{attempt}.data", rows))
        handle = (StateHandle(f"chk-{cid}/{u}-{attempt}.state", 0, 1, 1, _HASH),)
        splits = (SplitState(unit.split, str(unit.pos).encode()),) if unit.split else ()
        return (
            SubtaskState("src", u, u, handles=handle, split_states=splits, attempt=attempt),
            SubtaskState("sink", u, u, committables=tuple(unit.pending), attempt=attempt),
        )

    def _restart(self, u: int, *, crashed: bool = False) -> None:
        """Unit `u` restarts from its state in the latest completed checkpoint. After a driver
        crash its staged files are not discarded (a durable checkpoint may name them; the
        cleaner collects orphans)."""
        unit = self.units[u]
        self.result.redone_unit_epochs += unit.epochs_since_durable
        if not crashed:
            self.sink.discard(unit.pending)
        unit.pending = []
        unit.epochs_since_durable = 0
        [src, _] = self.coordinator.unit_states(u) or (None, None)
        if src is not None and src.split_states:
            unit.split = src.split_states[0].split_id
            unit.pos = int(src.split_states[0].position)
        else:
            unit.split, unit.pos = None, 0

    def _all_read(self) -> bool:
        return not self.enumerator.unassigned and all(unit.split is None for unit in self.units)

    # --- carrying out decisions --------------------------------------------------------------

    def _execute(self, decisions: list[Decision]) -> None:
        queue = list(decisions)
        while queue:
            d = queue.pop(0)
            self.result.decisions.append(d)
            if isinstance(d, WriteMetadata):
                self.result.metadata.append(d.metadata)
                cid = d.metadata.checkpoint_id
                queue += self._call(self.coordinator.on_metadata_durable, cid, self._now + 20)
                self.result.completed += 1
            elif isinstance(d, Commit):
                try:
                    perform_commit(d, self.sink)
                except CommitError as exc:
                    queue += self._call(
                        self.coordinator.on_commit_failed, d.vertex_id, d.checkpoint_id, str(exc)
                    )
                else:
                    queue += self._call(
                        self.coordinator.on_commit_done, d.vertex_id, d.checkpoint_id
                    )
            elif isinstance(d, NotifyComplete):
                for u in d.units:
                    self.units[u].pending = []
                    self.units[u].epochs_since_durable = 0
            elif isinstance(d, NotifyFallback):
                self._restart(d.unit_id)
            elif isinstance(d, AbortCheckpoint):
                for u in range(self.n):
                    self._restart(u)
            elif isinstance(d, DiscardAttempt):
                self.sink.discard(d.all_committables)
            elif isinstance(d, FailJob):
                self.result.failed = d.message
            elif isinstance(d, FinishJob):
                self.result.finished = True

    def _measure(self, cid: int) -> None:
        r = self.result
        owner = self.coordinator.unit_owner
        lags = [cid - owner(u) for u in range(self.n)]
        r.lag_sum += sum(lags)
        r.lag_max = max(r.lag_max, max(lags))
        r.lag_samples += self.n


def kind_counts(result: SimResult) -> dict[str, int]:
    """How many checkpoints of each kind completed."""
    out = dict.fromkeys((k.value for k in CheckpointKind), 0)
    for m in result.metadata:
        out[m.kind.value] += 1
    return out
