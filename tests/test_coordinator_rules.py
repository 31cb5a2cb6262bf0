"""The checkpoint coordinator against DESIGN §4 rules 2–9 and the checklist of
research/flink_regional.md §10 (items 4–30), adapted where our rules deliberately differ."""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
import pytest

from metadata.format import decode_metadata, encode_metadata
from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    ForcedGlobal,
    StateHandle,
    SubtaskState,
    VertexInfo,
)
from regional.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CoordinatorStateError,
    DiscardAttempt,
    FailJob,
    JobLayout,
    NotifyComplete,
    NotifyFallback,
    NotifySubsumed,
    Rule,
    WriteMetadata,
)
from regional.coordinator.operator_coordinator import RegionalCompletion
from regional.errors import JobFailedError
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy


def policy(**region: object) -> Policy:
    tolerable = region.pop("tolerable", 10)
    retained = region.pop("retained", 3)
    return Policy(
        checkpointing=CheckpointingPolicy(
            region=RegionPolicy(**region),  # type: ignore[arg-type]
            tolerable_failed_checkpoints=tolerable,  # type: ignore[arg-type]
            num_retained=retained,  # type: ignore[arg-type]
        )
    )


def layout(units: int, per_unit: int = 1) -> JobLayout:
    """`units` units; unit u holds subtask u of vertices v0 .. v{per_unit-1}."""
    vertices = tuple(VertexInfo(f"v{k}", units, 128) for k in range(per_unit))
    return JobLayout(
        units=tuple(tuple((f"v{k}", u) for k in range(per_unit)) for u in range(units)),
        vertices=vertices,
    )


class Job:
    """A coordinator plus helpers to answer for units and finish checkpoints."""

    def __init__(self, units: int = 10, per_unit: int = 1, coordinators=None, **region) -> None:
        self.layout = layout(units, per_unit)
        self.c = CheckpointCoordinator(
            self.layout, policy(**region), job_id="job", coordinators=coordinators
        )
        self.now = 0
        self.trigger = None

    def start(self, **kw):
        self.now += 1000
        self.trigger = self.c.trigger(self.now, **kw)
        return self.trigger

    def states(self, unit: int, attempt: int = 1) -> tuple[SubtaskState, ...]:
        cid = self.trigger.checkpoint_id
        return tuple(
            SubtaskState(
                v,
                i,
                unit,
                handles=(StateHandle(f"chk-{cid}/{unit}-{attempt}.state", 0, 1, 1, b"h" * 16),),
                attempt=attempt,
            )
            for v, i in self.layout.units[unit]
        )

    def ack(self, unit: int, attempt: int = 1):
        return self.c.on_ack(
            self.trigger.checkpoint_id, unit, attempt, self.states(unit, attempt), self.now + 1
        )

    def decline(self, unit: int, cause: str = "ValueError: bad record", attempt: int = 1):
        return self.c.on_decline(self.trigger.checkpoint_id, unit, attempt, cause, self.now + 1)

    def run(self, failed=(), durable: bool = True, **kw) -> list:
        """One checkpoint: `failed` units decline, the others ack; then metadata is durable."""
        self.start(**kw)
        out = []
        for u in range(self.layout.num_units):
            out += self.decline(u) if u in failed else self.ack(u)
            if self.c.pending_checkpoint_id is None:
                break
        if durable:
            out += self.finish(out)
        return out

    def finish(self, out: list) -> list:
        writes = [d for d in out if isinstance(d, WriteMetadata)]
        if not writes:
            return []
        return self.c.on_metadata_durable(writes[0].metadata.checkpoint_id, self.now + 2)


def metadata_of(out: list) -> CheckpointMetadata:
    [write] = [d for d in out if isinstance(d, WriteMetadata)]
    return write.metadata


def abort_of(out: list) -> AbortCheckpoint:
    [abort] = [d for d in out if isinstance(d, AbortCheckpoint)]
    return abort


# --- decline buffering (items 4-8) -----------------------------------------------------------


