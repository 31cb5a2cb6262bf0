"""Open epochs (continuous mode's `checkpoint_interval`, `regional.runtime.open_epoch`)
without Spark: a task that runs several batches per checkpoint, its state kept in memory,
commits exactly the rows and dead letters of one batch per checkpoint (micro-epoch), with
unit faults and however many batches each checkpoint runs: a keyed, windowed event-time job
with poison and late records dead-lettered, and a job across a keyed exchange; what a unit
that fails runs in an open epoch is never staged."""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orders_job
import pytest
import windows_job as job
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import SplitState, SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import UnitWork, packed
from regional.dataflow.unit_epoch import UnitEpoch
from regional.policy import load_policy
from regional.runtime.dispatch import Dispatch, spread_over_tasks
from regional.runtime.driver import JobDriver
from regional.runtime.faults import Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.open_epoch import carried_work, merged
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink


class OpenEpochs:
    """An in-process `TaskDispatcher` whose tasks run open epochs: each task's epoch closes
    after a number of batches `batches()` picks (what a marker does on a real clock)."""

    background_safe = False

    def __init__(self, env: TaskEnv, batches: Any, tasks: int = 2) -> None:
        self.env = env
        self.tasks = tasks
        self.batches = batches
        self.ran: list[int] = []  # batches per task epoch

    def start(self) -> None:
        pass

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch:
        slices = [[w] for w in works] if isolated else spread_over_tasks(works, self.tasks)
        batches = []
        answers = []
        for task in [s for s in slices if s]:
            want, asked = self.batches(), []

            def until(wait: float, want: int = want, asked: list[int] = asked) -> bool:
                asked.append(1)
                return len(asked) >= want

            got = run_units(self.env, task, until=None if isolated else until)
            self.ran.append(len(asked))
            for item in packed(got):
                (batches if type(item).__name__ == "AckBatch" else answers).append(item)
        return Dispatch(answers, None, batches)  # type: ignore[arg-type]


def _driver(
    base: Path, dispatcher_of: Any, faults: Faults | None = None, *, exchange: bool = False
) -> JobDriver:
    """The keyed, windowed job (`windows_job.pipeline`: sliding counts per user, a map that
    raises on poison clicks, late clicks dead-lettered), or with `exchange` the orders job
    (a running count per customer after a keyed exchange)."""
    if exchange:
        orders_job.write_orders(str(base / "orders"))
        p = orders_job.pipeline(str(base / "orders"), str(base / "table"))
    else:
        p = job.pipeline(
            "sliding",
            str(base / "table"),
            on_late="dead-letter",
            dead_letter=ParquetSink(str(base / "dead")),
            checked=True,
        )
    root = str(base / "ckpt")
    overrides = {"checkpointing": {"timeout": "60 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, p.name, p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p, dispatcher_of(env), storage=JobStorage(root, p.name), policy=policy, faults=faults
    )


def _outcome(base: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return job.rows(str(base / "table")), job.dead_letters(str(base / "dead"))


@pytest.fixture(scope="module")
def micro_epoch(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    base = tmp_path_factory.mktemp("micro")
    assert _driver(base, InProcessDispatcher).run().finished
    rows, dead = _outcome(base)
    assert {kind for _, kind, _, _ in dead} == {"ValueError", "LateRecord"}  # both kinds
    return rows, dead


@settings(max_examples=4, deadline=None)
@given(seed=st.integers(0, 2**16), most=st.integers(1, 4))
def test_open_epochs_of_any_length_commit_the_micro_epoch_rows_and_dead_letters(
    tmp_path_factory: pytest.TempPathFactory, micro_epoch: tuple[list, list], seed: int, most: int
) -> None:
    base = tmp_path_factory.mktemp("open")
    rng = random.Random(seed)
    made: list[OpenEpochs] = []

    def dispatcher(env: TaskEnv) -> OpenEpochs:
        made.append(OpenEpochs(env, lambda: rng.randint(1, most)))
        return made[0]

    summary = _driver(base, dispatcher).run()
    assert summary.finished
    assert _outcome(base) == micro_epoch
    if most > 1:  # fewer checkpoints than epochs of one batch each
        assert max(made[0].ran) > 1


def test_open_epochs_across_a_keyed_exchange_commit_every_order_once(tmp_path: Path) -> None:
    rng = random.Random(43)
    summary = _driver(
        tmp_path, lambda env: OpenEpochs(env, lambda: rng.randint(1, 3)), exchange=True
    ).run()
    assert summary.finished
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()


def test_unit_faults_in_open_epochs_fall_back_and_commit_the_micro_epoch_rows(
    tmp_path: Path, micro_epoch: tuple[list, list]
) -> None:
    faults = Faults(units={(2, 1): "fail", (3, 0): "fail", (3, 1): "fail", (4, 0): "fail"})
    summary = _driver(tmp_path, lambda env: OpenEpochs(env, lambda: 3), faults).run()
    assert summary.finished
    falls = {c.checkpoint_id: c.fallback_units for c in summary.checkpoints if c.fallback_units}
    assert falls == {2: (1,), 3: (0, 1), 4: (0,)}
    assert _outcome(tmp_path) == micro_epoch


def _work(positions: dict[str, bytes]) -> UnitWork:
    splits = tuple(SplitState(s, p) for s, p in positions.items())
    return UnitWork(
        5, 1, 0, (SubtaskState("src", 0, 0, split_states=splits), SubtaskState("out", 0, 0))
    )


def test_a_round_carries_its_positions_to_the_next_and_the_rounds_merge_in_order() -> None:
    work = msgspec_replace(_work({"a": b"1"}), new_splits=(("src", 0, "b"),))
    first = UnitEpoch(
        split_states={"src": (SplitState("a", b"3"), SplitState("b", b"2"))},
        sink_batches={"out": [[{"n": 1}]]},
        sink_watermarks={"out": (10, 20)},
        records_in=4,
        records_out=1,
    )
    second = UnitEpoch(
        split_states={"src": (SplitState("a", b"5"), SplitState("b", b"2"))},
        sink_batches={"out": [[{"n": 2}]]},
        sink_watermarks={"out": (10, 30)},
        records_in=2,
        records_out=1,
        dead_lettered=1,
    )
    nxt = carried_work(work, first)
    assert nxt.new_splits == () and nxt.restore[0].split_states == first.split_states["src"]
    assert nxt.restore[1] == work.restore[1]  # the sink's committables (its watermark) as given
    both = merged(merged(None, first), second)
    assert both.sink_batches == {"out": [[{"n": 1}], [{"n": 2}]]}
    assert both.split_states == second.split_states and both.sink_watermarks == {"out": (10, 30)}
    assert (both.records_in, both.records_out, both.dead_lettered) == (6, 2, 1)
    assert first.sink_batches == {"out": [[{"n": 1}]]}  # merging copies, never extends a round's


def msgspec_replace(work: UnitWork, **changes: Any) -> UnitWork:
    import msgspec

    return msgspec.structs.replace(work, **changes)


def test_acks_of_an_open_epoch_count_every_batch_it_read(tmp_path: Path) -> None:
    d = _driver(tmp_path, lambda env: OpenEpochs(env, lambda: 2, tasks=1))
    d.start()
    try:
        event = d.epoch()
    finally:
        d.lease.release()
    # the first checkpoint's 2 source units read two batches of PER_EPOCH records each
    assert event.records_in == 2 * 2 * job.PER_EPOCH
