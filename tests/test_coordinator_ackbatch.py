"""An `AckBatch` decides exactly as its acks one by one: the coordinator's batch fast path
(`_take_batch`, a comparison of the batch's shape with the layout's) against `on_ack` /
`on_decline` per answer, with malformed, stale, fenced, duplicate and retried acks, declines of
units that must be fresh, and batches arriving after the checkpoint was decided."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_coordinator_batch import (
    KINDS,
    LAYOUT,
    UNITS,
    Side,
    answer,
    durable,
    lenient_policy,
    one_by_one,
)

from metadata.model import SplitState, SubtaskState
from regional.coordinator import CoordinatorStateError, Decision, WriteMetadata
from regional.coordinator.messages import Ack, AckBatch, Answer, ack_shape, answers_of, packed
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy
from regional.runtime.dispatch import Dispatch

#: more than `test_coordinator_batch.KINDS`: a retried unit's attempt 2, an ack whose states
#: are a list (well-formed once made a tuple), one with a state of another unit
MORE = (*KINDS, "retried", "listy", "foreign")


def answer_of(cid: int, unit: int, kind: str) -> Answer:
    if kind == "retried":
        states = tuple(SubtaskState(v, i, unit, attempt=2) for v, i in LAYOUT.units[unit])
        return Ack(cid, unit, 2, states)
    if kind == "listy":
        a = answer(cid, unit, "ack")
        assert isinstance(a, Ack)
        return msgspec.structs.replace(a, states=list(a.states))
    if kind == "foreign":
        other = (unit + 1) % UNITS
        states = tuple(SubtaskState(v, i, other, attempt=1) for v, i in LAYOUT.units[unit])
        return Ack(cid, unit, 1, states)
    return answer(cid, unit, kind)


def batched(answers: list[Answer], joins: list[bool]) -> list[Answer | AckBatch]:
    """`answers` with runs of acks of one checkpoint packed into batches where `joins` says."""
    out: list[Answer | AckBatch] = []
    run: list[Ack] = []
    for k, a in enumerate(answers):
        join = joins[k % len(joins)] if joins else True
        if run and (not isinstance(a, Ack) or a.checkpoint_id != run[0].checkpoint_id or not join):
            out.append(AckBatch.of(run))
            run = []
        if isinstance(a, Ack):
            run.append(a)
        else:
            out.append(a)
    if run:
        out.append(AckBatch.of(run))
    return out


checkpoint_answers = st.tuples(
    st.lists(st.sampled_from((*MORE, None)), min_size=UNITS, max_size=UNITS),
    st.permutations(list(range(UNITS))),
    st.integers(0, UNITS),
    st.lists(st.tuples(st.integers(0, UNITS - 1), st.sampled_from(MORE)), max_size=4),
    st.lists(st.booleans(), max_size=6),
    st.sets(st.integers(0, UNITS - 1), max_size=2),
)


@settings(max_examples=300, deadline=None)
@given(
    checkpoints=st.lists(checkpoint_answers, min_size=1, max_size=8),
    enabled=st.booleans(),
    max_unit_fallbacks=st.integers(1, 2),
)
def test_an_ack_batch_decides_as_its_acks_one_by_one(
    checkpoints: list[
        tuple[list[str | None], list[int], int, list[tuple[int, str]], list[bool], set[int]]
    ],
    enabled: bool,
    max_unit_fallbacks: int,
) -> None:
    policy = lenient_policy(enabled, max_unit_fallbacks)
    batch, single = Side(policy), Side(policy)
    now = 0
    for kinds, order, split, extra, joins, retried in checkpoints:
        now += 1000
        for side in (batch, single):
            side.assign()
        trigger = batch.c.trigger(now)
        assert single.c.trigger(now) == trigger
        cid = trigger.checkpoint_id
        for unit in sorted(retried):  # a lost unit re-run alone: attempt 2
            assert batch.c.retry_unit(cid, unit, now) == single.c.retry_unit(cid, unit, now)
        got = [answer_of(cid, u, kinds[u]) for u in order if kinds[u] is not None]  # type: ignore[arg-type]
        got += [answer_of(cid, u, kind) for u, kind in extra]
        for answers in (got[:split], got[split:]):
            items = batched(answers, joins)
            assert answers_of(items) == answers
            by_batch = batch.c.on_answers(items, now + 1)
            assert by_batch == one_by_one(single, answers, now + 1)
            assert batch.view() == single.view()
            assert durable(batch, by_batch, now + 2) == durable(single, by_batch, now + 2)
        ticked = batch.c.on_tick(trigger.deadline_ms)
        assert ticked == single.c.on_tick(trigger.deadline_ms)
        assert durable(batch, ticked, now + 3) == durable(single, ticked, now + 3)
        assert batch.view() == single.view()


def test_a_whole_checkpoint_in_one_batch_is_taken_without_a_call_per_ack() -> None:
    side = Side(Policy())
    cid = side.c.trigger(0).checkpoint_id
    acks = [a for u in range(UNITS) if isinstance(a := answer(cid, u, "ack"), Ack)]
    calls: list[int] = []

    def on_ack(*args: object) -> list[Decision]:
        calls.append(args[1])  # type: ignore[arg-type]
        return []

    side.c.on_ack = on_ack  # type: ignore[method-assign,assignment]
    [write] = side.c.on_answers([AckBatch.of(acks)], 1)
    assert isinstance(write, WriteMetadata) and write.metadata.kind.value == "global"
    assert calls == []


def test_a_batch_with_a_unit_twice_or_a_unit_the_job_lacks_is_taken_ack_by_ack() -> None:
    side = Side(Policy())
    cid = side.c.trigger(0).checkpoint_id
    twice = AckBatch.of([answer(cid, 1, "ack"), answer(cid, 1, "ack")])  # type: ignore[list-item]
    assert side.c.on_answers([twice], 1) == []  # the second is a duplicate of the accepted one
    stray = Ack(cid, UNITS, 1, ())
    with pytest.raises(CoordinatorStateError, match=f"unit {UNITS} is not a unit of job job"):
        side.c.on_answers([AckBatch.of([answer(cid, 0, "ack"), stray])], 2)  # type: ignore[list-item]
    assert side.c.pending_checkpoint_id == cid


def test_a_batch_holds_acks_of_one_checkpoint() -> None:
    with pytest.raises(ValueError, match="one checkpoint"):
        AckBatch.of([Ack(1, 0, 1, ()), Ack(2, 1, 1, ())])
    with pytest.raises(ValueError, match="at least one"):
        AckBatch.of([])
    a = Ack(1, 0, 1, (SubtaskState("src", 0, 0, attempt=1),))
    b = AckBatch.of([a])
    assert b.shape == ack_shape(a)
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(b), type=AckBatch) == b
    d = Dispatch([], batches=[b])
    assert d.arrived() == [b] and answers_of(d.arrived()) == [a]


@pytest.mark.parametrize("first", ["decline", "ack", "retried"])
def test_a_batch_with_an_answered_or_retried_unit_decides_as_its_acks_one_by_one(
    first: str,
) -> None:
    batch, single = Side(Policy()), Side(Policy())
    for side in (batch, single):
        cid = side.c.trigger(0).checkpoint_id
        if first == "retried":
            side.c.retry_unit(cid, 2, 0)
    earlier = answer_of(cid, 2, "decline" if first == "decline" else "ack")
    later = [answer(cid, u, "ack") for u in (1, 2, 3)]
    assert batch.c.on_answers([earlier], 1) == one_by_one(single, [earlier], 1)
    items: list[Answer | AckBatch] = [AckBatch.of(later)]  # type: ignore[arg-type]
    assert batch.c.on_answers(items, 2) == one_by_one(single, later, 2)
    assert batch.view() == single.view()
    left = {"decline": UNITS - 3, "ack": UNITS - 3, "retried": UNITS - 2}[first]
    for side in (batch, single):
        assert side.c._pending is not None and side.c._pending.outstanding == left


def slow_first_unusable(side: Side, units: list[int]) -> tuple[int, str] | None:
    """Rule 3 d unit by unit (the reference for `_first_unusable`)."""
    for unit in units:
        if (why := side.c._unusable(unit)) is not None:
            return unit, why
    return None


def ack_with_splits(side: Side, cid: int, unit: int, foreign: bool) -> Ack:
    """An ack whose source state holds the unit's splits (or, `foreign`, another's)."""
    owner = (unit + 1) % UNITS if foreign else unit
    splits = tuple(
        SplitState(split, b"1") for split, index in side.splits.owners.items() if index == owner
    )
    states = tuple(
        SubtaskState(v, i, unit, split_states=splits if v == "src" else (), attempt=1)
        for v, i in LAYOUT.units[unit]
    )
    return Ack(cid, unit, 1, states)


@settings(max_examples=200, deadline=None)
@given(
    checkpoints=st.lists(
        st.tuples(
            st.lists(
                st.sampled_from(("ack", "splits", "foreign", "decline", None)),
                min_size=UNITS,
                max_size=UNITS,
            ),
            st.booleans(),
        ),
        min_size=1,
        max_size=6,
    ),
    subsets=st.lists(st.sets(st.integers(0, UNITS - 1)), min_size=1, max_size=4),
)
def test_rule_3d_over_units_finds_what_unit_by_unit_finds(
    checkpoints: list[tuple[list[str | None], bool]], subsets: list[set[int]]
) -> None:
    policy = Policy(
        checkpointing=CheckpointingPolicy(
            region=RegionPolicy(max_unit_fallbacks=3, max_failure_ratio=1.0),
            tolerable_failed_checkpoints=100,
        )
    )
    side = Side(policy)
    now = 0
    for kinds, savepoint in checkpoints:
        now += 1000
        side.assign()
        trigger = side.c.trigger(now, savepoint=savepoint)
        cid = trigger.checkpoint_id
        got: list[Answer] = []
        for unit, kind in enumerate(kinds):
            if kind in ("splits", "foreign"):
                got.append(ack_with_splits(side, cid, unit, kind == "foreign"))
            elif kind is not None:
                got.append(answer(cid, unit, kind))
        out = side.c.on_answers(got, now + 1)
        durable(side, out, now + 2)
        durable(side, side.c.on_tick(trigger.deadline_ms), now + 3)
        for subset in subsets:
            units = sorted(subset)
            assert side.c._first_unusable(units) == slow_first_unusable(side, units)


@given(kinds=st.lists(st.sampled_from(MORE), max_size=UNITS))
def test_packed_answers_are_the_acks_then_the_rest(kinds: list[str]) -> None:
    answers = [answer_of(1 + (unit % 2), unit, kind) for unit, kind in enumerate(kinds)]
    items = packed(answers)
    acks = [a for a in answers if isinstance(a, Ack)]
    assert sorted(answers_of(items), key=answers.index) == answers
    checkpoints = list(dict.fromkeys(a.checkpoint_id for a in acks))  # first seen first
    by_checkpoint = sorted(acks, key=lambda a: checkpoints.index(a.checkpoint_id))  # stable
    assert [a for a in answers_of(items) if isinstance(a, Ack)] == by_checkpoint
    assert all(isinstance(i, AckBatch) for i in items[: len({a.checkpoint_id for a in acks})])
