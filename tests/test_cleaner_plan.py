"""The pure retention planner: owner semantics (flink_regional.md §2.6 with owner ids), shared
files, segments, no-claim restore, damaged metadata, orphans and the exact reasons."""

from __future__ import annotations

import pytest

from cleaner.plan import (
    Action,
    ListedFile,
    PendingFiles,
    Reason,
    RestoreBase,
    RetentionInputError,
    RetentionPlan,
    plan_retention,
)
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState

SIZE = 100


class Store:
    """An in-memory job root: files (path -> size) and the completed checkpoints' metadata."""

    def __init__(self) -> None:
        self.files: dict[str, int] = {}
        self.completed: dict[int, CheckpointMetadata] = {}

    def checkpoint(
        self,
        cid: int,
        units: dict[int, int | None],
        *,
        shared: tuple[str, ...] = (),
        kind: str | None = None,
    ) -> CheckpointMetadata:
        """Complete checkpoint `cid`: unit -> None (fresh, writes chk-cid/u<unit>-a0.state) or
        the owner id whose file it re-uses. `shared` paths are referenced by unit 0."""
        subtasks = []
        for unit, owner in sorted(units.items()):
            path = f"chk-{owner if owner is not None else cid}/u{unit}-a0.state"
            if owner is None:
                self.files[path] = SIZE
            handles = [StateHandle(path, 0, SIZE, SIZE, b"")]
            if unit == 0:
                for s in shared:
                    self.files.setdefault(s, SIZE)
                    handles.append(StateHandle(s, 0, SIZE, SIZE, b"", shared=True))
            subtasks.append(
                SubtaskState("map", unit, unit, ref_checkpoint_id=owner, handles=tuple(handles))
            )
        fallback = tuple(UnitState(u, o, "declined") for u, o in units.items() if o is not None)
        md = CheckpointMetadata(
            checkpoint_id=cid,
            job_id="job",
            kind=kind or ("regional" if fallback else "global"),
            trigger_time_ms=cid,
            completion_time_ms=cid,
            units=fallback,
            subtasks=tuple(subtasks),
        )
        self.files[f"chk-{cid}/_metadata"] = 10
        self.completed[cid] = md
        return md

    def plan(self, num_retained: int = 1, **kw: object) -> RetentionPlan:
        listing = [ListedFile(p, s) for p, s in self.files.items()]
        return plan_retention(
            list(self.completed.values()), listing, num_retained=num_retained, **kw
        )

    def apply(self, plan: RetentionPlan) -> None:
        for d in plan.deletions:
            del self.files[d.path]
            cid = d.checkpoint_id
            if d.path == f"chk-{cid}/_metadata":
                del self.completed[cid]


def kept(plan: RetentionPlan) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {f.path: (f.reason.value, f.kept_by) for f in plan.files if f.action is Action.KEEP}


def deleted(plan: RetentionPlan) -> list[tuple[str, str]]:
    return [(f.path, f.reason.value) for f in plan.deletions]


def test_retain_one_keeps_only_the_owner_files_a_fallback_references() -> None:
    st = Store()
    st.checkpoint(101, {0: None, 1: None})
    st.checkpoint(102, {0: None, 1: 101})
    plan = st.plan(num_retained=1)
    assert kept(plan) == {
        "chk-101/u1-a0.state": ("referenced", (102,)),
        "chk-102/_metadata": ("retained", (102,)),
        "chk-102/u0-a0.state": ("retained", (102,)),
    }
    assert deleted(plan) == [("chk-101/_metadata", "subsumed"), ("chk-101/u0-a0.state", "subsumed")]
    c101 = plan.checkpoint(101)
    assert (c101.action, c101.reason, c101.referenced_by, c101.units) == (
        Action.KEEP_FILES,
        Reason.REFERENCED,
        (102,),
        (1,),
    )
    assert c101.detail == "metadata deleted; 1 file (100 bytes) kept for checkpoint 102 (units 1)"
    assert plan.retained_ids == (102,)
    assert plan.subsumed_ids == ()  # 101 is referenced: never notified as subsumed
    assert plan.referenced_ids == (101,)
    # Flink keeps 101 whole: its metadata and unit 0's file are what we save.
    assert (plan.kept_bytes, plan.whole_checkpoint_bytes, plan.saved_bytes) == (210, 320, 110)


