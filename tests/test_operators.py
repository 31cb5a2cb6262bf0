"""Operator coordinators: the split enumerator, the commit coordinator and the in-memory sink
(DESIGN §4 rules 7 and 8)."""

from __future__ import annotations

import pytest

from metadata.model import SplitState, SubtaskState
from regional.coordinator import Commit
from regional.coordinator.commit import CommitCoordinator, perform_commit
from regional.coordinator.operator_coordinator import OperatorCoordinator, RegionalCompletion
from regional.coordinator.split_enumerator import SplitEnumerator
from regional.errors import CommitError
from regional.sinks.base import TableCommitter
from regional.sinks.memory import InMemoryTableSink


def test_reference_classes_implement_the_protocols() -> None:
    assert isinstance(SplitEnumerator("src"), OperatorCoordinator)
    assert isinstance(CommitCoordinator("sink", "job"), OperatorCoordinator)
    assert isinstance(InMemoryTableSink(), TableCommitter)


# --- split enumerator ------------------------------------------------------------------------


def test_static_splits_are_assigned_in_order_and_never_twice() -> None:
    e = SplitEnumerator("src", ["a", "b", "c"])
    got = [e.assign(0), e.assign(1), e.assign(0), e.assign(1)]
    assert got == ["a", "b", "c", None]
    assert (e.owner_of("a"), e.owner_of("b"), e.owner_of("c")) == (0, 1, 0)


def test_dynamic_discovery_adds_only_new_splits() -> None:
    e = SplitEnumerator("src", ["a"])
    assert e.assign(0) == "a"
    assert e.discover(["a", "b", "b", "c"]) == ("b", "c")
    assert e.discover(["b"]) == ()
    assert e.unassigned == ("b", "c")


def test_fallback_snapshot_returns_splits_assigned_after_the_owner_checkpoint() -> None:
    # Flink's SourceCoordinatorRegionalCheckpointTest: 6 splits, some assigned before
    # checkpoint 100, some after; subtask 0 falls back to 100 in checkpoint 101.
    e = SplitEnumerator("src", [f"s{i}" for i in range(6)])
    e.assign(0), e.assign(1)  # s0, s1 before checkpoint 100
    e.snapshot(100)
    e.assign(0), e.assign(2)  # s2 to subtask 0 and s3 to subtask 2 after it
    data = e.snapshot_for_fallback(101, {0: 100})
    restored = SplitEnumerator("src")
    restored.restore(data)
    assert restored.unassigned == ("s2", "s4", "s5")  # rolled back first, then never assigned
    assert restored.owner_of("s0") == 0 and restored.owner_of("s3") == 2
    assert restored.owner_of("s2") is None
    # the snapshot does not change the live enumerator; the fallback notice does
    assert e.owner_of("s2") == 0
    e.notify_regional_complete(101, RegionalCompletion({0: 100}, {0: 100}))
    assert e.unassigned == ("s2", "s4", "s5") and e.owner_of("s2") is None


def test_fallback_of_several_subtasks_and_nothing_to_roll_back() -> None:
    e = SplitEnumerator("src", [f"s{i}" for i in range(5)])
    e.snapshot(1)
    e.assign(0), e.assign(1), e.assign(2)
    e.notify_complete(2)
    assert e.unassigned == ("s3", "s4")
    e.snapshot(2)
    e.notify_aborted(3, {0: 2, 2: 2})  # assigned in epoch 2, included in checkpoint 2
    assert e.unassigned == ("s3", "s4")
    e.notify_aborted(3, {0: 1, 2: 1})  # restarting from checkpoint 1: s0 and s2 come back
    assert e.unassigned == ("s0", "s2", "s3", "s4")
    assert e.owner_of("s1") == 1


def test_split_enumerator_state_survives_restore() -> None:
    e = SplitEnumerator("src", ["a", "b", "c"])
    e.assign(3)
    data = e.snapshot(4)
    r = SplitEnumerator("src")
    r.restore(data)
    assert r.unassigned == ("b", "c") and r.owner_of("a") == 3
    assert r.assign(1) == "b"
    r.notify_aborted(5, {1: 4})  # b was assigned after checkpoint 4
    assert r.unassigned == ("b", "c")


def test_check_fallback_refuses_state_whose_split_moved() -> None:
    e = SplitEnumerator("src", ["a", "b"])
    e.assign(0)
    e.snapshot(1)
    state = SubtaskState("src", 0, 0, split_states=(SplitState("a", b"7"),))
    assert e.check_fallback(state, 1) is None
    e.notify_aborted(2, {0: 0})  # subtask 0 went back to its initial state: "a" returned
    assert e.assign(1) == "b"  # not "a": kept for subtask 0 until the next snapshot
    e.snapshot(3)
    assert e.assign(1) == "a"
    assert e.check_fallback(state, 1) == (
        "split 'a' in the state of subtask ('src', 0) in checkpoint 1 is now assigned to subtask 1"
    )