def test_regional_disabled_first_decline_aborts_at_once() -> None:
    job = Job(enabled=False)
    job.start()
    out = job.decline(3)
    abort = abort_of(out)
    assert abort.rule is Rule.REGIONAL_DISABLED
    assert "unit 3 failed (declined: ValueError: bad record)" in abort.message
    assert job.c.pending_checkpoint_id is None
    assert abort.failed_units == (3,)


def test_regional_disabled_timeout_aborts() -> None:
    job = Job(enabled=False)
    t = job.start()
    assert job.c.on_tick(t.deadline_ms - 1) == []
    abort = abort_of(job.c.on_tick(t.deadline_ms))
    assert abort.rule is Rule.REGIONAL_DISABLED and "timeout" in abort.message


def test_savepoint_decline_aborts_at_once_even_with_regional_on() -> None:
    job = Job()
    t = job.start(savepoint=True)
    assert t.kind is CheckpointKind.SAVEPOINT
    abort = abort_of(job.decline(0))
    assert abort.rule is Rule.MUST_BE_FRESH and "savepoint" in abort.message


def test_decline_is_buffered_until_every_unit_answered() -> None:
    job = Job()
    t = job.start()
    assert job.decline(2) == []
    for u in range(9):
        if u != 2:
            assert job.ack(u) == []
    assert job.c.pending_checkpoint_id == t.checkpoint_id
    md = metadata_of(job.ack(9))
    assert md.kind is CheckpointKind.REGIONAL


def test_timeout_declines_silent_units_and_decides() -> None:
    job = Job()
    t = job.start()
    for u in range(9):
        job.ack(u)
    md = metadata_of(job.c.on_tick(t.deadline_ms))
    [unit9] = md.fallback_units
    assert unit9.unit_id == 9 and unit9.reason.startswith("timeout: no answer after 120 s")


def test_all_acks_complete_globally_and_reset_the_consecutive_counter() -> None:
    job = Job(max_consecutive_regional=5)
    job.run(failed={1})
    assert job.c.limits.consecutive_regional == 1
    md = metadata_of(job.run())
    assert md.kind is CheckpointKind.GLOBAL
    assert all(s.ref_checkpoint_id is None for s in md.subtasks)
    assert job.c.limits.consecutive_regional == 0


# --- decision order (items 9-13, rule 3) -----------------------------------------------------


def test_single_unit_job_aborts_by_rule_3b() -> None:
    job = Job(units=1)
    abort = abort_of(job.run(failed={0}))
    assert abort.rule is Rule.SINGLE_UNIT
    assert "single fallback unit" in abort.message


def test_failure_ratio_three_of_ten_completes_four_of_ten_aborts() -> None:
    job = Job(max_failure_ratio=0.3)
    assert metadata_of(job.run(failed={0, 1, 2})).kind is CheckpointKind.REGIONAL
    abort = abort_of(job.run(failed={3, 4, 5, 6}))
    assert abort.rule is Rule.FAILURE_RATIO
    assert "4 of 10 units failed (0.4 > max-failure-ratio 0.3)" in abort.message


def test_failure_ratio_uses_exact_rationals_not_binary_floats() -> None:
    # As binary floats 3/10 > 0.3 (0.3 is 0.29999...); exactly, they are equal, which passes.
    from fractions import Fraction

    assert Fraction(3, 10) > 0.3
    job = Job(units=20, max_failure_ratio=0.15)
    assert metadata_of(job.run(failed={1, 5, 9})).kind is CheckpointKind.REGIONAL


def test_forced_global_that_also_breaks_the_ratio_aborts_by_3a_and_resets_tier_2() -> None:
    job = Job(max_consecutive_regional=1)
    job.run(failed={0})
    t = job.start()
    assert t.kind is CheckpointKind.GLOBAL and "tier 1" in t.reasons[0]
    out = job.decline(1)  # first decline of a forced global aborts at once, by rule 3a
    abort = abort_of(out)
    assert abort.rule is Rule.MUST_BE_FRESH and "tier 1" in abort.message
    assert job.c.limits.consecutive_regional == 0
    assert job.start().kind is CheckpointKind.REGIONAL  # tier 2: the next cycle may be regional


