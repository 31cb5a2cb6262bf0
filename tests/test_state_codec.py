"""Operator state without pickle: the msgpack codec keeps every supported type exactly, refuses
what it cannot keep at the update, and a pickle segment from storage runs nothing (the task's
restore and the driver's rescale) unless the pipeline opted in and the segment's MAC verifies."""

from __future__ import annotations

import datetime as dt
import math
import os
import pickle
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import (
    HEADER_PICKLE,
    PickledState,
    StateCodec,
    StateDecodeError,
    StateTypeError,
)
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

SECRET = b"0123456789abcdef-job-secret"


class Point(msgspec.Struct, frozen=True):
    x: Any
    y: Any = None


class Reading(msgspec.Struct):
    at: dt.datetime
    values: list[Any]


class Foo:
    pass


# --- round trip ----------------------------------------------------------------------------------

_ints = st.integers(-(2**63), 2**64 - 1)
_floats = st.floats(allow_nan=True)
_decimals = st.decimals(allow_nan=False)
_zones = (
    st.sampled_from([None, dt.UTC, dt.timezone(dt.timedelta(hours=5, minutes=30)), *[None] * 2])
    | st.timezones()
)
_datetimes = st.datetimes(timezones=_zones)
_times = st.times(timezones=st.sampled_from([None, dt.UTC, dt.timezone(-dt.timedelta(hours=3))]))
_hashable_leaves = st.one_of(
    st.none(),
    st.booleans(),
    _ints,
    _floats,
    st.text(max_size=5),
    st.binary(max_size=5),
    _decimals,
    _datetimes,
    st.dates(),
    _times,
)
_hashables = st.recursive(
    _hashable_leaves,
    lambda inner: st.one_of(
        st.tuples(inner, inner),
        st.lists(inner, max_size=3).map(tuple),
        st.frozensets(_hashable_leaves, max_size=3),
        st.builds(Point, inner, inner),
    ),
    max_leaves=6,
)
_values = st.recursive(
    _hashables,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(_hashables, inner, max_size=3),
        st.sets(_hashable_leaves, max_size=3),
        st.builds(Point, inner, inner),
        st.builds(Reading, st.datetimes(), st.lists(inner, max_size=2)),
    ),
    max_leaves=12,
)


