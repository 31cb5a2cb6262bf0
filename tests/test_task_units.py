"""The task-side protocol without Spark: restore, process, snapshot, verified upload, answers."""

from __future__ import annotations

import threading
from pathlib import Path

import msgspec
import pytest

from metadata.model import SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.pipeline import Pipeline
from regional.runtime import task
from regional.runtime.faults import UnitFaults
from regional.runtime.task import TaskEnv, UploadLatency, run_units
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _count(ctx, r):
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"n": r["n"], "c": c.value()}


@pytest.fixture
def env(tmp_path):
    p = Pipeline("job", records_per_epoch=3)
    src = p.source(GeneratorSource(2, lambda s, n: {"n": n}, records_per_split=5), name="src")
    src.key_by(lambda r: "k").process(_count, name="count").sink(
        ParquetSink(str(tmp_path / "t")), name="out"
    )
    return TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=5.0)


def _initial(unit=0):
    return tuple(SubtaskState(v, 0, unit, ref_checkpoint_id=0) for v in ("src", "count", "out"))


def _states(answer):
    assert isinstance(answer, Ack), answer
    return answer.states


def test_ack_carries_positions_state_handles_and_committables(env, tmp_path):
    [ack] = run_units(env, [UnitWork(1, 1, 0, _initial(), (("src", 0, "g1"),))])
    assert isinstance(ack, Ack) and (ack.records_in, ack.records_out) == (3, 3)
    src, count, out = _states(ack)
    assert [(s.split_id, s.position) for s in src.split_states] == [("g1", b"3")]
    assert src.handles == () and out.handles == () and len(out.committables) == 1
    [handle] = count.handles
    assert handle.path == "chk-1/u0-a1.state" and count.attempt == 1
    storage = JobStorage(env.root, "job")
    assert storage.file_size(handle.path) == handle.size
    # the next epoch restores from these states (as the coordinator hands them back)
    owned = tuple(msgspec.structs.replace(s, ref_checkpoint_id=1) for s in (src, count, out))
    [ack2] = run_units(env, [UnitWork(2, 1, 0, owned)])
    src2, _, out2 = _states(ack2)
    assert src2.split_states == () and ack2.records_in == 2  # g1 finished at 5
    ParquetSink(str(tmp_path / "t")).commit("job", 1, out.committables + out2.committables)
    assert read_table(str(tmp_path / "t")).column("c").to_pylist() == [1, 2, 3, 4, 5]


def test_user_exception_becomes_a_decline_and_other_units_still_ack(env):
    works = [
        UnitWork(1, 1, 0, _initial(0), (("src", 0, "g0"),)),
        UnitWork(1, 1, 1, _initial(1), (("src", 0, "g1"),)),
    ]
    faulty = msgspec.structs.replace(env, faults=UnitFaults({(1, 0): "fail"}))
    declined, acked = run_units(faulty, works)
    assert isinstance(declined, Decline) and isinstance(acked, Ack)
    assert declined.reason == "InjectedFault: unit 0 fails checkpoint 1 (injected fault)"
    assert declined.trace is not None and "InjectedFault" in declined.trace


def test_hanging_unit_is_interrupted_by_its_timeout(env):
    short = msgspec.structs.replace(env, unit_timeout=0.3, faults=UnitFaults({(1, 0): "hang"}))
    [answer] = run_units(short, [UnitWork(1, 1, 0, _initial())])
    assert answer == Decline(1, 0, 1, "timeout: unit ran over 0.3 s")


def test_spark_task_retries_are_refused():
    from regional.runtime.spark import attempt_refused

    works = [UnitWork(4, 2, 0, _initial())]
    assert attempt_refused(works, 0) is None  # a first attempt runs its units
    [answer] = attempt_refused(works, 1) or []
    assert answer == Decline(4, 0, 2, "spark task attempt 1 refused: units run once per attempt")


def test_corrupt_restore_state_declines_naming_the_file(env):
    env = msgspec.structs.replace(env, hot_state=False)  # a restore that decodes the bytes
    [ack] = run_units(env, [UnitWork(1, 1, 0, _initial(), (("src", 0, "g0"),))])
    states = tuple(msgspec.structs.replace(s, ref_checkpoint_id=1) for s in _states(ack))
    storage = JobStorage(env.root, "job")
    path = states[1].handles[0].path
    full = f"{storage.job_path}/{path}"
    with open(full, "r+b") as f:
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    [answer] = run_units(env, [UnitWork(2, 1, 0, states)])
    assert isinstance(answer, Decline)
    assert path in answer.reason and "checksum" in answer.reason


