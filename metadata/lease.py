"""The job-root lease: one driver per job root at a time, on local disks and object stores.

Two drivers on one job root would overwrite and delete each other's files. Before a driver
writes anything it takes the root's lease; it renews the lease while it runs and checks it
before every write that others could see (metadata, commits, events, cleaning). A second driver
is refused while the lease is held, with a message naming the holder and when the lease expires.

The lease is a sequence of **generations**. Taking it means creating the record of the next
generation, `_lease/g<N>.json`, with an atomic create-if-absent (`JobStorage.create_new`: a
no-clobber link on a local disk, a conditional `If-None-Match: *` put on S3, a claim protocol
elsewhere; `metadata.exclusive`). Of drivers racing for generation N exactly one creates it,
whatever their clocks say and however slow their writes are; the others read it and are refused.
The holder of N renews by writing `_lease/g<N>-r<k>.json` (names only it writes) and releases
by writing a renewal marked released:

```
_lease/g000000000007.json              generation 7: {run_id, host, pid, acquired_ms, ...}
_lease/g000000000007-r000000012.json   its 12th renewal: expires_ms
```

The newest generation's newest record says who holds the lease and until when. A driver may
take generation N+1 only when that record expired, was released, or names a process of this
host that is gone (a killed local driver does not block its restart). Expiry is the only place
clocks matter: the drivers' clocks must agree to well within the TTL for a lapsed holder to stop
before another takes over. The start race does not depend on clocks at all.

Fencing: `check` (before every write that matters) reads exactly two records, and never lists
`_lease/` (a LIST per write would be most of a checkpoint's requests on S3): a HEAD of the next
generation's first record `g<N+1>.json` (it exists: another driver took a newer generation,
`LeaseLostError`), then a read of its own first record `g<N>.json` (gone, or not the bytes this
driver wrote: the lease records were removed or replaced, so it can no longer tell who holds
the lease, `LeaseLostError` too). It also refuses while its own lease is within a quarter TTL of
expiring (`LeaseExpiredError`) until `ensure` took it again. The new holder of N+1 deletes the
records of older generations; the newest generation's record is never deleted, so numbers
never repeat. `acquire` (at a driver's start, or after a lapse) still lists `_lease/`.

Why two records suffice, on every store, whatever the clocks. Let H be a driver that created
`g<N>.json` holding its record R. Three rules of this module:

1. *A generation starts only on its predecessor's record.* A driver takes generation G = top+1
   only when its listing of `_lease/` showed `g<top>.json`; when the top generation has no
   first record (only claims of an abandoned claim-protocol create, or only renewals), it first
   writes one there, a *skip record* (`skipped`, released: nobody holds it) with a plain
   overwrite, and lists again. The first file of generation G (its record, or a claim of the
   claim protocol, made after that listing) is therefore written after `g<G-1>.json` was.
2. *First records are deleted oldest first.* Only `_prune` deletes first records: the taker of
   K deletes those of generations below K in ascending order and stops at the first failure.
   Skip writes and renewals never delete one; only H ever writes the bytes R, once.
3. *Taking checks once by listing.* After creating `g<N>.json`, `acquire` lists `_lease/` and
   gives the generation up if a record of a newer one is there.

Claim: once another driver created (with the create-if-absent of `metadata.exclusive`: os.link
on a local disk, `If-None-Match: *` on S3, the token-ordered claims elsewhere) the record of
some generation M > N, then at every later moment `g<N+1>.json` exists or `g<N>.json` no longer
holds R, and the latter stays true once true. (Listings are assumed to show every completed
write, as the claim protocol already assumes; S3 and local disks do.) Proof: by rule 1 applied
from M down to N+1, `g<N+1>.json` was written, at some time t1. The newest generation's first
record is never deleted (by rule 2 only a taker of a higher one deletes it), so had t1 come
before H's listing, that listing would have shown a record newer than N: t1 is after it, after
R was written. By rule 2, whoever deletes `g<N+1>.json` (a taker of K >= N+2, whose listing
came after `g<K-1>.json`, hence after t1) deleted `g<N>.json` first or did not list it, i.e. R
was deleted; nothing writes R again. Hence `check` — HEAD `g<N+1>.json`, *then* read
`g<N>.json` — passes only if no newer generation had a record at its HEAD: if one had, either
the HEAD finds `g<N+1>.json`, or R was already gone at the HEAD and the read after it fails.
This holds under all three create modes, including an abandoned claim (rule 1's skip record
takes its generation's place, so the chain has no gap), and a skip record written late (by a
driver paused between listing and writing) only adds a file: it never holds R.

>>> import tempfile
>>> from metadata.storage import JobStorage
>>> storage = JobStorage(tempfile.mkdtemp(), "job")
>>> now = [1_000_000]
>>> a = JobLease(storage, "run-a", ttl_ms=60_000, clock=lambda: now[0])
>>> a.acquire(); a.held, a.generation
(True, 1)
>>> b = JobLease(storage, "run-b", ttl_ms=60_000, clock=lambda: now[0], host="elsewhere")
>>> b.acquire()  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.lease.LeaseHeldError: job root .../job is in use by driver run-a (host ..., pid ...) ...
>>> now[0] += 61_000  # run-a stopped renewing: its lease expired
>>> b.acquire(); b.held, b.generation
(True, 2)
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
from metadata.exclusive import claim_age_ms
from metadata.layout import LEASE_DIR
from metadata.storage import JobStorage

__all__ = [
    "JobLease",
    "LeaseExpiredError",
    "LeaseHeldError",
    "LeaseLostError",
    "LeaseRecord",
    "ensure_free",
    "lease_record_path",
]

_RECORD = re.compile(r"^_lease/g(\d{12})(?:-r(\d{9}))?\.json$")
_CLAIM = re.compile(r"^_lease/g(\d{12})\.json\.claim-")

#: How many times `_lease/` is listed again when a record vanished between listing and reading
#: (a renewal replaced it) or another driver created the generation this one tried to create.
_ATTEMPTS = 10


class LeaseHeldError(StorageError):
    """Another driver holds the job root's lease: this one does not start (exit code 2, as for
    bad usage: the job root given is in use)."""

    exit_code = 2


class LeaseLostError(StorageError):
    """Another driver holds the job root's lease now: this one must stop."""


