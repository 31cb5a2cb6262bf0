"""JobStorage on the local file system and on a real S3-compatible server (moto, loopback)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import pytest

from metadata.errors import MetadataError, StorageError
from metadata.format import encode_metadata
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState
from metadata.storage import FileEntry, JobSelectionError, JobStorage
from metadata.store import CompletedCheckpointStore

MakeStorage = Callable[[str], JobStorage]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def root(request, tmp_path) -> str:
    """A fresh checkpoint root: a local directory or a prefix in a fresh S3 bucket."""
    if request.param == "local":
        return str(tmp_path / "ckpt")
    server = request.getfixturevalue("s3_server")
    return server.uri(server.new_bucket(), "ckpt")


def put_raw(storage: JobStorage, rel: str, data: bytes) -> None:
    """Write bytes at `rel` behind the storage's back (a damaged or tampered file)."""
    if storage.filesystem.type_name == "local":
        storage.filesystem.create_dir(f"{storage.job_path}/{rel.rsplit('/', 1)[0]}")
    with storage.filesystem.open_output_stream(f"{storage.job_path}/{rel}") as out:
        out.write(data)


def checkpoint(cid: int, *subtasks: SubtaskState, kind: str = "global") -> CheckpointMetadata:
    return CheckpointMetadata(
        checkpoint_id=cid,
        job_id="job",
        kind=kind,
        trigger_time_ms=1000 * cid,
        completion_time_ms=1000 * cid + 10,
        subtasks=subtasks,
    )


def two_checkpoints(storage: JobStorage) -> tuple[CheckpointMetadata, CheckpointMetadata]:
    """chk-1 (global, 2 units) and chk-2 (unit 1 fell back to chk-1)."""
    a = storage.write_segments("chk-1/u0-a0.state", [b"source-0", b"map-0"])
    b = storage.write_state_file("chk-1/u1-a0.state", b"source-1")
    c1 = checkpoint(
        1,
        SubtaskState("source", 0, 0, handles=(a[0],)),
        SubtaskState("map", 0, 0, handles=(a[1],)),
        SubtaskState("source", 1, 1, handles=(b,)),
    )
    storage.write_metadata(c1)
    c = storage.write_segments("chk-2/u0-a1.state", [b"source-0'", b"map-0'"])
    c2 = msgspec_replace(
        checkpoint(
            2,
            SubtaskState("source", 0, 0, handles=(c[0],), attempt=1),
            SubtaskState("map", 0, 0, handles=(c[1],), attempt=1),
            SubtaskState("source", 1, 1, ref_checkpoint_id=1, handles=(b,)),
            kind="regional",
        ),
        units=(UnitState(0), UnitState(1, 1, "timeout")),
    )
    storage.write_metadata(c2)
    return c1, c2


def ours(caplog) -> list[str]:
    """Log messages of the metadata package (the S3 server logs too)."""
    return [r.getMessage() for r in caplog.records if r.name.startswith("metadata.")]


def msgspec_replace(md: CheckpointMetadata, **changes) -> CheckpointMetadata:
    import msgspec

    return msgspec.structs.replace(md, **changes)


def test_metadata_and_state_round_trip(root: str) -> None:
    storage = JobStorage(root, "job")
    c1, c2 = two_checkpoints(storage)
    assert storage.list_checkpoint_ids() == [1, 2]
    assert storage.read_metadata(1) == c1 and storage.read_metadata(2) == c2
    files = storage.list_files()
    assert [(f.path, f.size) for f in files] == [
        ("chk-1/_metadata", len(encode_metadata(c1))),
        ("chk-1/u0-a0.state", 13),
        ("chk-1/u1-a0.state", 8),
        ("chk-2/_metadata", len(encode_metadata(c2))),
        ("chk-2/u0-a1.state", 15),
    ]
    assert all(isinstance(f, FileEntry) and f.mtime_ms for f in files)
    assert [storage.read_segment(h) for s in c2.subtasks for h in s.handles] == [
        b"source-0'",
        b"map-0'",
        b"source-1",
    ]
    assert storage.exists("chk-1/u1-a0.state") and storage.file_size("chk-1/u1-a0.state") == 8
    assert not storage.exists("chk-9/_metadata") and storage.file_size("nope") is None
    assert storage.write_state_file("shared/sst-1", b"x").shared is True


