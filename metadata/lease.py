"""The job-root lease: one driver per job root at a time, on local disks and object stores.

Two drivers on one job root would overwrite and delete each other's files. Before a driver
writes anything it takes the root's lease; it renews the lease while it runs and checks it
before every write that others could see (metadata, commits, cleaning). A second driver is
refused while the lease is held, with a message naming the holder and when the lease expires.

Object stores have no atomic rename and pyarrow offers no conditional put, so the lease is built
from write-once objects, one holder record per renewal, under `_lease/`:

```
_lease/<acquired ms, 15 digits>-<run id>-<renewal, 9 digits>.json   {run_id, host, pid, ...}
```

A run's newest record says until when it holds the lease (`expires_ms`). To acquire, a driver
lists `_lease/`; if another run's newest record has not expired it is refused; otherwise it
writes its own first record and lists again: of the runs with unexpired records, the one that
acquired first (by name: acquisition time, then run id) holds the lease, and a later one
withdraws. A driver whose own lease expired (say, storage was unreachable while it should have
renewed) must not write (`LeaseExpiredError`) until it holds the lease again (`ensure`); one
that finds another driver holding it has lost it for good (`LeaseLostError`) and stops. A record
of a driver on this host whose process is gone counts as expired at once, so a killed local
driver does not block its restart. Clocks of the drivers' hosts must agree to well within the
TTL, as for any lease.

>>> import tempfile
>>> from metadata.storage import JobStorage
>>> storage = JobStorage(tempfile.mkdtemp(), "job")
>>> now = [1_000_000]
>>> a = JobLease(storage, "run-a", ttl_ms=60_000, clock=lambda: now[0])
>>> a.acquire(); a.held
True
>>> b = JobLease(storage, "run-b", ttl_ms=60_000, clock=lambda: now[0], host="elsewhere")
>>> b.acquire()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.lease.LeaseHeldError: job root .../job is in use by driver run-a (host ..., pid ...) ...
>>> now[0] += 61_000  # run-a stopped renewing: its lease expired
>>> b.acquire(); b.held
True
>>> a.check()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.lease.LeaseExpiredError: driver run-a does not hold the lease of job root .../job: ...
>>> a.ensure()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.lease.LeaseLostError: driver run-a lost the lease of job root .../job: driver run-b ...
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
import threading
from collections.abc import Callable

import msgspec

from metadata.errors import StorageError
from metadata.layout import LEASE_DIR
from metadata.storage import JobStorage

__all__ = [
    "JobLease",
    "LeaseExpiredError",
    "LeaseHeldError",
    "LeaseLostError",
    "LeaseRecord",
    "ensure_free",
]

_NAME = re.compile(r"^_lease/(\d{15})-([A-Za-z0-9_.-]+)-(\d{9})\.json$")


class LeaseHeldError(StorageError):
    """Another driver holds the job root's lease."""


class LeaseLostError(StorageError):
    """Another driver holds the job root's lease now: this one must stop."""


class LeaseExpiredError(StorageError):
    """This driver's lease lapsed (or was released): it must not write until `ensure` took it
    again. Nobody is known to have taken it over."""


class LeaseRecord(msgspec.Struct, frozen=True):
    """One renewal of a driver's lease."""

    run_id: str
    host: str
    pid: int
    acquired_ms: int
    expires_ms: int


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def ensure_free(storage: JobStorage, *, clock: Callable[[], int]) -> None:
    """Raise `LeaseHeldError` if a driver holds `storage`'s job root now (a cheap check before
    starting anything heavy; `JobLease.acquire` still decides)."""
    probe = JobLease(storage, "probe", ttl_ms=1, clock=clock)
    holder = probe._first_holder(probe._current())
    if holder is not None:
        raise probe._held_by(holder)


