"""A task's units in one pass (`regional.dataflow.walker`): the same epoch per unit as
running each unit alone, and the task falling back to one unit at a time exactly where a pass
cannot keep the units apart or fails."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from unit_chain import UnitChain

from metadata.model import SubtaskState
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.operators import records_of
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import (
    TaskUnit,
    UnitFailed,
    run_task_epoch,
    run_unit_epoch,
)
from regional.runtime import task
from regional.runtime.faults import UnitFaults
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def _checked(r: dict[str, int]) -> dict[str, int]:
    if r["n"] % 11 == 7:  # some records a user function fails on
        raise ValueError(f"record {r['n']} of split {r['s']} is bad")
    return {**r, "k": r["n"] % 3}


def _count(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    seen = ctx.map_state("seen")
    seen[r["n"] % 4] = seen.get(r["n"] % 4, 0) + 1
    yield {**r, "c": c.value(), "seen": len(seen)}


def _twice(r: dict[str, int]) -> list[dict[str, int]]:
    return [r, {**r, "c": -r["c"]}] if r["n"] % 5 == 0 else [r]


def _plus_one(batch: pa.RecordBatch) -> pa.RecordBatch:
    return batch.set_column(batch.schema.get_field_index("n"), "n", pc.add(batch.column("n"), 1))


def _totals(ctx: Any, table: pa.Table) -> pa.Table:
    total = ctx.value_state("total", 0)
    total.update(total.value() + table.num_rows)
    return table.append_column("total", pa.array([total.value()] * table.num_rows, pa.int64()))


def _pipeline(
    tmp: str, *, parallelism: int, splits: int, per_split: int, per_epoch: int, dead_letters: bool
) -> Pipeline:
    p = Pipeline(
        "pass",
        records_per_epoch=per_epoch,
        on_error="dead-letter" if dead_letters else "fail",
        dead_letter=ParquetSink(f"{tmp}/dead") if dead_letters else None,
    )
    src = p.source(
        GeneratorSource(splits, _record, records_per_split=per_split),
        parallelism=parallelism,
        name="src",
    )
    (
        src.map(_checked, name="checked")
        .key_by(lambda r: r["k"])
        .process(_count, name="count")
        .flat_map(_twice, name="twice")
        .filter(lambda r: r["n"] % 7 != 3, name="kept")
        .map_batches(_plus_one, name="plus")
        .key_by("k")
        .apply_in_arrow(_totals, name="totals")
        .sink(ParquetSink(f"{tmp}/out"), name="out")
    )
    return p


def _rows(epoch: UnitEpoch) -> dict[str, list[Any]]:
    return {
        v: [r for b in batches for r in records_of(b)] for v, batches in epoch.sink_batches.items()
    }


def _seen(epoch: UnitEpoch) -> tuple[Any, ...]:
    return (
        epoch.split_states,
        epoch.snapshots,
        _rows(epoch),
        epoch.records_in,
        epoch.records_out,
        epoch.dead_lettered,
    )


@settings(max_examples=60, deadline=None)
# every unit fails at the last epoch: the pass runs again without each, until none is left
@example(parallelism=2, owners=[0, 1], per_split=8, per_epoch=2, epochs=4, dead_letters=False)
@given(
    parallelism=st.integers(2, 4),
    owners=st.lists(st.integers(0, 3), min_size=1, max_size=6),
    per_split=st.integers(0, 14),
    per_epoch=st.integers(1, 8),
    epochs=st.integers(1, 4),
    dead_letters=st.booleans(),
)
def test_a_pass_gives_every_unit_the_epoch_it_has_alone(
    tmp_path_factory: pytest.TempPathFactory,
    parallelism: int,
    owners: list[int],
    per_split: int,
    per_epoch: int,
    epochs: int,
    dead_letters: bool,
) -> None:
    # split g<i> is assigned to unit owners[i] (mod parallelism) at the first epoch; each unit
    # is one subtask of every vertex; state and positions go from one epoch to the next
    tmp = str(tmp_path_factory.mktemp("pass"))
    p = _pipeline(
        tmp,
        parallelism=parallelism,
        splits=len(owners),
        per_split=per_split,
        per_epoch=per_epoch,
        dead_letters=dead_letters,
    )
    chain = UnitChain(p, parallelism, owners)
    for checkpoint in range(1, epochs + 1):
        units = chain.units(checkpoint)
        alone = []
        for unit in units:
            try:
                alone.append(chain.alone(p, unit, checkpoint))
            except ValueError as exc:  # without dead letters: this unit declines
                alone.append(exc)  # type: ignore[arg-type]
        # a unit that fails alone fails the pass naming it, with the error it raises alone;
        # the pass runs again without it (as the task does), the others' epochs unchanged
        left = list(range(parallelism))
        while True:
            try:
                together = run_task_epoch(p, [units[u] for u in left], checkpoint_id=checkpoint)
            except UnitFailed as failed:
                first = next(x for x in left if isinstance(alone[x], Exception))
                u = left.pop(failed.unit)
                assert u == first
                assert repr(failed.error) == repr(alone[u])
                continue
            break
        assert together is not None
        assert [_seen(t) for t in together] == [_seen(alone[u]) for u in left]
        if len(left) < parallelism:
            return  # the failed units fall back: the next epoch restores them from before
        for u, epoch in zip(left, together, strict=True):
            chain.keep(u, epoch)


def _listing(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    seen = ctx.list_state("all")  # subtask-level: a pass cannot give each unit its own
    seen.append(r["n"])
    yield {**r, "c": len(seen), "seen": 0}


def test_subtask_level_list_state_keeps_units_apart() -> None:
    p = Pipeline("lists", records_per_epoch=4)
    src = p.source(GeneratorSource(2, _record, records_per_split=4), parallelism=2, name="src")
    src.key_by(lambda r: r["n"]).process(_listing, name="count").sink(
        ParquetSink("/nonexistent/out"), name="out"
    )
    units = [
        TaskUnit(
            {v: SubtaskState(v, u, u) for v in ("src", "count", "out")},
            (("src", u, f"g{u}"),),
            (),
            lambda s: (b"", "none"),
        )
        for u in range(2)
    ]
    assert run_task_epoch(p, units, checkpoint_id=1) is None
    alone = [
        run_unit_epoch(
            p,
            u.restore,
            checkpoint_id=1,
            new_splits=u.new_splits,
            ended=(),
            state_of=u.state_of,
            now_ms=0,
        )
        for u in units
    ]
    assert [[r["c"] for r in _rows(a)["out"]] for a in alone] == [[1, 2, 3, 4]] * 2


# --- the task: which units run in a pass, and what happens when it fails ----------------------

FAILS_LEFT: list[int] = []


def _fails_while_told(r: dict[str, int]) -> dict[str, int]:
    if r["s"] == 2 and r["n"] == 1 and FAILS_LEFT and FAILS_LEFT[0] > 0:
        FAILS_LEFT[0] -= 1
        raise ValueError("split 2 record 1 fails")
    return r


def _task_env(tmp_path: Path, **kw: Any) -> TaskEnv:
    p = Pipeline("job", records_per_epoch=3)
    src = p.source(GeneratorSource(4, _record, records_per_split=6), parallelism=4, name="src")
    src.map(_fails_while_told, name="m").sink(ParquetSink(str(tmp_path / "t")), name="out")
    return TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=5.0, **kw)


def _works(checkpoint: int = 1) -> list[UnitWork]:
    return [
        UnitWork(
            checkpoint,
            1,
            u,
            tuple(SubtaskState(v, u, u, ref_checkpoint_id=0) for v in ("src", "m", "out")),
            (("src", u, f"g{u}"),),
        )
        for u in range(4)
    ]


def test_units_of_one_shape_run_in_one_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def alone(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a unit ran alone")

    monkeypatch.setattr(task, "run_unit_epoch", alone)
    answers = run_units(_task_env(tmp_path), _works())
    assert all(isinstance(a, Ack) and a.records_in == 3 for a in answers)


def test_a_unit_with_an_injected_fault_runs_alone_and_the_others_in_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran_alone: list[int] = []
    real = task.run_unit_epoch

    def alone(*args: Any, **kw: Any) -> Any:
        ran_alone.append(kw["checkpoint_id"])
        return real(*args, **kw)

    monkeypatch.setattr(task, "run_unit_epoch", alone)
    env = _task_env(tmp_path, faults=UnitFaults({(1, 2): "fail"}))
    answers = run_units(env, _works())
    assert [type(a) for a in answers] == [Ack, Ack, Decline, Ack]
    assert ran_alone == [1]


def test_a_record_failing_in_the_pass_declines_only_its_unit(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def alone(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a unit ran alone")

    monkeypatch.setattr(task, "run_unit_epoch", alone)
    FAILS_LEFT[:] = [1]  # fails the first time only: the unit declines as it would alone
    env = _task_env(tmp_path)
    with caplog.at_level(logging.INFO, logger="regional.runtime.task"):
        answers = run_units(env, _works())
    assert [type(a) for a in answers] == [Ack, Ack, Decline, Ack]
    assert answers[2].reason == "ValueError: split 2 record 1 fails"  # type: ignore[union-attr]
    assert "in _fails_while_told" in answers[2].trace  # type: ignore[union-attr, operator]
    assert caplog.messages == [
        "checkpoint 1: unit 2 failed in a pass over 4 units (ValueError: split 2 record 1 "
        "fails); the others run again"
    ]
    # what the acked units staged commits: their rows exactly
    committables = [
        c for a in answers if isinstance(a, Ack) for s in a.states for c in s.committables
    ]
    ParquetSink(str(tmp_path / "t")).commit("job", 1, committables)
    rows = read_table(str(tmp_path / "t")).to_pylist()
    assert sorted((r["s"], r["n"]) for r in rows) == [(s, n) for s in (0, 1, 3) for n in range(3)]


def test_a_pass_failing_for_no_one_unit_runs_the_units_one_by_one(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def together(*args: Any, **kw: Any) -> Any:
        raise MemoryError("no room for the pass")

    monkeypatch.setattr(task, "run_task_epoch", together)
    with caplog.at_level(logging.INFO, logger="regional.runtime.task"):
        answers = run_units(_task_env(tmp_path), _works())
    assert all(isinstance(a, Ack) and a.records_in == 3 for a in answers)
    assert caplog.messages == [
        "checkpoint 1: a pass over 4 units failed (MemoryError: no room for the pass); running "
        "them one by one"
    ]


def test_a_unit_that_fell_back_at_the_last_checkpoint_runs_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran_alone: list[int] = []
    real = task.run_unit_epoch

    def alone(*args: Any, **kw: Any) -> Any:
        ran_alone.append(args[1]["src"].unit_id)
        return real(*args, **kw)

    monkeypatch.setattr(task, "run_unit_epoch", alone)
    works = _works(checkpoint=3)
    works = [
        msgspec.structs.replace(
            w,
            restore=tuple(
                msgspec.structs.replace(s, ref_checkpoint_id=1 if w.unit_id == 1 else 2)
                for s in w.restore
            ),
        )
        for w in works
    ]
    answers = run_units(_task_env(tmp_path), works)
    assert all(isinstance(a, Ack) for a in answers)
    assert ran_alone == [1]


def test_the_pass_can_be_turned_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def together(*args: Any, **kw: Any) -> Any:
        raise AssertionError("a pass ran")

    monkeypatch.setattr(task, "run_task_epoch", together)
    env = _task_env(tmp_path, task_pass=False)
    assert all(isinstance(a, Ack) for a in run_units(env, _works()))
    assert msgspec.structs.replace(env, task_pass=True).task_pass


HANG: list[bool] = []


def _hangs_while_told(r: dict[str, int]) -> dict[str, int]:
    while r["s"] == 1 and HANG:  # a stuck user function (SIGALRM interrupts the sleep)
        time.sleep(0.01)
    return r


def test_a_unit_stuck_in_a_pass_times_out_alone(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the pass runs out of half a unit's timeout; then the units run one by one, each with
    # its own timeout: the stuck one declines, the others ack
    HANG[:] = [True]
    p = Pipeline("job", records_per_epoch=3)
    src = p.source(GeneratorSource(4, _record, records_per_split=6), parallelism=4, name="src")
    src.map(_hangs_while_told, name="m").sink(ParquetSink(str(tmp_path / "t")), name="out")
    env = TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=0.4)
    works = [
        UnitWork(
            1,
            1,
            u,
            tuple(SubtaskState(v, u, u) for v in ("src", "m", "out")),
            (("src", u, f"g{u}"),),
        )
        for u in range(4)
    ]
    try:
        with caplog.at_level(logging.INFO, logger="regional.runtime.task"):
            answers = run_units(env, works)
    finally:
        HANG.clear()
    assert [type(a) for a in answers] == [Ack, Decline, Ack, Ack]
    assert answers[1].reason == "timeout: unit ran over 0.4 s"  # type: ignore[union-attr]
    assert caplog.messages == [
        "checkpoint 1: a pass over 4 units failed (ran over 0.2 s, half a unit's timeout); "
        "running them one by one"
    ]
