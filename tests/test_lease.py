"""One driver per job root: the lease refuses a second driver, lets a driver take over after
the holder's lease expired, and makes a driver that lost it stop before it writes."""

from __future__ import annotations

import subprocess
import sys

import msgspec
import pytest

from metadata.lease import (
    JobLease,
    LeaseExpiredError,
    LeaseHeldError,
    LeaseLostError,
    LeaseRecord,
    ensure_free,
)
from metadata.storage import JobStorage
from regional.policy import Policy
from regional.runtime.sim import Simulation

TTL = 60_000


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000

    def __call__(self) -> int:
        return self.now


def _lease(storage: JobStorage, run: str, clock: Clock, **kw: object) -> JobLease:
    return JobLease(storage, run, ttl_ms=TTL, clock=clock, **kw)  # type: ignore[arg-type]


def test_a_second_driver_is_refused_with_the_holder_named(tmp_path):
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    _lease(storage, "run-a", clock, host="host-a", pid=4242).acquire()
    with pytest.raises(LeaseHeldError) as refused:
        _lease(storage, "run-b", clock, host="host-b").acquire()
    assert str(refused.value) == (
        f"job root {tmp_path}/job is in use by driver run-a (host host-a, pid 4242); its lease "
        "expires in 60 s unless renewed. Stop that driver, or wait until its lease expires (a "
        "driver that died stops renewing) and start again; use another --job-id or "
        "--checkpoint-dir to run a second copy of the job"
    )
    with pytest.raises(LeaseHeldError):
        ensure_free(storage, clock=clock)
    assert storage.list_dir("_lease") == ["_lease/g000000000001.json"]  # b wrote nothing


def test_after_the_holder_stops_renewing_another_driver_takes_over_and_the_first_stops(tmp_path):
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    a = _lease(storage, "run-a", clock, host="host-a")
    a.acquire()
    clock.now += TTL // 2
    a.renew()  # renewed: still a's for a whole TTL from now
    clock.now += TTL - 1
    with pytest.raises(LeaseHeldError):
        _lease(storage, "run-b", clock, host="host-b").acquire()
    clock.now += 2  # a's renewal expired
    b = _lease(storage, "run-b", clock, host="host-b")
    b.acquire()
    with pytest.raises(LeaseExpiredError, match=r"it expired without renewal"):
        a.check()  # a writes nothing...
    with pytest.raises(LeaseLostError, match=r"lost the lease .*: driver run-b holds it now"):
        a.ensure()  # ...and, trying to take it again, learns that b holds it
    with pytest.raises(LeaseLostError):
        a.check()
    b.check()


def test_a_lease_that_lapsed_while_nobody_else_came_is_taken_again(tmp_path):
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    a = _lease(storage, "run-a", clock)
    a.acquire()
    clock.now += TTL + 1  # storage was unreachable: no renewal
    with pytest.raises(LeaseExpiredError):
        a.check()
    a.ensure()
    a.check()


def test_a_holder_that_renewed_late_learns_another_driver_holds_it(tmp_path):
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    a = _lease(storage, "run-a", clock, host="host-a")
    a.acquire()
    clock.now += TTL + 1
    _lease(storage, "run-b", clock, host="host-b").acquire()
    clock.now -= TTL  # a's clock says its lease is still valid (skew): the records decide
    with pytest.raises(LeaseLostError, match=r"driver run-b \(host host-b\) holds it now"):
        a.renew()


def test_of_two_drivers_racing_the_one_that_creates_the_generation_keeps_it(tmp_path):
    """b acquires between a's reading of `_lease/` and a's create, with an earlier clock (a
    slower write with an earlier time): the generation record decides, not the time."""
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    a = _lease(storage, "run-a", clock, host="host-a")
    b = _lease(storage, "run-b", clock, host="host-b")
    create = storage.create_new

    def b_first(path: str, data: bytes) -> bool:
        storage.create_new = create  # type: ignore[method-assign]
        clock.now -= 1
        b.acquire()
        clock.now += 1
        return create(path, data)

    storage.create_new = b_first  # type: ignore[method-assign]
    with pytest.raises(LeaseHeldError, match="in use by driver run-b"):
        a.acquire()
    assert storage.list_dir("_lease") == ["_lease/g000000000001.json"]  # a wrote nothing
    assert not a.held
    b.check()