def test_three_deep_fallback_of_one_unit_while_the_others_advance() -> None:
    st = Store()
    st.checkpoint(99, {0: None, 1: None, 2: None})
    st.checkpoint(100, {0: 99, 1: None, 2: None})
    st.checkpoint(101, {0: 99, 1: None, 2: None})
    st.checkpoint(102, {0: 99, 1: None, 2: None})
    plan = st.plan(num_retained=1)
    assert kept(plan) == {
        "chk-99/u0-a0.state": ("referenced", (102,)),
        "chk-102/_metadata": ("retained", (102,)),
        "chk-102/u1-a0.state": ("retained", (102,)),
        "chk-102/u2-a0.state": ("retained", (102,)),
    }
    assert [c.checkpoint_id for c in plan.checkpoints if c.action is Action.DELETE] == [100, 101]
    assert plan.subsumed_ids == (100, 101)
    assert plan.referenced_ids == (99,)
    assert plan.dropped_ids == (99, 100, 101)
    # Metadata first (oldest first), then files oldest first.
    assert deleted(plan)[:3] == [
        ("chk-99/_metadata", "subsumed"),
        ("chk-100/_metadata", "subsumed"),
        ("chk-101/_metadata", "subsumed"),
    ]
    assert {d.phase for d in plan.deletions[3:]} == {1}
    st.apply(plan)

    # Unit 0 finally checkpoints fresh in a regional checkpoint where unit 2 falls back to 102:
    # 99's last file is released and 99 is now safe to notify.
    st.checkpoint(103, {0: None, 1: None, 2: 102})
    plan = st.plan(num_retained=1)
    assert deleted(plan) == [
        ("chk-102/_metadata", "subsumed"),
        ("chk-99/u0-a0.state", "orphan"),
        ("chk-102/u1-a0.state", "subsumed"),
    ]
    assert plan.subsumed_ids == (99,)
    assert plan.checkpoint(102).action is Action.KEEP_FILES


def test_a_global_checkpoint_ends_all_protection() -> None:
    st = Store()
    st.checkpoint(99, {0: None, 1: None})
    st.checkpoint(101, {0: 99, 1: None})
    st.checkpoint(102, {0: 99, 1: 101})
    first = st.plan(num_retained=1)
    assert set(kept(first)) == {
        "chk-99/u0-a0.state",
        "chk-101/u1-a0.state",
        "chk-102/_metadata",
    }
    st.checkpoint(103, {0: None, 1: None})
    plan = st.plan(num_retained=1)
    assert set(kept(plan)) == {"chk-103/_metadata", "chk-103/u0-a0.state", "chk-103/u1-a0.state"}
    assert plan.subsumed_ids == (99, 101, 102)
    assert plan.referenced_ids == ()
    assert plan.saved_bytes == 0


def test_retained_checkpoints_within_num_retained_keep_everything_they_reference() -> None:
    st = Store()
    st.checkpoint(1, {0: None, 1: None})
    st.checkpoint(2, {0: 1, 1: None})
    st.checkpoint(3, {0: None, 1: 2})
    plan = st.plan(num_retained=2)
    assert plan.retained_ids == (2, 3)
    assert kept(plan)["chk-1/u0-a0.state"] == ("referenced", (2,))
    assert kept(plan)["chk-2/u1-a0.state"] == ("retained", (2, 3))
    assert deleted(plan) == [("chk-1/_metadata", "subsumed"), ("chk-1/u1-a0.state", "subsumed")]


def test_shared_files_are_reference_counted_across_checkpoints() -> None:
    st = Store()
    st.checkpoint(1, {0: None}, shared=("shared/a",))
    st.checkpoint(2, {0: None}, shared=("shared/a", "shared/b"))
    st.checkpoint(3, {0: None}, shared=("shared/a", "shared/b"))
    st.files["shared/never-used"] = 7
    plan = st.plan(num_retained=2)
    assert kept(plan)["shared/a"] == ("referenced", (2, 3))
    assert kept(plan)["shared/b"] == ("referenced", (2, 3))
    assert ("shared/never-used", "orphan") in deleted(plan)
    assert plan.deletions[-1].path == "shared/never-used"  # shared orphans go last
    st.apply(plan)
    st.checkpoint(4, {0: None}, shared=("shared/b",))
    st.checkpoint(5, {0: None}, shared=("shared/b",))
    plan = st.plan(num_retained=2)
    assert ("shared/a", "orphan") in deleted(plan)
    assert kept(plan)["shared/b"] == ("referenced", (4, 5))


