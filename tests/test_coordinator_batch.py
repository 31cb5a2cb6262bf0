"""The coordinator's batch paths decide exactly as the answer-by-answer ones: `on_answers`
against `on_ack` / `on_decline` one by one, a tick's timeouts against declining each expired
unit in turn, and an abort's `SubtaskOwners` against the plain mapping of every subtask's owner
(the split enumerator reads it in O(units behind))."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import StateHandle, SubtaskState, VertexInfo
from regional.coordinator import (
    AbortCheckpoint,
    CheckpointCoordinator,
    CoordinatorStateError,
    Decision,
    DiscardAttempt,
    JobLayout,
    NotifyComplete,
    Rule,
    WriteMetadata,
)
from regional.coordinator.messages import Ack, Answer, Decline
from regional.coordinator.operator_coordinator import RegionalCompletion, SubtaskOwners
from regional.coordinator.split_enumerator import SplitEnumerator
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy

UNITS = 8
LAYOUT = JobLayout(
    units=tuple((("src", u), ("sink", u)) for u in range(UNITS)),
    vertices=(VertexInfo("src", UNITS, 128), VertexInfo("sink", UNITS, 128)),
    sources=frozenset({"src"}),
)
#: what a unit does in one answer of a batch
KINDS = ("ack", "ack", "ack", "decline", "malformed", "stale", "fenced", "mislabelled", "files")


class Recorder:
    """An operator coordinator of the sink vertex that keeps what it was told."""

    vertex_id = "sink"

    def __init__(self) -> None:
        self.calls: list[tuple[object, ...]] = []

    def snapshot(self, checkpoint_id: int) -> bytes:
        return b"%d" % checkpoint_id

    def snapshot_for_fallback(self, checkpoint_id: int, fallback: Mapping[int, int]) -> bytes:
        return b"%d-%r" % (checkpoint_id, sorted(fallback.items()))

    def check_fallback(self, state: SubtaskState, owner: int) -> str | None:
        return None

    def restore(self, data: bytes) -> None:
        return None

    def notify_complete(self, checkpoint_id: int) -> None:
        self.calls.append(("complete", checkpoint_id))

    def notify_regional_complete(self, checkpoint_id: int, info: RegionalCompletion) -> None:
        self.calls.append(("regional", checkpoint_id, list(info.fallback.items())))

    def notify_aborted(self, checkpoint_id: int, reset: Mapping[int, int]) -> None:
        self.calls.append(("aborted", checkpoint_id, list(reset.items())))


class Side:
    """One coordinator with its split enumerator and sink recorder."""

    def __init__(self, policy: Policy) -> None:
        self.splits = SplitEnumerator("src", [f"s{k}" for k in range(3 * UNITS)])
        self.sink = Recorder()
        self.c = CheckpointCoordinator(
            LAYOUT, policy, job_id="job", coordinators={"src": self.splits, "sink": self.sink}
        )

    def assign(self) -> None:
        """Every source subtask takes one more split (as an epoch's plan does)."""
        for index in range(UNITS):
            self.splits.assign(index)

    def view(self) -> tuple[object, ...]:
        c = self.c
        return (
            c.pending_checkpoint_id,
            c.latest_completed_id,
            [c.unit_owner(u) for u in range(UNITS)],
            [c.unit_states(u) for u in range(UNITS)],
            self.splits.unassigned,
            self.splits.owners,
            self.sink.calls,
        )


def answer(cid: int, unit: int, kind: str) -> Answer:
    """`kind`: ack, decline, malformed (a state not fresh), stale (an older checkpoint), fenced
    (attempt 2, never started), mislabelled (attempt 2 with states of attempt 1), files (an ack
    with state files and committables)."""
    attempt = 2 if kind in ("fenced", "mislabelled") else 1
    if kind == "decline":
        return Decline(cid, unit, 1, f"ValueError: unit {unit}")
    states = tuple(
        SubtaskState(
            v,
            i,
            unit,
            ref_checkpoint_id=cid if kind == "malformed" and v == "sink" else None,
            handles=(StateHandle(f"chk-{cid}/{unit}.state", 0, 1, 1, b"h" * 16),)
            if kind == "files"
            else (),
            committables=(b"c%d" % unit,) if kind == "files" and v == "sink" else (),
            attempt=1 if kind == "mislabelled" else attempt,
        )
        for v, i in LAYOUT.units[unit]
    )
    return Ack(cid - 1 if kind == "stale" else cid, unit, attempt, states)


def durable(side: Side, out: list[Decision], now: int) -> list[Decision]:
    writes = [d for d in out if isinstance(d, WriteMetadata)]
    if not writes:
        return []
    return side.c.on_metadata_durable(writes[0].metadata.checkpoint_id, now)


#: per checkpoint: what each unit does (None: it stays silent until the tick), the order the
#: answers arrive in, where the batch splits, and extra answers (duplicates, stale) at its end
checkpoint_answers = st.tuples(
    st.lists(st.sampled_from((*KINDS, None)), min_size=UNITS, max_size=UNITS),
    st.permutations(list(range(UNITS))),
    st.integers(0, UNITS),
    st.lists(st.tuples(st.integers(0, UNITS - 1), st.sampled_from(KINDS)), max_size=4),
)


def lenient_policy(enabled: bool, max_unit_fallbacks: int) -> Policy:
    """Any failure ratio passes and aborts never fail the job: every rule but 3c is reachable."""
    return Policy(
        checkpointing=CheckpointingPolicy(
            region=RegionPolicy(
                enabled=enabled, max_unit_fallbacks=max_unit_fallbacks, max_failure_ratio=1.0
            ),
            tolerable_failed_checkpoints=100,
        )
    )


def one_by_one(side: Side, answers: list[Answer], now: int) -> list[Decision]:
    out: list[Decision] = []
    for a in answers:
        if isinstance(a, Ack):
            out += side.c.on_ack(a.checkpoint_id, a.unit, a.attempt, a.states, now)
        else:
            out += side.c.on_decline(a.checkpoint_id, a.unit, a.attempt, a.reason, now)
    return out


def tick_one_by_one(c: CheckpointCoordinator, now: int) -> list[Decision]:
    """What a tick did before timeouts were recorded together: each expired unit declined
    in turn until the checkpoint is decided (the reference for `on_tick`)."""
    p = c._pending
    if p is None:
        return []
    out: list[Decision] = []
    for unit_id in p.expired(now):
        cause = f"timeout: no answer after {(now - p.trigger_ms) / 1000:g} s"
        out += c._record_decline(p, unit_id, cause, now)
        if c._pending is not p:
            break
    return out


@settings(max_examples=300, deadline=None)
@given(
    checkpoints=st.lists(checkpoint_answers, min_size=1, max_size=8),
    enabled=st.booleans(),
    max_unit_fallbacks=st.integers(1, 2),
)
def test_a_batch_decides_as_its_answers_one_by_one(
    checkpoints: list[tuple[list[str | None], list[int], int, list[tuple[int, str]]]],
    enabled: bool,
    max_unit_fallbacks: int,
) -> None:
    policy = lenient_policy(enabled, max_unit_fallbacks)
    batch, single = Side(policy), Side(policy)
    now = 0
    for kinds, order, split, extra in checkpoints:
        now += 1000
        for side in (batch, single):
            side.assign()
        trigger = batch.c.trigger(now)
        assert single.c.trigger(now) == trigger
        cid = trigger.checkpoint_id
        got = [answer(cid, u, kinds[u]) for u in order if kinds[u] is not None]  # type: ignore[arg-type]
        got += [answer(cid, u, kind) for u, kind in extra]
        for answers in (got[:split], got[split:]):
            by_batch = batch.c.on_answers(answers, now + 1)
            assert by_batch == one_by_one(single, answers, now + 1)
            assert batch.view() == single.view()
            assert durable(batch, by_batch, now + 2) == durable(single, by_batch, now + 2)
        ticked = batch.c.on_tick(trigger.deadline_ms)
        assert ticked == tick_one_by_one(single.c, trigger.deadline_ms)
        assert durable(batch, ticked, now + 3) == durable(single, ticked, now + 3)
        assert batch.view() == single.view()


def test_a_decline_that_must_abort_discards_the_rest_of_its_batch_in_arrival_order() -> None:
    side = Side(Policy(checkpointing=CheckpointingPolicy(region=RegionPolicy(enabled=False))))
    t = side.c.trigger(0)
    cid = t.checkpoint_id
    out = side.c.on_answers(
        [
            answer(cid, 3, "ack"),
            answer(cid, 5, "decline"),
            answer(cid, 1, "ack"),
            answer(cid, 0, "decline"),
            answer(cid, 2, "files"),
        ],
        1,
    )
    abort = out[0]
    assert isinstance(abort, AbortCheckpoint) and abort.rule is Rule.REGIONAL_DISABLED
    assert abort.failed_units == (5,)
    # the acked unit 3 (from the abort), then the stale acks 1 and 2 as they arrived
    assert out[1:] == [
        DiscardAttempt(cid, 3, 1),
        DiscardAttempt(cid, 1, 1),
        DiscardAttempt(cid, 2, 1, ("chk-1/2.state",), {"sink": (b"c2",)}),
    ]
    assert side.c.pending_checkpoint_id is None


def test_a_whole_batch_completes_the_checkpoint_and_later_answers_are_discarded() -> None:
    side = Side(Policy())
    cid = side.c.trigger(0).checkpoint_id
    late = answer(cid, 4, "files")
    out = side.c.on_answers([answer(cid, u, "ack") for u in range(UNITS)] + [late], 1)
    [write, discard] = out
    assert isinstance(write, WriteMetadata) and write.metadata.kind.value == "global"
    assert discard == DiscardAttempt(cid, 4, 1, ("chk-1/4.state",), {"sink": (b"c4",)})
    assert isinstance(side.c.on_metadata_durable(cid, 2)[0], NotifyComplete)


def test_an_answer_of_a_unit_the_job_lacks_is_refused_in_a_batch_as_alone() -> None:
    side = Side(Policy())
    cid = side.c.trigger(0).checkpoint_id
    stray = Decline(cid, UNITS, 1, "lost")
    with pytest.raises(CoordinatorStateError, match=f"unit {UNITS} is not a unit of job job"):
        side.c.on_answers([answer(cid, 0, "ack"), stray], 1)
    assert side.c.pending_checkpoint_id == cid  # the answers before it were taken
    side.c.on_answers([answer(cid, u, "ack") for u in range(1, UNITS)], 2)
    assert side.c.pending_checkpoint_id is None  # decided: the rest of a batch is stale
    with pytest.raises(CoordinatorStateError, match=f"unit {UNITS} is not a unit of job job"):
        side.c.on_answers([answer(cid, 0, "ack"), stray], 3)


def test_an_abort_tells_every_subtask_its_units_owner() -> None:
    side = Side(Policy(checkpointing=CheckpointingPolicy(tolerable_failed_checkpoints=100)))
    c = side.c
    for cid, failed in ((1, {6}), (2, {2, 6}), (3, set(range(UNITS)))):
        t = c.trigger(cid * 1000)
        out = c.on_answers(
            [answer(cid, u, "decline" if u in failed else "ack") for u in range(UNITS)],
            cid * 1000 + 1,
        )
        if failed == set(range(UNITS)):
            assert isinstance(out[0], AbortCheckpoint)
        else:
            durable(side, out, cid * 1000 + 2)
        assert t.checkpoint_id == cid
    # unit 6 fell back twice (to its initial state), unit 2 once (to checkpoint 1)
    owners = [c.unit_owner(u) for u in range(UNITS)]
    assert owners == [2, 2, 1, 2, 2, 2, 0, 2]
    [(_, aborted, reset)] = [call for call in side.sink.calls if call[0] == "aborted"]
    assert aborted == 3 and reset == [(u, owners[u]) for u in range(UNITS)]


def test_after_a_restore_an_abort_tells_every_subtask_its_units_owner() -> None:
    first = Side(Policy())
    for cid, failed in ((1, {6}), (2, {2, 6})):
        first.c.trigger(cid * 1000)
        out = first.c.on_answers(
            [answer(cid, u, "decline" if u in failed else "ack") for u in range(UNITS)], 1
        )
        [write] = [d for d in out if isinstance(d, WriteMetadata)]
        first.c.on_metadata_durable(cid, 2)
    side = Side(Policy())
    side.c.restore(write.metadata)
    owners = [side.c.unit_owner(u) for u in range(UNITS)]
    assert owners == [2, 2, 1, 2, 2, 2, 0, 2]
    side.c.trigger(3000)
    side.c.on_answers([answer(3, u, "decline") for u in range(UNITS)], 3001)
    [(_, aborted, reset)] = [call for call in side.sink.calls if call[0] == "aborted"]
    assert aborted == 3 and reset == [(u, owners[u]) for u in range(UNITS)]


history = st.lists(
    st.one_of(
        st.tuples(st.just("assign"), st.integers(0, 5)),
        st.tuples(st.just("snapshot"), st.none()),
        st.tuples(
            st.just("reset"),
            st.tuples(st.integers(0, 6), st.dictionaries(st.integers(0, 5), st.integers(0, 6))),
        ),
        st.tuples(st.just("fallback"), st.dictionaries(st.integers(0, 5), st.integers(0, 6))),
    ),
    max_size=40,
)


@settings(max_examples=300, deadline=None)
@given(history=history, order=st.permutations(list(range(6))))
def test_the_split_enumerator_reads_subtask_owners_as_the_plain_mapping(
    history: list[tuple[str, Any]], order: list[int]
) -> None:
    fast = SplitEnumerator("src", [f"s{k}" for k in range(20)])
    plain = SplitEnumerator("src", [f"s{k}" for k in range(20)])
    places = {index: place for place, index in enumerate(order)}
    checkpoint = 0
    for step, arg in history:
        if step == "assign":
            assert fast.assign(arg) == plain.assign(arg)
        elif step == "snapshot":
            checkpoint += 1
            assert fast.snapshot(checkpoint) == plain.snapshot(checkpoint)
        elif step == "fallback":
            info = RegionalCompletion(arg, {})
            fast.notify_regional_complete(checkpoint, info)
            plain.notify_regional_complete(checkpoint, info)
        else:
            default, others = arg
            reset = SubtaskOwners(places, default=default, others=others)
            fast.notify_aborted(checkpoint, reset)
            plain.notify_aborted(checkpoint, dict(reset))
        assert fast.unassigned == plain.unassigned
        assert fast.owners == plain.owners
    assert fast.snapshot(checkpoint + 1) == plain.snapshot(checkpoint + 1)
    restored = SplitEnumerator("src")
    restored.restore(fast.snapshot(checkpoint + 2))
    reset = SubtaskOwners(places, default=0, others={})
    restored.notify_aborted(checkpoint + 2, reset)
    plain.notify_aborted(checkpoint + 2, dict(reset))
    assert msgspec.msgpack.decode(restored.snapshot(9)) == msgspec.msgpack.decode(plain.snapshot(9))
