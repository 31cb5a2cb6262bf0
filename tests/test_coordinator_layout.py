"""`JobLayout`: adapting the region analyser's plan, and refusing inconsistent layouts."""

from __future__ import annotations

import dataclasses

import pytest

from metadata.model import SplitState, SubtaskState, VertexInfo
from regional.coordinator import CheckpointCoordinator, JobLayout, Rule, WriteMetadata
from regional.coordinator.split_enumerator import SplitEnumerator
from regional.errors import GraphError
from regional.policy import Policy

VERTICES = (VertexInfo("src", 2, 128), VertexInfo("map", 2, 128))


@dataclasses.dataclass
class Plan:
    units: list[list[tuple[str, int]]]

    @property
    def num_units(self) -> int:
        return len(self.units)

    def subtasks_of_unit(self, unit_id: int) -> list[tuple[str, int]]:
        return self.units[unit_id]


def test_from_plan_adapts_any_plan_with_units() -> None:
    plan = Plan([[("src", 0), ("map", 0)], [("src", 1), ("map", 1)]])
    layout = JobLayout.from_plan(plan, VERTICES, sources=["src"], bounded_sources=["src"])
    assert layout.num_units == 2
    assert layout.units[1] == (("src", 1), ("map", 1))
    assert layout.unit_of("map", 0) == 0


@pytest.mark.parametrize(
    ("units", "message"),
    [
        (
            [[("src", 0), ("map", 0)], [("src", 1), ("map", 1), ("map", 0)]],
            "subtask ('map', 0) is in units 0 and 1; a subtask belongs to exactly one unit",
        ),
        ([[("src", 0), ("map", 0)], [("src", 1)]], "subtask ('map', 1) is in no unit"),
        (
            [[("src", 0), ("map", 0)], [("src", 1), ("map", 2)]],
            "unit 1 holds subtask ('map', 2) but vertex 'map' has parallelism 2",
        ),
        (
            [[("src", 0), ("map", 0)], [("src", 1), ("sink", 1)]],
            "unit 1 holds subtask ('sink', 1) of an unknown vertex; known vertices: map, src",
        ),
        ([[("src", 0), ("map", 0), ("src", 1), ("map", 1)], []], "unit 1 has no subtasks"),
    ],
)
def test_inconsistent_layouts_are_refused_with_the_subtask_named(units, message) -> None:
    with pytest.raises(GraphError) as err:
        JobLayout.from_plan(Plan(units), VERTICES)
    assert str(err.value).startswith(message)


def test_bounded_sources_must_be_sources() -> None:
    plan = Plan([[("src", 0), ("map", 0)], [("src", 1), ("map", 1)]])
    with pytest.raises(GraphError, match="bounded_sources map are not listed in sources"):
        JobLayout.from_plan(plan, VERTICES, sources=["src"], bounded_sources=["map"])


def test_fallback_state_whose_split_moved_is_not_usable() -> None:
    layout = JobLayout(
        units=tuple((("src", u),) for u in range(4)),
        vertices=(VertexInfo("src", 4, 128),),
    )
    enumerator = SplitEnumerator("src", ["a", "b", "c", "d"])
    c = CheckpointCoordinator(layout, Policy(), job_id="j", coordinators={"src": enumerator})

    def state(u: int, split: str) -> tuple[SubtaskState, ...]:
        return (SubtaskState("src", u, u, split_states=(SplitState(split, b"0"),), attempt=1),)

    splits = [enumerator.assign(u) for u in range(4)]
    c.trigger(0)
    out = []
    for u in range(4):
        out += c.on_ack(1, u, 1, state(u, splits[u]), 1)
    [write] = out
    assert isinstance(write, WriteMetadata)
    c.on_metadata_durable(1, 2)
    # a runtime bug hands split "a" of unit 0 to subtask 3 behind the coordinator's back
    enumerator.notify_aborted(0, {0: 0})
    enumerator.snapshot(1)  # no longer kept for subtask 0
    enumerator.assign(3)
    c.trigger(10)
    for u in (1, 2, 3):
        c.on_ack(2, u, 1, state(u, splits[u]), 11)
    [abort] = c.on_decline(2, 0, 1, "boom", 12)[:1]
    assert abort.rule is Rule.NO_USABLE_STATE
    assert abort.message.endswith(
        "split 'a' in the state of subtask ('src', 0) in checkpoint 1 is now assigned to subtask 3"
    )
