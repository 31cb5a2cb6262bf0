"""The executor and the `regional clean` CLI against real storage (local and the S3 test
server): exact files left, idempotence, crash then resume, the live guard, progress, and the
job-root confinement with canary files."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from pyarrow import fs as pafs

from cleaner.plan import (
    Action,
    FileDecision,
    PendingFiles,
    Reason,
    RetentionInputError,
    RetentionPlan,
)
from cleaner.run import CleanProgress, DeletionStatus, execute, scan
from cleaner.views import RETENTION_SCHEMA, retention_table, retention_totals
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState
from metadata.storage import JobStorage
from regional.cli import main


class Job:
    """Writes real checkpoints through JobStorage: unit -> None (fresh) or its owner id."""

    def __init__(self, storage: JobStorage) -> None:
        self.storage = storage
        self.handles: dict[tuple[int, int], tuple[StateHandle, ...]] = {}

    def checkpoint(self, cid: int, units: dict[int, int | None]) -> None:
        subtasks = []
        for unit, owner in sorted(units.items()):
            if owner is None:
                segs = [f"{cid}:{unit}:a".encode(), f"{cid}:{unit}:b".encode()]
                hs = tuple(self.storage.write_segments(f"chk-{cid}/u{unit}-a0.state", segs))
            else:
                hs = self.handles[owner, unit]
            self.handles[cid, unit] = hs
            subtasks += [
                SubtaskState("map", 2 * unit + i, unit, ref_checkpoint_id=owner, handles=(h,))
                for i, h in enumerate(hs)
            ]
        fallback = tuple(UnitState(u, o, "timeout") for u, o in units.items() if o is not None)
        self.storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id=self.storage.job_id,
                kind="regional" if fallback else "global",
                trigger_time_ms=cid,
                completion_time_ms=cid,
                units=fallback,
                subtasks=tuple(subtasks),
            )
        )

    def paths(self) -> list[str]:
        return [f.path for f in self.storage.list_files()]


def three_deep(storage: JobStorage) -> Job:
    """Unit 0 stays on checkpoint 1's state while units 1 and 2 advance; 5 never completed."""
    job = Job(storage)
    job.checkpoint(1, {0: None, 1: None, 2: None})
    job.checkpoint(2, {0: 1, 1: None, 2: None})
    job.checkpoint(3, {0: 1, 1: None, 2: 2})
    job.checkpoint(4, {0: 1, 1: None, 2: None})
    storage.write_segments("chk-5/u1-a0.state", [b"aborted"])
    return job


AFTER_CLEAN = [
    "chk-1/u0-a0.state",
    "chk-4/_metadata",
    "chk-4/u1-a0.state",
    "chk-4/u2-a0.state",
]


@pytest.fixture
def local(tmp_path: Path) -> JobStorage:
    return JobStorage(str(tmp_path / "root"), "job")


def test_clean_leaves_exactly_the_referenced_files_and_is_idempotent(local: JobStorage) -> None:
    job = three_deep(local)
    plan = scan(local, num_retained=1)
    assert plan.retained_ids == (4,)
    assert plan.referenced_ids == (1,)
    assert plan.subsumed_ids == (2, 3)
    report = execute(plan, local, max_workers=4)
    assert report.ok
    assert report.count(DeletionStatus.DELETED) == len(plan.deletions) == 9
    assert report.deleted_bytes == plan.deleted_bytes
    assert job.paths() == AFTER_CLEAN
    assert local.find_restorable(verify_checksums=True).metadata.checkpoint_id == 4
    again = execute(plan, local)
    assert {o.status for o in again.outcomes} == {DeletionStatus.ALREADY_GONE}
    assert scan(local, num_retained=1).deletions == ()


def test_metadata_goes_first_and_checkpoints_oldest_first(local: JobStorage) -> None:
    three_deep(local)
    order: list[str] = []
    plan = scan(local, num_retained=1)
    execute(plan, local, max_workers=1, progress=lambda p: order.append(p.last.path))
    assert order[:3] == ["chk-1/_metadata", "chk-2/_metadata", "chk-3/_metadata"]
    assert order[3:] == [
        "chk-1/u1-a0.state",
        "chk-1/u2-a0.state",
        "chk-2/u1-a0.state",
        "chk-2/u2-a0.state",
        "chk-3/u1-a0.state",
        "chk-5/u1-a0.state",
    ]


class Crash(BaseException):
    """Stands for the process dying mid-clean."""


class CrashingStorage:
    """Deletes through `storage` until `after` deletions, then every call crashes."""

    def __init__(self, storage: JobStorage, after: int) -> None:
        self.storage = storage
        self.left = after
        self.lock = threading.Lock()

    def delete_file(self, relpath: str) -> bool:
        with self.lock:
            if self.left <= 0:
                raise Crash(relpath)
            self.left -= 1
        return self.storage.delete_file(relpath)