def test_unit_that_never_checkpointed_falls_back_to_its_initial_state() -> None:
    job = Job(per_unit=2)
    md = metadata_of(job.run(failed={4}))
    fallback = [s for s in md.subtasks if s.unit_id == 4]
    assert [(s.vertex_id, s.ref_checkpoint_id, s.handles) for s in fallback] == [
        ("v0", 0, ()),
        ("v1", 0, ()),
    ]


class Recorder:
    """An operator coordinator that records calls; `fail_fallback` makes it refuse fallbacks."""

    def __init__(self, vertex_id: str, fail_fallback: bool = False) -> None:
        self.vertex_id = vertex_id
        self.fail_fallback = fail_fallback
        self.calls: list[tuple] = []

    def snapshot(self, checkpoint_id: int) -> bytes:
        self.calls.append(("snapshot", checkpoint_id))
        return b"fresh-%d" % checkpoint_id

    def snapshot_for_fallback(self, checkpoint_id: int, fallback: Mapping[int, int]) -> bytes:
        self.calls.append(("fallback", checkpoint_id, dict(fallback)))
        if self.fail_fallback:
            raise NotImplementedError("no region fallback support")
        return b"fallback-%d" % checkpoint_id

    def check_fallback(self, state: SubtaskState, owner: int) -> str | None:
        return None

    def restore(self, data: bytes) -> None:
        self.calls.append(("restore", data))

    def notify_complete(self, checkpoint_id: int) -> None:
        self.calls.append(("complete", checkpoint_id))

    def notify_regional_complete(self, checkpoint_id: int, info: RegionalCompletion) -> None:
        self.calls.append(("regional-complete", checkpoint_id, dict(info.fallback)))

    def notify_aborted(self, checkpoint_id: int, reset: Mapping[int, int]) -> None:
        self.calls.append(("aborted", checkpoint_id, dict(reset)))


def test_coordinator_without_fallback_support_aborts_by_rule_3e() -> None:
    rec = Recorder("v1", fail_fallback=True)
    job = Job(per_unit=2, coordinators={"v1": rec})
    abort = abort_of(job.run(failed={2}))
    assert abort.rule is Rule.COORDINATOR_FALLBACK
    assert "operator coordinator of 'v1' cannot produce a fallback snapshot for subtasks [2]" in (
        abort.message
    )
    assert ("aborted", 1, dict.fromkeys(range(10), 0)) in rec.calls  # every unit restarts


def test_rule_order_must_be_fresh_before_ratio_before_usable_state() -> None:
    # Unit 0 is at its unit limit (force-fresh) and fails with too many others: rule 3a wins.
    job = Job(max_unit_fallbacks=1, on_unit_fallback_limit="force-fresh")
    job.run(failed={0})
    assert abort_of(job.run(failed={0, 1, 2, 3, 4})).rule is Rule.MUST_BE_FRESH
    # Too many failures and a unit without usable state: 3c wins over 3d.
    md = metadata_of(Job().run())
    job = Job()
    job.c.restore(msgspec.structs.replace(md, vertices=(VertexInfo("v0", 10, 64),)))
    assert abort_of(job.run(failed={0, 1, 2, 3})).rule is Rule.FAILURE_RATIO
    assert abort_of(job.run(failed={0})).rule is Rule.NO_USABLE_STATE


# --- state assembly (items 14-19, rule 4) ----------------------------------------------------


def test_regional_checkpoint_merges_fresh_and_owner_referenced_state() -> None:
    job = Job(per_unit=2)
    first = metadata_of(job.run())
    md = metadata_of(job.run(failed={3}))
    for s in md.subtasks:
        if s.unit_id == 3:
            [owner_state] = [
                o for o in first.subtasks if (o.vertex_id, o.index) == (s.vertex_id, s.index)
            ]
            assert s.ref_checkpoint_id == 1
            assert s.handles == owner_state.handles
        else:
            assert s.ref_checkpoint_id is None
            assert s.handles[0].path == f"chk-2/{s.unit_id}-1.state"
    assert [(u.unit_id, u.ref_checkpoint_id) for u in md.fallback_units] == [(3, 1)]


