"""Hypothesis stateful test of the cleaner over real local storage.

Random sequences of checkpoint attempts (unit attempt files, stale attempts), global and
regional completions with owner references, aborts, cleans that crash part-way, and restores
(claim and no-claim). After every step: every file a retained or pending checkpoint references
exists, the newest completed checkpoint is restorable, nothing a no-claim restore base owns is
deleted, and no plan notifies a referenced checkpoint as subsumed. After every clean that ran
to the end: nothing unreferenced is left (no leak).
"""

from __future__ import annotations

import shutil
import tempfile
import threading

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from cleaner.plan import PendingFiles, RestoreBase
from cleaner.run import execute, scan
from metadata.format import segment_checksum
from metadata.layout import metadata_path
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState
from metadata.storage import JobStorage

UNITS = 3


class Crash(BaseException):
    """Stands for the process dying mid-clean."""


class CrashingStorage:
    def __init__(self, storage: JobStorage, after: int) -> None:
        self.storage, self.left, self.lock = storage, after, threading.Lock()

    def delete_file(self, relpath: str) -> bool:
        with self.lock:
            if self.left <= 0:
                raise Crash(relpath)
            self.left -= 1
        return self.storage.delete_file(relpath)


def _handles(path: str) -> list[StateHandle]:
    """Handles of the two segments `CleanerMachine.upload` writes to `path`."""
    segs = [f"{path}:0".encode(), f"{path}:1".encode()]
    size = sum(len(s) for s in segs)
    return [
        StateHandle(path, offset, len(seg), size, segment_checksum(seg))
        for offset, seg in zip((0, len(segs[0])), segs, strict=True)
    ]


