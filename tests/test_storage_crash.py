"""Crash safety of `_metadata` writes: an interrupted write never leaves a checkpoint that
looks complete (restorable or loadable); the previous checkpoint stays the one restored."""

from __future__ import annotations

import os

import pytest

from metadata.errors import StorageError
from metadata.format import encode_metadata
from metadata.model import CheckpointMetadata, SubtaskState
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore


def setup_two(storage: JobStorage) -> tuple[CheckpointMetadata, CheckpointMetadata]:
    """chk-1 completed; chk-2's state written, its metadata not yet."""
    h1 = storage.write_state_file("chk-1/u0-a0.state", b"one")
    c1 = CheckpointMetadata(
        checkpoint_id=1,
        job_id="job",
        kind="global",
        trigger_time_ms=1,
        completion_time_ms=2,
        subtasks=(SubtaskState("map", 0, 0, handles=(h1,)),),
    )
    storage.write_metadata(c1)
    h2 = storage.write_state_file("chk-2/u0-a0.state", b"two")
    c2 = CheckpointMetadata(
        checkpoint_id=2,
        job_id="job",
        kind="global",
        trigger_time_ms=3,
        completion_time_ms=4,
        reasons=("forced: unit 0 fell back 3 times",),
        subtasks=(SubtaskState("map", 0, 0, handles=(h2,)),),
    )
    return c1, c2


def test_local_write_failing_at_any_step_leaves_no_metadata(tmp_path, monkeypatch) -> None:
    storage = JobStorage(str(tmp_path), "job")
    c1, c2 = setup_two(storage)

    def broken(*args, **kwargs):
        raise OSError(28, "No space left on device")

    for step in ("fsync", "link", "replace"):
        with monkeypatch.context() as m:
            m.setattr(os, step, broken)
            if step == "replace":  # link unsupported, then the rename fails too
                m.setattr(os, "link", lambda *a: (_ for _ in ()).throw(OSError(1, "EPERM")))
            with pytest.raises(StorageError, match=r"cannot write .*chk-2/_metadata: .*not comp"):
                storage.write_metadata(c2)
        assert storage.list_checkpoint_ids() == [1], step
        assert sorted(os.listdir(tmp_path / "job" / "chk-2")) == ["u0-a0.state"], step
        assert storage.find_latest_restorable() == c1
    storage.write_metadata(c2)  # nothing left over blocks the retry
    assert storage.find_latest_restorable() == c2


def test_local_crash_at_any_byte_leaves_only_a_temp_file(tmp_path) -> None:
    """A crash mid-write leaves the temp file with some prefix, never `_metadata`."""
    storage = JobStorage(str(tmp_path), "job")
    c1, c2 = setup_two(storage)
    data = encode_metadata(c2)
    for n in range(len(data) + 1):
        (tmp_path / "job" / "chk-2" / "_metadata.tmp-crashed").write_bytes(data[:n])
        assert storage.list_checkpoint_ids() == [1]
        assert storage.find_latest_restorable(warn=False) == c1
    assert CompletedCheckpointStore.load(storage).ids() == (1,)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def storage(request, tmp_path) -> JobStorage:
    if request.param == "local":
        return JobStorage(str(tmp_path), "job")
    server = request.getfixturevalue("s3_server")
    return JobStorage(server.uri(server.new_bucket(), "ckpt"), "job")


def test_partial_metadata_objects_are_never_restored(storage: JobStorage) -> None:
    """Worst case of a store without atomic objects: every prefix of the file is visible."""
    c1, c2 = setup_two(storage)
    data = encode_metadata(c2)
    local = storage.filesystem.type_name == "local"
    lengths = range(len(data)) if local else sorted({0, 1, 4, 15, 16, 17, len(data) // 2})
    for n in lengths:
        with storage.filesystem.open_output_stream(f"{storage.job_path}/chk-2/_metadata") as out:
            out.write(data[:n])
        assert storage.find_latest_restorable(warn=False) == c1, n
        store = CompletedCheckpointStore.load(storage)
        assert store.ids() == (1,) and [d.checkpoint_id for d in store.damaged] == [2], n
        assert "truncated" in store.damaged[0].error