# --- commit coordinator and sink -------------------------------------------------------------


def test_commits_are_strictly_ordered_and_a_failed_commit_blocks_later_ones() -> None:
    sink = InMemoryTableSink()
    c = CommitCoordinator("sink", "job")
    f1 = sink.stage("chk-1/a", ["r1"])
    f2 = sink.stage("chk-2/a", ["r2"])
    c.checkpoint_complete(1, (f1,))
    c.checkpoint_complete(2, (f2,))
    first = c.next_commit()
    assert first is not None and first.checkpoint_id == 1
    assert c.next_commit() is None  # one in flight at a time
    sink.fail_next_commits = 1
    with pytest.raises(CommitError, match="injected"):
        perform_commit(first, sink)
    c.commit_failed(1)
    retry = c.next_commit()
    assert retry == first  # retried, and 2 waits behind it
    assert perform_commit(retry, sink)
    c.commit_succeeded(1)
    second = c.next_commit()
    assert second is not None and second.checkpoint_id == 2
    perform_commit(second, sink)
    c.commit_succeeded(2)
    assert sink.rows() == ["r1", "r2"] and sink.latest_committed("job") == 2


def test_queueing_out_of_order_is_refused() -> None:
    c = CommitCoordinator("sink", "job")
    c.checkpoint_complete(5, (b"x",))
    with pytest.raises(CommitError, match="checkpoint 4 queued after 5"):
        c.checkpoint_complete(4, (b"y",))


def test_perform_commit_is_idempotent_per_commit_user() -> None:
    sink = InMemoryTableSink()
    f = sink.stage("chk-3/a", ["r"])
    commit = Commit(3, "sink", "job", (f,), recommit=True)
    assert perform_commit(commit, sink) is True
    assert perform_commit(commit, sink) is False
    assert sink.rows() == ["r"]
    other_user = Commit(3, "sink", "other-job", (f,))
    assert perform_commit(other_user, sink) is True


def test_sink_refuses_an_identifier_not_after_the_latest() -> None:
    sink = InMemoryTableSink()
    sink.commit("job", 5, [sink.stage("a", [1])])
    with pytest.raises(
        CommitError, match="commit 4 of user 'job' is not after its latest commit 5"
    ):
        sink.commit("job", 4, [sink.stage("b", [2])])


def test_restore_recommits_pending_commits_and_refuses_missing_data_files() -> None:
    sink = InMemoryTableSink()
    c = CommitCoordinator("sink", "job-7")
    c.checkpoint_complete(1, (sink.stage("chk-1/a", ["r1"]),))
    c.checkpoint_complete(2, (sink.stage("chk-2/a", ["r2"]),))
    perform_commit(c.next_commit(), sink)  # 1 committed, crash before commit_succeeded
    data = c.snapshot(3)
    r = CommitCoordinator("sink", "ignored")
    r.restore(data)
    assert r.commit_user == "job-7" and r.queued == (1, 2)
    first = r.next_commit()
    assert first.recommit and perform_commit(first, sink) is False  # already committed
    r.commit_succeeded(1)
    second = r.next_commit()
    sink.delete_file("chk-2/a")
    with pytest.raises(CommitError) as err:
        perform_commit(second, sink)
    assert str(err.value) == (
        "cannot re-commit checkpoint 2 of sink 'sink': data file(s) chk-2/a are missing (were "
        "they cleaned?); restore from a newer checkpoint or restore the files"
    )


def test_empty_commits_are_not_queued() -> None:
    c = CommitCoordinator("sink", "job")
    c.checkpoint_complete(1, ())
    assert c.next_commit() is None and c.queued == ()


def test_fallback_units_reach_the_table_and_survive_a_coordinator_restore() -> None:
    sink = InMemoryTableSink()
    c = CommitCoordinator("sink", "job-7")
    c.checkpoint_complete(4, (sink.stage("chk-4/a", ["r4"]),), fallback={2: 3, 5: 0})
    c.checkpoint_complete(5, (sink.stage("chk-5/a", ["r5"]),))
    r = CommitCoordinator("sink", "ignored")
    r.restore(c.snapshot(5))
    first = r.next_commit()
    assert (first.checkpoint_id, first.fallback) == (4, {2: 3, 5: 0})
    perform_commit(first, sink)
    r.commit_succeeded(4)
    perform_commit(r.next_commit(), sink)
    assert sink.fallback == {("job-7", 4): {2: 3, 5: 0}, ("job-7", 5): {}}