def test_a_physical_file_goes_only_when_no_kept_segment_remains() -> None:
    packed = "chk-5/u0-a0.state"

    def seg(offset: int) -> tuple[StateHandle, ...]:
        return (StateHandle(packed, offset, 50, 100, b""),)

    c5 = CheckpointMetadata(
        checkpoint_id=5,
        job_id="job",
        kind="global",
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=(
            SubtaskState("map", 0, 0, handles=seg(0)),
            SubtaskState("map", 1, 1, handles=seg(50)),
        ),
    )
    c6 = CheckpointMetadata(
        checkpoint_id=6,
        job_id="job",
        kind="regional",
        trigger_time_ms=0,
        completion_time_ms=0,
        units=(UnitState(1, 5),),
        subtasks=(
            SubtaskState("map", 0, 0, handles=(StateHandle("chk-6/u0-a0.state", 0, 50, 50, b""),)),
            SubtaskState("map", 1, 1, ref_checkpoint_id=5, handles=seg(50)),
        ),
    )
    files = [
        ListedFile(p, s)
        for p, s in [
            ("chk-5/_metadata", 1),
            (packed, 100),
            ("chk-6/_metadata", 1),
            ("chk-6/u0-a0.state", 50),
        ]
    ]
    plan = plan_retention([c5, c6], files, num_retained=1)
    assert kept(plan)[packed] == ("referenced", (6,))
    assert deleted(plan) == [("chk-5/_metadata", "subsumed")]
    c7 = CheckpointMetadata(
        checkpoint_id=7, job_id="job", kind="global", trigger_time_ms=0, completion_time_ms=0
    )
    plan = plan_retention([c6, c7], [*files[1:], ListedFile("chk-7/_metadata", 1)], num_retained=1)
    assert (packed, "orphan") in deleted(plan)


def test_no_claim_restore_base_and_everything_before_it_are_never_deleted() -> None:
    st = Store()
    st.checkpoint(9, {0: None})
    st.checkpoint(10, {0: None, 1: 9})
    st.files["chk-10/u7-a3.state"] = 5  # even an unreferenced attempt file: not ours
    st.checkpoint(11, {0: None, 1: None})
    st.checkpoint(12, {0: None, 1: None})
    plan = st.plan(num_retained=1, restore_base=RestoreBase(10, "no-claim"))
    assert [(c.checkpoint_id, c.action.value, c.reason.value) for c in plan.checkpoints] == [
        (9, "keep", "not-owned"),
        (10, "keep", "not-owned"),
        (11, "delete", "subsumed"),
        (12, "keep", "retained"),
    ]
    assert all(not d.path.startswith(("chk-9/", "chk-10/")) for d in plan.deletions)
    assert kept(plan)["chk-10/u7-a3.state"] == ("not-owned", ())
    claimed = st.plan(num_retained=1, restore_base=RestoreBase(10, "claim"))
    assert claimed.subsumed_ids == (9, 10, 11)


def test_damaged_metadata_is_reported_and_kept_and_does_not_count_as_retained() -> None:
    st = Store()
    st.checkpoint(4, {0: None})
    st.checkpoint(5, {0: None})
    del st.completed[5]  # its _metadata does not decode
    plan = st.plan(num_retained=1, damaged=[5])
    assert plan.retained_ids == (4,)
    assert kept(plan)["chk-5/_metadata"] == ("damaged", ())
    assert kept(plan)["chk-5/u0-a0.state"] == ("damaged", ())
    c5 = plan.checkpoint(5)
    assert (c5.action, c5.reason) == (Action.KEEP, Reason.DAMAGED)
    assert "regional inspect ROOT validate" in c5.detail
    assert deleted(plan) == []


def test_orphans_aborted_attempts_stale_attempts_and_unknown_files() -> None:
    st = Store()
    st.checkpoint(6, {0: None})
    st.files["chk-7/u0-a0.state"] = 1  # no metadata, older than the newest completed
    st.checkpoint(8, {0: None})
    st.files["chk-8/u0-a1.state"] = 2  # a late attempt nobody references
    st.files["chk-8/sink-data.parquet"] = 3  # not a state handle: may be a committable's file
    st.files["chk-9/u0-a0.state"] = 4  # never completed, not pending
    st.files["chk-9/staged-0.parquet"] = 5
    st.files["chk-10/u0-a0.state"] = 6  # in progress
    st.files["chk-11/_metadata"] = 7  # completed after the scan
    st.files["savepoints/sp-3/_metadata"] = 8
    st.files["README.txt"] = 9
    plan = st.plan(num_retained=1, pending=[PendingFiles(10)])
    assert deleted(plan) == [
        ("chk-6/_metadata", "subsumed"),
        ("chk-6/u0-a0.state", "subsumed"),
        ("chk-7/u0-a0.state", "orphan"),
        ("chk-8/u0-a1.state", "stale-attempt"),
        ("chk-9/staged-0.parquet", "staged"),
        ("chk-9/u0-a0.state", "aborted"),
    ]
    k = kept(plan)
    assert k["chk-8/sink-data.parquet"] == ("unknown", (8,))
    assert k["chk-10/u0-a0.state"] == ("pending", ())
    assert k["chk-11/_metadata"] == ("unknown", ())
    assert k["savepoints/sp-3/_metadata"] == ("savepoint", ())
    assert k["README.txt"] == ("unknown", ())
    assert [(c.checkpoint_id, c.reason.value) for c in plan.checkpoints] == [
        (6, "subsumed"),
        (7, "orphan"),
        (8, "retained"),
        (9, "aborted"),
        (10, "pending"),
        (11, "unknown"),
    ]
    assert plan.subsumed_ids == (6, 7)