@pytest.mark.parametrize("after", [0, 1, 3, 5, 8])
def test_a_crash_mid_clean_is_finished_by_the_next_plan(local: JobStorage, after: int) -> None:
    job = three_deep(local)
    with pytest.raises(Crash):
        execute(scan(local, num_retained=1), CrashingStorage(local, after), max_workers=1)
    # Whatever the crash left, checkpoint 4 is still restorable with every file it needs.
    assert local.find_restorable(verify_checksums=True).metadata.checkpoint_id == 4
    resumed = scan(local, num_retained=1)
    assert len(resumed.deletions) == 9 - after
    assert execute(resumed, local).ok
    assert job.paths() == AFTER_CLEAN


def test_the_live_set_at_run_time_protects_a_checkpoint_that_started_after_planning(
    local: JobStorage,
) -> None:
    three_deep(local)
    plan = scan(local, num_retained=1)  # planned while 5 looked aborted
    assert ("chk-5/u1-a0.state", Reason.ABORTED) in [(d.path, d.reason) for d in plan.deletions]
    report = execute(plan, local, live=lambda: [PendingFiles(5)])
    skipped = [o for o in report.outcomes if o.status is DeletionStatus.SKIPPED_LIVE]
    assert [(o.path, o.detail) for o in skipped] == [
        ("chk-5/u1-a0.state", "checkpoint 5 is in progress; not deleted")
    ]
    assert report.ok
    assert "chk-5/u1-a0.state" in [f.path for f in local.list_files()]


def test_progress_reports_every_deletion_and_the_bytes_freed(local: JobStorage) -> None:
    three_deep(local)
    plan = scan(local, num_retained=1)
    seen: list[CleanProgress] = []
    execute(plan, local, max_workers=3, progress=seen.append)
    assert [p.done for p in seen] == list(range(1, 10))
    assert {p.total for p in seen} == {9}
    assert seen[-1].deleted_bytes == plan.deleted_bytes


def test_concurrency_is_bounded_by_max_workers(local: JobStorage) -> None:
    three_deep(local)
    state = {"now": 0, "max": 0}
    lock = threading.Lock()

    class Counting:
        def delete_file(self, relpath: str) -> bool:
            with lock:
                state["now"] += 1
                state["max"] = max(state["max"], state["now"])
            try:
                return local.delete_file(relpath)
            finally:
                with lock:
                    state["now"] -= 1

    execute(scan(local, num_retained=1), Counting(), max_workers=2)
    assert 1 <= state["max"] <= 2


def test_damaged_metadata_is_kept_and_reported(local: JobStorage) -> None:
    job = three_deep(local)
    with local.filesystem.open_output_stream(f"{local.job_path}/chk-3/_metadata") as out:
        out.write(b"RGNL garbage")
    plan = scan(local, num_retained=1)
    c3 = plan.checkpoint(3)
    assert (c3.action, c3.reason) == (Action.KEEP, Reason.DAMAGED)
    execute(plan, local)
    assert "chk-3/_metadata" in job.paths()
    assert "chk-3/u1-a0.state" in job.paths()


def crafted(storage: JobStorage, other_bucket: str = "other-bucket") -> None:
    """Checkpoint 1 (to be dropped) and 2 (retained) whose metadata point outside the root."""
    bad = ["../other-job/chk-1/u0-a0.state", "../canary.txt", "/tmp/canary.txt"]
    bad.append(f"s3://{other_bucket}/job/chk-1/u0-a0.state")
    for cid in (1, 2):
        own = storage.write_segments(f"chk-{cid}/u0-a0.state", [b"ok"])
        handles = [*own, *(StateHandle(p, 0, 1, 1, b"") for p in bad)]
        storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id=storage.job_id,
                kind="global",
                trigger_time_ms=0,
                completion_time_ms=0,
                subtasks=tuple(
                    SubtaskState("map", i, 0, handles=(h,)) for i, h in enumerate(handles)
                ),
            )
        )


