"""What the Spark dispatcher ships (no Spark needed): a task's work and answers as msgpack blobs."""

from __future__ import annotations

import msgspec
from hypothesis import given
from hypothesis import strategies as st

from metadata.model import SplitState, StateHandle, SubtaskState
from regional.runtime.protocol import Ack, Answer, Decline, UnitWork
from regional.runtime.spark import _answers, _packed, _unpacked


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


@given(units=st.integers(0, 40), tasks=st.integers(1, 8))
def test_work_is_sliced_as_parallelize_slices_and_decodes_to_the_same_structs(units, tasks):
    works = [_work(u) for u in range(units)]
    blobs = _packed(works, tasks)
    slices = [_unpacked(b) for b in blobs]
    assert len(blobs) == tasks and [w for s in slices for w in s] == works
    assert max(map(len, slices)) - min(map(len, slices)) <= 1  # near-equal, contiguous


def test_answers_decode_and_a_task_spark_ran_again_wins_per_unit_attempt():
    ack = Ack(3, 0, 1, (SubtaskState("src", 0, 0, attempt=1, committables=(b"\x00f",)),))
    first = msgspec.msgpack.encode([ack, Decline(3, 1, 1, "ValueError: bad", "Traceback ...")])
    again = msgspec.msgpack.encode(  # Spark re-ran the task: its units decline
        [Decline(3, 0, 1, "spark task attempt 1 refused: units run once per attempt")]
    )
    got: list[Answer] = _answers([first, again])
    assert [type(a).__name__ for a in got] == ["Decline", "Decline"]
    assert got[0].unit == 0 and got[0].reason.startswith("spark task attempt 1")
    assert got[1] == Decline(3, 1, 1, "ValueError: bad", "Traceback ...")
    assert _answers([first]) == [ack, Decline(3, 1, 1, "ValueError: bad", "Traceback ...")]