def test_files_named_by_a_pending_checkpoint_are_kept() -> None:
    st = Store()
    st.checkpoint(1, {0: None, 1: None})
    st.checkpoint(2, {0: None, 1: None})
    plan = st.plan(num_retained=1, pending=[PendingFiles(3, files=("chk-1/u1-a0.state",))])
    assert kept(plan)["chk-1/u1-a0.state"] == ("pending", ())
    assert (
        plan.checkpoint(1).detail
        == "metadata deleted; 1 file (100 bytes) kept for pending checkpoints"
    )
    assert plan.subsumed_ids == ()


def test_referenced_files_missing_from_storage_are_reported() -> None:
    st = Store()
    st.checkpoint(1, {0: None})
    del st.files["chk-1/u0-a0.state"]
    plan = st.plan()
    assert [(m.path, m.referenced_by) for m in plan.missing] == [("chk-1/u0-a0.state", (1,))]


def test_paths_outside_the_root_in_metadata_are_refused_and_reported() -> None:
    bad = ("../other-job/chk-1/u0-a0.state", "/etc/passwd", "s3://other-bucket/x", "chk-1/../../x")
    md = CheckpointMetadata(
        checkpoint_id=1,
        job_id="job",
        kind="global",
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=tuple(
            SubtaskState("map", i, i, handles=(StateHandle(p, 0, 1, 1, b""),))
            for i, p in enumerate(bad)
        ),
    )
    plan = plan_retention([md], [ListedFile("chk-1/_metadata", 1)], num_retained=1)
    assert sorted(r.path for r in plan.refused) == sorted(bad)
    assert all("job root" in r.error for r in plan.refused)
    assert plan.missing == ()  # refused paths are not looked for


def test_num_retained_below_one_is_bad_input() -> None:
    with pytest.raises(RetentionInputError, match=r"num-retained must be at least 1 \(got 0\)"):
        plan_retention([], [], num_retained=0)
    assert RetentionInputError.exit_code == 2


def test_without_the_live_set_a_newest_incomplete_checkpoint_is_kept() -> None:
    st = Store()
    st.checkpoint(1, {0: None})
    st.files["chk-0/u0-a0.state"] = 1  # older than a completed one: an orphan either way
    st.files["chk-2/u0-a0.state"] = 2
    plan = st.plan(live_unknown=True)
    assert deleted(plan) == [("chk-0/u0-a0.state", "orphan")]
    assert kept(plan)["chk-2/u0-a0.state"] == ("pending", ())
    c2 = plan.checkpoint(2)
    assert (c2.action, c2.reason) == (Action.KEEP, Reason.PENDING)
    assert deleted(st.plan()) == [("chk-0/u0-a0.state", "orphan"), ("chk-2/u0-a0.state", "aborted")]


def test_keep_details_name_each_files_own_checkpoint() -> None:
    def md(cid: int) -> CheckpointMetadata:
        handles = tuple(
            StateHandle(p, 0, 1, 1, b"") for p in ("chk-3/u0-a0.state", "chk-5/u1-a0.state")
        )
        return CheckpointMetadata(
            checkpoint_id=cid,
            job_id="job",
            kind="global",
            trigger_time_ms=0,
            completion_time_ms=0,
            subtasks=(SubtaskState("map", 0, 0, handles=handles),),
        )

    files = [ListedFile(p, 1) for p in ("chk-3/u0-a0.state", "chk-5/u1-a0.state")]
    plan = plan_retention([md(3), md(5)], files, num_retained=2)
    assert [(f.path, f.detail) for f in plan.files] == [
        ("chk-3/u0-a0.state", "file of kept checkpoint 3, also referenced by 5"),
        ("chk-5/u1-a0.state", "file of kept checkpoint 5, also referenced by 3"),
    ]


def test_the_newest_restorable_checkpoint_is_kept_when_a_newer_one_lost_a_state_file() -> None:
    st = Store()
    st.checkpoint(1, {0: None, 1: None})
    st.checkpoint(2, {0: None, 1: None})
    st.checkpoint(3, {0: None, 1: None})
    del st.files["chk-3/u1-a0.state"]  # checkpoint 3 cannot be restored any more
    plan = st.plan(num_retained=1)
    assert kept(plan) == {
        "chk-2/_metadata": ("retained", (2,)),
        "chk-2/u0-a0.state": ("retained", (2,)),
        "chk-2/u1-a0.state": ("retained", (2,)),
        "chk-3/_metadata": ("retained", (3,)),
        "chk-3/u0-a0.state": ("retained", (3,)),
    }
    assert deleted(plan) == [
        ("chk-1/_metadata", "subsumed"),
        ("chk-1/u0-a0.state", "subsumed"),
        ("chk-1/u1-a0.state", "subsumed"),
    ]
