"""File merging on the task side (DESIGN §4 rule 16): one physical state file per task holding
every acked unit's segments; a unit that declines contributes nothing."""

from __future__ import annotations

import msgspec
import pytest

from metadata.model import SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.pipeline import Pipeline
from regional.runtime.faults import UnitFaults
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def _count(ctx, r):
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"n": r["n"], "c": c.value()}


@pytest.fixture
def env(tmp_path):
    p = Pipeline("job", records_per_epoch=3)
    src = p.source(GeneratorSource(3, lambda s, n: {"n": n}, records_per_split=5), name="src")
    src.key_by(lambda r: "k").process(_count, name="count").sink(
        ParquetSink(str(tmp_path / "t")), name="out"
    )
    return TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=5.0, run_id="r1")


def _works(checkpoint_id=1, states=None):
    return [
        UnitWork(
            checkpoint_id,
            1,
            u,
            states[u]
            if states
            else tuple(SubtaskState(v, 0, u, ref_checkpoint_id=0) for v in ("src", "count", "out")),
            () if states else (("src", 0, f"g{u}"),),
        )
        for u in range(3)
    ]


def _state_files(env):
    storage = JobStorage(env.root, env.job_id)
    return sorted(f.path for f in storage.list_files() if f.path.endswith(".state"))


def _count_handle(answer):
    assert isinstance(answer, Ack), answer
    [handle] = answer.states[1].handles
    return handle


def test_a_task_writes_one_state_file_with_every_units_segments_and_restores_from_them(env):
    acks = run_units(env, _works())
    handles = [_count_handle(a) for a in acks]
    assert _state_files(env) == ["chk-1/u0-a1-r1.state"]
    assert {h.path for h in handles} == {"chk-1/u0-a1-r1.state"}
    assert [h.offset for h in handles] == [0, handles[0].length, handles[0].length * 2]
    total = sum(h.length for h in handles)
    assert all(h.size == total for h in handles)
    storage = JobStorage(env.root, env.job_id)
    assert storage.file_size("chk-1/u0-a1-r1.state") == total
    # the next epoch restores each unit from its own segment of the shared file
    owned = [tuple(msgspec.structs.replace(s, ref_checkpoint_id=1) for s in a.states) for a in acks]
    again = run_units(env, _works(2, owned))
    counts = {a.unit: a.states[1] for a in again if isinstance(a, Ack)}
    assert sorted(counts) == [0, 1, 2]
    assert _state_files(env) == ["chk-1/u0-a1-r1.state", "chk-2/u0-a1-r1.state"]


def test_a_declined_unit_contributes_no_segment(env):
    faulty = msgspec.structs.replace(env, faults=UnitFaults({(1, 1): "fail"}))
    first, declined, third = run_units(faulty, _works())
    assert isinstance(declined, Decline)
    a, c = _count_handle(first), _count_handle(third)
    assert (a.offset, c.offset) == (0, a.length) and a.size == a.length + c.length
    assert JobStorage(env.root, env.job_id).read_segment(c)  # verified against its checksum


def test_a_unit_interrupted_by_its_timeout_leaves_nothing_in_the_file(env):
    short = msgspec.structs.replace(env, unit_timeout=0.3, faults=UnitFaults({(1, 0): "hang"}))
    hung, second, third = run_units(short, _works())
    assert hung == Decline(1, 0, 1, "timeout: unit ran over 0.3 s")
    b, c = _count_handle(second), _count_handle(third)
    # named after the first unit attempt with state in it
    assert _state_files(env) == ["chk-1/u1-a1-r1.state"] and b.path == "chk-1/u1-a1-r1.state"
    assert (b.offset, c.offset, c.size) == (0, b.length, b.length + c.length)


def test_a_failed_upload_declines_every_unit_in_the_file_and_deletes_their_staged_files(
    env, tmp_path, monkeypatch
):
    def broken(self, relpath, segments):
        raise OSError("disk full")

    monkeypatch.setattr(JobStorage, "write_segments", broken)
    answers = run_units(env, _works())
    assert [a.reason for a in answers if isinstance(a, Decline)] == [
        "upload failed: OSError: disk full"
    ] * 3
    assert list((tmp_path / "t" / "_staging" / "job").iterdir()) == []


def test_without_merging_each_unit_writes_its_own_file(env):
    acks = run_units(msgspec.structs.replace(env, merge_state=False), _works())
    assert all(isinstance(a, Ack) for a in acks)
    assert _state_files(env) == [f"chk-1/u{u}-a1-r1.state" for u in range(3)]


def test_units_restoring_from_one_merged_file_read_it_once(env, monkeypatch):
    env = msgspec.structs.replace(env, hot_state=False)  # states decoded from their bytes
    acks = run_units(env, _works())
    owned = [tuple(msgspec.structs.replace(s, ref_checkpoint_id=1) for s in a.states) for a in acks]
    reads: list[str] = []
    read = JobStorage.read_segment

    def counting(self, handle, *, checkpoint_id=None, whole_files=None):
        if whole_files is None or handle.path not in whole_files:
            reads.append(handle.path)  # goes to storage
        return read(self, handle, checkpoint_id=checkpoint_id, whole_files=whole_files)

    monkeypatch.setattr(JobStorage, "read_segment", counting)
    again = run_units(env, _works(2, owned))
    assert all(isinstance(a, Ack) for a in again)
    assert reads == ["chk-1/u0-a1-r1.state"]  # three units' segments, one read


def test_the_spool_keeps_exactly_what_was_appended_and_not_cut_off() -> None:
    from regional.runtime.task import _Spool

    spool = _Spool()
    try:
        assert spool.append([b"ab", b"c"]) == 0
        assert spool.append([b"dd"]) == 3
        spool.truncate(3)  # the second unit declined
        assert spool.append([b"e", b"ff"]) == 3
        assert spool.read() == b"abceff"
        assert spool.append([b"g"]) == 6  # after a read, appends go to the end still
        assert spool.read() == b"abceffg"
    finally:
        spool.close()
