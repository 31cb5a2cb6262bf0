"""Drivers that take the lease at the same instant: exactly one holds it, on a local disk (threads
and processes) and on the S3-compatible test server (conditional writes, and the claim protocol
for stores without them); records vanishing under a reader and a removed `_lease/` do not break
acquire; a driver learns before its next write (not at its next renewal) that another holds it.
"""

from __future__ import annotations

import multiprocessing
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import msgspec
import pytest

from metadata.errors import StorageError
from metadata.lease import JobLease, LeaseHeldError, LeaseLostError, LeaseRecord
from metadata.storage import JobStorage

TTL = 60_000


def wall_ms() -> int:
    return time.time_ns() // 1_000_000


def race(new_storage: Callable[[str], JobStorage], trials: int, drivers: int) -> Counter[int]:
    """`trials` job roots, `drivers` threads acquiring each at once (a barrier per trial);
    returns how many trials ended with how many holders (the holders still pass `check`)."""
    holders: list[list[JobLease]] = [[] for _ in range(trials)]
    refused = [0] * trials
    barrier = threading.Barrier(drivers, timeout=120)
    lock = threading.Lock()
    errors: list[BaseException] = []

    def driver(n: int) -> None:
        try:
            for t in range(trials):
                lease = JobLease(new_storage(f"job-{t}"), f"run-{n}", ttl_ms=TTL, clock=wall_ms)
                barrier.wait()
                try:
                    lease.acquire()
                except LeaseHeldError:
                    with lock:
                        refused[t] += 1
                    continue
                with lock:
                    holders[t].append(lease)
        except BaseException as exc:
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=driver, args=(n,)) for n in range(drivers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not [e for e in errors if not isinstance(e, threading.BrokenBarrierError)], errors
    for t in range(trials):
        assert refused[t] + len(holders[t]) == drivers
        for lease in holders[t]:
            lease.check()  # a holder really holds it, as far as storage says
    return Counter(len(h) for h in holders)


def test_threads_racing_on_a_local_disk_leave_exactly_one_holder(tmp_path):
    outcome = race(lambda job: JobStorage(str(tmp_path), job), trials=1000, drivers=4)
    assert outcome == Counter({1: 1000})


def _process_driver(root: str, n: int, trials: int, barrier: Any, out: Any) -> None:
    won = []
    for t in range(trials):
        lease = JobLease(JobStorage(root, f"job-{t}"), f"proc-{n}", ttl_ms=TTL, clock=wall_ms)
        barrier.wait()
        try:
            lease.acquire()
        except LeaseHeldError:
            continue
        lease.check()
        won.append(t)
    out.put((n, won))


def test_processes_racing_on_a_local_disk_leave_exactly_one_holder(tmp_path):
    trials, drivers = 1000, 4
    ctx = multiprocessing.get_context("fork")
    barrier, out = ctx.Barrier(drivers, timeout=120), ctx.Queue()
    procs = [
        ctx.Process(target=_process_driver, args=(str(tmp_path), n, trials, barrier, out))
        for n in range(drivers)
    ]
    for p in procs:
        p.start()
    wins = Counter[int]()
    for _ in procs:
        _, won = out.get(timeout=300)
        wins.update(won)
    for p in procs:
        p.join()
        assert p.exitcode == 0
    assert Counter(wins[t] for t in range(trials)) == Counter({1: trials})


@pytest.mark.s3
def test_threads_racing_on_s3_with_conditional_writes_leave_exactly_one_holder(s3_server):
    bucket = s3_server.new_bucket()
    outcome = race(lambda job: JobStorage(s3_server.uri(bucket), job), trials=60, drivers=4)
    assert outcome == Counter({1: 60})


@pytest.mark.s3
def test_threads_racing_on_s3_without_conditional_writes_leave_exactly_one_holder(s3_server):
    bucket = s3_server.new_bucket()

    def storage(job: str) -> JobStorage:
        s = JobStorage(s3_server.uri(bucket), job)
        s.conditional_writes = False  # the claim protocol, as on a store without them
        return s

    outcome = race(storage, trials=30, drivers=3)
    assert outcome == Counter({1: 30})
    assert not [p for p in storage("job-0").list_dir("_lease") if ".claim-" in p]


# --- records changing under a reader ---------------------------------------------------------


def test_a_record_replaced_between_listing_and_reading_still_refuses(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    now = [1_000_000]
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=lambda: now[0], host="host-a")
    a.acquire()
    now[0] += TTL // 3
    a.renew()
    read = storage.read_file

    def renewed_meanwhile(path: str) -> bytes | None:
        storage.read_file = read  # type: ignore[method-assign]
        a.renew()  # writes r2, deletes r1: the record just listed is gone
        return read(path)

    storage.read_file = renewed_meanwhile  # type: ignore[method-assign]
    b = JobLease(storage, "run-b", ttl_ms=TTL, clock=lambda: now[0], host="host-b")
    with pytest.raises(LeaseHeldError, match="in use by driver run-a"):
        b.acquire()


def test_a_lease_directory_removed_while_acquiring_does_not_break_acquire(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    (tmp_path / "job" / "_lease").mkdir(parents=True)
    listed = storage.list_dir

    def removed_after_listing(reldir: str) -> list[str]:
        storage.list_dir = listed  # type: ignore[method-assign]
        paths = listed(reldir)
        shutil.rmtree(tmp_path / "job" / "_lease")
        return paths

    storage.list_dir = removed_after_listing  # type: ignore[method-assign]
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=wall_ms)
    a.acquire()
    a.check()
    assert storage.list_dir("_lease") == ["_lease/g000000000001.json"]


# --- fencing ----------------------------------------------------------------------------------


def test_a_holder_learns_at_its_next_check_that_another_driver_took_over(tmp_path):
    """b's clock runs ahead: by it, a's lease expired. a's own clock says a's lease is good for
    another minute, yet a's check before its next write sees b's generation and stops."""
    storage = JobStorage(str(tmp_path), "job")
    a_now, b_now = [1_000_000], [1_000_000 + TTL + 1]
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=lambda: a_now[0], host="host-a")
    a.acquire()
    b = JobLease(storage, "run-b", ttl_ms=TTL, clock=lambda: b_now[0], host="host-b")
    b.acquire()
    assert a.held  # by a's clock
    with pytest.raises(LeaseLostError, match=r"driver run-b \(host host-b\) holds it now"):
        a.check()
    b.check()


