"""State that does not grow forever: the keyed state of a finished split leaves with the
snapshot of the checkpoint in which it finished (a streaming FileSource reading file after
file), and per-state TTL (`ttl=`) on an injected clock, through snapshots."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import PickledState, StateCodec
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource


def _count(ctx: Any, click: dict) -> list[dict]:
    n = ctx.value_state("n", 0)
    n.update(n.value() + 1)
    return [{"file": ctx.split_id, "user": click["user"], "n": n.value()}]


def _snapshot_splits(storage: JobStorage, cid: int) -> dict[str, int]:
    """Split -> number of keys in the `count` operator's state in checkpoint `cid`."""
    splits: dict[str, int] = {}
    for s in storage.read_metadata(cid).subtasks:
        if s.vertex_id == "count" and s.handles:
            data = b"".join(storage.read_segment(h) for h in s.handles)
            for split, keys in OperatorState.from_bytes(data).keyed.items():
                splits[split] = splits.get(split, 0) + len(keys)
    return splits


def test_state_of_finished_files_is_dropped_so_state_stays_bounded(tmp_path: Path) -> None:
    files = tmp_path / "in"
    files.mkdir()
    p = Pipeline("stream", records_per_epoch=2)  # a 3-record file takes two epochs
    src = p.source(FileSource(str(files), format="jsonl", bounded=False), parallelism=2)
    src.key_by(lambda c: c["user"]).process(_count, name="count").sink(
        ParquetSink(str(tmp_path / "out"))
    )
    root = str(tmp_path / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    storage = JobStorage(root, "stream")
    dispatcher = InProcessDispatcher(TaskEnv(root, "stream", p, 10))
    driver = JobDriver(p, dispatcher, storage=storage, policy=policy)
    sizes = []
    for i in range(12):  # one new file per epoch, each with 3 users of its own
        users = [f"u{i}-{k}" for k in range(2)]
        lines = [{"user": users[0]}, {"user": users[1]}, {"user": users[0]}]
        (files / f"f{i:02d}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
        [event] = driver.run(max_checkpoints=1).checkpoints
        assert event.kind == "global"
        sizes.append(_snapshot_splits(storage, event.checkpoint_id))
    for _ in range(3):  # no new files: the last ones finish
        [event] = driver.run(max_checkpoints=1).checkpoints
        sizes.append(_snapshot_splits(storage, event.checkpoint_id))

    # at most one unfinished file per source subtask holds keyed state, never all files read
    assert max(len(s) for s in sizes) <= 2 and max(sum(s.values()) for s in sizes) <= 4
    assert sizes[-1] == {}
    out = read_table(str(tmp_path / "out")).to_pylist()
    assert len(out) == 36  # every record once, counted per (file, user): state was kept
    assert sorted((r["file"], r["user"], r["n"]) for r in out if r["file"] == "f05.jsonl") == [
        ("f05.jsonl", "u5-0", 1),
        ("f05.jsonl", "u5-0", 2),
        ("f05.jsonl", "u5-1", 1),
    ]


def test_retain_splits_keeps_only_live_splits() -> None:
    state = OperatorState()
    for split in ("a", "b", "c"):
        state.context(split, "k").value_state("n").update(1)
    assert state.retain_splits({"b", "z"}) == 2
    assert list(state.keyed) == ["b"]


class Clock:
    """A fake processing-time clock in ms."""

    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


def test_value_state_ttl_expires_on_the_clock_and_updates_refresh_it() -> None:
    clock = Clock()
    state = OperatorState(clock=clock)
    ctx = state.context("s", "alice")
    seen = ctx.value_state("seen", "never", ttl=dt.timedelta(minutes=1))
    seen.update("home")
    clock.ms += 59_999
    assert seen.value() == "home"
    seen.update("cart")  # refreshed
    clock.ms += 59_999
    assert ctx.value_state("seen", "never", ttl=60).value() == "cart"
    clock.ms += 1
    assert seen.value() == "never"
    state.context("s", "bob").value_state("forever").update(1)  # no ttl: kept
    assert OperatorState.from_bytes(state.to_bytes()).keyed == {"s": {"bob": {"forever": 1}}}


def test_map_state_ttl_per_entry() -> None:
    clock = Clock()
    state = OperatorState(clock=clock)
    pages = state.context("s", "alice").map_state("pages", ttl=10)
    pages["home"] = 1
    clock.ms += 6_000
    pages["cart"] = 2
    clock.ms += 4_000  # home: 10 s old, cart: 4 s
    assert dict(pages) == {"cart": 2} and len(pages) == 1 and "home" not in pages
    with pytest.raises(KeyError):
        pages["home"]
    with pytest.raises(KeyError):
        del pages["home"]
    pages["home"] = 3
    restored = OperatorState.from_bytes(state.to_bytes(), clock=clock)
    again = restored.context("s", "alice").map_state("pages", ttl=10)
    assert dict(again) == {"cart": 2, "home": 3}
    clock.ms += 6_000  # cart: 10 s old
    assert dict(again) == {"home": 3}
    restored.to_bytes()
    assert restored.keyed["s"]["alice"]["pages"] == {"home": 3}
    clock.ms += 10_000
    restored.to_bytes()
    assert restored.keyed == {}


@pytest.mark.parametrize(
    "codec",
    [StateCodec(), StateCodec(pickled=PickledState(secret=b"k" * 32))],
    ids=["msgpack", "pickle"],
)
def test_ttl_state_round_trips_through_a_snapshot(codec: StateCodec) -> None:
    clock = Clock()
    state = OperatorState(codec=codec, clock=clock)
    ctx = state.context("file-1", ("alice", 1))
    ctx.value_state("last", ttl=30).update(dt.date(2026, 11, 25))
    ctx.map_state("pages", ttl=60)["home"] = 2
    data = state.to_bytes()
    restored = OperatorState.from_bytes(data, codec=codec, clock=clock)
    assert restored.keyed == state.keyed
    assert restored.keyed["file-1"][("alice", 1)][("last", "ttl")] == [1_000_000, 30_000]
    clock.ms += 30_000
    rctx = restored.context("file-1", ("alice", 1))
    assert rctx.value_state("last", ttl=30).value() is None
    assert dict(rctx.map_state("pages", ttl=60)) == {"home": 2}


@pytest.mark.parametrize("ttl", [0, -1, "1h", True, dt.timedelta(0)])
def test_a_bad_ttl_names_the_state(ttl: Any) -> None:
    ctx = OperatorState().context("s", "k")
    with pytest.raises(ValueError, match=r"state 'seen': ttl=.*give a positive datetime.timedelta"):
        ctx.value_state("seen", ttl=ttl)


def test_ttl_stamps_are_plain_msgpack_in_the_slot() -> None:
    clock = Clock()
    state = OperatorState(clock=clock)
    state.context("s", "k").value_state("x", ttl=1).update(5)
    body = msgspec.msgpack.decode(state.to_bytes()[5:])
    assert body[0]["s"]["k"]["x"] == 5 and len(body[0]["s"]["k"]) == 2


def test_ttl_state_survives_a_rescale_of_its_splits() -> None:
    from regional.runtime.rescale import redistribute_state

    clock = Clock()
    codec = StateCodec()
    old = OperatorState(codec=codec, clock=clock)
    old.context("f1", "k").value_state("x", ttl=60).update(1)
    old.context("f2", "k").value_state("x").update(2)
    [a, b] = redistribute_state([old], {"f1": 0, "f2": 1}, 2)
    data = codec.encode(a.keyed, a.lists, operator="count")  # as a restore writes it
    assert data[:5] == b"\xc1RSM\x02"
    assert codec.encode(b.keyed, b.lists, operator="count")[:5] == b"\xc1RSM\x01"
    back = OperatorState.from_bytes(data, codec=codec, clock=clock)
    assert back.context("f1", "k").value_state("x", ttl=60).value() == 1
    clock.ms += 60_000
    assert back.context("f1", "k").value_state("x", ttl=60).value() is None
