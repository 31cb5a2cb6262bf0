"""Continuous mode without Spark: where units run (placed once, then sticky by unit id) and
the `mode` a `SparkRuntime` accepts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import SubtaskState
from regional.coordinator.messages import UnitWork
from regional.dataflow.pipeline import Pipeline
from regional.runtime.continuous import UnitPlacement
from regional.runtime.spark import SparkRuntime

units = st.lists(st.integers(min_value=0, max_value=5000), max_size=8, unique=True).map(tuple)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 8), st.lists(units, min_size=1, max_size=5))
def test_units_stay_on_the_task_they_were_placed_on(tasks, epochs):
    p = UnitPlacement(tasks)
    placed: dict[int, int] = {}
    for us in epochs:
        ws = [UnitWork(1, 1, u, (SubtaskState("src", u, u),)) for u in us]
        by_task = p.place(ws)
        assert sorted(w.unit_id for t in by_task for w in t) == sorted(us)
        for task, slice_ in enumerate(by_task):
            for w in slice_:
                assert placed.setdefault(w.unit_id, task) == task


def test_a_placement_of_the_first_epoch_spreads_units_evenly():
    ws = [UnitWork(1, 1, u, (SubtaskState("src", u, u),)) for u in range(10)]
    assert [len(t) for t in UnitPlacement(4).place(ws)] == [2, 3, 2, 3]
    with pytest.raises(ValueError, match="at least one task, not 0"):
        UnitPlacement(0)


def test_an_unknown_mode_is_refused_before_spark_is_touched(tmp_path):
    with pytest.raises(
        ValueError,
        match="mode 'streaming' for pipeline 'p': use one of 'micro-epoch', 'continuous'",
    ):
        SparkRuntime(Pipeline("p"), None, root=str(tmp_path), mode="streaming")  # type: ignore[arg-type]
