"""`regional inspect ROOT state`: each stateful operator's state in the newest checkpoint (the
checkpoints owning it, its bytes and keys), and `StateCodec.key_count`, which counts the keys
from the segment layout without the user's types."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import orders_job
import pytest

from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from regional.cli import main
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import PickledState, StateCodec, StateDecodeError
from regional.runtime.driver import JobDriver
from regional.runtime.faults import Faults
from regional.runtime.task import TaskEnv

KEYS_NOTE = (
    "keys: one per key and input split on a forward chain, one per key after a keyed exchange"
)


def _run(tmp_path: Path, faults: Faults) -> tuple[str, JobStorage]:
    """Three checkpoints of the orders job (files -> exchange by customer -> running totals in
    4 subtasks, units 3 to 6)."""
    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    storage = JobStorage(root, "orders")
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=faults.unit_faults())
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=storage, faults=faults)
    driver.run(max_checkpoints=3)
    return root, storage


def _decoded_keys(storage: JobStorage, checkpoint_id: int) -> dict[int, tuple[int, int, int]]:
    """Per totals subtask: (owner, bytes, keys), the keys by decoding the state whole."""
    chk = storage.read_metadata(checkpoint_id)
    out = {}
    for s in chk.subtasks_of("totals"):
        data = b"".join(storage.read_segment(h) for h in s.handles)
        keys = sum(len(slots) for slots in OperatorState.from_bytes(data).keyed.values())
        owner = s.ref_checkpoint_id or checkpoint_id
        out[s.index] = (owner, sum(h.length for h in s.handles), keys)
    return out


def test_state_per_operator_and_per_subtask_with_a_fallback_owner(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unit 4 (totals subtask 1) fails at checkpoint 3: its state is checkpoint 2's, and the
    view says so; bytes and keys are what the segments hold."""
    root, storage = _run(tmp_path, Faults(units={(3, 4): "fail"}))
    assert CompletedCheckpointStore.load(storage).latest().checkpoint_id == 3
    expected = _decoded_keys(storage, 3)
    assert [owner for owner, _, _ in expected.values()] == [3, 2, 3, 3]
    total_bytes = sum(b for _, b, _ in expected.values())
    total_keys = sum(k for _, _, k in expected.values())
    assert total_keys == orders_job.CUSTOMERS  # every customer seen by checkpoint 2
    capsys.readouterr()

    assert main(["inspect", root, "state"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "operator  subtasks  owner_checkpoints  state_bytes  keys",
        "--------  --------  -----------------  -----------  ----",
        f"totals           4  2,3                {total_bytes:>11}  {total_keys:>4}",
        f"checkpoint 3: 1 stateful operator(s), {total_bytes} byte(s) of state; {KEYS_NOTE}",
    ]

    assert main(["inspect", root, "state", "--subtasks", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [
        {
            "operator": "totals",
            "subtask_index": index,
            "unit_id": 3 + index,
            "owner_checkpoint_id": owner,
            "state_bytes": size,
            "keys": keys,
        }
        for index, (owner, size, keys) in expected.items()
    ]

    assert main(["inspect", root, "state", "--no-keys"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2] == f"totals           4  2,3                {total_bytes:>11}     -"
    assert lines[3] == (
        f"checkpoint 3: 1 stateful operator(s), {total_bytes} byte(s) of state; keys not "
        "counted (--no-keys)"
    )


def test_a_damaged_segment_is_a_warning_and_no_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, storage = _run(tmp_path, Faults())
    keys = [str(k) for _, _, k in _decoded_keys(storage, 3).values()]
    chk = storage.read_metadata(3)
    damaged = chk.subtasks_of("totals")[2].handles[0]
    path = Path(root) / "orders" / damaged.path
    data = bytearray(path.read_bytes())
    data[damaged.offset] ^= 0xFF  # same size, another checksum
    path.write_bytes(bytes(data))
    capsys.readouterr()

    assert main(["inspect", root, "state", "--subtasks"]) == 0
    out, err = capsys.readouterr()
    assert err == (
        f"warning: keys of operator 'totals' subtask 2 not counted: state file {path} of "
        f"checkpoint 3: segment at {damaged.offset}+{damaged.length} fails its checksum; the "
        "file is corrupt; run `regional inspect ROOT validate` to check the checkpoint\n"
    )
    rows = out.splitlines()
    assert [r.split()[-1] for r in rows[2:6]] == [*keys[:2], "-", keys[3]]
    assert rows[-1].endswith(
        f"{KEYS_NOTE}; '-': not counted (pickled state, or a segment that could not be read)"
    )


def test_a_job_without_a_checkpoint_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = JobStorage(str(tmp_path), "empty")
    storage.write_new_file("events/.keep", b"")  # a job root with nothing completed
    assert main(["inspect", str(tmp_path), "--job", "empty", "state"]) == 0
    assert capsys.readouterr().out == "no completed checkpoint: no state to show\n"


# -- StateCodec.key_count: the layout alone -------------------------------------------------


@pytest.mark.parametrize("keys", [0, 1, 15, 16, 65_535, 65_536])
def test_key_count_reads_every_map_header_width(keys: int) -> None:
    """fixmap (up to 15 entries), map 16 and map 32: the count equals a full decode's."""
    codec = StateCodec()
    keyed = {"g0": {k: {"n": k} for k in range(keys)}, "g1": {"a": {"n": 1}}}
    blob = codec.encode(keyed, {"buffer": [1, 2, 3]}, operator="op")
    assert codec.key_count(blob, operator="op", source="f") == keys + 1


def test_key_count_needs_no_declared_types_and_reads_ttl_state() -> None:
    """Keys that are tuples, dates and Decimals, Struct values of a class the inspector does
    not know, and TTL'd slots: counted without decoding them."""
    import msgspec

    class Order(msgspec.Struct):
        n: int

    now = [0]
    state = OperatorState(codec=StateCodec(types=[Order]), clock=lambda: now[0])
    for key in [("a", 1), dt.date(2025, 1, 1), "c"]:
        ctx = state.context("g0", key)
        ctx.value_state("last", None, ttl=60).update(Order(1))
    blob = state.to_bytes()
    assert blob[:5] == b"\xc1RSM\x02"  # TTL'd
    assert StateCodec().key_count(blob, operator="op", source="f") == 3


def test_key_count_of_pickled_state_is_unknown_and_damage_is_named() -> None:
    pickled = StateCodec(pickled=PickledState(secret=b"s" * 16))
    blob = pickled.encode({"g0": {"a": {"n": 1}}}, {}, operator="op")
    assert StateCodec().key_count(blob, operator="op", source="f") is None
    assert StateCodec().key_count(b"", operator="op", source="f") == 0
    with pytest.raises(StateDecodeError) as err:
        StateCodec().key_count(b"\xc1RSM\x01\x92\x81\xa2g0\x07\x80", operator="op", source="f")
    assert str(err.value) == (
        "state of operator 'op' in f does not decode (ValueError: a split's keyed state is not a "
        "map (msgpack type byte 0x07)); the file is damaged or was not written by regional: "
        "restore another checkpoint"
    )
    with pytest.raises(StateDecodeError) as err:
        StateCodec().key_count(b"\xc1RSM\x09", operator="op", source="f")
    assert str(err.value) == (
        "state of operator 'op' in f has state format b'M\\t', which this regional does not read "
        "(written by a newer regional?); upgrade regional"
    )