@pytest.mark.parametrize("in_sync_phase", [False, True], ids=["async", "sync"])
def test_failed_upload_declines_and_deletes_the_staged_sink_file(
    env, tmp_path, monkeypatch, in_sync_phase
):
    def broken(self, relpath, segments):
        raise OSError("disk full")

    monkeypatch.setattr(JobStorage, "write_segments", broken)
    env = msgspec.structs.replace(env, upload_in_sync_phase=in_sync_phase)
    [answer] = run_units(env, [UnitWork(1, 1, 0, _initial(), (("src", 0, "g0"),))])
    assert isinstance(answer, Decline)
    assert answer.reason == "upload failed: OSError: disk full"
    # staged and deleted again, or (sink files merged per task) never staged
    assert list((tmp_path / "t" / "_staging" / "job").glob("*")) == []


def test_upload_latency_is_seeded_and_heavy_tailed():
    slow = UploadLatency(0.01, tail_probability=0.25, tail_factor=10.0, seed=7)
    delays = [slow.seconds(c, u, 1) for c in range(1, 21) for u in range(10)]
    assert set(delays) == {0.01, 0.1}
    assert 0 < delays.count(0.1) < len(delays) / 2
    assert delays == [slow.seconds(c, u, 1) for c in range(1, 21) for u in range(10)]
    other_seed = UploadLatency(0.01, tail_probability=0.25, tail_factor=10.0, seed=8)
    assert delays != [other_seed.seconds(c, u, 1) for c in range(1, 21) for u in range(10)]


def _two_units():
    return [
        UnitWork(1, 1, 0, _initial(0), (("src", 0, "g0"),)),
        UnitWork(1, 1, 1, _initial(1), (("src", 0, "g1"),)),
    ]


def _record_steps(monkeypatch, *, wait_for_second_unit: bool):
    """Record the order of processing and uploads; with `wait_for_second_unit` the first
    upload waits (up to 5 s) until the second unit has been processed."""
    steps: list[tuple[str, int]] = []
    processed = threading.Event()
    process, write = task._process, JobStorage.write_segments

    def recording_process(env, storage, work, *spool):
        snap = process(env, storage, work, *spool)
        steps.append(("process", work.unit_id))
        if work.unit_id == 1:
            processed.set()
        return snap

    def recording_write(self, relpath, segments):
        if wait_for_second_unit:
            processed.wait(5)
        steps.append(("upload", int(relpath.split("/u")[1].split("-")[0])))
        return write(self, relpath, segments)

    monkeypatch.setattr(task, "_process", recording_process)
    monkeypatch.setattr(JobStorage, "write_segments", recording_write)
    return steps


def test_async_phase_uploads_while_the_next_unit_runs(env, monkeypatch):
    steps = _record_steps(monkeypatch, wait_for_second_unit=True)
    answers = run_units(msgspec.structs.replace(env, merge_state=False), _two_units())
    assert [type(a) for a in answers] == [Ack, Ack]
    assert steps[:2] == [("process", 0), ("process", 1)]


def test_upload_in_sync_phase_blocks_the_unit_for_its_injected_latency(env, monkeypatch):
    steps = _record_steps(monkeypatch, wait_for_second_unit=False)
    sync = msgspec.structs.replace(
        env, upload_in_sync_phase=True, upload_latency=UploadLatency(0.05, tail_probability=0)
    )
    answers = run_units(sync, _two_units())
    assert steps == [("process", 0), ("upload", 0), ("process", 1), ("upload", 1)]
    assert [type(a) for a in answers] == [Ack, Ack]
    assert all(
        a.snapshot_blocked_s >= 0.05 for a in answers if isinstance(a, Ack)
    )  # at least the injected sleep


def _two_staging_units(checkpoint_id: int = 1) -> list[UnitWork]:
    return [
        UnitWork(checkpoint_id, 1, 0, _initial(0), (("src", 0, "g0"),)),
        UnitWork(checkpoint_id, 1, 1, _initial(1), (("src", 0, "g1"),)),
    ]