class LeaseExpiredError(StorageError):
    """This driver's lease lapsed (or was released): it must not write until `ensure` took it
    again. Nobody is known to have taken it over."""


class LeaseRecord(msgspec.Struct, frozen=True):
    """One record of a driver's lease: who holds `generation`, and until when."""

    run_id: str
    host: str
    pid: int
    acquired_ms: int
    expires_ms: int
    generation: int = 0
    released: bool = False
    #: A skip record: written by `run_id` in place of a generation whose create was abandoned
    #: (only claims, no record; rule 1 of the module docstring). Released: nobody holds it.
    skipped: bool = False


def lease_record_path(generation: int, renewal: int = 0) -> str:
    """`_lease/g<generation>.json` (the record that takes it), or a renewal's record.

    >>> lease_record_path(7), lease_record_path(7, 12)
    ('_lease/g000000000007.json', '_lease/g000000000007-r000000012.json')
    """
    base = f"{LEASE_DIR}/g{generation:012d}"
    return f"{base}.json" if renewal == 0 else f"{base}-r{renewal:09d}.json"


class _State(msgspec.Struct, frozen=True):
    """What `_lease/` says: the newest generation (0: none), its newest readable record, the
    age of the youngest claim when that generation has claims but no record yet (someone is
    taking it now), and every lease file listed."""

    generation: int
    record: LeaseRecord | None
    claim_age_ms: int | None
    paths: tuple[str, ...]