def test_a_holder_whose_lease_records_were_removed_stops(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=wall_ms)
    a.acquire()
    shutil.rmtree(tmp_path / "job" / "_lease")
    with pytest.raises(LeaseLostError, match=r"no longer holds this driver's record"):
        a.check()


@pytest.mark.s3
def test_s3_conditional_puts_are_used_where_the_store_has_them(s3_server):
    from metadata.exclusive import s3_put_if_absent

    bucket = s3_server.new_bucket()
    filesystem = s3_server.filesystem()
    assert s3_put_if_absent(filesystem, f"{bucket}/job/_lease/g1.json", b"a") is True
    assert s3_put_if_absent(filesystem, f"{bucket}/job/_lease/g1.json", b"b") is False
    with filesystem.open_input_stream(f"{bucket}/job/_lease/g1.json") as f:
        assert f.read() == b"a"
    assert [i.path for i in filesystem.get_file_info(fs_selector(f"{bucket}/job/_lease"))] == [
        f"{bucket}/job/_lease/g1.json"  # the probe object is gone
    ]


def fs_selector(path: str) -> Any:
    from pyarrow import fs

    return fs.FileSelector(path)


# --- fencing without listing (`check`: HEAD g<N+1>.json, then read g<N>.json) ----------------


def _modes() -> list[Any]:
    return [
        pytest.param("local", id="os.link"),
        pytest.param("conditional", id="if-none-match", marks=pytest.mark.s3),
        pytest.param("claims", id="claims", marks=pytest.mark.s3),
    ]


def _storage_for(mode: str, request: Any, tmp_path: Any) -> JobStorage:
    """A job root on a local disk, or on the S3 test server with conditional writes or with
    the claim protocol of stores without them."""
    if mode == "local":
        return JobStorage(str(tmp_path), "job")
    server = request.getfixturevalue("s3_server")
    storage = JobStorage(server.uri(server.new_bucket()), "job")
    storage.conditional_writes = mode == "conditional"
    return storage


def _listings(storage: JobStorage) -> list[str]:
    """Make `storage.list_dir` record each call (and still list)."""
    calls: list[str] = []
    listed = storage.list_dir

    def counted(reldir: str) -> list[str]:
        calls.append(reldir)
        return listed(reldir)

    storage.list_dir = counted  # type: ignore[method-assign]
    return calls


@pytest.mark.parametrize("mode", _modes())
def test_a_holder_sees_a_newer_generation_without_listing_in_every_create_mode(
    mode, request, tmp_path
):
    storage = _storage_for(mode, request, tmp_path)
    a_now, b_now = [1_000_000], [1_000_000 + 2 * TTL]  # b's clock: a's renewal expired
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=lambda: a_now[0], host="host-a")
    a.acquire()
    calls = _listings(storage)
    a.check()
    a_now[0] += TTL // 3
    a.renew()
    assert calls == []  # the steady state lists nothing
    b = JobLease(storage, "run-b", ttl_ms=TTL, clock=lambda: b_now[0], host="host-b")
    b.acquire()
    assert b.generation == 2
    with pytest.raises(LeaseLostError, match=r"driver run-b \(host host-b\) holds it now"):
        a.check()
    b.check()


def _abandon_claim(storage: JobStorage, generation: int, age_ms: int, now_ms: int) -> str:
    """A claim of the claim protocol left by a driver that died before creating the record."""
    path = f"_lease/g{generation:012d}.json.claim-{now_ms - age_ms:013d}-{'0' * 32}"
    storage.write_new_file(path, b"")
    return path