def test_write_metadata_refuses_to_overwrite(root: str) -> None:
    storage = JobStorage(root, "job")
    c1, _ = two_checkpoints(storage)
    with pytest.raises(StorageError, match=r"chk-1/_metadata already exists; checkpoint 1"):
        storage.write_metadata(msgspec_replace(c1, kind="savepoint"))
    assert storage.read_metadata(1) == c1


def test_damaged_state_is_detected_on_read(root: str) -> None:
    storage = JobStorage(root, "job")
    _, c2 = two_checkpoints(storage)
    fresh, map_handle, old = (h for s in c2.subtasks for h in s.handles)
    put_raw(storage, "chk-2/u0-a1.state", b"SOURCE-0'map-0'")  # same size, other bytes
    with pytest.raises(StorageError, match=r"chk-2/u0-a1.state of checkpoint 2: segment at 0\+9 "):
        storage.read_segment(fresh, checkpoint_id=2)
    assert storage.read_segment(map_handle) == b"map-0'"
    put_raw(storage, "chk-1/u1-a0.state", b"short")
    with pytest.raises(StorageError, match=r"u1-a0.state has 5 bytes, the metadata records 8"):
        storage.read_segment(old)
    storage.delete_file("chk-1/u1-a0.state")
    with pytest.raises(StorageError, match=r"chk-1/u1-a0.state is missing"):
        storage.read_segment(old)


@pytest.mark.parametrize(
    "path", ["../other-job/chk-1/u0-a0.state", "/etc/passwd", "s3://other-bucket/x", "chk-1/../.."]
)
def test_tampered_paths_are_refused(root: str, path: str) -> None:
    storage = JobStorage(root, "job")
    handle = StateHandle(path, 0, 1, 1, bytes(16))
    with pytest.raises(StorageError, match=rf"refusing a state handle of checkpoint 4: .*{path!r}"):
        storage.read_segment(handle, checkpoint_id=4)
    with pytest.raises(StorageError, match=r"outside the job root|absolute or a URI"):
        storage.delete_file(path)
    tampered = checkpoint(3, SubtaskState("map", 0, 0, handles=(handle,)))
    storage.write_metadata(tampered)
    search = storage.find_restorable()
    assert search.metadata is None
    # the metadata holding such a path is damaged: refused when it is decoded
    assert [(p.checkpoint_id, p.path) for p in search.skipped] == [(3, "chk-3/_metadata")]
    assert f"subtask map[0] has state handle path {path!r}" in search.skipped[0].problem


def test_delete_file_is_idempotent_and_removes_empty_checkpoint_dirs(root: str) -> None:
    storage = JobStorage(root, "job")
    two_checkpoints(storage)
    assert storage.delete_file("chk-2/u0-a1.state") is True
    assert storage.delete_file("chk-2/u0-a1.state") is False
    assert storage.delete_file("chk-2/_metadata") is True
    assert storage.list_checkpoint_ids() == [1]
    assert [f.path for f in storage.list_files()] == [
        "chk-1/_metadata",
        "chk-1/u0-a0.state",
        "chk-1/u1-a0.state",
    ]
    if storage.filesystem.type_name == "local":
        import os

        assert not os.path.exists(f"{storage.job_path}/chk-2")
        assert os.path.isdir(f"{storage.job_path}/chk-1")


def test_find_latest_restorable_falls_back_loudly(root: str, caplog) -> None:
    storage = JobStorage(root, "job")
    c1, c2 = two_checkpoints(storage)
    assert storage.find_latest_restorable() == c2
    put_raw(storage, "chk-2/u0-a1.state", b"x")  # wrong size
    with caplog.at_level(logging.WARNING, logger="metadata.storage"):
        assert storage.find_latest_restorable() == c1
    assert ours(caplog) == [
        "checkpoint 2 of job job is not restorable (chk-2/u0-a1.state: size is 1 bytes, "
        "recorded 15); using checkpoint 1 instead"
    ]
    storage.delete_file("chk-1/u1-a0.state")  # needed by both
    search = storage.find_restorable()
    assert search.metadata is None
    assert [(p.checkpoint_id, p.path, p.problem) for p in search.skipped] == [
        (2, "chk-2/u0-a1.state", "size is 1 bytes, recorded 15"),
        (2, "chk-1/u1-a0.state", "missing"),
        (1, "chk-1/u1-a0.state", "missing"),
    ]


