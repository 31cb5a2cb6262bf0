"""The incremental plan (`cleaner.incremental`) against the full plan (`cleaner.plan`).

Over random histories of global, regional (with fallbacks, whose segments a checkpoint may copy
into a compacted file of its own) and savepoint completions, stale attempts, staged files,
events and durable-exchange segments: every file an incremental step
deletes, the full plan run on the same storage deletes too, with the same reason, detail and
phase, and nothing under `exchange/`; after a final full scan, a job root cleaned
incrementally holds exactly what one cleaned by the full plan after every checkpoint holds.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.incremental import IncrementalPlanner
from cleaner.model import (
    Action,
    ListedFile,
    Reason,
    RestoreBase,
    RetentionInputError,
    deletion_order,
)
from cleaner.plan import plan_retention
from metadata.layout import event_path, metadata_path
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState


@dataclasses.dataclass
class Root:
    """A job root in memory: path -> size, and the metadata of each `_metadata` there."""

    files: dict[str, int] = dataclasses.field(default_factory=dict)
    metadata: dict[int, CheckpointMetadata] = dataclasses.field(default_factory=dict)

    def listing(self) -> list[ListedFile]:
        return [ListedFile(p, n) for p, n in self.files.items()]

    def delete(self, path: str) -> None:
        del self.files[path]
        for cid, _ in list(self.metadata.items()):
            if path == metadata_path(cid):
                del self.metadata[cid]


@dataclasses.dataclass(frozen=True)
class Epoch:
    """One completed checkpoint: `fallback` units re-use their owner's state."""

    kind: str  # global | regional | savepoint
    fallback: frozenset[int]
    stale_attempt: bool  # a unit's earlier attempt left its file behind
    staged: bool  # a sink staged a file under the checkpoint's directory
    compact: bool = False  # fallback segments copied into chk-<id>/compacted-r.state


UNITS = 3
epochs = st.lists(
    st.builds(
        Epoch,
        kind=st.sampled_from(["global", "regional", "regional", "savepoint"]),
        fallback=st.frozensets(st.integers(0, UNITS - 1)),
        stale_attempt=st.booleans(),
        staged=st.booleans(),
        compact=st.booleans(),
    ),
    min_size=1,
    max_size=14,
)


class Job:
    """Writes checkpoints the way the runtime does: fresh units' state files, the owner
    references of fallback units, `_metadata` last, then the checkpoint's event."""

    def __init__(self) -> None:
        self.owner = dict.fromkeys(range(UNITS), 0)
        self.handle: dict[int, StateHandle] = {}  # unit -> where its latest state is
        self.next_id = 1

    def complete(self, epoch: Epoch, roots: list[Root]) -> CheckpointMetadata:
        cid = self.next_id
        self.next_id += 1
        regional = epoch.kind == "regional" and cid > 1
        subtasks, units = [], []
        compacted = f"chk-{cid}/compacted-r.state"
        refs: dict[int, int] = {}  # fallback unit -> its owner
        for u in range(UNITS):
            if regional and u in epoch.fallback and self.owner[u]:
                refs[u] = self.owner[u]
                units.append(UnitState(u, refs[u], "timeout"))
            else:
                self.owner[u] = cid
                self.handle[u] = StateHandle(f"chk-{cid}/u{u}-a0.state", 0, 10 + u, 10 + u, b"")
        copied = sorted(refs) if epoch.compact else []
        size, offset = sum(self.handle[u].length for u in copied), 0
        for u in copied:  # relocated: the same state, owner unchanged, in a file of this one
            self.handle[u] = StateHandle(compacted, offset, self.handle[u].length, size, b"")
            offset += self.handle[u].length
        for u in range(UNITS):
            subtasks.append(SubtaskState("map", u, u, refs.get(u), handles=(self.handle[u],)))
        kind = "regional" if units else ("savepoint" if epoch.kind == "savepoint" else "global")
        md = CheckpointMetadata(
            checkpoint_id=cid,
            job_id="j",
            kind=kind,
            trigger_time_ms=cid,
            completion_time_ms=cid,
            units=tuple(units),
            subtasks=tuple(subtasks),
        )
        for root in roots:
            for s in subtasks:
                h = s.handles[0]
                if h.path.startswith(f"chk-{cid}/"):  # fresh, or this checkpoint's copy
                    root.files[h.path] = h.size
            if epoch.stale_attempt:
                root.files[f"chk-{cid}/u0-a1.state"] = 7
            if epoch.staged:
                root.files[f"chk-{cid}/part-0.parquet"] = 5
            root.files[f"exchange/seg-{cid}.arrow"] = 3
            root.files[metadata_path(cid)] = 100 + cid
            root.metadata[cid] = md
        return md


def full_plan(root: Root, num_retained: int, events: int, base: RestoreBase | None):
    return plan_retention(
        list(root.metadata.values()),
        root.listing(),
        num_retained=num_retained,
        num_retained_events=events,
        restore_base=base,
    )


def clean_fully(root: Root, num_retained: int, events: int, base: RestoreBase | None):
    plan = full_plan(root, num_retained, events, base)
    for d in plan.deletions:
        root.delete(d.path)
    return plan


