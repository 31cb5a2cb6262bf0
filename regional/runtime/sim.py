"""A deterministic simulation of a job on the driver that ships (DESIGN §3).

`Simulation` runs the real `JobDriver` — the real `CheckpointCoordinator`, `SplitEnumerator`,
`CommitCoordinator`, metadata writes, restore and cleaner — over an in-memory checkpoint root,
with a simulated clock instead of the wall clock, and its units run on the record path
production runs: the in-process dispatcher (`runtime.local`) hands them to the task side
(`run_units`), as a Spark task would. The job: N units, each a source subtask `("src", u)`
reading splits of numbered records and a sink subtask `("sink", u)` staging them through the
sink writer into an `InMemoryTableSink` (each row a `(split, n)` tuple). Units are stateless
between epochs, as Spark tasks are: every epoch restores from the states the coordinator hands
out (their sources' positions; they keep no operator state). A vertex has at most 32,768
subtasks (Flink's bound on max parallelism), so more units are spread over several equal
source→sink chains (`chain_vertices`): `src`/`sink`, then `src-1`/`sink-1`, and so on, each
chain reading its own splits and committing to the same table.

Faults: a unit declines (without running), hangs past its deadline, or acks late from a fenced
attempt (it runs, and its ack reaches the driver after the checkpoint was decided); the
driver crashes before any numbered coordinator call (`crash_before`; calls counted over the
whole run), and once its lease of the job root expired a new driver restores from the latest
restorable checkpoint in storage, as `regional run` would. Every trigger and decision is
recorded. Used by the tests (crash + restore commits exactly the fault-free output) and by
`benchmarks/`.

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
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import msgspec
import pyarrow as pa
from fsspec.implementations.memory import MemoryFileSystem
from pyarrow import fs as pafs

from metadata.model import CheckpointKind, CheckpointMetadata
from metadata.storage import JobStorage
from regional.coordinator import (
    AbortCheckpoint,
    Decision,
    NotifyComplete,
    NotifyFallback,
    TriggerCheckpoint,
    WriteMetadata,
)
from regional.coordinator.messages import Ack, Answer, Decline, UnitWork, answers_of
from regional.dataflow.pipeline import Pipeline
from regional.errors import JobFailedError
from regional.graph.job_graph import MAX_PARALLELISM_UPPER_BOUND
from regional.policy import Policy
from regional.runtime.dispatch import Dispatch
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.base import WriteContext
from regional.sinks.memory import InMemoryTableSink
from regional.sources.base import ReadResult

__all__ = [
    "Fault",
    "RandomFaults",
    "SimResult",
    "Simulation",
    "chain_vertices",
    "kind_counts",
    "timing_floor",
]

#: decline: the unit fails its epoch; hang: it never answers (declined at its deadline);
#: late_ack: it hangs, then acks after the checkpoint was decided (a fenced, stale attempt).
Fault = Literal["decline", "hang", "late_ack"]
FaultSchedule = Callable[[int, int], Fault | None] | Mapping[tuple[int, int], Fault]

#: The coordinator calls the crash schedule counts (and whose CPU time is measured).
_STEPS = frozenset(
    {
        "trigger",
        "restore",
        "retry_unit",
        "on_ack",
        "on_answers",
        "on_decline",
        "on_tick",
        "on_metadata_durable",
        "on_metadata_failed",
        "on_commit_done",
        "on_commit_failed",
    }
)


def chain_vertices(num_units: int) -> list[tuple[str, str, int]]:
    """The simulated job's source→sink chains: (source, sink, parallelism) each, as few as the
    32,768-subtask bound of a vertex allows, of equal size (within one).

    >>> chain_vertices(4)
    [('src', 'sink', 4)]
    >>> chain_vertices(100_000)  # doctest: +NORMALIZE_WHITESPACE
    [('src', 'sink', 25000), ('src-1', 'sink-1', 25000), ('src-2', 'sink-2', 25000),
     ('src-3', 'sink-3', 25000)]
    """
    chains = max(1, -(-num_units // MAX_PARALLELISM_UPPER_BOUND))
    size, extra = divmod(num_units, chains)
    return [
        ("src" if c == 0 else f"src-{c}", "sink" if c == 0 else f"sink-{c}", size + (c < extra))
        for c in range(chains)
    ]


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
    """What a run did: every trigger and decision, the metadata written, the sink's rows, and
    measures (unit epochs run and redone, lag of unit state behind the latest checkpoint,
    seconds spent inside the coordinator: in all, per call name, and per epoch)."""

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
    coordinator_calls: int = 0  # events: each answer of a batch counts, as the crash schedule
    coordinator_timed_calls: int = 0  # calls timed: a batch of answers is one
    coordinator_seconds_by_call: dict[str, float] = dataclasses.field(default_factory=dict)
    coordinator_epoch_seconds: list[float] = dataclasses.field(default_factory=list)

    @property
    def kinds(self) -> list[str]:
        """Kind of each completed checkpoint, in order."""
        return [m.kind.value for m in self.metadata]

    @property
    def mean_lag(self) -> float:
        return self.lag_sum / self.lag_samples if self.lag_samples else 0.0


class _Crash(Exception):
    """The simulated driver process died."""


#: The simulated records: `{"split": split, "n": n}`.
_RECORD = pa.schema([("split", pa.string()), ("n", pa.int64())])


class _NumberedSource:
    """`splits` of `records_per_split` records `{"split": split, "n": n}` each (never ending when
    not `bounded`); the position is the next record number."""

    def __init__(self, splits: Sequence[str], records_per_split: int, bounded: bool) -> None:
        self.splits = list(splits)
        self.records_per_split = records_per_split
        self._bounded = bounded
        # the columns records are sliced from (building small Arrow arrays costs more than
        # everything else a simulated unit does)
        self._numbers = pa.array(range(records_per_split if bounded else 1024), pa.int64())
        self._names: dict[str, pa.Array] = {}

    @property
    def bounded(self) -> bool:
        return self._bounded

    def discover(self) -> list[str]:
        return list(self.splits)

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        """The records from `position` (up to `max_records`), the next position, and whether
        the split is done."""
        start = int(position or b"0")
        end = start + max_records
        if self._bounded:
            end = min(end, self.records_per_split)
        finished = self._bounded and end >= self.records_per_split
        if end <= start:
            return ReadResult([], str(start).encode(), finished)
        if end > len(self._numbers):  # one column of record numbers, sliced by every split
            self._numbers = pa.array(range(max(end, 2 * len(self._numbers))), pa.int64())
        n = end - start
        split = self._names.get(split_id)
        if split is None or len(split) < n:  # the split's name, repeated (building it is slow)
            split = self._names[split_id] = pa.array([split_id] * n, pa.string())
        numbers = self._numbers.slice(start, n)
        batch = pa.RecordBatch.from_arrays([split.slice(0, n), numbers], schema=_RECORD)
        return ReadResult([batch], str(end).encode(), finished)


class _NumberedTable(InMemoryTableSink):
    """The table every chain's sink commits to: staged through the sink writer's path
    (`write`), each row kept as its `(split, n)` tuple; with `keep_rows` False it stages
    nothing (benchmarks: memory stays flat)."""

    def __init__(self, keep_rows: bool = True) -> None:
        super().__init__()
        self.keep_rows = keep_rows

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        if not self.keep_rows:
            return ()
        rows = [
            row
            for b in batches
            for row in zip(b.column("split").to_pylist(), b.column("n").to_pylist(), strict=True)
        ]
        if not rows:
            return ()
        c = context
        path = f"chk-{c.checkpoint_id}/u{c.unit_id}-{c.vertex_id}-{c.index}-a{c.attempt}.data"
        return (self.stage(path, rows),)


class _SimDispatcher:
    """The simulation's dispatcher: each unit runs the task side production runs
    (`InProcessDispatcher`, on the simulated clock), unless the fault schedule makes it decline
    (without running), hang (never answers) or ack late (it runs, and its ack is handed to the
    driver after the checkpoint was decided). A dispatch that hung ends at its deadline."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.late: list[Answer] = []

    def start(self) -> None:
        return None

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        sim = self.sim
        declined: list[Answer] = []
        running: list[UnitWork] = []
        late: list[UnitWork] = []
        for work in works:
            fault = sim.fault(work.checkpoint_id, work.unit_id)
            sim.unit_ran(work.unit_id)
            if fault == "decline":
                declined.append(Decline(work.checkpoint_id, work.unit_id, work.attempt, "injected"))
            elif fault == "late_ack":
                late.append(work)
            elif fault != "hang":
                running.append(work)
        size = 0 if isolated else sim.ack_batch
        tasks = -(-len(running) // size) if size else 1
        clock = sim.clock.now_ms
        ran = InProcessDispatcher(sim.env, tasks=tasks, pack_acks=bool(size), clock=clock).run(
            running, deadline_ms, isolated=isolated
        )
        if late:
            self.late += answers_of(
                InProcessDispatcher(sim.env, clock=clock).run(late, deadline_ms).arrived()
            )
        answers = ran.answers + declined
        if size == 0:  # every answer on its own, in unit order
            order = {w.unit_id: k for k, w in enumerate(works)}
            answers.sort(key=lambda a: order[a.unit])
        batches = list(ran.batches)
        if sim.rng is not None:
            sim.rng.shuffle(answers)
            sim.rng.shuffle(batches)
        hung = len(running) + len(declined) < len(works)
        sim.clock.now = deadline_ms if hung else sim.clock.now + 10
        return Dispatch(answers, batches=batches)


class _SimClock:
    """A clock that moves only when told to."""

    def __init__(self) -> None:
        self.now = 0

    def now_ms(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += round(seconds * 1000)


class _CountedCoordinator:
    """The driver's coordinator, with every event counted (the crash schedule) and every call
    timed (the simulation is single-threaded, so wall time inside the calls is their CPU time).

    Each answer of a batch (`on_answers`) counts as one event, as when answers were handed
    over one call each: a crash point inside a batch crashes before the batch (its answers
    before that point would change nothing a new driver sees). The batch is one timed call;
    its time is reported under `on_ack` and `on_decline` in proportion to their numbers."""

    def __init__(self, inner: Any, sim: Simulation) -> None:
        self._inner = inner
        self._sim = sim

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._inner, name)
        if name not in _STEPS:
            return attr
        sim = self._sim
        batch = name == "on_answers"

        def call(*args: Any, **kwargs: Any) -> Any:
            answers = answers_of(args[0]) if batch else ()
            events = len(answers) if batch else 1
            first = sim.step + 1
            sim.step += events
            if events == 1:
                if sim.step in sim.crash_before:
                    raise _Crash
            elif any(first <= k <= sim.step for k in sim.crash_before):
                raise _Crash
            started = time.perf_counter()  # cheap (vDSO): the hot path is timed per call
            try:
                return attr(*args, **kwargs)
            finally:
                took = time.perf_counter() - started
                r = sim.result
                r.coordinator_seconds += took
                r.coordinator_calls += events
                r.coordinator_timed_calls += 1
                by_call = r.coordinator_seconds_by_call
                if batch and events:
                    acks = sum(isinstance(a, Ack) for a in answers)
                    for key, share in (("on_ack", acks), ("on_decline", events - acks)):
                        if share:
                            by_call[key] = by_call.get(key, 0) + took * share / events
                else:
                    by_call[name] = by_call.get(name, 0) + took

        return call


class Simulation:
    """Runs `num_units` units under `policy` until the job finishes, fails, or
    `max_checkpoints` were triggered.

    Input: `splits_per_unit * num_units` splits of `records_per_split` records, read
    `records_per_epoch` per unit and epoch, shared fairly among its splits as every source
    subtask shares its budget (`bounded=False`: one never-ending split per unit).
    `crash_before`: coordinator call numbers (1, 2, ... counted over the whole run) before
    which the driver crashes; a new driver then restores the latest restorable checkpoint in
    `restore_mode`. `interval_ms`: simulated time between epochs. `shuffle_seed`: deliver
    answers in a random order. `fail_commits`: the sink fails that many commits first.
    `stage_output=False` stages no sink files (benchmarks: keeps memory flat). `ack_batch`:
    the units of each dispatch (not units re-run alone) run in tasks of at most this many
    (near-equal contiguous slices), each task's acks packed into one `AckBatch`, as a Spark
    task packs its partition's, handed over before the declines; 0: one task, every answer on
    its own, in unit order.
    Above 32,768 units the job has several chains (`chain_vertices`); `source` is the first
    chain's, `sources` all of them (the splits of chain c follow those of chain c - 1).
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
        ack_batch: int = 1024,
        job_id: str = "sim",
    ) -> None:
        self.n = num_units
        if faults is None:
            self.fault: Callable[[int, int], Fault | None] = lambda c, u: None
        elif isinstance(faults, Mapping):
            table = dict(faults)
            self.fault = lambda c, u: table.get((c, u))
        else:
            self.fault = faults
        # a crashed driver resumes from the latest checkpoint in `restore_mode`
        restore = msgspec.structs.replace(policy.restore, mode=restore_mode)
        self.policy = msgspec.structs.replace(policy, restore=restore)
        self.crash_before = frozenset(crash_before)
        self.ack_batch = ack_batch
        self.rng = random.Random(shuffle_seed) if shuffle_seed is not None else None
        self._interval = interval_ms / 1000
        self._bounded = bounded
        per_unit = splits_per_unit if bounded else 1
        self.sink = _NumberedTable(stage_output)  # every chain's sink commits to this table
        self.sink.fail_next_commits = fail_commits
        self.pipeline = Pipeline(job_id, records_per_epoch=records_per_epoch)
        self.source_of: dict[str, _NumberedSource] = {}
        first = 0
        for src_id, sink_id, parallelism in chain_vertices(num_units):
            splits = [f"s{k}" for k in range(first, first + per_unit * parallelism)]
            first += len(splits)
            source = self.source_of[src_id] = _NumberedSource(splits, records_per_split, bounded)
            self.pipeline.source(source, parallelism=parallelism, name=src_id).sink(
                self.sink, name=sink_id
            )
        self.sources = list(self.source_of.values())
        self.source = self.sources[0]
        memory = MemoryFileSystem(skip_instance_cache=True)
        memory.store, memory.pseudo_dirs = {}, [""]  # this simulation's own, not fsspec's global
        self.storage = JobStorage(
            f"/{job_id}-{uuid.uuid4().hex[:8]}",
            job_id,
            filesystem=pafs.PyFileSystem(pafs.FSSpecHandler(memory)),
        )
        # The task side: the simulated units keep no operator state (sources' positions only),
        # so it never reads or writes the checkpoint root (an in-memory one the driver holds);
        # no unit timer either: a simulated unit hangs only when the schedule says so.
        self.env = TaskEnv(self.storage.root, job_id, self.pipeline, unit_timeout=0)
        self.clock = _SimClock()
        # no renewal thread in simulated time: a lease that outlasts an epoch run to its deadline
        self._lease_ttl = 3 * self.policy.checkpointing.timeout
        self.dispatcher = _SimDispatcher(self)
        self.step = 0
        self._since_durable = [0] * num_units
        self.result = SimResult([], [], [], [], [])

    @property
    def records_per_epoch(self) -> int:
        """How many records each unit reads per epoch (the pipeline's; may be changed between
        runs)."""
        return self.pipeline.records_per_epoch

    @records_per_epoch.setter
    def records_per_epoch(self, n: int) -> None:
        self.pipeline.records_per_epoch = n

    # --- what the dispatcher and the driver report ------------------------------------------

    def unit_ran(self, unit_id: int) -> None:
        self._since_durable[unit_id] += 1
        self.result.unit_epochs += 1

    def _redo(self, units: Iterable[int]) -> None:
        for u in units:
            self.result.redone_unit_epochs += self._since_durable[u]
            self._since_durable[u] = 0

    def _observe(self, d: Decision | TriggerCheckpoint) -> None:
        r = self.result
        r.decisions.append(d)
        if isinstance(d, TriggerCheckpoint):
            r.triggered += 1
        elif isinstance(d, WriteMetadata):
            r.metadata.append(d.metadata)
            r.completed += 1
        elif isinstance(d, NotifyComplete):
            for u in d.units:
                self._since_durable[u] = 0
        elif isinstance(d, NotifyFallback):
            self._redo([d.unit_id])
        elif isinstance(d, AbortCheckpoint):
            self._redo(range(self.n))

    # --- the run ----------------------------------------------------------------------------

    def new_driver(self) -> JobDriver:
        """A new driver process on the same checkpoint root and table (not started)."""
        driver = JobDriver(
            self.pipeline,
            self.dispatcher,
            storage=self.storage,
            policy=self.policy,
            clock=self.clock,
            observe=self._observe,
            lease_ttl=self._lease_ttl,
        )
        driver.coordinator = _CountedCoordinator(driver.coordinator, self)  # type: ignore[assignment]
        return driver

    def run(self, max_checkpoints: int) -> SimResult:
        expected = (
            sorted(
                (s, i)
                for source in self.sources
                for s in source.splits
                for i in range(source.records_per_split)
            )
            if self._bounded
            else []
        )
        self.result = r = SimResult([], [], [], expected, [])
        driver: JobDriver | None = None
        while r.triggered < max_checkpoints and r.failed is None:
            try:
                if driver is None:
                    driver = self.new_driver()
                    driver.start()
                if driver.finished:
                    break
                before = r.coordinator_seconds
                event = driver.epoch()
                for answer in self.dispatcher.late:
                    driver.handle_answer(answer)
                self.dispatcher.late.clear()
                r.coordinator_epoch_seconds.append(r.coordinator_seconds - before)
                self._measure(driver, event.checkpoint_id)
                self.clock.sleep(self._interval)
            except _Crash:
                r.crashes += 1
                if driver is not None:  # its cleaning thread stops with it
                    driver.cleaning.close()
                self.dispatcher.late.clear()
                self._redo(range(self.n))
                driver = None
                # the crashed driver's lease must expire before the next one may start
                self.clock.sleep(self._lease_ttl)
            except JobFailedError as exc:
                r.failed = str(exc)
        if driver is not None:
            driver.cleaning.close()  # its deletions are done while it holds the lease
            driver.lease.release()  # a clean stop: the next driver may start at once
        r.finished = driver is not None and driver.finished
        r.committed_rows = self.sink.rows()
        r.commit_log = list(self.sink.log)
        return r

    def _measure(self, driver: JobDriver, cid: int) -> None:
        r = self.result
        owner = driver.coordinator.unit_owner
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


class _NoCoordinator:
    """Answers `on_ack` with nothing: what the per-call timing costs by itself."""

    def on_ack(self, *args: Any) -> list[Decision]:
        return []


def timing_floor(calls: int) -> float:
    """Seconds that `calls` coordinator calls add to `SimResult.coordinator_seconds` when the
    coordinator does nothing: the per-call timing and call overhead, measured now (on a busy
    machine it is far from zero; benchmarks print it next to the coordinator's time).

    >>> timing_floor(10) > 0
    True
    """
    sim = Simulation.__new__(Simulation)
    sim.step, sim.crash_before, sim.result = 0, frozenset(), SimResult([], [], [], [], [])
    on_ack = _CountedCoordinator(_NoCoordinator(), sim).on_ack
    for unit_id in range(calls):
        on_ack(1, unit_id, 1, (), 0)
    return sim.result.coordinator_seconds
