"""Savepoints and restores from a given path: a savepoint is self-contained (move it, copy it to
a bucket, restore from the copy), never cleaned; claim imports the restored state as the job's
own checkpoint; no-claim never touches the restored files and keeps nothing of them."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from clicks_job import expected_rows, pipeline, policy, rows

from metadata.layout import METADATA_NAME
from metadata.savepoint import CheckpointPathError, open_checkpoint
from metadata.storage import JobStorage
from regional.errors import RestoreError
from regional.policy import load_policy
from regional.runtime.spark import SparkRuntime

pytestmark = pytest.mark.spark


def _digest(directory: Path) -> dict[str, str]:
    """Every file under `directory` and the hash of its bytes."""
    return {
        str(p.relative_to(directory)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def stopped(spark, tmp_path_factory):
    """A job run for 1 checkpoint, a savepoint (sp1, its table copied as it was then), 2 more
    checkpoints with num-retained 1, then stopped with a savepoint (sp2)."""
    base = tmp_path_factory.mktemp("savepoint")
    rt = SparkRuntime(
        pipeline(str(base / "table")), spark, root=str(base / "ckpt"), policy=policy()
    )
    rt.run(max_checkpoints=1)
    sp1 = Path(rt.savepoint())
    shutil.copytree(base / "table", base / "table-at-sp1")
    sp1_files = _digest(sp1)
    summary = rt.run(max_checkpoints=2, stop_with_savepoint=True)
    assert [c.kind for c in summary.checkpoints] == ["global", "global", "savepoint"]
    assert not summary.finished
    return base, sp1, sp1_files, Path(summary.savepoint)


def test_a_savepoint_is_self_contained_and_never_cleaned(stopped):
    base, sp1, sp1_files, sp2 = stopped
    job = base / "ckpt" / "clicks"
    assert (sp1, sp2) == (job / "savepoints" / "sp-2", job / "savepoints" / "sp-5")
    assert _digest(sp1) == sp1_files  # 3 checkpoints and cleans later: untouched
    for sp in (sp1, sp2):
        names = sorted(p.name for p in sp.iterdir())
        assert names[0] == METADATA_NAME and all(n.endswith(".state") for n in names[1:])
        md = open_checkpoint(str(sp)).metadata
        assert md.kind == "savepoint"
        paths = {h.path for s in md.subtasks for h in s.handles}
        assert paths == set(names[1:])  # relative to the savepoint directory, every one inside
    # the savepoint is also the job's own global checkpoint 5 (a crash would resume from it)
    storage = JobStorage(str(base / "ckpt"), "clicks")
    assert storage.list_checkpoint_ids() == [5]
    assert storage.read_metadata(5).kind == "global"


def test_restore_from_a_moved_savepoint_gives_the_fault_free_output(spark, stopped, tmp_path):
    base, _, _, sp2 = stopped
    moved = tmp_path / "elsewhere" / "before-upgrade"
    shutil.copytree(base / "table", tmp_path / "table")
    shutil.copytree(sp2, moved)
    shutil.rmtree(sp2)  # the original is gone: only the moved copy is left
    try:
        rt = SparkRuntime(
            pipeline(str(tmp_path / "table")),
            spark,
            root=str(tmp_path / "ckpt"),
            policy=policy(),
            restore_from=str(moved),
        )
        summary = rt.run()
    finally:
        shutil.copytree(moved, sp2)
    assert summary.finished and summary.restored_from == 5
    assert summary.restored_location == str(moved)
    assert rows(str(tmp_path / "table")) == expected_rows()


@pytest.mark.s3
def test_restore_from_a_savepoint_copied_to_a_bucket(spark, stopped, s3_server, tmp_path):
    base, sp1, _, _ = stopped
    bucket = s3_server.new_bucket()
    fs = s3_server.filesystem()
    for p in sp1.iterdir():
        with fs.open_output_stream(f"{bucket}/savepoints/copied/{p.name}") as out:
            out.write(p.read_bytes())
    table = tmp_path / "table"
    shutil.copytree(base / "table-at-sp1", table)
    rt = SparkRuntime(
        pipeline(str(table), parallelism=2),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=policy(),
        restore_from=s3_server.uri(bucket, "savepoints/copied"),
    )
    summary = rt.run()
    assert summary.finished and summary.restored_from == 2
    assert rows(str(table)) == expected_rows()


@pytest.mark.parametrize("mode", ["claim", "no-claim"])
def test_restore_modes_never_touch_the_restored_files(spark, stopped, tmp_path, mode):
    base, sp1, sp1_files, _ = stopped
    before = _digest(base / "ckpt")
    shutil.copytree(base / "table-at-sp1", tmp_path / "table")
    rt = SparkRuntime(
        pipeline(str(tmp_path / "table")),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=policy(),
        restore_from=str(sp1),
        restore_mode=mode,
    )
    storage = JobStorage(str(tmp_path / "ckpt"), "clicks")
    summary = rt.run()
    assert summary.finished and len(summary.checkpoints) >= 4  # many checkpoints and cleans
    assert rows(str(tmp_path / "table")) == expected_rows()
    assert _digest(base / "ckpt") == before and _digest(sp1) == sp1_files  # untouched
    if mode == "no-claim":  # the first checkpoint had to be global
        assert summary.checkpoints[0].kind == "global"
    # nothing restored is left in the job root: claim's chk-2 was cleaned once subsumed,
    # no-claim's staged state once the first checkpoint succeeded
    left = [f.path for f in storage.list_files()]
    assert not [p for p in left if p.startswith("chk-2/") or p.endswith("-a0.state")], left
    assert storage.list_checkpoint_ids() == [summary.checkpoints[-1].checkpoint_id]


def test_claim_imports_the_restored_checkpoint_as_the_jobs_own(spark, stopped, tmp_path):
    base, sp2 = stopped[0], stopped[3]
    shutil.copytree(base / "table", tmp_path / "table")
    rt = SparkRuntime(
        pipeline(str(tmp_path / "table")),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=policy(),
        restore_from=str(sp2 / METADATA_NAME),
        restore_mode="claim",
    )
    rt.run(max_checkpoints=0)
    storage = JobStorage(str(tmp_path / "ckpt"), "clicks")
    assert storage.list_checkpoint_ids() == [5]
    md = storage.read_metadata(5)
    assert md.kind == "global" and md.reasons[0] == f"restored from {sp2} (claim)"


def test_bad_restore_paths_are_refused_with_the_reason(spark, stopped, tmp_path):
    base, _, _, sp2 = stopped

    def restore(path: str, root: Path) -> None:
        SparkRuntime(
            pipeline(str(tmp_path / "table")), spark, root=str(root), restore_from=path
        ).run(max_checkpoints=0)

    with pytest.raises(CheckpointPathError, match=r"holds no _metadata; give a savepoint"):
        restore(str(tmp_path), tmp_path / "a")
    renamed = tmp_path / "chk-copy"
    shutil.copytree(base / "ckpt" / "clicks" / "chk-5", renamed)
    with pytest.raises(
        CheckpointPathError,
        match=r"holds checkpoint 5, but its directory is "
        r"named 'chk-copy'; a checkpoint's state paths are relative",
    ):
        restore(str(renamed), tmp_path / "b")
    broken = tmp_path / "broken-sp"
    shutil.copytree(sp2, broken)
    victim = next(p for p in broken.iterdir() if p.name.endswith(".state"))
    victim.unlink()
    with pytest.raises(CheckpointPathError, match=rf"cannot be restored: {victim.name}: missing"):
        restore(str(broken), tmp_path / "c")
    with pytest.raises(
        RestoreError,
        match=r"already holds checkpoints \(latest 5\), and a run "
        r"there resumes from them\. Drop --from",
    ):
        restore(str(sp2), base / "ckpt")


def test_resuming_the_job_root_in_no_claim_mode_keeps_the_restored_checkpoint(spark, tmp_path):
    table, root = str(tmp_path / "table"), str(tmp_path / "ckpt")
    SparkRuntime(pipeline(table), spark, root=root, policy=policy()).run(max_checkpoints=2)
    restored = tmp_path / "ckpt" / "clicks" / "chk-2"
    before = _digest(restored)
    no_claim = load_policy(
        env={},
        overrides={
            "checkpointing": {"timeout": "30 s", "num-retained": 1},
            "restore": {"mode": "no-claim"},
        },
    ).policy
    summary = SparkRuntime(pipeline(table), spark, root=root, policy=no_claim).run()
    assert summary.restored_from == 2 and summary.finished and len(summary.checkpoints) >= 4
    assert summary.checkpoints[0].kind == "global"
    assert _digest(restored) == before  # not cleaned although subsumed many times
    assert rows(table) == expected_rows()