@pytest.mark.parametrize("mode", _modes())
def test_an_abandoned_claim_is_skipped_with_a_record_so_the_old_holder_still_sees_the_new(
    mode, request, tmp_path
):
    """a holds generation 1; a driver died while claiming 2; b, once that claim is stale,
    takes 3. Rule 1: b first writes a skip record in place of 2, so `g2.json` exists and a's
    HEAD finds it, even if b's pruning stops before deleting a's record (rule 2)."""
    storage = _storage_for(mode, request, tmp_path)
    a_now, b_now = [1_000_000], [1_000_000 + 3 * TTL]
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=lambda: a_now[0], host="host-a")
    a.acquire()
    claim = _abandon_claim(storage, 2, age_ms=TTL, now_ms=b_now[0])
    deleted = storage.delete_file

    def stuck_on_generation_1(relpath: str) -> bool:  # b's pruning fails on a's record
        if relpath == "_lease/g000000000001.json":
            raise StorageError("unreachable")
        return deleted(relpath)

    storage.delete_file = stuck_on_generation_1  # type: ignore[method-assign]
    b = JobLease(storage, "run-b", ttl_ms=TTL, clock=lambda: b_now[0], host="host-b")
    b.acquire()
    assert b.generation == 3
    skip = storage.read_file("_lease/g000000000002.json")
    assert skip is not None
    record = msgspec.json.decode(skip, type=LeaseRecord)
    assert (record.run_id, record.skipped, record.released) == ("run-b", True, True)
    assert claim in storage.list_dir("_lease")  # claims are their writers'
    with pytest.raises(LeaseLostError, match=r"driver run-b \(host host-b\) holds it now"):
        a.check()


def test_a_young_claim_on_the_newest_generation_is_not_skipped(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    now = [1_000_000]
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=lambda: now[0], host="host-a")
    a.acquire()
    a.release()
    _abandon_claim(storage, 2, age_ms=1_000, now_ms=now[0])
    b = JobLease(storage, "run-b", ttl_ms=TTL, clock=lambda: now[0], host="host-b")
    with pytest.raises(LeaseHeldError, match="being taken by another driver"):
        b.acquire()
    assert storage.read_file("_lease/g000000000002.json") is None


def test_pruning_deletes_the_oldest_generation_first_and_stops_at_a_failure(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    now = [1_000_000]
    leases = []
    for n in range(3):  # generations 1, 2, 3 (each prunes the older ones)
        lease = JobLease(storage, f"run-{n}", ttl_ms=TTL, clock=lambda: now[0], host=f"h{n}")
        lease.acquire()
        leases.append(lease)
        now[0] += 2 * TTL
    for g in (1, 2):  # put the older first records back, as a slow pruner would meet them
        storage.replace_file(f"_lease/g{g:012d}.json", b"{}")
    deleted, attempts = storage.delete_file, []

    def failing(relpath: str) -> bool:
        attempts.append(relpath)
        if relpath == "_lease/g000000000001.json":
            raise StorageError("unreachable")
        return deleted(relpath)

    storage.delete_file = failing  # type: ignore[method-assign]
    d = JobLease(storage, "run-d", ttl_ms=TTL, clock=lambda: now[0], host="hd")
    d.acquire()
    assert d.generation == 4
    assert attempts == ["_lease/g000000000001.json"]  # g2 and g3 wait: g1 is still there
    assert storage.list_dir("_lease")[:3] == [f"_lease/g{g:012d}.json" for g in (1, 2, 3)]


def test_a_late_skip_record_in_place_of_a_pruned_record_does_not_revive_its_holder(tmp_path):
    """Rule 2's other half: `check` reads its own first record's bytes, not just that a file
    is there, so a skip record written late (by a driver paused between listing and writing)
    where a's pruned record was cannot make a pass again."""
    storage = JobStorage(str(tmp_path), "job")
    a_now, later = [1_000_000], [1_000_000 + 2 * TTL]
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=lambda: a_now[0], host="host-a")
    a.acquire()
    for run in ("run-b", "run-c"):  # generations 2 and 3; c prunes 1 and 2
        JobLease(storage, run, ttl_ms=TTL, clock=lambda: later[0], host=run).acquire()
        later[0] += 2 * TTL
    assert storage.list_dir("_lease") == ["_lease/g000000000003.json"]
    late = JobLease(storage, "run-z", ttl_ms=TTL, clock=lambda: later[0], host="host-z")
    late._write_skip(1)
    with pytest.raises(LeaseLostError, match="no longer holds this driver's record"):
        a.check()


def test_a_holder_whose_record_was_replaced_stops(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    a = JobLease(storage, "run-a", ttl_ms=TTL, clock=wall_ms)
    a.acquire()
    storage.replace_file("_lease/g000000000001.json", b'{"run_id": "someone else"}')
    with pytest.raises(LeaseLostError, match=r"no longer holds this driver's record"):
        a.check()
