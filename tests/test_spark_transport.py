"""What the Spark dispatcher ships (no Spark needed): a task's work and answers as msgpack blobs."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from metadata.model import SplitState, StateHandle, SubtaskState
from regional.coordinator.messages import (
    Ack,
    AckBatch,
    Answer,
    Decline,
    UnitWork,
    answers_of,
    packed,
)
from regional.runtime.spark import _answers, _work_blobs, _work_of


def _work(unit: int) -> UnitWork:
    restore = (
        SubtaskState("src", unit, unit, ref_checkpoint_id=2, split_states=(SplitState("g", b"7"),)),
        SubtaskState(
            "count",
            unit,
            unit,
            ref_checkpoint_id=1,
            handles=(StateHandle("chk-1/u0-a1.state", 0, 5, 5, b"x" * 16),),
        ),
    )
    return UnitWork(3, 1, unit, restore, (("src", unit, f"g{unit}"),))


def _stage_work(unit: int, vertices: tuple[str, ...]) -> UnitWork:
    return UnitWork(3, 1, unit, tuple(SubtaskState(v, unit, unit) for v in vertices), ())


@given(units=st.integers(0, 40), tasks=st.integers(1, 8))
def test_work_of_one_stage_is_sliced_as_parallelize_slices_and_decodes_to_the_same_structs(
    units, tasks
):
    works = [_work(u) for u in range(units)]
    blobs = _work_blobs(works, tasks)
    slices = [_work_of(b) for b in blobs]
    assert len(blobs) == tasks and [w for s in slices for w in s] == works
    assert max(map(len, slices)) - min(map(len, slices)) <= 1  # near-equal, contiguous


@given(stages=st.lists(st.integers(0, 12), min_size=1, max_size=5), tasks=st.integers(1, 4))
def test_every_stage_is_spread_over_the_tasks(stages, tasks):
    """Units of each stage (one shape) go to every task in near-equal contiguous slices, not
    one stage to one task and the next stage to another; each unit exactly once."""
    works, unit = [], 0
    for s, size in enumerate(stages):
        works += [_stage_work(unit + i, (f"src{s}", f"out{s}")) for i in range(size)]
        unit += size
    slices = [_work_of(b) for b in _work_blobs(works, tasks)]
    assert sorted(w.unit_id for s in slices for w in s) == list(range(unit))
    for s in range(len(stages)):
        mine = [[w.unit_id for w in sl if w.restore[0].vertex_id == f"src{s}"] for sl in slices]
        assert max(map(len, mine)) - min(map(len, mine)) <= 1
        assert all(ids == list(range(ids[0], ids[0] + len(ids))) for ids in mine if ids)
    assert max(map(len, slices)) - min(map(len, slices)) <= len(stages)


def test_answers_decode_and_a_task_spark_ran_again_wins_per_unit_attempt():
    ack0 = Ack(3, 0, 1, (SubtaskState("src", 0, 0, attempt=1, committables=(b"\x00f",)),))
    ack2 = Ack(3, 2, 1, (SubtaskState("src", 2, 2, attempt=1),))
    bad = Decline(3, 1, 1, "ValueError: bad", "Traceback ...")
    first = msgspec.msgpack.encode(packed([ack0, bad, ack2]))
    got = _answers([first])
    assert got.batches == [AckBatch.of([ack0, ack2])] and got.answers == [bad]  # kept whole
    refused = "spark task attempt 1 refused: units run once per attempt"
    again = msgspec.msgpack.encode(packed([Decline(3, 0, 1, refused)]))  # Spark re-ran unit 0
    got = _answers([first, again], "spark job failed: lost executor")
    assert got.batches == [] and got.error == "spark job failed: lost executor"
    assert got.answers == [ack2, bad, Decline(3, 0, 1, refused)]  # the batch's kept ack alone
    arrived: list[Answer] = answers_of(got.arrived())
    assert sorted(a.unit for a in arrived) == [0, 1, 2]
