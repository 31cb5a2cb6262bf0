"""The simulator beyond one vertex's 32,768 subtasks: units spread over several source→sink
chains, with the same exactly-once output as one chain."""

from __future__ import annotations

import pytest

from regional.policy import Policy
from regional.runtime import sim as sim_module
from regional.runtime.sim import Simulation, chain_vertices


def test_32769_units_run_as_two_chains_of_at_most_32768_subtasks() -> None:
    run = Simulation(32_769, Policy(), bounded=False, records_per_epoch=1, stage_output=False).run(
        2
    )
    assert run.failed is None and run.kinds == ["global", "global"]
    md = run.metadata[-1]
    assert [(v.vertex_id, v.parallelism, v.max_parallelism) for v in md.vertices] == [
        ("src", 16_385, 32_768),
        ("sink", 16_385, 32_768),
        ("src-1", 16_384, 32_768),
        ("sink-1", 16_384, 32_768),
    ]
    assert len(md.units) == 32_769 and len(md.subtasks) == 2 * 32_769


def test_chains_split_units_evenly_and_keep_one_chain_up_to_the_bound() -> None:
    assert chain_vertices(32_768) == [("src", "sink", 32_768)]
    assert [p for _, _, p in chain_vertices(65_537)] == [21_846, 21_846, 21_845]


@pytest.mark.parametrize("mode", ["claim", "no-claim"])
def test_several_chains_commit_exactly_the_fault_free_output_after_faults_and_a_crash(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(sim_module, "MAX_PARALLELISM_UPPER_BOUND", 3)  # 7 units: 3 chains
    clean = Simulation(7, Policy()).run(100)
    faults = {(2, 0): "decline", (2, 5): "hang", (3, 6): "late_ack", (4, 2): "decline"}
    run = Simulation(7, Policy(), faults=faults, crash_before=[40], restore_mode=mode).run(100)
    assert [s.splits for s in Simulation(7, Policy()).sources] == [
        [f"s{k}" for k in range(0, 6)],
        [f"s{k}" for k in range(6, 10)],
        [f"s{k}" for k in range(10, 14)],
    ]
    assert clean.finished and run.finished and run.crashes == 1, run.failed
    assert "regional" in run.kinds
    assert sorted(run.committed_rows) == sorted(clean.committed_rows) == run.expected_rows
    assert {s for s, _ in run.committed_rows} == {f"s{k}" for k in range(14)}
    users = {u for u, _, _ in run.commit_log}
    # one commit user per sink vertex, <job>-<run>-<sink> (a restore reloads it)
    assert sorted(u.split("-", 2)[2] for u in users) == ["sink", "sink-1", "sink-2"]
    for user in users:
        ids = [i for u, i, _ in run.commit_log if u == user]
        assert ids == sorted(set(ids))


def test_coordinator_time_is_split_by_call_and_by_epoch() -> None:
    run = Simulation(6, Policy(), faults={(2, 1): "decline", (3, 4): "hang"}).run(5)
    by_call = run.coordinator_seconds_by_call
    assert {"trigger", "on_ack", "on_decline", "on_tick", "on_metadata_durable"} <= set(by_call)
    assert sum(by_call.values()) == pytest.approx(run.coordinator_seconds)
    assert len(run.coordinator_epoch_seconds) == run.triggered == 5
    assert 0 < sum(run.coordinator_epoch_seconds) <= run.coordinator_seconds
    # a trigger, six answers and (for each completed checkpoint) its durable metadata per
    # epoch at least, plus the start's calls
    assert run.coordinator_calls >= 5 * 7 + run.completed
