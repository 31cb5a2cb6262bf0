"""Stuck units (DESIGN §4 rule 5): a unit over `max-unit-fallbacks` never stops the healthy ones.
With the default `on-unit-fallback-limit = "isolate"` checkpoints keep completing regionally
with it on its owner's state; once it has been stuck longer than `max-stuck-time` (on the
driver's clock the coordinator is given) the job fails naming it, what it reads, its last
cause and the fix. A bounded job whose sources finished fails the same way. The old behaviour
(`"force-fresh"`) stays available: tests/test_coordinator_rules.py pins it."""

from __future__ import annotations

from test_coordinator_rules import Job, abort_of, metadata_of

from metadata.model import CheckpointKind, SplitState, SubtaskState, VertexInfo
from regional.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    Commit,
    FailJob,
    JobLayout,
    NotifyComplete,
)
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy

CAUSE = "declined: ValueError: bad record"


def fails(out: list) -> list[FailJob]:
    return [d for d in out if isinstance(d, FailJob)]


def test_a_unit_over_the_limit_is_stuck_and_checkpoints_keep_completing_regionally() -> None:
    job = Job(units=10)  # the default policy: isolate, max-unit-fallbacks 3, 15 min
    job.run()
    for n in range(1, 8):
        out = job.run(failed={7})
        md = metadata_of(out)
        assert md.kind is CheckpointKind.REGIONAL
        assert [u.unit_id for u in md.fallback_units] == [7]
        [complete] = [d for d in out if isinstance(d, NotifyComplete)]
        assert complete.units == (0, 1, 2, 3, 4, 5, 6, 8, 9)  # the healthy units commit
        # stuck from the checkpoint that made 3 fallbacks in a row, since its completion time
        assert job.c.stuck_units == ({7: 4002} if n >= 3 else {})
        assert not fails(out)
    assert job.c.limits.streak == {7: 7}
    assert job.c.metrics.aborted_by_rule == {}


def test_a_unit_stuck_longer_than_max_stuck_time_fails_the_job_after_the_healthy_commit() -> None:
    job = Job(units=10, max_stuck_time=60.0)
    job.run()
    for _ in range(3):
        job.run(failed={7})
    since = job.c.stuck_units[7]
    job.now = since + 57_000  # the next checkpoint completes 58 s after it got stuck
    out = job.run(failed={7})
    assert not fails(out)
    job.now = since + 60_000  # and the one after that 61 s after
    out = job.run(failed={7})
    [fail] = fails(out)
    assert out[-1] is fail  # after the notifications (the healthy units' completion)
    assert any(isinstance(d, NotifyComplete) for d in out)
    assert fail.units == (7,)
    assert fail.message == (
        "job job failed: unit 7 has been stuck for 1 min 1 s (max-stuck-time = 1 min): it fell "
        "back in the last 5 checkpoints and still runs on checkpoint 1's state; last cause: "
        f"{CAUSE}; fix what makes it fail (it is retried every epoch while the healthy units "
        'keep committing), or raise checkpointing.region.max-stuck-time ("unlimited" never '
        "fails the job)"
    )


def test_unlimited_max_stuck_time_never_fails_the_job() -> None:
    job = Job(units=10, max_stuck_time=None)
    job.run()
    for _ in range(10):
        job.now += 3_600_000
        assert not fails(job.run(failed={7}))
    assert 7 in job.c.stuck_units


def test_a_stuck_unit_that_is_fresh_again_is_no_longer_stuck_and_its_clock_restarts() -> None:
    job = Job(units=10, max_stuck_time=60.0)
    job.run()
    for _ in range(3):
        job.run(failed={7})
    assert 7 in job.c.stuck_units
    job.run()
    assert job.c.stuck_units == {} and job.c.last_cause == {}
    job.now += 10 * 60_000
    for _ in range(3):
        assert not fails(job.run(failed={7}))
    assert job.c.stuck_units == {7: job.now + 2}


