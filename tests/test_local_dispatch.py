"""The in-process dispatcher (`regional.runtime.local`): an epoch's units run through the task
side (`run_units`) spread over tasks as Spark spreads them, each task's acks packed or loose,
the deadline kept as a cancelled Spark job keeps it, and a job run by it commits exactly once."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, AckBatch, UnitWork, answers_of
from regional.dataflow.pipeline import Pipeline
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher, round_robin
from regional.runtime.task import TaskEnv
from regional.sinks.memory import InMemoryTableSink
from regional.sources.generator import GeneratorSource

UNITS, PER_SPLIT, PER_EPOCH = 5, 7, 3
NEVER = 2**62  # a deadline no test reaches


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def _env(tmp_path: Path, sink: InMemoryTableSink | None = None) -> TaskEnv:
    p = Pipeline("local", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(UNITS, _record, records_per_split=PER_SPLIT), parallelism=UNITS, name="src"
    )
    src.sink(sink or InMemoryTableSink(), name="out")
    return TaskEnv(str(tmp_path / "ckpt"), "local", p, unit_timeout=10)


def _works() -> list[UnitWork]:
    """Checkpoint 1's work of every unit: a fresh start, reading split g<u>."""
    return [
        UnitWork(
            1, 1, u, (SubtaskState("src", u, u), SubtaskState("out", u, u)), (("src", u, f"g{u}"),)
        )
        for u in range(UNITS)
    ]


class _Clock:
    """Milliseconds that move on by `step` at every look."""

    def __init__(self, step: int) -> None:
        self.now, self.step = 0, step

    def __call__(self) -> int:
        self.now += self.step
        return self.now


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 40), tasks=st.integers(1, 12))
def test_round_robin_covers_every_unit_once_by_unit_id(n: int, tasks: int) -> None:
    spread = round_robin([UnitWork(1, 1, u, ()) for u in range(n)], tasks)
    assert sorted(w.unit_id for t in spread for w in t) == list(range(n))
    assert all(len({w.unit_id % tasks for w in t}) == 1 for t in spread)


def test_every_unit_answers_once_in_unit_order_when_loose(tmp_path: Path) -> None:
    got = InProcessDispatcher(_env(tmp_path), tasks=2).run(_works(), NEVER)
    assert got.batches == [] and got.error is None
    assert [(type(a), a.unit) for a in got.answers] == [(Ack, u) for u in range(UNITS)]


def test_packed_acks_arrive_as_one_batch_per_task(tmp_path: Path) -> None:
    got = InProcessDispatcher(_env(tmp_path), tasks=2, pack_acks=True).run(_works(), NEVER)
    assert got.answers == []
    assert [[a.unit for a in b.acks] for b in got.batches] == [[0, 1], [2, 3, 4]]
    assert all(isinstance(b, AckBatch) for b in got.batches)


def test_isolated_units_run_alone_and_answer_loose(tmp_path: Path) -> None:
    got = InProcessDispatcher(_env(tmp_path), pack_acks=True).run(_works(), NEVER, isolated=True)
    assert got.batches == [] and [a.unit for a in got.answers] == list(range(UNITS))


def test_units_not_run_by_the_deadline_are_not_answered(tmp_path: Path) -> None:
    # the clock is read before and after each task, 10 ms on at every look
    def run(deadline_ms: int) -> list[int]:
        d = InProcessDispatcher(_env(tmp_path), tasks=3, clock=_Clock(10))
        got = d.run(_works(), deadline_ms)
        return [a.unit for a in answers_of(got.arrived())]

    assert run(25) == [0]  # task 1 ran from 10 to 20; task 2 would start at 30: not run
    assert run(15) == []  # task 1 ended at 20, after the deadline: its answers are lost
    assert run(5) == []  # the deadline passed before any task started
    assert run(NEVER) == list(range(UNITS))


def test_a_job_run_in_process_commits_every_record_once(tmp_path: Path) -> None:
    sink = InMemoryTableSink()
    env = _env(tmp_path, sink)
    dispatcher = InProcessDispatcher(env, tasks=2, pack_acks=True)
    storage = JobStorage(env.root, env.job_id)
    assert JobDriver(env.pipeline, dispatcher, storage=storage).run().finished
    rows: list[Any] = sorted((r["s"], r["n"]) for r in sink.rows())
    assert rows == [(s, n) for s in range(UNITS) for n in range(PER_SPLIT)]


@settings(max_examples=25, deadline=None)
@given(tasks=st.integers(1, UNITS + 2), pack=st.booleans(), interleaved=st.booleans())
def test_however_units_are_spread_and_packed_each_answers_once_with_its_records(
    tasks: int, pack: bool, interleaved: bool
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        d = InProcessDispatcher(
            _env(Path(tmp)), tasks=tasks, pack_acks=pack, interleaved=interleaved
        )
        got = d.run(_works(), NEVER)
    answers = answers_of(got.arrived())
    assert sorted(a.unit for a in answers) == list(range(UNITS))
    assert all(isinstance(a, Ack) and a.records_in == PER_EPOCH for a in answers)
    assert (got.answers == []) == pack
