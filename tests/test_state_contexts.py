"""Keyed contexts and value states are reused per (split, key) on the hot path, and never
outlive the slot they write to: state stays exact when slots are dropped and made again."""

from __future__ import annotations

from regional.dataflow.state import OperatorState


def test_one_context_and_value_state_per_key_while_its_slot_lives() -> None:
    state = OperatorState()
    first = state.context("s", "alice")
    assert state.context("s", "alice") is first
    assert state.context("s", "bob") is not first
    assert state.context("t", "alice") is not first
    count = first.value_state("n", 0)
    count.update(1)
    assert first.value_state("n", 0) is count
    # another default object is another opening: it reads with its own default
    other = first.value_state("m", [])
    assert first.value_state("m", []) is not other


def test_a_dropped_slot_gets_a_new_context_writing_to_the_live_slot() -> None:
    state = OperatorState()
    old = state.context("s", "alice")
    old.value_state("n", 0).update(5)
    assert state.retain_splits(live=[]) == 1  # the split finished: its slots are dropped
    new = state.context("s", "alice")
    assert new is not old
    assert new.value_state("n", 0).value() == 0
    new.value_state("n", 0).update(1)
    restored = OperatorState.from_bytes(state.to_bytes())
    assert restored.keyed == {"s": {"alice": {"n": 1}}}


def test_ttl_states_are_not_shared_and_expire_as_before() -> None:
    now = [0]
    state = OperatorState(clock=lambda: now[0])
    ctx = state.context("s", "k")
    seen = ctx.value_state("seen", False, ttl=1)
    assert ctx.value_state("seen", False, ttl=1) is not seen
    seen.update(True)
    now[0] = 999
    assert ctx.value_state("seen", False, ttl=1).value() is True
    now[0] = 1_000
    assert ctx.value_state("seen", False, ttl=1).value() is False