def test_checksums_are_verified_when_asked(root: str) -> None:
    storage = JobStorage(root, "job")
    c1, _ = two_checkpoints(storage)
    put_raw(storage, "chk-2/u0-a1.state", b"XXXXXXXXXXXXXXX")
    assert storage.find_restorable().metadata.checkpoint_id == 2
    search = storage.find_restorable(verify_checksums=True)
    assert search.metadata == c1
    assert {(p.checkpoint_id, p.path) for p in search.skipped} == {(2, "chk-2/u0-a1.state")}


def test_damaged_metadata_is_skipped_and_reported(root: str, caplog) -> None:
    storage = JobStorage(root, "job")
    c1, c2 = two_checkpoints(storage)
    data = encode_metadata(c2)
    storage.delete_file("chk-2/_metadata")
    put_raw(storage, "chk-2/_metadata", data[:-3] + b"abc")
    put_raw(storage, "chk-3/_metadata", encode_metadata(c1))  # a copy in the wrong place
    with pytest.raises(MetadataError, match=r"chk-2/_metadata fails its checksum"):
        storage.read_metadata(2)
    with pytest.raises(MetadataError, match=r"chk-3/_metadata holds checkpoint 1, not 3"):
        storage.read_metadata(3)
    with pytest.raises(MetadataError, match=r"chk-7/_metadata does not exist"):
        storage.read_metadata(7)
    with caplog.at_level(logging.WARNING):
        store = CompletedCheckpointStore.load(storage)
        assert storage.find_latest_restorable() == c1
    assert store.ids() == (1,)
    assert [(d.checkpoint_id, d.path) for d in store.damaged] == [
        (2, "chk-2/_metadata"),
        (3, "chk-3/_metadata"),
    ]
    assert "fails its checksum" in store.damaged[0].error
    assert len(ours(caplog)) == 4


def test_jobs_under_a_root(root: str) -> None:
    with pytest.raises(JobSelectionError, match=r"does not exist|holds no job") as exc:
        JobStorage.open(root)
    assert exc.value.exit_code == 2
    two_checkpoints(JobStorage(root, "job-b"))
    JobStorage(root, "job-a").write_state_file("chk-1/u0-a0.state", b"x")
    assert JobStorage.list_jobs(root) == ["job-a", "job-b"]
    with pytest.raises(JobSelectionError, match=r"holds 2 jobs \(job-a, job-b\); choose one"):
        JobStorage.open(root)
    with pytest.raises(
        JobSelectionError, match=r"job 'job-c' not found .*jobs there: job-a, job-b"
    ):
        JobStorage.open(root, "job-c")
    assert JobStorage.open(root, "job-b").list_checkpoint_ids() == [1, 2]
    assert "testing:testing" not in str(exc.value)


@pytest.mark.parametrize("job", ["", "a/b", "..", "."])
def test_job_ids_that_are_not_directory_names_are_refused(job: str) -> None:
    with pytest.raises(JobSelectionError, match="cannot be a directory name"):
        JobStorage("/tmp", job)


def test_store_operations() -> None:
    store = CompletedCheckpointStore([checkpoint(2), checkpoint(1)])
    assert [md.checkpoint_id for md in store] == [1, 2] and len(store) == 2
    with pytest.raises(MetadataError, match="checkpoint 2 is already in the store"):
        store.add(checkpoint(2))
    store.add(checkpoint(5))
    assert store.latest().checkpoint_id == 5 and 5 in store and 3 not in store
    assert store.remove(2).checkpoint_id == 2
    with pytest.raises(MetadataError, match=r"checkpoint 2 is not in the store .*: 1, 5\)"):
        store.remove(2)
    assert CompletedCheckpointStore().latest() is None