class JobLease:
    """The lease of `storage`'s job root for driver run `run_id`, held `ttl_ms` per renewal.

    `acquire` takes it (or raises `LeaseHeldError`); `renew` extends it (call it at least every
    third of the TTL: `renew_due` says when; `keep_renewed` does it on a thread); `ensure`
    renews or, after a lapse, takes it again; `check` raises before a write when it is not
    safely held; `release` gives it up. `clock` is wall time in ms. Thread-safe.
    """

    def __init__(
        self,
        storage: JobStorage,
        run_id: str,
        *,
        ttl_ms: int,
        clock: Callable[[], int],
        host: str | None = None,
        pid: int | None = None,
    ) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", run_id):
            raise ValueError(f"run id {run_id!r}: use letters, digits, '_', '.' and '-'")
        if ttl_ms <= 0:
            raise ValueError(f"lease TTL must be positive, got {ttl_ms} ms")
        self.storage = storage
        self.run_id = run_id
        self.ttl_ms = ttl_ms
        self._clock = clock
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self._record: LeaseRecord | None = None
        self._renewal = 0
        self._path: str | None = None
        self._lost_why: str | None = None
        self._lock = threading.RLock()
        self._keeper: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def held(self) -> bool:
        """True while this driver holds an unexpired lease (as far as it knows)."""
        return self._record is not None and self._clock() < self._record.expires_ms

    @property
    def renew_due(self) -> bool:
        """True when a third of the TTL has passed since the last renewal."""
        if self._record is None:
            return True
        return self._clock() >= self._record.expires_ms - 2 * self.ttl_ms // 3

    def acquire(self) -> None:
        """Take the lease, or raise `LeaseHeldError` naming the driver that holds it."""
        with self._lock:
            if self.held:
                self.renew()
                return
            holder = self._first_holder(self._current())
            if holder is not None:
                raise self._held_by(holder)
            now = self._clock()
            self._record, self._lost_why, self._renewal = None, None, 0
            self._write(LeaseRecord(self.run_id, self.host, self.pid, now, now + self.ttl_ms))
            holder = self._first_holder(self._current())
            if holder is not None and holder.run_id != self.run_id:  # lost a race: withdraw
                self._withdraw()
                raise self._held_by(holder)

    def ensure(self) -> None:
        """Hold the lease: renew it when due, or take it again after it lapsed. Raises
        `LeaseLostError` when another driver holds it, `StorageError` when storage cannot be
        reached (then nothing changed)."""
        with self._lock:
            if self._lost_why is not None:
                raise self._lost(self._lost_why)
            if self.held:
                if self.renew_due:
                    self.renew()
                return
            try:
                self.acquire()
            except LeaseHeldError as held:
                self._lost_why = f"driver {self._holder_of(held)} holds it now"
                raise self._lost(self._lost_why) from None

    def renew(self) -> None:
        """Extend the lease by the TTL; `LeaseExpiredError` if it lapsed first,
        `LeaseLostError` if another driver took it over meanwhile."""
        with self._lock:
            self.check()
            assert self._record is not None
            records = self._current()
            holder = self._first_holder(records)
            # a run that acquired after our lease had expired (by its clock) took over
            later = [
                r
                for _, r in records
                if r.run_id != self.run_id and r.acquired_ms >= self._record.expires_ms
            ]
            holder = later[0] if later else holder
            if holder is not None and holder.run_id != self.run_id:
                self._record = None
                self._lost_why = f"driver {holder.run_id} (host {holder.host}) holds it now"
                raise self._lost(self._lost_why)
            record = msgspec.structs.replace(self._record, expires_ms=self._clock() + self.ttl_ms)
            previous = self._path
            self._write(record)
            if previous is not None:
                with contextlib.suppress(StorageError):
                    self.storage.delete_file(previous)

    def check(self) -> None:
        """Before a write: raise unless the lease is held with a quarter of the TTL to spare
        (room for the write). `LeaseLostError` if another driver took it over,
        `LeaseExpiredError` if it lapsed or was never taken."""
        with self._lock:
            if self._lost_why is not None:
                raise self._lost(self._lost_why)
            if self._record is None:
                raise self._expired("it was released or never taken")
            now = self._clock()
            if now + self.ttl_ms // 4 >= self._record.expires_ms:
                raise self._expired(
                    "it expired without renewal (was storage unreachable?)"
                    if now >= self._record.expires_ms
                    else "it is about to expire and could not be renewed"
                )

    def keep_renewed(self) -> None:
        """Renew on a daemon thread every third of the TTL until `release` (for long epochs).
        A failed renewal is retried at the next tick; a lost lease ends the thread, and the
        driver's next `check` fails."""
        if self._keeper is not None:
            return
        self._stop.clear()

        def keep() -> None:
            while not self._stop.wait(self.ttl_ms / 3000):
                try:
                    self.renew()
                except LeaseLostError:
                    return
                except (StorageError, OSError):
                    continue  # lapsed or storage unreachable: the driver's `ensure` decides

        self._keeper = threading.Thread(target=keep, name=f"lease-{self.run_id}", daemon=True)
        self._keeper.start()

    def release(self) -> None:
        """Give the lease up (a clean stop): the next driver may start at once."""
        self._stop.set()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.join()
        with self._lock:
            self._withdraw()

    # --- records ----------------------------------------------------------------------------

    def _write(self, record: LeaseRecord) -> None:
        self._renewal += 1
        path = f"{LEASE_DIR}/{record.acquired_ms:015d}-{self.run_id}-{self._renewal:09d}.json"
        self.storage.write_new_file(path, msgspec.json.encode(record))
        self._record, self._path = record, path

    def _withdraw(self) -> None:
        self._record = None
        for path in self.storage.list_dir(LEASE_DIR):
            m = _NAME.match(path)
            if m is not None and m.group(2) == self.run_id:
                with contextlib.suppress(StorageError):
                    self.storage.delete_file(path)
        self._path = None

    def _current(self) -> list[tuple[str, LeaseRecord]]:
        """The newest record of every run that has one, as (name prefix for ordering, record).
        Unreadable or foreign files under `_lease/` are ignored."""
        newest: dict[str, tuple[str, str]] = {}
        for path in self.storage.list_dir(LEASE_DIR):
            m = _NAME.match(path)
            if m is None:
                continue
            key = f"{m.group(1)}-{m.group(2)}"
            if m.group(2) not in newest or path > newest[m.group(2)][1]:
                newest[m.group(2)] = (key, path)
        out = []
        for key, path in newest.values():
            data = self.storage.read_file(path)
            if data is None:
                continue
            try:
                out.append((key, msgspec.json.decode(data, type=LeaseRecord)))
            except msgspec.DecodeError:
                continue
        return out

    def _first_holder(self, records: list[tuple[str, LeaseRecord]]) -> LeaseRecord | None:
        """Of the runs whose lease is live, the one that acquired first."""
        now = self._clock()
        live = [
            (key, r)
            for key, r in records
            if now < r.expires_ms
            and not (r.run_id != self.run_id and r.host == self.host and not _pid_alive(r.pid))
        ]
        return min(live, key=lambda kr: kr[0])[1] if live else None

    def _held_by(self, holder: LeaseRecord) -> LeaseHeldError:
        seconds = max(0, holder.expires_ms - self._clock()) / 1000
        return LeaseHeldError(
            f"job root {self.storage.describe('')} is in use by driver {holder.run_id} "
            f"(host {holder.host}, pid {holder.pid}); its lease expires in {seconds:.0f} s "
            "unless renewed. Stop that driver, or wait until its lease expires (a driver that "
            "died stops renewing) and start again; use another --job-id or --checkpoint-dir to "
            "run a second copy of the job"
        )

    @staticmethod
    def _holder_of(held: LeaseHeldError) -> str:
        return str(held).split("in use by driver ", 1)[-1].split(" (", 1)[0]

    def _expired(self, why: str) -> LeaseExpiredError:
        return LeaseExpiredError(
            f"driver {self.run_id} does not hold the lease of job root "
            f"{self.storage.describe('')}: {why}; it writes nothing until it holds it again"
        )

    def _lost(self, why: str) -> LeaseLostError:
        return LeaseLostError(
            f"driver {self.run_id} lost the lease of job root {self.storage.describe('')}: "
            f"{why}; it stops without writing. Its last completed checkpoint is intact: start "
            "the job again to resume"
        )