def same(a: Any, b: Any) -> bool:
    """Equal *and* of the same types all the way down (`(1,) != [1]`, `1 != 1.0`, tz kept)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or repr(a) == repr(b)
    if isinstance(a, Decimal):
        return str(a) == str(b)
    if isinstance(a, dt.datetime | dt.time):
        return (a.isoformat(), a.tzinfo, a.fold) == (b.isoformat(), b.tzinfo, b.fold)
    if isinstance(a, dict):
        return len(a) == len(b) and all(
            same(ka, kb) and same(va, vb)
            for (ka, va), (kb, vb) in zip(a.items(), b.items(), strict=True)
        )
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, set | frozenset):
        return len(a) == len(b) and all(any(same(x, y) for y in b) for x in a)
    if isinstance(a, msgspec.Struct):
        return all(same(getattr(a, f), getattr(b, f)) for f in a.__struct_fields__)
    return bool(a == b)


_codec = StateCodec([Point, Reading])


@settings(max_examples=150, deadline=None)
@given(
    keyed=st.dictionaries(
        st.text(max_size=3),
        st.dictionaries(_hashables, st.dictionaries(st.text(max_size=3), _values, max_size=3)),
        max_size=3,
    ),
    lists=st.dictionaries(st.text(max_size=3), st.lists(_values, max_size=3), max_size=2),
)
def test_every_supported_value_comes_back_with_its_type(keyed, lists):
    for slots in keyed.values():  # what the state API accepts is what the codec keeps
        for key, slot in slots.items():
            _codec.check(key, what="key", operator="op")
            for value in slot.values():
                _codec.check(value, what="state", operator="op")
    blob = _codec.encode(keyed, lists, operator="op")
    assert same(_codec.decode(blob, operator="op", source="f"), (keyed, lists))


def test_tuple_keys_decimals_zones_and_structs_through_the_state_api():
    p = Pipeline("p", state_types=[Point])
    state = OperatorState(operator="totals", codec=p.state_codec)
    ctx = state.context("s0", ("eu", 7))
    ctx.value_state("sum").update(Decimal("10.25"))
    ctx.map_state("by_day")[(2024, 3, 31)] = dt.datetime(
        2024, 3, 31, 2, 30, tzinfo=dt.timezone(dt.timedelta(hours=2))
    )
    ctx.map_state("where")[Point(1, 2)] = {
        "z": dt.datetime(2024, 10, 27, 2, 30, fold=1).replace(
            tzinfo=__import__("zoneinfo").ZoneInfo("Europe/Berlin")
        )
    }
    ctx.list_state("seen").append((1, [2, (3,)]))
    back = OperatorState.from_bytes(state.to_bytes(), operator="totals", codec=p.state_codec)
    assert same(back.keyed, state.keyed) and same(back.lists, state.lists)
    assert back.keyed["s0"][("eu", 7)]["where"][Point(1, 2)]["z"].fold == 1


# --- what cannot be kept ----------------------------------------------------------------------

_KEEPS = (
    "state keeps int (64 bits), float, str, bytes, bool, None, list, dict, tuple, set, "
    "frozenset, datetime, date, time, Decimal and declared msgspec Structs; convert it, or pass "
    "Pipeline(state_serializer=PickledState(secret=...)) to pickle state"
)


def _ctx(codec: StateCodec | None = None):
    return OperatorState(operator="count", codec=codec).context("s0", "alice")


def test_an_unsupported_value_is_refused_at_the_update_naming_state_type_and_path():
    totals = _ctx().map_state("totals")
    with pytest.raises(StateTypeError) as err:
        totals["c07"] = (1, Foo())
    assert str(err.value) == (
        "state 'totals' of operator 'count' holds a value of type "
        f"test_state_codec.Foo at ['c07'][1]: {_KEEPS}"
    )
    assert "c07" not in totals
    with pytest.raises(StateTypeError) as err:
        _ctx().value_state("n").update({"a": [1, 2**70]})
    assert str(err.value) == (
        f"state 'n' of operator 'count' holds an int that does not fit in 64 bits ({2**70}) at "
        "['a'][1]: state keeps ints from -2**63 to 2**64-1 (msgpack); keep it as a str or Decimal"
    )


def test_an_undeclared_struct_and_a_bad_key_are_refused_at_the_update():
    with pytest.raises(StateTypeError) as err:
        _ctx().value_state("p").update([Point(1)])
    assert str(err.value) == (
        "state 'p' of operator 'count' holds a Point (test_state_codec:Point), a msgspec Struct "
        "not declared for state at [0]: declare it: Pipeline(state_types=[Point]), from a module "
        "the Python workers import"
    )
    with pytest.raises(StateTypeError, match=r"holds a value of type builtins.object at <key>"):
        _ctx().map_state("m")[object()] = 1
    with pytest.raises(StateTypeError) as err:
        OperatorState(operator="count").context("s0", ("k", Foo()))
    assert str(err.value) == (
        "the key of split 's0' of operator 'count' holds a value of type test_state_codec.Foo "
        f"at [1]: {_KEEPS}"
    )


def test_list_state_and_values_changed_in_place_are_refused_at_the_snapshot():
    ctx = _ctx()
    ctx.list_state("seen").extend([1, {2}, bytearray(b"x")])
    with pytest.raises(StateTypeError) as err:
        ctx._state.to_bytes()
    assert str(err.value) == (
        "list state 'seen' of operator 'count' holds a value of type builtins.bytearray at [2]: "
        f"{_KEEPS}"
    )
    ctx = _ctx()
    ctx.value_state("d").update({"a": 1})
    ctx.value_state("d").value()["b"] = Foo()  # changed in place, after the update
    with pytest.raises(StateTypeError) as err:
        ctx._state.to_bytes()
    assert str(err.value) == (
        "state 'd' (split 's0', key 'alice') of operator 'count' holds a value of type "
        f"test_state_codec.Foo at ['b']: {_KEEPS}"
    )


def test_a_struct_of_an_undeclared_class_is_refused_when_decoding():
    blob = StateCodec([Point]).encode({"s0": {"k": {"p": Point(1)}}}, {}, operator="count")
    with pytest.raises(StateDecodeError) as err:
        StateCodec().decode(blob, operator="count", source="chk-3/u0.state")
    assert str(err.value) == (
        "state of operator 'count' in chk-3/u0.state holds a test_state_codec:Point Struct in "
        "state 'p' (split 's0', key 'k'), a class not declared for state; declare it: "
        "Pipeline(state_types=[Point]) (declared: none)"
    )


# --- the opt-in: pickled state with a MAC ----------------------------------------------------


def test_pickled_state_keeps_any_object_and_refuses_a_tampered_segment():
    codec = Pipeline("p", state_serializer=PickledState(secret=SECRET)).state_codec
    state = OperatorState(operator="count", codec=codec)
    state.context("s0", "k").value_state("f").update(Foo)  # a class: pickle keeps it
    blob = state.to_bytes()
    assert blob.startswith(HEADER_PICKLE)
    back = OperatorState.from_bytes(blob, operator="count", codec=codec, source="u0.state")
    assert back.context("s0", "k").value_state("f").value() is Foo
    tampered = blob[:-3] + b"X" + blob[-2:]
    with pytest.raises(StateDecodeError) as err:
        OperatorState.from_bytes(tampered, operator="count", codec=codec, source="u0.state")
    assert str(err.value) == (
        "state of operator 'count' in u0.state does not carry a valid MAC for this job's secret: "
        "refused unread (tampered with, written by another job or operator, or the secret "
        "changed); restore another checkpoint, or run with the secret that wrote it"
    )
    # a segment of another operator does not verify either
    with pytest.raises(StateDecodeError, match="does not carry a valid MAC"):
        codec.decode(blob, operator="other", source="u0.state")
    other = StateCodec(pickled=PickledState(secret=b"another secret of 16+ bytes"))
    with pytest.raises(StateDecodeError, match="does not carry a valid MAC"):
        other.decode(blob, operator="count", source="u0.state")
    with pytest.raises(StateTypeError, match="at least 16 bytes"):
        PickledState(secret=b"short")
    assert "0123" not in repr(PickledState(secret=SECRET))


# --- the attack: a pickle payload in checkpoint storage runs nothing ------------------------


class _Evil:
    def __init__(self, canary: Path) -> None:
        self.canary = canary

    def __reduce__(self):
        return (os.system, (f"touch {self.canary}",))


def _count(ctx, r):
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"n": r["n"], "c": c.value()}


def _pipeline(table: str, parallelism: int = 2, **kw: Any) -> Pipeline:
    p = Pipeline("job", records_per_epoch=3, **kw)
    src = p.source(
        GeneratorSource(2, lambda s, n: {"n": n}, records_per_split=6),
        name="src",
        parallelism=parallelism,
    )
    src.key_by(lambda r: "k").process(_count, name="count").sink(ParquetSink(table), name="out")
    return p


def _forged(canary: Path) -> dict[str, bytes]:
    payload = pickle.dumps(_Evil(canary))
    return {
        "unsigned": payload,
        "signed": HEADER_PICKLE + b"\0" * 32 + payload,
    }


UNSIGNED = (
    "is an unsigned pickle (a snapshot of regional 0.1, or forged): refused unread, since "
    "unpickling data from storage can run code. To migrate a checkpoint root you trust, run "
    "once with Pipeline(state_serializer=PickledState(secret=..., accept_unsigned=True)) and "
    "keep PickledState(secret=...) afterwards; otherwise start the job over with empty state"
)
NOT_OPTED_IN = (
    "is pickled (PickledState) and is refused unread: this pipeline does not opt in to pickled "
    "state. Pass the job's secret: Pipeline(state_serializer=PickledState(secret=...))"
)


@pytest.mark.parametrize(("kind", "why"), [("unsigned", UNSIGNED), ("signed", NOT_OPTED_IN)])
def test_a_pickle_segment_restored_by_a_task_runs_nothing(tmp_path, kind, why):
    canary = tmp_path / "canary"
    env = TaskEnv(str(tmp_path / "ckpt"), "job", _pipeline(str(tmp_path / "t")), unit_timeout=5)
    storage = JobStorage(env.root, "job")
    [handle] = storage.write_segments("chk-1/u0-a1.state", [_forged(canary)[kind]])
    restore = (
        msgspec.structs.replace(_subtask("src"), split_states=()),
        msgspec.structs.replace(_subtask("count"), handles=(handle,)),
        _subtask("out"),
    )
    [answer] = run_units(env, [UnitWork(2, 1, 0, restore)])
    assert isinstance(answer, Decline)
    where = f"{storage.describe('chk-1/u0-a1.state')}"
    assert answer.reason == f"StateDecodeError: state of operator 'count' in {where} {why}"
    assert not canary.exists()


def _subtask(vertex: str):
    from metadata.model import SubtaskState

    return SubtaskState(vertex, 0, 0, ref_checkpoint_id=1)


def _driver(tmp_path: Path, parallelism: int, **kw: Any) -> JobDriver:
    p = _pipeline(str(tmp_path / "table"), parallelism, **kw)
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "job", p, unit_timeout=10)
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    return JobDriver(p, InProcessDispatcher(env), storage=JobStorage(root, "job"), policy=policy)


def _forge_latest(tmp_path: Path, make: Any) -> None:
    """What an attacker with write access does: new state segments for 'count' in the latest
    checkpoint, checksums recomputed in its metadata (they are not keyed)."""
    storage = JobStorage(str(tmp_path / "ckpt"), "job")
    [cid] = storage.list_checkpoint_ids()[-1:]
    md = storage.read_metadata(cid)
    subtasks = []
    for s in md.subtasks:
        if s.vertex_id == "count" and s.handles:
            [h] = storage.write_segments(f"chk-{cid}/evil-{s.index}.state", [make(s)])
            s = msgspec.structs.replace(s, handles=(h,))
        subtasks.append(s)
    (tmp_path / "ckpt" / "job" / f"chk-{cid}" / "_metadata").unlink()
    storage.write_metadata(msgspec.structs.replace(md, subtasks=tuple(subtasks)))


def test_a_pickle_segment_rescaled_by_the_driver_runs_nothing(tmp_path):
    canary = tmp_path / "canary"
    _driver(tmp_path, 2).run(max_checkpoints=2)
    _forge_latest(tmp_path, lambda s: _forged(canary)["unsigned"])
    with pytest.raises(StateDecodeError) as err:
        _driver(tmp_path, 1).run()  # another parallelism: the driver decodes and redistributes
    where = JobStorage(str(tmp_path / "ckpt"), "job").describe("chk-2/evil-0.state")
    assert str(err.value) == f"state of operator 'count' in {where} of checkpoint 2 {UNSIGNED}"
    assert not canary.exists()


def test_signed_pickled_state_restores_and_rescales_with_the_secret(tmp_path):
    """The opt-in end to end: a run with PickledState, then a rescaled run with the same secret
    gives exact output; a tampered segment (MAC of another secret) is refused, naming the file."""
    secret = PickledState(secret=SECRET)
    _driver(tmp_path, 2, state_serializer=secret).run(max_checkpoints=2)
    summary = _driver(tmp_path, 1, state_serializer=secret).run()
    assert summary.finished
    t = read_table(str(tmp_path / "table"))
    rows = sorted(zip(t.column("n").to_pylist(), t.column("c").to_pylist(), strict=True))
    assert rows == sorted((n, n + 1) for _ in range(2) for n in range(6))


def test_a_segment_signed_with_another_secret_is_refused_before_unpickling(tmp_path):
    canary = tmp_path / "canary"
    secret = PickledState(secret=SECRET)
    _driver(tmp_path, 2, state_serializer=secret).run(max_checkpoints=2)
    attacker = PickledState(secret=b"the attacker's own secret")

    def signed(s: Any) -> bytes:
        payload = pickle.dumps(_Evil(canary))
        return HEADER_PICKLE + attacker.mac("count", payload) + payload

    _forge_latest(tmp_path, signed)
    with pytest.raises(StateDecodeError, match=r"evil-0.state of checkpoint 2 does not carry a "):
        _driver(tmp_path, 1, state_serializer=secret).run()
    assert not canary.exists()


def test_a_legacy_pickle_snapshot_migrates_with_accept_unsigned(tmp_path):
    legacy = pickle.dumps(({"s0": {"k": {"c": 3}}}, {"seen": [1]}), protocol=5)
    codec = StateCodec(pickled=PickledState(secret=SECRET, accept_unsigned=True))
    state = OperatorState.from_bytes(legacy, operator="count", codec=codec)
    assert (state.keyed, state.lists) == ({"s0": {"k": {"c": 3}}}, {"seen": [1]})
    assert state.to_bytes().startswith(HEADER_PICKLE)  # written signed from then on


def test_acks_still_carry_state_in_the_new_format(tmp_path):
    env = TaskEnv(str(tmp_path / "ckpt"), "job", _pipeline(str(tmp_path / "t")), unit_timeout=5)
    initial = tuple(_subtask(v) for v in ("src", "count", "out"))
    [ack] = run_units(env, [UnitWork(1, 1, 0, initial, (("src", 0, "g1"),))])
    assert isinstance(ack, Ack)
    [handle] = ack.states[1].handles
    data = JobStorage(env.root, "job").read_segment(handle)
    assert data.startswith(b"\xc1RSM\x01")
    state = OperatorState.from_bytes(data, operator="count")
    assert state.keyed == {"g1": {"k": {"c": 3}}}