def test_the_lease_of_a_dead_driver_on_this_host_is_taken_over_at_once(tmp_path):
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    _lease(storage, "run-a", clock, pid=int(dead.stdout)).acquire()
    b = _lease(storage, "run-b", clock)
    b.acquire()
    assert b.held


def test_renewals_replace_records_and_a_release_frees_the_lease_at_once(tmp_path):
    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    a = _lease(storage, "run-a", clock)
    a.acquire()
    for _ in range(3):
        clock.now += TTL // 3
        a.renew()
    record, first = storage.list_dir("_lease")
    assert (first, record) == ("_lease/g000000000001.json", "_lease/g000000000001-r000000003.json")
    data = storage.read_file(record)
    assert data is not None
    assert msgspec.json.decode(data, type=LeaseRecord).expires_ms == clock.now + TTL
    storage.write_new_file("_lease/notes.txt", b"not a lease")  # ignored, never deleted
    a.release()
    assert not a.held
    released = "_lease/g000000000001-r000000004.json"
    assert storage.list_dir("_lease") == [released, "_lease/g000000000001.json", "_lease/notes.txt"]
    data = storage.read_file(released)
    assert data is not None and msgspec.json.decode(data, type=LeaseRecord).released
    b = _lease(storage, "run-b", clock, host="host-b")
    b.acquire()  # at once: released
    assert b.generation == 2
    assert storage.list_dir("_lease") == ["_lease/g000000000002.json", "_lease/notes.txt"]


# --- the driver -------------------------------------------------------------------------------


def test_a_second_driver_on_the_root_is_refused_until_the_first_run_returns():
    sim = Simulation(4, Policy())
    first, second = sim.new_driver(), sim.new_driver()
    first.start()
    with pytest.raises(LeaseHeldError, match=f"in use by driver {first.run_id}"):
        second.start()
    summary = first.run()  # releases the lease when it returns
    assert summary.finished
    second.start()


def test_a_driver_whose_lease_lapsed_mid_epoch_writes_nothing_and_the_new_one_is_exact():
    sim = Simulation(4, Policy(), bounded=True)
    old = sim.new_driver()
    old.run(max_checkpoints=2)
    old.start()
    taken_over = []
    run = sim.dispatcher.run

    def slow_epoch(works, deadline_ms, *, isolated=False):  # the old driver stalls too long
        answers = run(works, deadline_ms, isolated=isolated)
        sim.clock.now += round(3 * sim.policy.checkpointing.timeout * 1000)
        new = sim.new_driver()
        new.start()
        taken_over.append(new)
        return answers

    sim.dispatcher.run = slow_epoch  # type: ignore[method-assign]
    before = sim.storage.list_checkpoint_ids()
    aborted = old.epoch()  # its lease lapsed during the epoch: the checkpoint aborts
    assert aborted.kind == "aborted" and f"driver {old.run_id} does not hold" in aborted.message
    assert sim.storage.list_checkpoint_ids() == before  # checkpoint 3 was never written
    sim.dispatcher.run = run  # type: ignore[method-assign]
    with pytest.raises(LeaseLostError, match=f"driver {old.run_id} lost the lease"):
        old.epoch()  # and it stops once it learns another driver holds the lease
    [new] = taken_over
    assert new.run().finished
    assert sorted(sim.sink.rows()) == sorted(
        (s, n) for s in sim.source.splits for n in range(sim.source.records_per_split)
    )


def test_the_cleaner_keeps_a_lease_record_and_says_why(tmp_path):
    from cleaner.model import Action, Reason
    from cleaner.run import scan

    storage, clock = JobStorage(str(tmp_path), "job"), Clock()
    _lease(storage, "run-a", clock).acquire()
    [record] = scan(storage, num_retained=3).files
    assert (record.action, record.reason) == (Action.KEEP, Reason.LEASE)