def _generations(paths: list[str]) -> tuple[dict[int, list[tuple[int, str]]], dict[int, list[str]]]:
    """Record paths by generation as (renewal, path), and claim paths by generation."""
    records: dict[int, list[tuple[int, str]]] = {}
    claims: dict[int, list[str]] = {}
    for path in paths:
        if (m := _RECORD.match(path)) is not None:
            records.setdefault(int(m.group(1)), []).append((int(m.group(2) or 0), path))
        elif (m := _CLAIM.match(path)) is not None:
            claims.setdefault(int(m.group(1)), []).append(path)
    return records, claims


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
    probe._refuse_if_held(probe._state(), ttl_ms=1)


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
        self._first: bytes | None = None  # the bytes of this driver's first record
        self._generation = 0
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
    def generation(self) -> int:
        """The generation this driver took last (0: never)."""
        return self._generation

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
            for _ in range(_ATTEMPTS):
                state = self._state()
                self._refuse_if_held(state, ttl_ms=self.ttl_ms)
                top = lease_record_path(state.generation)
                if state.generation > 0 and top not in state.paths:
                    self._write_skip(state.generation)  # rule 1: no gap in the chain
                    continue
                generation = state.generation + 1
                now = self._clock()
                record = LeaseRecord(
                    self.run_id, self.host, self.pid, now, now + self.ttl_ms, generation
                )
                path = lease_record_path(generation)
                data = msgspec.json.encode(record)
                if not self.storage.create_new(path, data):
                    continue  # another driver took this generation first: it holds the lease
                self._record, self._path, self._lost_why = record, path, None
                self._generation, self._renewal, self._first = generation, 0, data
                newer = self._newer_listed()  # rule 3
                if newer is not None:  # a driver paused long enough for a newer generation
                    self._record = None
                    raise self._held_by(newer)
                self._prune(state.paths)
                return
            raise StorageError(
                f"cannot take the lease of job root {self.storage.describe('')}: its records "
                f"under {LEASE_DIR}/ kept changing while {_ATTEMPTS} attempts read them; start "
                "again"
            )

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
            record = msgspec.structs.replace(self._record, expires_ms=self._clock() + self.ttl_ms)
            self._put_renewal(record)

    def check(self) -> None:
        """Before a write: raise unless the lease is held with a quarter of the TTL to spare
        (room for the write) and no other driver took a newer generation (read from storage,
        so a driver sees another holder before its write, not at its next renewal: a HEAD of
        `g<N+1>.json` and a read of `g<N>.json`, no listing; see the module docstring).
        `LeaseLostError` if another driver took it over, `LeaseExpiredError` if it lapsed or was
        never taken."""
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
            newer = self._newer_holder()
            if newer is not None:
                self._record = None
                self._lost_why = f"driver {newer.run_id} (host {newer.host}) holds it now"
                raise self._lost(self._lost_why)

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
        """Give the lease up (a clean stop): the next driver may start at once. Best effort:
        when storage cannot be reached the lease just expires."""
        self._stop.set()
        keeper, self._keeper = self._keeper, None
        if keeper is not None:
            keeper.join()
        with self._lock:
            record, self._record = self._record, None
            if record is None or self._lost_why is not None:
                return
            with contextlib.suppress(StorageError):
                if self._newer_holder() is None:
                    done = msgspec.structs.replace(record, expires_ms=self._clock(), released=True)
                    self._put_renewal(done)
            self._record = None

    # --- records ----------------------------------------------------------------------------

    def _put_renewal(self, record: LeaseRecord) -> None:
        """Write the next renewal record of this driver's generation; drop the previous one
        (the generation's first record stays: generation numbers never repeat)."""
        self._renewal += 1
        path = lease_record_path(self._generation, self._renewal)
        self.storage.write_new_file(path, msgspec.json.encode(record))
        previous, self._record, self._path = self._path, record, path
        if previous is not None and previous != lease_record_path(self._generation):
            with contextlib.suppress(StorageError):
                self.storage.delete_file(previous)

    def _prune(self, paths: tuple[str, ...]) -> None:
        """Delete the records of older generations (best effort; claims are their writers'):
        oldest generation first, each generation's first record after its renewals, and stop at
        the first failure, so a first record is never gone while an older one is still there
        (rule 2 of the module docstring, which `check`'s two reads rely on)."""
        records, _ = _generations(list(paths))
        for generation in sorted(g for g in records if g < self._generation):
            for _, path in sorted(records[generation], reverse=True):  # renewals, then the first
                try:
                    self.storage.delete_file(path)
                except StorageError:
                    return  # what is left waits for the next taker

    def _write_skip(self, generation: int) -> None:
        """Write the skip record of `generation`, which has no first record (rule 1 of the
        module docstring): a plain overwrite, since an abandoned claim blocks every exclusive
        create of that name. Released, so it holds nothing; any record there is replaced (its
        holder's next `check` fails: the bytes it wrote are gone)."""
        now = self._clock()
        skip = LeaseRecord(
            self.run_id, self.host, self.pid, now, now, generation, released=True, skipped=True
        )
        self.storage.replace_file(lease_record_path(generation), msgspec.json.encode(skip))

    def _state(self) -> _State:
        """Read `_lease/`: the newest generation and its newest readable record. A record
        deleted between listing and reading (replaced by a renewal) makes it list again."""
        for _ in range(_ATTEMPTS):
            paths = self.storage.list_dir(LEASE_DIR)
            records, claims = _generations(paths)
            top = max([*records, *claims], default=0)
            if top not in records:
                now = self._clock()
                ages = [a for p in claims.get(top, []) if (a := claim_age_ms(p, now)) is not None]
                return _State(top, None, min(ages, default=None), tuple(paths))
            vanished = False
            for _, path in sorted(records[top], reverse=True):
                data = self.storage.read_file(path)
                if data is None:
                    vanished = True
                    break
                try:
                    record = msgspec.json.decode(data, type=LeaseRecord)
                except msgspec.DecodeError:
                    continue  # unreadable: an older record of the generation decides
                return _State(top, record, None, tuple(paths))
            if not vanished:
                return _State(top, None, None, tuple(paths))
        raise StorageError(
            f"the lease records under {self.storage.describe(LEASE_DIR)} kept changing while "
            f"{_ATTEMPTS} attempts read them; start again"
        )

    def _newer_holder(self) -> LeaseRecord | None:
        """Without listing (`check`): the record naming who holds a generation newer than this
        driver's, or one made up when this driver's own first record is gone or replaced (the
        lease records were removed: this driver can no longer tell who holds the lease); None
        if neither. A HEAD of `g<N+1>.json`, then a read of `g<N>.json`, in that order (the
        module docstring says why that order and these two suffice). Only once a newer
        generation is found is `_lease/` listed, to name its newest holder."""
        if self.storage.exists(lease_record_path(self._generation + 1)):
            newer = self._newer_listed()
            return newer or LeaseRecord("(unknown)", "unknown", 0, 0, 0, self._generation + 1)
        if self.storage.read_file(lease_record_path(self._generation)) != self._first:
            return self._records_gone()
        return None

    def _records_gone(self) -> LeaseRecord:
        return LeaseRecord(
            f"(unknown: {LEASE_DIR}/ no longer holds this driver's record)", "unknown", 0, 0, 0
        )

    def _newer_listed(self) -> LeaseRecord | None:
        """`_newer_holder` by listing `_lease/` (`acquire`'s rule 3, and naming the holder
        once `check` found one): the newest record of the newest generation above this
        driver's, or a made-up one when this driver's own records are gone."""
        records, _ = _generations(self.storage.list_dir(LEASE_DIR))
        newer = [g for g in records if g > self._generation]
        if newer:
            for _, path in sorted(records[max(newer)], reverse=True):
                data = self.storage.read_file(path)
                with contextlib.suppress(msgspec.DecodeError):
                    if data is not None:
                        return msgspec.json.decode(data, type=LeaseRecord)
            return LeaseRecord("(unknown)", "unknown", 0, 0, 0, max(newer))
        if self._generation not in records:
            return self._records_gone()
        return None

    def _live(self, record: LeaseRecord) -> bool:
        if record.released or self._clock() >= record.expires_ms:
            return False
        foreign = record.run_id != self.run_id
        return not (foreign and record.host == self.host and not _pid_alive(record.pid))

    def _refuse_if_held(self, state: _State, *, ttl_ms: int) -> None:
        """`LeaseHeldError` if `state` shows another driver holding the lease, or taking it now
        (a claim younger than the TTL; `metadata.exclusive`)."""
        record = state.record
        if record is not None and record.run_id != self.run_id and self._live(record):
            raise self._held_by(record)
        if record is None and state.claim_age_ms is not None and state.claim_age_ms < ttl_ms:
            raise LeaseHeldError(
                f"job root {self.storage.describe('')} is being taken by another driver right "
                f"now (a claim on generation {state.generation} under {LEASE_DIR}/); start "
                "again in a moment, or use another --job-id or --checkpoint-dir to run a second "
                "copy of the job"
            )

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