def test_refs_name_the_owner_not_the_previous_checkpoint() -> None:
    job = Job(max_unit_fallbacks=5)
    job.run()
    for _ in range(3):
        md = metadata_of(job.run(failed={6}))
    assert md.checkpoint_id == 4
    assert {s.ref_checkpoint_id for s in md.subtasks if s.unit_id == 6} == {1}
    assert md.oldest_ref_checkpoint_id == 1
    assert job.c.metrics.lag_of(6) == 3


def test_every_subtask_of_a_failed_unit_falls_back_never_half_fresh() -> None:
    job = Job(units=4, per_unit=3, max_failure_ratio=0.5)
    job.run()
    md = metadata_of(job.run(failed={1}))
    refs = [s.ref_checkpoint_id for s in md.subtasks if s.unit_id == 1]
    assert refs == [1, 1, 1]
    assert len(md.subtasks) == 12 and len({(s.vertex_id, s.index) for s in md.subtasks}) == 12


def test_coordinator_fallback_snapshot_is_written_and_notified() -> None:
    rec = Recorder("v1")
    job = Job(per_unit=2, coordinators={"v1": rec})
    job.run()
    out = job.run(failed={5})
    md = metadata_of(out)
    assert md.coordinators == {"v1": b"fallback-2"}
    assert ("fallback", 2, {5: 1}) in rec.calls
    assert ("regional-complete", 2, {5: 1}) in rec.calls
    assert ("complete", 1) in rec.calls


def test_coordinator_of_a_healthy_operator_is_told_the_checkpoint_was_regional() -> None:
    # rule 6: vertex "b" has no subtask in the failed unit, yet it must not be told "complete"
    units = ((("a", 0),), (("a", 1),), (("b", 0),), (("b", 1),))
    vertices = (VertexInfo("a", 2, 128), VertexInfo("b", 2, 128))
    recorders = {"a": Recorder("a"), "b": Recorder("b")}
    c = CheckpointCoordinator(
        JobLayout(units=units, vertices=vertices),
        policy(max_failure_ratio=0.5),
        job_id="job",
        coordinators=recorders,
    )
    t = c.trigger(now_ms=0)
    out = []
    for u, ((vertex, index),) in enumerate(units):
        if u == 0:
            out += c.on_decline(t.checkpoint_id, u, 1, "ValueError: bad", 1)
        else:
            state = SubtaskState(vertex, index, u, attempt=1)
            out += c.on_ack(t.checkpoint_id, u, 1, (state,), 1)
    [write] = [d for d in out if isinstance(d, WriteMetadata)]
    c.on_metadata_durable(write.metadata.checkpoint_id, 2)
    assert recorders["a"].calls[-1] == ("regional-complete", 1, {0: 0})
    assert recorders["b"].calls[-1] == ("regional-complete", 1, {})


def test_restore_with_other_parallelism_refuses_fallback_by_rule_3d() -> None:
    job = Job(units=4)
    md = metadata_of(job.run())
    other = msgspec.structs.replace(md, vertices=(VertexInfo("v0", 4, 64),))
    fresh = Job(units=4)
    fresh.c.restore(other)
    abort = abort_of(fresh.run(failed={2}))
    assert abort.rule is Rule.NO_USABLE_STATE
    assert "vertex 'v0' had parallelism / max parallelism 4 / 64 in checkpoint 1, now 4 / 128" in (
        abort.message
    )


def test_no_claim_restore_keeps_checkpoints_global_until_one_succeeds() -> None:
    job = Job()
    md = metadata_of(job.run())
    fresh = Job()
    fresh.c.restore(md, mode="no-claim")
    t = fresh.start()
    assert t.kind is CheckpointKind.GLOBAL and "no-claim" in t.reasons[0]
    assert abort_of(fresh.c.on_tick(t.deadline_ms)).rule is Rule.MUST_BE_FRESH
    assert metadata_of(fresh.run()).kind is CheckpointKind.GLOBAL
    assert fresh.start().kind is CheckpointKind.REGIONAL


