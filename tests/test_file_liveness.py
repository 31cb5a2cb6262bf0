"""Segment-level liveness of merged state files (DESIGN §4 rule 16): the cleaner deletes a
physical file only when no retained or pending checkpoint references any segment of it, explains
what keeps a merged file, and reports live / physical bytes; savepoints copy only the
referenced segments."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.model import Action, ListedFile, PendingFiles
from cleaner.plan import plan_retention
from cleaner.views import retention_totals
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState
from metadata.savepoint import open_checkpoint, write_savepoint
from metadata.storage import JobStorage


def _segment_length(checkpoint_id: int, unit: int) -> int:
    return 3 + (unit * 7 + checkpoint_id * 5) % 11


class _Job:
    """A job whose units run in `tasks` Spark tasks: each task writes one merged state file per
    checkpoint holding a segment per acked unit (fresh, or acked and declared fallen back later)."""

    def __init__(self, units: int, tasks: int) -> None:
        self.units, self.tasks = units, tasks
        self.owner_handle: dict[int, StateHandle] = {}  # unit -> its latest fresh segment
        self.owner_id: dict[int, int] = {}
        self.files: dict[str, int] = {}  # the listing: path -> size

    def checkpoint(
        self, cid: int, fallback: set[int], acked_then_fell_back: set[int]
    ) -> CheckpointMetadata:
        fallback = {u for u in fallback if u in self.owner_handle}  # never checkpointed: fresh
        writers = [u for u in range(self.units) if u not in fallback or u in acked_then_fell_back]
        handles: dict[int, StateHandle] = {}
        for task in range(self.tasks):
            mine = [u for u in writers if u % self.tasks == task]
            if not mine:
                continue
            path = f"chk-{cid}/u{mine[0]}-a1-r.state"
            size = sum(_segment_length(cid, u) for u in mine)
            offset = 0
            for u in mine:
                n = _segment_length(cid, u)
                handles[u] = StateHandle(path, offset, n, size, b"c" * 16)
                offset += n
            self.files[path] = size
        subtasks, units = [], []
        for u in range(self.units):
            if u in fallback:
                owner = self.owner_id[u]
                subtasks.append(SubtaskState("op", u, u, owner, (self.owner_handle[u],)))
                units.append(UnitState(u, owner, "declined"))
            else:
                subtasks.append(SubtaskState("op", u, u, handles=(handles[u],), attempt=1))
                units.append(UnitState(u))
                self.owner_handle[u], self.owner_id[u] = handles[u], cid
        self.files[f"chk-{cid}/_metadata"] = 100
        return CheckpointMetadata(
            checkpoint_id=cid,
            job_id="j",
            kind="regional" if fallback else "global",
            trigger_time_ms=cid,
            completion_time_ms=cid,
            units=tuple(units),
            subtasks=tuple(subtasks),
        )


def _brute_live(kept: list[CheckpointMetadata], listed: dict[str, int]) -> tuple[int, int]:
    segments = {
        (h.path, h.offset, h.length)
        for md in kept
        for s in md.subtasks
        for h in s.handles
        if h.path in listed
    }
    paths = {p for p, _, _ in segments}
    return sum(n for _, _, n in segments), sum(listed[p] for p in paths)


_steps = st.lists(
    st.tuples(st.frozensets(st.integers(0, 7)), st.frozensets(st.integers(0, 7)), st.booleans()),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(
    units=st.integers(2, 8),
    tasks=st.integers(1, 3),
    num_retained=st.integers(1, 3),
    steps=_steps,
)
def test_a_physical_file_is_deleted_only_when_no_kept_or_pending_checkpoint_references_a_segment(
    units, tasks, num_retained, steps
):
    job = _Job(units, tasks)
    completed: dict[int, CheckpointMetadata] = {}
    for cid, (fallback, late, pending_next) in enumerate(steps, start=1):
        completed[cid] = job.checkpoint(cid, set(fallback), set(late))
        # a checkpoint in progress protects the owner files its fallback state will reference
        pending = ()
        if pending_next:
            owners = tuple({job.owner_handle[u].path for u in fallback if u in job.owner_handle})
            pending = (PendingFiles(cid + 1, owners),)
        listing = [ListedFile(p, n) for p, n in job.files.items()]
        plan = plan_retention(
            list(completed.values()),
            listing,
            num_retained=num_retained,
            pending=pending,
            liveness_totals=True,
        )
        kept = [completed[k] for k in plan.retained_ids]
        referenced = {h.path for md in kept for s in md.subtasks for h in s.handles}
        referenced |= {p for pend in pending for p in pend.files}
        assert (plan.live_bytes, plan.physical_bytes) == _brute_live(kept, job.files)
        for d in plan.deletions:
            assert d.path not in referenced, (d.path, d.reason, d.detail)
            del job.files[d.path]
            if d.path.endswith("/_metadata"):
                completed.pop(int(d.path[4:].split("/")[0]))
        # and every state file nothing references is gone (no space leak)
        assert {p for p in job.files if p.endswith(".state")} == referenced & set(job.files)
        assert referenced <= set(job.files)


def _merged_job() -> tuple[_Job, list[CheckpointMetadata]]:
    # units 6, 7, 8 in one task; unit 7 falls back in checkpoints 10, 11, 12 to its owner 9
    job = _Job(units=9, tasks=1)
    for u in range(6):
        job.owner_handle[u] = StateHandle("chk-1/u0-a1-r.state", u, 1, 6, b"c" * 16)
        job.owner_id[u] = 1
    mds = [job.checkpoint(9, set(), set())]
    mds += [job.checkpoint(cid, {7}, set()) for cid in (10, 11, 12)]
    job.files["chk-1/u0-a1-r.state"] = 6
    return job, mds


def test_a_merged_file_kept_for_a_fallback_unit_says_which_segment_keeps_it():
    job, mds = _merged_job()
    listing = [ListedFile(p, n) for p, n in job.files.items()]
    plan = plan_retention(mds, listing, num_retained=1, liveness_totals=True)
    [kept] = [f for f in plan.files if f.path == "chk-9/u0-a1-r.state"]
    segment = _segment_length(9, 7)
    assert (kept.action, kept.reason.value) == (Action.KEEP, "referenced")
    assert kept.detail == (
        f"segment of unit 7 referenced by chk-12 (fallback owner 9); "
        f"live {segment} of {job.files['chk-9/u0-a1-r.state']} bytes"
    )
    assert [d.path for d in plan.deletions if d.path.endswith(".state")] == [
        "chk-1/u0-a1-r.state",
        "chk-10/u0-a1-r.state",
        "chk-11/u0-a1-r.state",
    ]
    own = job.files["chk-12/u0-a1-r.state"]
    totals = retention_totals(plan).to_pylist()[0]
    assert (totals["live_bytes"], totals["physical_bytes"]) == (
        own + segment,
        own + job.files["chk-9/u0-a1-r.state"],
    )


def test_the_old_file_goes_once_the_unit_snapshots_fresh_and_its_referrers_are_subsumed():
    job, mds = _merged_job()
    mds.append(job.checkpoint(13, set(), set()))  # unit 7 fresh again
    listing = [ListedFile(p, n) for p, n in job.files.items()]
    plan = plan_retention(mds, listing, num_retained=1, liveness_totals=True)
    [gone] = [d for d in plan.deletions if d.path == "chk-9/u0-a1-r.state"]
    assert gone.reason.value == "orphan" or gone.reason.value == "subsumed"
    assert plan.live_bytes == plan.physical_bytes == job.files["chk-13/u0-a1-r.state"]


def test_a_savepoint_copies_only_the_referenced_segments_of_a_merged_file(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    # a task's file: units 0 and 2 in the savepoint, a segment in between nobody references
    h0, _unreferenced, h2 = storage.write_segments(
        "chk-4/u0-a1-r.state", [b"zero", b"declined-later", b"two!"]
    )
    md = CheckpointMetadata(
        checkpoint_id=4,
        job_id="job",
        kind="savepoint",
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=(SubtaskState("op", 0, 0, handles=(h0,)), SubtaskState("op", 2, 2, handles=(h2,))),
    )
    source = open_checkpoint(write_savepoint(storage, md))
    handles = [s.handles[0] for s in source.metadata.subtasks]
    assert [(h.path, h.offset, h.length, h.size) for h in handles] == [
        ("u0-a1-r.state", 0, 4, 8),
        ("u0-a1-r.state", 4, 4, 8),
    ]
    assert [source.storage.read_segment(h) for h in handles] == [b"zero", b"two!"]


def test_validate_names_a_damaged_segment_of_a_merged_file_in_every_checkpoint_using_it(tmp_path):
    from metadata.validate import validate_job

    storage = JobStorage(str(tmp_path), "job")

    def checkpoint(cid: int, subtasks) -> None:
        storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id="job",
                kind="regional" if cid > 1 else "global",
                trigger_time_ms=cid,
                completion_time_ms=cid,
                subtasks=tuple(subtasks),
            )
        )

    h0, h1 = storage.write_segments("chk-1/u0-a1-r.state", [b"unit zero", b"unit one"])
    checkpoint(
        1, [SubtaskState("op", 0, 0, handles=(h0,)), SubtaskState("op", 1, 1, handles=(h1,))]
    )
    [h0b] = storage.write_segments("chk-2/u0-a1-r.state", [b"unit zero again"])
    checkpoint(2, [SubtaskState("op", 0, 0, handles=(h0b,)), SubtaskState("op", 1, 1, 1, (h1,))])
    with open(f"{storage.job_path}/chk-1/u0-a1-r.state", "r+b") as f:  # damage unit 1's segment
        f.seek(h1.offset)
        f.write(b"X")
    report = validate_job(storage)
    assert sorted((p.checkpoint_id, p.path) for p in report.problems) == [
        (1, "chk-1/u0-a1-r.state"),
        (2, "chk-1/u0-a1-r.state"),
    ]
    assert all(f"segment at {h1.offset}+{h1.length} fails its checksum" in p.problem
               for p in report.problems)  # fmt: skip
    assert report.restore_checkpoint_id is None