def test_the_stuck_unit_is_named_by_what_it_reads() -> None:
    names = {7: ["events:7"]}
    lay = Job(units=10).layout
    c = CheckpointCoordinator(
        lay,
        Policy(checkpointing=CheckpointingPolicy(region=RegionPolicy(max_stuck_time=1.0))),
        job_id="kafka-users",
        reads=lambda u: names.get(u, []),
    )
    job = Job(units=10)
    job.c, job.layout = c, lay
    for _ in range(3):
        job.run(failed={7})
    job.now += 5_000
    [fail] = fails(job.run(failed={7}))
    assert fail.message.startswith(
        "job kafka-users failed: unit 7 (events:7) has been stuck for 6 s (max-stuck-time = "
        "1 s): it fell back in the last 4 checkpoints and still runs on its initial state (it "
        "never completed a checkpoint); last cause: declined: ValueError: bad record; fix"
    )


def test_by_default_a_unit_is_named_by_the_splits_in_its_latest_state() -> None:
    lay = JobLayout(units=((("src", 0),), (("src", 1),)), vertices=(VertexInfo("src", 2, 8),))
    c = CheckpointCoordinator(lay, Policy(), job_id="j")
    t = c.trigger(0)
    for u in (0, 1):
        split = SplitState(f"clicks-0{u}.jsonl", b"10")
        state = SubtaskState("src", u, u, split_states=(split,), attempt=1)
        c.on_ack(t.checkpoint_id, u, 1, (state,), 1)
    c.on_metadata_durable(1, 2)
    assert [c.unit_name(0), c.unit_name(1)] == [
        "unit 0 (clicks-00.jsonl)",
        "unit 1 (clicks-01.jsonl)",
    ]


def test_force_fresh_keeps_the_old_abort_for_users_who_want_it() -> None:
    job = Job(units=10, max_unit_fallbacks=2, on_unit_fallback_limit="force-fresh")
    job.run(failed={7})
    job.run(failed={7})
    out = job.run(failed={7})
    assert abort_of(out).message.startswith(
        "checkpoint 3 aborted (rule 3a): unit 7 had to be fresh (it fell back in the last 2 "
        "checkpoints (max-unit-fallbacks = 2)) but failed"
    )
    assert job.c.stuck_units == {}


def bounded_job(**region: object) -> tuple[CheckpointCoordinator, JobLayout]:
    from regional.coordinator.commit import CommitCoordinator

    lay = JobLayout(
        units=tuple((("src", u), ("sink", u)) for u in range(4)),
        vertices=(VertexInfo("src", 4, 128), VertexInfo("sink", 4, 128)),
        sources=frozenset({"src"}),
        bounded_sources=frozenset({"src"}),
    )
    policy = Policy(
        checkpointing=CheckpointingPolicy(
            region=RegionPolicy(max_failure_ratio=0.5, **region),  # type: ignore[arg-type]
            tolerable_failed_checkpoints=2,
        )
    )
    committer = CommitCoordinator("sink", commit_user="job")
    return CheckpointCoordinator(lay, policy, job_id="job", coordinators={"sink": committer}), lay


def _states(cid: int, u: int) -> tuple[SubtaskState, ...]:
    return (
        SubtaskState("src", u, u, attempt=1),
        SubtaskState("sink", u, u, committables=(b"f%d-%d" % (cid, u),), attempt=1),
    )