def test_staged_files_made_durable_by_one_syncfs_per_task_and_a_failed_one_declines(
    env, monkeypatch
):
    import ctypes

    synced: list[int] = []

    def syncfs(fd: int) -> int:
        synced.append(fd)
        return 0

    monkeypatch.setattr("regional.sinks.durability._syncfs", lambda: syncfs)
    monkeypatch.setattr("regional.sinks.durability._dirty_bytes", lambda: 0)  # nothing else writing
    monkeypatch.setattr("regional.sinks.durability.fsync_path", pytest.fail)  # not one fsync
    acks = run_units(env, _two_staging_units())
    assert all(isinstance(a, Ack) for a in acks)
    assert len(synced) == 1  # the two units' staged files: one call for the task

    def broken(fd: int) -> int:  # the file system lost a write-back since the task began
        ctypes.set_errno(5)
        return -1

    monkeypatch.setattr("regional.sinks.durability._syncfs", lambda: broken)
    answers = run_units(env, _two_staging_units(2))
    assert [type(a) for a in answers] == [Decline, Decline]
    staging = f"{env.pipeline.vertices['out'].sink.path}/_staging/job"
    assert answers[0].reason == (
        "staged sink files not durable: OSError: [Errno 5] Input/output error "
        f"(syncfs of {staging})"
    )


@pytest.mark.parametrize("merged", [True, False], ids=["merged", "per-unit"])
def test_without_syncfs_each_staged_file_is_fsynced_then_the_directory_once(
    env, monkeypatch, merged
):
    env = msgspec.structs.replace(env, merge_sink_files=merged)
    synced: list[str] = []
    monkeypatch.setattr("regional.sinks.durability._syncfs", lambda: None)  # another system
    monkeypatch.setattr("regional.sinks.durability.fsync_path", synced.append)
    acks = run_units(env, _two_staging_units())
    assert all(isinstance(a, Ack) for a in acks)
    staging = [p for p in synced if p.endswith("/_staging/job")]
    assert len(staging) == 1 and synced[-1] == staging[0]  # the directory once, last
    # and each staged file once, before it: the task's one merged file, or one per unit
    assert len(synced) == (2 if merged else 3)

    def broken(path: str) -> None:
        if path.endswith(".staged"):  # a staged file's data does not reach the disk
            raise OSError(5, "Input/output error")

    monkeypatch.setattr("regional.sinks.durability.fsync_path", broken)
    answers = run_units(env, _two_staging_units(2))
    assert [type(a) for a in answers] == [Decline, Decline]
    assert answers[0].reason == (
        "staged sink files not durable: OSError: [Errno 5] Input/output error"
    )


def test_acks_say_where_the_units_task_time_went_and_the_epoch_adds_it_up(env):
    from regional.runtime.timing import EpochStopwatch

    [first] = run_units(env, [UnitWork(1, 1, 0, _initial(), (("src", 0, "g1"),))])
    owned = tuple(msgspec.structs.replace(s, ref_checkpoint_id=1) for s in _states(first))
    [second] = run_units(env, [UnitWork(2, 1, 0, owned)])
    assert isinstance(second, Ack)
    assert second.restore_s > 0.0  # the second epoch reads the first one's state
    for ack in (first, second):
        assert ack.process_s > 0.0 and ack.snapshot_s > 0.0 and ack.upload_s > 0.0
    watch = EpochStopwatch()
    watch.add_tasks([first, second, Decline(2, 1, 1, "no")])
    timing = watch.timing(2)
    assert timing.task_upload_s == first.upload_s + second.upload_s
    assert timing.task_restore_s == pytest.approx(first.restore_s + second.restore_s)


def test_staging_past_the_timeout_declines_its_units_and_deletes_what_it_staged(env, monkeypatch):
    declined = threading.Event()
    real_write, real_decline = ParquetSink.write_merged, task._decline

    def slow_write(self, parts):  # stages, then stays busy until the task gave up on it
        out = real_write(self, parts)
        declined.wait(30)
        return out

    def decline(work, reason, trace=None):
        d = real_decline(work, reason, trace)
        if reason.startswith("timeout: staging"):
            declined.set()
        return d

    monkeypatch.setattr(ParquetSink, "write_merged", slow_write)
    monkeypatch.setattr(task, "_decline", decline)
    env = msgspec.structs.replace(env, unit_timeout=0.3)
    answers = run_units(env, _two_staging_units())
    assert [a.reason for a in answers] == [
        "timeout: staging the sink files did not finish in time"
    ] * 2
    staging = Path(env.pipeline.vertices["out"].sink.path) / "_staging" / "job"
    assert list(staging.glob("*")) == []
