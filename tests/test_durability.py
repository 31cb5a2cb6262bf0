"""`regional.sinks.durability.StagedFiles`: one syncfs per file system, the fsync fallback, no
leaks."""

from __future__ import annotations

import os
import pickle

import pytest

from regional.sinks import durability
from regional.sinks.durability import StagedFiles


@pytest.fixture(autouse=True)
def _little_dirty_data(monkeypatch):
    """The machine's dirty page cache as if nothing else were writing (syncfs allowed)."""
    monkeypatch.setattr("regional.sinks.durability._dirty_bytes", lambda: 0)


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _stage(staged: StagedFiles, folder: str, names: list[str]) -> None:
    staged.directory(folder)
    for name in names:
        path = os.path.join(folder, name)
        with open(path, "wb") as f:
            f.write(b"rows")
        staged.file(path)


@pytest.mark.skipif(not durability.syncfs_available(), reason="syncfs needs Linux 5.8+")
def test_real_syncfs_syncs_and_closes_what_it_opened(tmp_path):
    before = _open_fds()
    staged = StagedFiles()
    _stage(staged, str(tmp_path), ["a.staged", "b.staged"])
    assert staged.pending == 2 and _open_fds() == before + 1  # the directory, held open
    staged.sync()
    assert staged.pending == 0 and _open_fds() == before


def test_one_syncfs_per_file_system_however_many_directories(tmp_path, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(
        "regional.sinks.durability._syncfs", lambda: lambda fd: calls.append(fd) or 0
    )
    staged = StagedFiles()
    for sub in ("x", "y", "z"):
        (tmp_path / sub).mkdir()
        _stage(staged, str(tmp_path / sub), ["f.staged"])
    staged.sync()
    assert len(calls) == 1  # the three directories share a device
    staged.sync()  # nothing new: nothing to do
    assert len(calls) == 1


def test_fallback_fsyncs_every_file_then_each_directory(tmp_path, monkeypatch):
    synced: list[str] = []
    monkeypatch.setattr("regional.sinks.durability.fsync_path", synced.append)
    staged = StagedFiles(use_syncfs=False)
    _stage(staged, str(tmp_path), ["a.staged", "b.staged", "c.staged"])
    staged.sync()
    assert sorted(synced[:3]) == [str(tmp_path / n) for n in ("a.staged", "b.staged", "c.staged")]
    assert synced[3:] == [str(tmp_path)]


def test_a_failed_sync_is_not_retried_silently(tmp_path, monkeypatch):
    import ctypes

    def broken(fd: int) -> int:
        ctypes.set_errno(28)
        return -1

    monkeypatch.setattr("regional.sinks.durability._syncfs", lambda: broken)
    before = _open_fds()
    staged = StagedFiles()
    _stage(staged, str(tmp_path), ["a.staged"])
    with pytest.raises(OSError, match=rf"No space left on device \(syncfs of {tmp_path}\)"):
        staged.sync()
    assert staged.pending == 0 and _open_fds() == before  # forgotten and closed: the task
    staged.sync()  # declined those units; a later sync does not claim them durable


def test_pickled_empty_as_shipped_to_a_task(tmp_path, monkeypatch):
    monkeypatch.setattr("regional.sinks.durability._syncfs", lambda: lambda fd: 0)
    staged = StagedFiles()
    _stage(staged, str(tmp_path), ["a.staged"])
    copy = pickle.loads(pickle.dumps(staged))
    assert copy.pending == 0 and copy.use_syncfs
    staged.sync()


def test_with_much_dirty_data_elsewhere_every_file_is_fsynced_instead(tmp_path, monkeypatch):
    synced: list[str] = []
    monkeypatch.setattr("regional.sinks.durability._syncfs", lambda: pytest.fail)  # never called
    monkeypatch.setattr("regional.sinks.durability.fsync_path", synced.append)
    monkeypatch.setattr(
        "regional.sinks.durability._dirty_bytes", lambda: durability.SYNCFS_MAX_DIRTY + 1
    )
    before = _open_fds()
    staged = StagedFiles()
    _stage(staged, str(tmp_path), ["a.staged", "b.staged"])
    staged.sync()
    assert sorted(synced) == [str(tmp_path), str(tmp_path / "a.staged"), str(tmp_path / "b.staged")]
    assert synced[-1] == str(tmp_path) and _open_fds() == before


def test_the_dirty_page_cache_is_read_from_proc_meminfo(monkeypatch):
    monkeypatch.undo()  # the real reading
    dirty = durability._dirty_bytes()
    assert dirty is None or dirty >= 0