# --- limits (items 20, 21, 29; rule 5) -------------------------------------------------------


def test_tier_1_forces_a_global_checkpoint_after_the_consecutive_limit() -> None:
    job = Job(max_consecutive_regional=2)
    assert metadata_of(job.run(failed={1})).kind is CheckpointKind.REGIONAL
    assert metadata_of(job.run(failed={1})).kind is CheckpointKind.REGIONAL
    t = job.start()
    assert t.kind is CheckpointKind.GLOBAL
    assert t.reasons == (
        "tier 1: 2 consecutive regional checkpoints (max-consecutive-regional = 2)",
    )


def test_max_consecutive_regional_zero_means_never_regional() -> None:
    job = Job(max_consecutive_regional=0)
    assert job.start().kind is CheckpointKind.GLOBAL
    assert abort_of(job.decline(0)).rule is Rule.MUST_BE_FRESH


def test_unlimited_consecutive_regional_never_forces_global() -> None:
    job = Job(max_consecutive_regional=None, max_unit_fallbacks=100)
    for _ in range(15):
        assert metadata_of(job.run(failed={2})).kind is CheckpointKind.REGIONAL


def test_force_fresh_unit_limit_makes_that_unit_fresh_while_others_still_fall_back() -> None:
    job = Job(
        max_unit_fallbacks=2, max_consecutive_regional=None, on_unit_fallback_limit="force-fresh"
    )
    job.run(failed={7})
    job.run(failed={7})
    t = job.start()
    assert t.kind is CheckpointKind.REGIONAL and t.must_be_fresh == frozenset({7})
    for u in range(7):
        job.ack(u)
    assert job.decline(8) == []  # another unit may still fall back
    abort = abort_of(job.decline(7))
    assert abort.rule is Rule.MUST_BE_FRESH
    assert "unit 7 had to be fresh (it fell back in the last 2 checkpoints" in abort.message
    md = metadata_of(job.run(failed={8}))  # 7 fresh again: its streak ends
    assert [u.unit_id for u in md.fallback_units] == [8]
    assert job.c.limits.unit_limit_reason(7) is None


def test_tolerable_failed_checkpoints_then_fail_job_naming_units() -> None:
    job = Job(tolerable=2, max_unit_fallbacks=1, on_unit_fallback_limit="force-fresh")
    job.run(failed={4})
    assert not any(isinstance(d, FailJob) for d in job.run(failed={4}))
    assert not any(isinstance(d, FailJob) for d in job.run(failed={4}))
    out = job.run(failed={4})
    [fail] = [d for d in out if isinstance(d, FailJob)]
    assert fail.units == (4,)
    assert "3 consecutive checkpoints aborted (tolerable-failed-checkpoints = 2); unit 4" in (
        fail.message
    )
    with pytest.raises(JobFailedError, match="job job failed"):
        job.start()


def test_regional_completion_resets_the_tolerable_failure_count() -> None:
    job = Job(tolerable=1, max_failure_ratio=0.1)
    job.run(failed={1, 2})
    assert job.c.limits.consecutive_aborts == 1
    job.run(failed={3})
    assert job.c.limits.consecutive_aborts == 0


def test_tier_2_abort_with_tolerance_zero_fails_the_job() -> None:
    job = Job(tolerable=0, max_consecutive_regional=1)
    job.run(failed={1})
    out = job.run(failed={1})
    assert abort_of(out).rule is Rule.MUST_BE_FRESH
    assert any(isinstance(d, FailJob) for d in out)


