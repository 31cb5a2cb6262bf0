"""The simulator driving the real coordinator: crash + restore gives the fault-free output,
faults show up as the decisions they should cause, and runs are reproducible."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from regional.coordinator import AbortCheckpoint, DiscardAttempt, FinishJob, Rule
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy
from regional.runtime.sim import RandomFaults, Simulation, kind_counts

UNITS = 6
faults = st.dictionaries(
    st.tuples(st.integers(1, 25), st.integers(0, UNITS - 1)),
    st.sampled_from(["decline", "hang", "late_ack"]),
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    faults=faults,
    crashes=st.lists(st.integers(1, 250), max_size=3),
    mode=st.sampled_from(["claim", "no-claim"]),
    shuffle=st.integers(0, 3),
)
def test_committed_output_after_faults_and_crashes_equals_a_fault_free_run(
    faults: dict, crashes: list[int], mode: str, shuffle: int
) -> None:
    clean = Simulation(UNITS, Policy()).run(200)
    run = Simulation(
        UNITS,
        Policy(),
        faults=faults,
        crash_before=crashes,
        restore_mode=mode,
        shuffle_seed=shuffle,
    ).run(200)
    assert clean.finished and run.finished, run.failed
    assert sorted(run.committed_rows) == sorted(clean.committed_rows) == run.expected_rows
    ids = [i for _, i, _ in run.commit_log]
    assert ids == sorted(set(ids))


def test_a_failing_unit_gives_regional_checkpoints_and_the_job_still_ends_globally() -> None:
    run = Simulation(UNITS, Policy(), faults={(2, 3): "decline", (3, 3): "hang"}).run(100)
    assert run.kinds[:3] == ["global", "regional", "regional"]
    assert run.metadata[2].units[3].reason.startswith("timeout")
    assert run.metadata[-1].kind.value == "global"
    assert isinstance(run.decisions[-1], FinishJob)
    assert run.redone_unit_epochs == 2  # unit 3 redid epochs 2 and 3


def test_late_ack_files_are_discarded_never_committed() -> None:
    run = Simulation(UNITS, Policy(), faults={(2, 1): "late_ack"}).run(100)
    [discard] = [d for d in run.decisions if isinstance(d, DiscardAttempt)]
    assert (discard.checkpoint_id, discard.unit_id) == (2, 1)
    committed = {p for _, _, paths in run.commit_log for p in paths}
    assert not committed & {c.decode() for c in discard.all_committables}
    assert sorted(run.committed_rows) == run.expected_rows


def test_a_failed_commit_is_retried_before_later_commits() -> None:
    run = Simulation(UNITS, Policy(), fail_commits=2).run(100)
    assert run.finished and sorted(run.committed_rows) == run.expected_rows
    commits = [d.checkpoint_id for d in run.decisions if type(d).__name__ == "Commit"]
    assert commits[:3] == [1, 1, 1]


def test_global_mode_aborts_where_regional_mode_completes() -> None:
    off = Policy(checkpointing=CheckpointingPolicy(region=RegionPolicy(enabled=False)))
    schedule = {(2, 0): "decline", (3, 4): "decline"}
    regional = Simulation(UNITS, Policy(), faults=schedule).run(100)
    global_ = Simulation(UNITS, off, faults=schedule).run(100)
    assert kind_counts(regional)["regional"] == 2
    aborts = [d for d in global_.decisions if isinstance(d, AbortCheckpoint)]
    assert [a.rule for a in aborts] == [Rule.REGIONAL_DISABLED] * 2
    assert global_.redone_unit_epochs > regional.redone_unit_epochs
    assert sorted(global_.committed_rows) == global_.expected_rows


def test_random_faults_are_reproducible() -> None:
    a = Simulation(50, Policy(), faults=RandomFaults(0.05, seed=7), bounded=False).run(20)
    b = Simulation(50, Policy(), faults=RandomFaults(0.05, seed=7), bounded=False).run(20)
    assert a.kinds == b.kinds and a.redone_unit_epochs == b.redone_unit_epochs
    assert a.triggered == 20 and kind_counts(a)["regional"] > 0