@settings(max_examples=300, deadline=None)
@given(
    history=epochs,
    num_retained=st.integers(1, 3),
    events=st.integers(0, 3),
    seed_at=st.integers(0, 6),
    no_claim=st.booleans(),
)
def test_incremental_deletes_only_what_the_full_plan_deletes_and_converges(
    history: list[Epoch], num_retained: int, events: int, seed_at: int, no_claim: bool
) -> None:
    base = RestoreBase(1, "no-claim") if no_claim else None
    full, incr = Root(), Root()
    job = Job()
    planner: IncrementalPlanner | None = None
    for i, epoch in enumerate(history):
        md = job.complete(epoch, [full, incr])
        event = event_path(md.checkpoint_id, 1000 + md.checkpoint_id)
        clean_fully(full, num_retained, events, base)
        full.files[event] = 40
        clean_fully(full, num_retained, events, base)
        if planner is None and i < seed_at:  # before start-up: a full scan after each step
            clean_fully(incr, num_retained, events, base)
            incr.files[event] = 40
            clean_fully(incr, num_retained, events, base)
            continue
        if planner is None:  # start-up: one full scan, then incremental
            scanned = list(incr.metadata.values())
            plan = clean_fully(incr, num_retained, events, base)
            planner = IncrementalPlanner.after_scan(
                plan, scanned, restore_base=base, num_retained_events=events
            )
            steps = []
        else:
            steps = [planner.completed(md, 100 + md.checkpoint_id)]
        incr.files[event] = 40
        steps.append(planner.event_written(event, 40))
        for step in steps:
            expected = {f.path: f for f in full_plan(incr, num_retained, events, base).files}
            assert list(step.deletions) == sorted(step.deletions, key=deletion_order)
            for d in step.deletions:
                assert not d.path.startswith("exchange/")
                f = expected[d.path]
                assert (f.action, f.reason, f.detail, f.phase, f.checkpoint_id, f.size) == (
                    Action.DELETE,
                    d.reason,
                    d.detail,
                    d.phase,
                    d.checkpoint_id,
                    d.size,
                ), d.path
            for d in step.deletions:
                incr.delete(d.path)
    clean_fully(incr, num_retained, events, base)
    assert sorted(incr.files) == sorted(full.files)


def _history(*kinds_and_fallbacks: tuple[str, set[int]]) -> list[Epoch]:
    return [Epoch(k, frozenset(f), False, False) for k, f in kinds_and_fallbacks]


def test_an_owner_keeps_its_referenced_file_until_its_last_referrer_leaves() -> None:
    root, job = Root(), Job()
    planner = IncrementalPlanner(num_retained=1)
    deleted = []
    history = _history(("global", set()), ("regional", {0}), ("regional", {0}), ("global", set()))
    for epoch in history:
        md = job.complete(epoch, [root])
        deleted.append([(d.path, d.reason.value) for d in planner.completed(md).deletions])
    assert deleted == [
        [],
        [("chk-1/_metadata", "subsumed"), ("chk-1/u1-a0.state", "subsumed"),
         ("chk-1/u2-a0.state", "subsumed")],
        [("chk-2/_metadata", "subsumed"), ("chk-2/u1-a0.state", "subsumed"),
         ("chk-2/u2-a0.state", "subsumed")],
        [("chk-3/_metadata", "subsumed"), ("chk-1/u0-a0.state", "orphan"),
         ("chk-3/u1-a0.state", "subsumed"), ("chk-3/u2-a0.state", "subsumed")],
    ]  # fmt: skip


def test_a_no_claim_base_and_savepoints_are_never_deleted() -> None:
    root, job = Root(), Job()
    planner = IncrementalPlanner(num_retained=1, restore_base=RestoreBase(1, "no-claim"))
    paths = []
    history = _history(("global", set()), ("savepoint", set()), *[("global", set())] * 2)
    for epoch in history:
        paths += [d.path for d in planner.completed(job.complete(epoch, [root])).deletions]
    assert paths == [
        "chk-3/_metadata", "chk-3/u0-a0.state", "chk-3/u1-a0.state", "chk-3/u2-a0.state",
    ]  # fmt: skip


def test_what_the_full_scan_kept_whole_is_never_touched() -> None:
    root, job = Root(), Job()
    for epoch in _history(("global", set()), ("global", set())):
        job.complete(epoch, [root])
    root.files["chk-2/_metadata"] = 1  # damaged: the scan could not decode it
    damaged = root.metadata.pop(2)
    plan = plan_retention(list(root.metadata.values()), root.listing(), num_retained=1, damaged=[2])
    assert plan.checkpoint(2).reason is Reason.DAMAGED
    planner = IncrementalPlanner.after_scan(plan, list(root.metadata.values()))
    assert planner.retained == (1,)
    steps = [planner.completed(job.complete(e, [root])) for e in _history(("global", set()))]
    assert [d.path for d in steps[0].deletions] == [
        "chk-1/_metadata", "chk-1/u0-a0.state", "chk-1/u1-a0.state", "chk-1/u2-a0.state",
    ]  # fmt: skip
    assert damaged.checkpoint_id not in {d.checkpoint_id for s in steps for d in s.deletions}


def test_checkpoints_out_of_order_are_refused_with_the_fix() -> None:
    planner = IncrementalPlanner(num_retained=2)
    job = Job()
    md = job.complete(_history(("global", set()))[0], [Root()])
    planner.completed(md)
    with pytest.raises(
        RetentionInputError,
        match=r"^checkpoint 1 completed after checkpoint 1: the incremental plan takes completed "
        r"checkpoints in increasing id order; re-plan with a full scan \(`regional clean`\)$",
    ):
        planner.completed(md)


def test_events_beyond_the_newest_n_expire_oldest_first() -> None:
    planner = IncrementalPlanner(num_retained=1, num_retained_events=2)
    steps = [planner.event_written(event_path(c, 5), 40) for c in (1, 2, 3, 4)]
    assert [[(d.path, d.reason.value, d.detail) for d in s.deletions] for s in steps] == [
        [],
        [],
        [("events/000000000001-5.json", "expired-event", "event older than the newest 2 events")],
        [("events/000000000002-5.json", "expired-event", "event older than the newest 2 events")],
    ]
    assert planner.event_written("exchange/000000000009-5.json").deletions == ()