def test_final_checkpoint_is_global_and_the_job_ends_after_it() -> None:
    from regional.coordinator.commit import CommitCoordinator

    lay = JobLayout(
        units=tuple((("src", u), ("sink", u)) for u in range(4)),
        vertices=(VertexInfo("src", 4, 128), VertexInfo("sink", 4, 128)),
        sources=frozenset({"src"}),
        bounded_sources=frozenset({"src"}),
    )
    committer = CommitCoordinator("sink", commit_user="job")
    c = CheckpointCoordinator(lay, Policy(), job_id="job", coordinators={"sink": committer})

    def states(cid: int, u: int) -> tuple[SubtaskState, ...]:
        return (
            SubtaskState("src", u, u, attempt=1),
            SubtaskState("sink", u, u, committables=(b"f%d-%d" % (cid, u),), attempt=1),
        )

    c.on_source_finished("src")
    t = c.trigger(0)
    assert t.final and t.kind is CheckpointKind.GLOBAL
    c.on_ack(1, 0, 1, states(1, 0), 1)
    abort = abort_of(c.on_decline(1, 1, 1, "boom", 1))
    assert abort.rule is Rule.MUST_BE_FRESH and "bounded source has finished" in abort.message
    # unit 1 restarts from older state: its source reads again, so it is not finished
    t = c.trigger(10)
    assert not t.final and t.kind is CheckpointKind.GLOBAL  # still global: sticky
    for u in range(4):
        out = c.on_ack(2, u, 1, states(2, u), 11)
    out = c.on_metadata_durable(2, 12)
    [commit] = [d for d in out if d.__class__.__name__ == "Commit"]
    assert commit.committables == (b"f2-0", b"f2-1", b"f2-2", b"f2-3")
    assert not c.finished  # no FinishJob: checkpoint 2 was not a final checkpoint
    c.on_commit_done("sink", 2)
    c.on_source_finished("src")
    t = c.trigger(20)
    assert t.final
    for u in range(4):
        c.on_ack(3, u, 1, states(3, u), 21)
    out = c.on_metadata_durable(3, 22)
    assert [type(d).__name__ for d in out][-1] == "Commit"
    out = c.on_commit_done("sink", 3)
    assert [type(d).__name__ for d in out] == ["FinishJob"] and c.finished


def test_commit_of_a_regional_checkpoint_names_the_fallback_units_also_after_restore() -> None:
    from regional.coordinator.commit import CommitCoordinator

    lay = JobLayout(
        units=tuple((("src", u), ("sink", u)) for u in range(4)),
        vertices=(VertexInfo("src", 4, 128), VertexInfo("sink", 4, 128)),
        sources=frozenset({"src"}),
    )

    def states(cid: int, u: int) -> tuple[SubtaskState, ...]:
        return (
            SubtaskState("src", u, u, attempt=1),
            SubtaskState("sink", u, u, committables=(b"f%d-%d" % (cid, u),), attempt=1),
        )

    def coordinator(commit_user: str) -> CheckpointCoordinator:
        committer = CommitCoordinator("sink", commit_user=commit_user)
        return CheckpointCoordinator(lay, Policy(), job_id="job", coordinators={"sink": committer})

    c = coordinator("job-run-1")
    c.trigger(0)
    for u in range(4):
        c.on_ack(1, u, 1, states(1, u), 1)
    c.on_metadata_durable(1, 2)
    c.on_commit_done("sink", 1)
    c.trigger(10)
    out = [d for u in (0, 1, 3) for d in c.on_ack(2, u, 1, states(2, u), 11)]
    out += c.on_decline(2, 2, 1, "boom", 11)
    [write] = [d for d in out if isinstance(d, WriteMetadata)]
    [commit] = [d for d in c.on_metadata_durable(2, 12) if d.__class__.__name__ == "Commit"]
    assert commit.committables == (b"f2-0", b"f2-1", b"f2-3")
    assert commit.fallback == {2: 1}  # unit 2 fell back to checkpoint 1
    # a driver crash before the commit: the restore re-commits 2 with the same fallback units
    [again] = coordinator("job-run-2").restore(write.metadata)
    assert (again.checkpoint_id, again.recommit, again.fallback) == (2, True, {2: 1})
    assert again.commit_user == "job-run-1"  # the commit user comes back from the checkpoint


# --- notifications, retention, attempts (items 25-30, rules 6 and 9) -------------------------