class CleanerMachine(RuleBasedStateMachine):
    """A model coordinator writing real checkpoints, and the cleaner run against them."""

    @initialize(num_retained=st.integers(1, 3))
    def setup(self, num_retained: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="cleaner-stateful-")
        self.storage = JobStorage(self.dir, "job")
        self.num_retained = num_retained
        self.next_id = 1
        self.owner: dict[int, int] = {}  # unit -> checkpoint whose file holds its latest state
        self.owner_paths: dict[int, str] = {}  # unit -> that file
        self.refs: dict[int, set[str]] = {}  # completed checkpoint -> paths it references
        self.pending: int | None = None
        self.attempts: dict[int, int] = {}  # unit -> latest attempt written for `pending`
        self.pending_paths: set[str] = set()
        self.must_be_global = False
        self.restore_base: RestoreBase | None = None
        self.not_owned_files: set[str] = set()

    def teardown(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    # -- the coordinator ---------------------------------------------------------------------

    def files(self) -> set[str]:
        return {f.path for f in self.storage.list_files()}

    def completed(self) -> list[int]:
        """Completed checkpoints whose metadata is still there, oldest first."""
        present = self.files()
        return sorted(c for c in self.refs if metadata_path(c) in present)

    def live(self) -> list[PendingFiles]:
        if self.pending is None:
            return []
        return [PendingFiles(self.pending, files=tuple(self.owner_paths.values()))]

    @rule()
    def trigger(self) -> None:
        """Start a checkpoint (one still pending is given up, as a newer one subsumes it)."""
        self.pending, self.next_id = self.next_id, self.next_id + 1
        self.attempts = {}
        self.pending_paths = set()

    @rule(unit=st.integers(0, UNITS - 1))
    def upload(self, unit: int) -> None:
        """A unit attempt uploads its state file (a retry writes a new attempt)."""
        if self.pending is None:
            self.trigger()
        attempt = self.attempts.get(unit, -1) + 1
        self.attempts[unit] = attempt
        path = f"chk-{self.pending}/u{unit}-a{attempt}.state"
        self.storage.write_segments(path, [f"{path}:0".encode(), f"{path}:1".encode()])
        self.pending_paths.add(path)

    @rule(failed=st.sets(st.integers(0, UNITS - 1), max_size=UNITS - 1))
    def complete(self, failed: set[int]) -> None:
        """Complete the pending checkpoint: `failed` units fall back to their owner's file."""
        if self.pending is None:
            self.trigger()
        cid = self.pending
        assert cid is not None
        if not self.owner or self.must_be_global:
            failed = set()
        subtasks, units, paths = [], [], set()
        for u in range(UNITS):
            if u in failed:
                owner: int | None = self.owner[u]
                path = self.owner_paths[u]
                units.append(UnitState(u, owner, "declined"))
            else:
                if u not in self.attempts:
                    self.upload(u)
                owner = None
                path = f"chk-{cid}/u{u}-a{self.attempts[u]}.state"
            paths.add(path)
            subtasks += [
                SubtaskState("map", 2 * u + i, u, ref_checkpoint_id=owner, handles=(h,))
                for i, h in enumerate(_handles(path))
            ]
        self.storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id="job",
                kind="regional" if failed else "global",
                trigger_time_ms=cid,
                completion_time_ms=cid,
                units=tuple(units),
                subtasks=tuple(subtasks),
            )
        )
        self.refs[cid] = paths
        for u in set(range(UNITS)) - failed:
            self.owner[u] = cid
            self.owner_paths[u] = f"chk-{cid}/u{u}-a{self.attempts[u]}.state"
        if not failed:
            self.must_be_global = False
        self.pending = None

    @rule()
    def abort(self) -> None:
        self.pending = None

    @rule(crash_after=st.none() | st.integers(0, 6), workers=st.sampled_from([1, 3]))
    def clean(self, crash_after: int | None, workers: int) -> None:
        plan = scan(
            self.storage,
            num_retained=self.num_retained,
            pending=self.live(),
            restore_base=self.restore_base,
        )
        assert plan.refused == ()
        kept_refs = {p for c in plan.retained_ids for p in self.refs[c]}
        for sid in plan.subsumed_ids:  # never notify a checkpoint whose files are still needed
            assert not any(p.startswith(f"chk-{sid}/") for p in kept_refs), sid
        target = self.storage if crash_after is None else CrashingStorage(self.storage, crash_after)
        try:
            report = execute(plan, target, live=self.live, max_workers=workers)
        except Crash:
            return
        assert report.ok
        # No leak: exactly what retained and pending checkpoints need (and a no-claim base) stays.
        retained = plan.retained_ids
        expected = {p for c in retained for p in self.refs[c]}
        expected |= {metadata_path(c) for c in retained}
        if self.pending is not None:
            expected |= {p for p in self.files() if p.startswith(f"chk-{self.pending}/")}
        expected |= self.not_owned_files & self.files()
        assert self.files() == expected

    @rule(mode=st.sampled_from(["claim", "no-claim"]))
    def restore(self, mode: str) -> None:
        """The job dies (its pending checkpoint with it) and restarts from the latest
        restorable checkpoint."""
        self.pending = None
        md = self.storage.find_latest_restorable(warn=False)
        if md is None:
            return
        assert md.checkpoint_id == max(self.completed())
        self.owner_paths = {}
        for s in md.subtasks:
            self.owner[s.unit_id] = s.ref_checkpoint_id or md.checkpoint_id
            self.owner_paths[s.unit_id] = s.handles[0].path
        if mode == "no-claim" and self.restore_base is None:
            self.restore_base = RestoreBase(md.checkpoint_id, "no-claim")
            self.must_be_global = True
            self.not_owned_files = {
                p
                for p in self.files()
                if p.startswith("chk-") and int(p[4 : p.index("/")]) <= md.checkpoint_id
            }

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def retained_and_pending_files_exist(self) -> None:
        if not hasattr(self, "storage"):
            return
        present = self.files()
        done = self.completed()
        for cid in done[-self.num_retained :]:
            missing = self.refs[cid] - present
            assert not missing, (cid, missing)
        if self.refs:
            assert done, "the newest completed checkpoint lost its metadata"
            assert max(done) == max(self.refs)
        if self.pending is not None:
            assert self.pending_paths <= present
            for u in range(UNITS):
                if u in self.owner:
                    assert self.owner_paths[u] in present
        assert self.not_owned_files <= present


CleanerMachine.TestCase.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
test_cleaner_state_machine = CleanerMachine.TestCase