def test_crafted_paths_are_refused_and_nothing_outside_the_root_is_touched(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    storage = JobStorage(str(root), "job")
    crafted(storage)
    canaries = [root / "canary.txt", root / "other-job/chk-1/u0-a0.state", tmp_path / "canary"]
    for c in canaries:
        c.parent.mkdir(parents=True, exist_ok=True)
        c.write_text("canary")
    plan = scan(storage, num_retained=1)
    # such metadata does not decode (its paths are checked then): damaged, kept whole
    assert plan.refused == () and plan.deletions == ()
    assert [(c.checkpoint_id, c.reason.value) for c in plan.checkpoints] == [
        (1, "damaged"),
        (2, "damaged"),
    ]

    # A plan carrying such paths directly (e.g. built by other code) is refused file by file.
    evil = RetentionPlan(
        num_retained=1,
        checkpoints=(),
        files=tuple(
            FileDecision(p, 1, Action.DELETE, Reason.ORPHAN, "", None, (), 2)
            for p in ("../canary.txt", "/" + str(tmp_path / "canary"), "chk-1/../../canary.txt")
        ),
        retained_ids=(),
        subsumed_ids=(),
        referenced_ids=(),
    )
    report = execute(evil, storage)
    assert {o.status for o in report.outcomes} == {DeletionStatus.REFUSED}
    assert not report.ok

    before = [f.path for f in storage.list_files()]
    code = main(["clean", str(root), "--job", "job", "--num-retained", "1"])
    out = capsys.readouterr().out
    assert code == 0
    assert "planned for deletion: 0 files, 0 bytes" in out
    assert all(c.read_text() == "canary" for c in canaries)
    assert [f.path for f in storage.list_files()] == before


def test_cli_dry_run_json_and_exit_codes(
    local: JobStorage, capsys: pytest.CaptureFixture[str]
) -> None:
    job = three_deep(local)
    before = job.paths()
    assert main(["clean", local.root, "--dry-run", "--json", "--num-retained", "1"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert job.paths() == before
    files = {r["path"]: (r["action"], r["reason"]) for r in rows if r["row"] == "file"}
    assert files["chk-1/u0-a0.state"] == ("keep", "referenced")
    assert files["chk-1/_metadata"] == ("delete", "subsumed")
    assert files["chk-5/u1-a0.state"] == ("keep", "pending")  # the CLI cannot see the coordinator
    cps = {r["checkpoint_id"]: r for r in rows if r["row"] == "checkpoint"}
    assert cps[5]["detail"] == (
        "no _metadata, newer than every completed checkpoint: may be in progress"
    )
    assert cps[1]["detail"] == "metadata deleted; 1 file (10 bytes) kept for checkpoint 4 (units 0)"

    assert main(["clean", local.root, "--num-retained", "1"]) == 0
    out = capsys.readouterr().out
    assert "deleted: 8 files" in out
    assert job.paths() == [*AFTER_CLEAN, "chk-5/u1-a0.state"]

    assert main(["clean", local.root, "--job", "nope"]) == 2
    assert "job 'nope' not found" in capsys.readouterr().err
    assert main(["clean", local.root, "--num-retained", "0"]) == 2
    assert "--num-retained 0 is out of range; give a whole number from 1 to 1000000" in (
        capsys.readouterr().err
    )
    with pytest.raises(SystemExit) as exc:
        main(["clean", local.root, "--max-workers", "0"])
    assert exc.value.code == 2
    assert "--max-workers: must be at least 1 (got 0)" in capsys.readouterr().err
    with pytest.raises(RetentionInputError, match=r"max-workers must be at least 1 \(got 0\)"):
        execute(scan(local, num_retained=1), local, max_workers=0)


def test_retention_view_schema_and_totals(local: JobStorage) -> None:
    three_deep(local)
    plan = scan(local, num_retained=1)
    table = retention_table(plan)
    assert table.schema == RETENTION_SCHEMA
    assert table.num_rows == len(plan.checkpoints) + len(plan.files)
    totals = retention_totals(plan).to_pylist()[0]
    assert totals["retained"] == [4]
    assert totals["subsumed"] == [2, 3]
    assert totals["deleted_files"] == 9
    assert totals["saved_bytes"] == plan.whole_checkpoint_bytes - plan.kept_bytes > 0


@pytest.mark.s3
def test_clean_on_the_s3_server_keeps_referenced_files_and_spares_other_buckets(
    s3_server,
) -> None:
    bucket, other = s3_server.new_bucket(), s3_server.new_bucket()
    s3 = s3_server.filesystem()
    for canary in (f"{bucket}/canary.txt", f"{bucket}/other-job/chk-1/u0-a0.state"):
        with s3.open_output_stream(canary) as out:
            out.write(b"canary")
    with s3.open_output_stream(f"{other}/job/chk-1/u0-a0.state") as out:
        out.write(b"canary")
    storage = JobStorage(s3_server.uri(bucket), "job")
    job = three_deep(storage)
    plan = scan(storage, num_retained=1)
    report = execute(plan, storage, max_workers=4)
    assert report.ok and report.count(DeletionStatus.DELETED) == 9
    assert job.paths() == AFTER_CLEAN
    assert execute(plan, storage).count(DeletionStatus.ALREADY_GONE) == 9

    crafted_storage = JobStorage(s3_server.uri(bucket), "crafted")
    crafted(crafted_storage, other)
    plan = scan(crafted_storage, num_retained=1)
    assert plan.deletions == ()  # the crafted metadata is damaged: refused at decode, kept
    assert {c.reason.value for c in plan.checkpoints} == {"damaged"}
    kept = [f"{bucket}/canary.txt", f"{bucket}/other-job/chk-1/u0-a0.state"]
    kept.append(f"{other}/job/chk-1/u0-a0.state")
    infos = s3.get_file_info(kept)
    assert all(i.type == pafs.FileType.File for i in infos)