def test_notifications_complete_for_healthy_fallback_with_owner_for_failed() -> None:
    job = Job(units=5)
    job.run()
    out = job.run(failed={2})
    assert NotifyComplete(2, (0, 1, 3, 4)) in out
    assert NotifyFallback(2, 2, 1) in out


def test_subsumed_is_never_reported_for_a_referenced_checkpoint() -> None:
    job = Job(units=5, retained=1, max_unit_fallbacks=5)
    job.run()
    out = job.run(failed={2})  # 2 references 1
    assert not [d for d in out if isinstance(d, NotifySubsumed)]
    out = job.run(failed={2})  # 3 references 1; 2 is subsumed, 1 still referenced
    assert [d for d in out if isinstance(d, NotifySubsumed)] == [NotifySubsumed(2)]
    out = job.run()  # global: nothing references 1 or 3 any more
    assert [d for d in out if isinstance(d, NotifySubsumed)] == [
        NotifySubsumed(1),
        NotifySubsumed(3),
    ]


def test_ref_checkpoint_id_survives_encoding_and_restore() -> None:
    job = Job(units=5)
    job.run()
    md = metadata_of(job.run(failed={3}))
    decoded = decode_metadata(encode_metadata(md), source="chk-2/_metadata")
    fresh = Job(units=5)
    fresh.c.restore(decoded)
    assert fresh.c.unit_owner(3) == 1 and fresh.c.unit_owner(0) == 2
    assert {s.ref_checkpoint_id for s in fresh.c.unit_states(3)} == {1}
    assert fresh.start().checkpoint_id == 3


def test_late_ack_from_a_timed_out_attempt_is_ignored_and_its_files_discarded() -> None:
    job = Job(units=5)
    t = job.start()
    for u in range(4):
        job.ack(u)
    md = metadata_of(job.c.on_tick(t.deadline_ms))
    late = job.c.on_ack(1, 4, 1, job.states(4), t.deadline_ms + 5)
    assert late == [DiscardAttempt(1, 4, 1, ("chk-1/4-1.state",), {})]
    assert [u.unit_id for u in md.fallback_units] == [4]


def test_retry_fences_the_old_attempt() -> None:
    job = Job(units=5)
    job.start()
    assert job.c.retry_unit(1, 2, job.now + 5) == 2
    stale = job.ack(2, attempt=1)
    assert isinstance(stale[0], DiscardAttempt) and stale[0].attempt == 1
    for u in (0, 1, 3, 4):
        job.ack(u)
    md = metadata_of(job.ack(2, attempt=2))
    assert md.kind is CheckpointKind.GLOBAL
    assert [s.attempt for s in md.subtasks if s.unit_id == 2] == [2]


def test_retried_attempt_never_runs_past_the_checkpoint_deadline() -> None:
    job = Job(units=4, timeout=60)  # region timeout 60 s; the checkpoint's is 60 s too
    t = job.start()
    for _ in range(5):  # each retry near the end would otherwise add another 60 s
        job.c.retry_unit(t.checkpoint_id, 2, t.deadline_ms - 1)
    job.ack(0), job.ack(1), job.ack(3)
    out = job.c.on_tick(t.deadline_ms)
    [unit] = metadata_of(out).fallback_units
    assert unit.unit_id == 2 and unit.reason.startswith("timeout")
    assert job.c.pending_checkpoint_id is None


@pytest.mark.parametrize("unit", [-1, 9, 10])
def test_answers_for_units_outside_the_job_are_refused_and_the_coordinator_goes_on(
    unit: int,
) -> None:
    job = Job(units=9)
    t = job.start()
    message = f"unit {unit} is not a unit of job job: its units are 0..8;"
    with pytest.raises(CoordinatorStateError, match=message):
        job.c.on_ack(t.checkpoint_id, unit, 1, (), job.now)
    with pytest.raises(CoordinatorStateError, match=message):
        job.c.on_decline(t.checkpoint_id, unit, 1, "x", job.now)
    with pytest.raises(CoordinatorStateError, match=message):
        job.c.retry_unit(t.checkpoint_id, unit, job.now)
    out = []
    for u in range(9):
        out += job.ack(u)
    assert metadata_of(out).kind is CheckpointKind.GLOBAL  # unit 8 was not aliased by -1
    job.finish(out)
    assert metadata_of(job.run(failed={8})).kind is CheckpointKind.REGIONAL