def test_a_bounded_job_with_a_stuck_unit_fails_with_the_stuck_error_once_the_bound_passes():
    c, _ = bounded_job(max_stuck_time=30.0)
    now = 0
    for cid in (1, 2, 3):  # unit 1 fails every epoch: stuck after 3
        t = c.trigger(now)
        for u in (0, 2, 3):
            c.on_ack(t.checkpoint_id, u, 1, _states(cid, u), now + 1)
        c.on_decline(t.checkpoint_id, 1, 1, "ValueError: bad record", now + 1)
        out = c.on_metadata_durable(cid, now + 2)
        for d in out:
            if isinstance(d, Commit):
                c.on_commit_done("sink", d.checkpoint_id)
        now += 1000
    assert c.stuck_units == {1: 2002}
    c.on_source_finished("src")  # every split read: only a global checkpoint may end the job
    aborts = 0
    while True:
        t = c.trigger(now)
        assert t.kind is CheckpointKind.GLOBAL
        out = c.on_decline(t.checkpoint_id, 1, 1, "ValueError: bad record", now + 1)
        assert isinstance(out[0], AbortCheckpoint)
        if fails(out):
            break
        aborts += 1  # more than tolerable-failed-checkpoints = 2: not counted, left to the bound
        now += 5_000
        c.on_source_finished("src")
    [fail] = fails(out)
    assert aborts == 6 and now + 1 - 2002 > 30_000
    assert fail.message.startswith("job job failed: unit 1 has been stuck for 31 s (max-stuck-")
    assert c.limits.consecutive_aborts == 0


def test_a_unit_restored_stuck_is_stuck_from_the_first_trigger_of_the_new_run() -> None:
    job = Job(units=10)
    job.run()
    for _ in range(3):
        md = metadata_of(job.run(failed={7}))
    again = Job(units=10, max_stuck_time=60.0)
    again.c.restore(md)
    again.now = 1_000_000
    again.start()
    assert again.c.stuck_units == {7: 1_001_000}
    assert again.c.last_cause == {7: CAUSE}  # from the restored checkpoint's unit states


# --- through the real driver (simulated dispatcher and clock) ----------------------------------


def _sim_policy(**region: object) -> Policy:
    from regional.policy import load_policy

    return load_policy(env={}, overrides={"checkpointing": {"region": region}}).policy


def test_the_driver_reports_a_stuck_unit_in_every_event_and_fails_with_its_name() -> None:
    from regional.cli.progress import checkpoint_line
    from regional.runtime.sim import Simulation

    faults = {(c, 2): "decline" for c in range(1, 100)}
    policy = _sim_policy(**{"max-stuck-time": "5 s"})
    sim = Simulation(4, policy, faults=faults, bounded=False, interval_ms=1_000)
    driver = sim.new_driver()
    events: list = []

    def progress(event) -> None:
        events.append(event)
        sim.clock.sleep(1.0)  # a second between checkpoints

    driver.progress = progress
    try:
        driver.run(max_checkpoints=50)
    except Exception as exc:  # JobFailedError: the job failed as it should
        failed = str(exc)
    else:
        raise AssertionError("the job did not fail")
    # every checkpoint completed regionally with unit 2 behind; the healthy units committed
    assert [e.kind for e in events] == ["regional"] * len(events)
    assert [e.stuck for e in events[:2]] == [(), ()]
    stuck = events[2].stuck
    assert [(s.unit_id, s.splits, s.fallbacks, s.owner_checkpoint_id) for s in stuck] == [
        (2, ("s2",), 3, 0)
    ]
    assert stuck[0].cause.startswith("declined: ")
    assert events[2].unit_reads == {2: ("s2",)}
    assert checkpoint_line(events[3]).splitlines()[-2:] == [
        f"    unit 2 (s2): {stuck[0].cause}",
        "    stuck: unit 2 (s2) for 1 s (on its initial state; 4 fallbacks in a row)",
    ]
    assert failed.startswith(
        "job sim failed: src[2] (unit 2) has been stuck for 5.05 s (max-stuck-time = 5 s): it fell "
        "back in the last 8 checkpoints and still runs on its initial state"
    )
    assert events[-1].message == failed
    rows = {r[0] for r in sim.sink.rows()}
    assert rows == {"s0", "s1", "s3"}  # the healthy units' output, none of the stuck one's