def test_single_unit_job_triggers_global_checkpoints() -> None:
    t = Job(units=1).start()
    assert t.kind is CheckpointKind.GLOBAL
    assert t.forced == (ForcedGlobal.SINGLE_UNIT,)
    assert t.reasons == ("the job has a single fallback unit: its checkpoints are global",)


def test_restore_keeps_the_consecutive_regional_count_towards_tier_1() -> None:
    job = Job(max_consecutive_regional=3)
    job.run()
    for _ in range(2):
        md = metadata_of(job.run(failed={1}))
    assert md.consecutive_regional == 2
    again = Job(max_consecutive_regional=3)
    again.c.restore(md)  # a crash after two regional checkpoints in a row
    assert metadata_of(again.run(failed={1})).consecutive_regional == 3
    t = again.start()
    assert t.kind is CheckpointKind.GLOBAL
    assert t.forced == (ForcedGlobal.CONSECUTIVE_REGIONAL,)


def test_malformed_ack_counts_as_a_decline() -> None:
    job = Job(units=5)
    job.start()
    bad = (SubtaskState("v0", 3, 2, attempt=1),)
    out = job.c.on_ack(1, 2, 1, bad, job.now)
    assert isinstance(out[0], DiscardAttempt)
    for u in (0, 1, 3, 4):
        out = job.ack(u)
    [unit] = metadata_of(out).fallback_units
    assert "malformed ack: subtask state ('v0', 3, unit 2" in unit.reason


def test_only_one_checkpoint_in_flight() -> None:
    job = Job()
    job.start()
    with pytest.raises(CoordinatorStateError, match="checkpoint 1 is in flight"):
        job.c.trigger(5)


def test_metadata_write_failure_aborts_and_discards_every_attempt_of_it() -> None:
    job = Job(units=5)
    job.run()
    out = job.run(failed={1}, durable=False)
    md = metadata_of(out)
    out = job.c.on_metadata_failed(md.checkpoint_id, "disk full", job.now)
    abort = abort_of(out)
    assert abort.rule is Rule.METADATA_WRITE and "disk full" in abort.message
    assert abort.failed_units == (1,)
    discards = [d for d in out if isinstance(d, DiscardAttempt)]
    assert [(d.unit_id, d.files) for d in discards] == [
        (u, (f"chk-2/{u}-1.state",)) for u in (0, 2, 3, 4)
    ]
    assert job.c.latest_completed_id == 1


def test_metrics_count_regional_and_aborts_by_rule() -> None:
    job = Job()
    job.run()
    job.run(failed={1, 2})
    job.run(failed={1, 2, 3, 4})
    m = job.c.metrics
    assert (m.global_checkpoint_count, m.regional_checkpoint_count) == (1, 1)
    assert m.aborted_by_rule == {Rule.FAILURE_RATIO: 1}
    assert m.oldest_ref_checkpoint_id == {1: None, 2: 1}
    assert m.unit_lag == {1: 1, 2: 1} and m.max_unit_lag == 1


def test_discarded_committables_are_grouped_by_sink_so_a_sink_sees_only_its_own() -> None:
    job = Job(units=4, per_unit=2, enabled=False)
    job.start()
    cid = job.trigger.checkpoint_id
    states = tuple(
        msgspec.structs.replace(s, committables=(f"{s.vertex_id}-file".encode(),))
        for s in job.states(0)
    )
    job.c.on_ack(cid, 0, 1, states, job.now + 1)
    out = job.decline(1)  # global mode: the first decline aborts, unit 0's attempt is garbage
    [discard] = [d for d in out if isinstance(d, DiscardAttempt) and d.unit_id == 0]
    assert discard.committables == {"v0": (b"v0-file",), "v1": (b"v1-file",)}
    assert discard.all_committables == (b"v0-file", b"v1-file")
