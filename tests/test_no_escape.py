"""No escape from the checkpoint root (issue 18 items 3 and 4).

Symbolic links under a local job root are never followed out of it: a canary file outside the
root behind a directory link and behind a file link survives `regional clean`, the plan says
why, and validate and restore report the checkpoint. Names read from storage that become paths
(state handle paths, commit users, committable file names, split ids) are refused.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cleaner.run import scan
from metadata.errors import MetadataError, OutsideRootError
from metadata.model import CheckpointMetadata, SubtaskState
from metadata.storage import JobStorage
from metadata.validate import validate_job
from regional.cli import main


def checkpoint(storage: JobStorage, cid: int) -> None:
    """Checkpoint `cid` with one state file of unit 0."""
    [h] = storage.write_segments(f"chk-{cid}/u0-a0.state", [b"state-%d" % cid])
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=cid, job_id=storage.job_id, kind="global", trigger_time_ms=cid,
            completion_time_ms=cid + 1, subtasks=(SubtaskState("map", 0, 0, handles=(h,)),),
        )
    )  # fmt: skip


@pytest.fixture
def linked(tmp_path: Path) -> tuple[JobStorage, Path]:
    """A job root with checkpoints 3..5, a directory link `chk-2 -> outside/` holding three
    canary files, and checkpoint 4's state file replaced by a link to a canary outside."""
    outside = tmp_path / "outside"
    (outside / "sub").mkdir(parents=True)
    for name in ("u0-a0.state", "notes", "sub/deep"):
        (outside / name).write_text("canary")
    (tmp_path / "secret").write_text("canary")
    storage = JobStorage(str(tmp_path / "root"), "job")
    for cid in (3, 4, 5):
        checkpoint(storage, cid)
    job = tmp_path / "root" / "job"
    os.symlink(outside, job / "chk-2")
    size = (job / "chk-4" / "u0-a0.state").stat().st_size
    (job / "chk-4" / "u0-a0.state").unlink()
    (tmp_path / "secret").write_text("x" * size)  # the size the metadata records
    os.symlink(tmp_path / "secret", job / "chk-4" / "u0-a0.state")
    return storage, tmp_path


def canaries(tmp_path: Path) -> dict[str, str]:
    found = {}
    for p in sorted((tmp_path / "outside").rglob("*")):
        if p.is_file():
            found[str(p.relative_to(tmp_path))] = p.read_text()
    found["secret"] = (tmp_path / "secret").read_text()
    return found


def test_the_listing_reports_links_instead_of_following_them(linked) -> None:
    storage, tmp_path = linked
    entries = {f.path: (f.link, f.outside_root) for f in storage.list_files() if f.link}
    assert entries == {
        "chk-2": (str(tmp_path / "outside"), True),
        "chk-4/u0-a0.state": (str(tmp_path / "secret"), True),
    }
    with pytest.raises(OutsideRootError) as exc:
        storage.read_file("chk-2/notes")
    assert str(exc.value) == (
        f"{tmp_path}/root/job/chk-2/notes is under chk-2, which is a symbolic link to "
        f"{tmp_path}/outside, outside the job root {tmp_path}/root/job; regional never reads, "
        "writes or deletes through a link out of the job root: remove the link"
    )
    with pytest.raises(OutsideRootError, match=r"chk-4/u0-a0.state is a symbolic link to "):
        storage.delete_file("chk-4/u0-a0.state")
    with pytest.raises(OutsideRootError):
        storage.write_state_file("chk-2/u1-a0.state", b"x")
    assert not (tmp_path / "outside" / "u1-a0.state").exists()


def test_clean_never_deletes_through_a_link_and_says_why(
    linked, capsys: pytest.CaptureFixture[str]
) -> None:
    storage, tmp_path = linked
    before = canaries(tmp_path)
    plan = scan(storage, num_retained=1, live_unknown=True)
    why = {c.checkpoint_id: (c.action.value, c.reason.value) for c in plan.checkpoints}
    assert why == {
        2: ("keep", "outside-root"),
        3: ("delete", "subsumed"),
        4: ("keep", "outside-root"),
        5: ("keep", "retained"),
    }
    assert main(["clean", str(tmp_path / "root"), "--job", "job", "--num-retained", "1"]) == 0
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    outside, secret = tmp_path / "outside", tmp_path / "secret"
    for expected in (
        f"checkpoint 2 chk-2/ keep outside-root - - 0 0 holds a symbolic link chk-2 -> {outside} "
        "(outside the job root); nothing under it is deleted: inspect it, remove the link -",
        f"checkpoint 4 chk-4/ keep outside-root - - 235 0 holds a symbolic link chk-4/u0-a0.state "
        f"-> {secret} (outside the job root); nothing under it is deleted: inspect it, remove "
        "the link -",
        f"file 2 chk-2 keep outside-root - - 0 0 a symbolic link chk-2 -> {outside} (outside "
        "the job root): never followed nor deleted; remove it by hand -",
        f"file 4 chk-4/u0-a0.state keep outside-root - - 0 0 a symbolic link chk-4/u0-a0.state "
        f"-> {secret} (outside the job root): never followed nor deleted; remove it by hand -",
        "file 4 chk-4/_metadata keep outside-root - - 235 0 checkpoint 4 holds a symbolic link "
        f"chk-4/u0-a0.state -> {secret} (outside the job root); kept whole -",
        "file 3 chk-3/u0-a0.state delete subsumed - - 0 7 file of dropped checkpoint 3 deleted",
        "deleted: 2 files, 242 bytes; already gone: 0; skipped (in progress): 0; refused: 0; "
        "failed: 0",
    ):
        assert expected in lines, "\n".join(lines)
    assert canaries(tmp_path) == before  # 3 files behind the directory link, 1 behind the file link
    assert sorted(f.path for f in storage.list_files()) == [
        "chk-2",
        "chk-4/_metadata",
        "chk-4/u0-a0.state",
        "chk-5/_metadata",
        "chk-5/u0-a0.state",
    ]


def test_validate_and_restore_report_the_link(linked, capsys: pytest.CaptureFixture[str]) -> None:
    storage, tmp_path = linked
    secret = tmp_path / "secret"
    os.unlink(tmp_path / "root" / "job" / "chk-5" / "u0-a0.state")
    report = validate_job(storage)
    assert [(p.checkpoint_id, p.path, p.problem) for p in report.problems] == [
        (
            4,
            "chk-4/u0-a0.state",
            f"refused: a symbolic link to {secret}, outside the job root; regional never follows "
            "it: remove the link",
        ),
        (5, "chk-5/u0-a0.state", "missing"),
    ]
    assert report.restore_checkpoint_id == 3
    assert storage.find_latest_restorable(warn=False).checkpoint_id == 3
    assert main(["inspect", str(tmp_path / "root"), "--job", "job", "validate"]) == 1
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == "a restore would use checkpoint 3 (3 checked, 2 problems)"


def test_a_metadata_file_linked_out_of_the_root_is_a_damaged_checkpoint(tmp_path: Path) -> None:
    elsewhere = JobStorage(str(tmp_path / "elsewhere"), "job")
    checkpoint(elsewhere, 7)
    storage = JobStorage(str(tmp_path / "root"), "job")
    checkpoint(storage, 6)
    (tmp_path / "root" / "job" / "chk-7").mkdir()
    target = tmp_path / "elsewhere" / "job" / "chk-7" / "_metadata"
    os.symlink(target, tmp_path / "root" / "job" / "chk-7" / "_metadata")
    with pytest.raises(OutsideRootError, match=r"chk-7/_metadata is a symbolic link to "):
        storage.read_metadata(7)
    plan = scan(storage, num_retained=1)
    assert plan.checkpoint(7).reason.value == "outside-root"
    assert plan.deletions == ()
    assert storage.find_latest_restorable(warn=False).checkpoint_id == 6


def test_a_link_to_a_directory_inside_the_root_is_not_followed(tmp_path: Path) -> None:
    storage = JobStorage(str(tmp_path / "root"), "job")
    for cid in (1, 2):
        checkpoint(storage, cid)
    job = tmp_path / "root" / "job"
    os.symlink(job / "chk-2", job / "chk-9")  # deleting chk-9/* would delete checkpoint 2
    plan = scan(storage, num_retained=1)
    assert plan.checkpoint(9).reason.value == "symlink"
    assert plan.checkpoint(2).reason.value == "retained"
    assert [d.path for d in plan.deletions] == ["chk-1/_metadata", "chk-1/u0-a0.state"]


# -- names read from storage that become paths ----------------------------------------------


def test_a_state_handle_path_out_of_the_root_is_refused_at_decode(tmp_path: Path) -> None:
    from metadata.model import StateHandle

    storage = JobStorage(str(tmp_path / "root"), "job")
    for cid, path in ((1, "../../x"), (2, str(tmp_path / "x"))):
        storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid, job_id="job", kind="global", trigger_time_ms=0,
                completion_time_ms=0, subtasks=(
                    SubtaskState("map", 0, 0, handles=(StateHandle(path, 0, 1, 1, b""),)),),
            )
        )  # fmt: skip
    with pytest.raises(MetadataError) as exc:
        storage.read_metadata(1)
    assert str(exc.value) == (
        f"{tmp_path}/root/job/chk-1/_metadata: subtask map[0] has state handle path '../../x' "
        "('..' is not allowed); state paths are relative to the job root and never leave it; "
        "the metadata of checkpoint 1 is damaged"
    )
    with pytest.raises(MetadataError, match=r"\(it is absolute or a URI\)"):
        storage.read_metadata(2)
    assert storage.find_latest_restorable(warn=False) is None


def _craft_commit_user(storage: JobStorage, checkpoint_id: int, user: str) -> None:
    """Rewrite checkpoint `checkpoint_id`'s metadata with `user` as its sink's commit user
    (re-encoded with a valid checksum, as anyone who can write to the root can)."""
    import msgspec

    from metadata.layout import metadata_path

    md = storage.read_metadata(checkpoint_id)
    state = msgspec.msgpack.decode(md.coordinators["sink"])
    state[0] = user
    coordinators = {**md.coordinators, "sink": msgspec.msgpack.encode(state)}
    storage.delete_file(metadata_path(checkpoint_id))
    storage.write_metadata(msgspec.structs.replace(md, coordinators=coordinators))


def test_a_crafted_commit_user_in_a_checkpoint_is_refused_at_restore() -> None:
    from regional.policy import Policy
    from regional.runtime.sim import Simulation

    sim = Simulation(2, Policy(), records_per_split=9)
    sim.run(2)
    log = list(sim.sink.log)
    _craft_commit_user(sim.storage, 2, "../../../escape-cu")
    with pytest.raises(MetadataError) as exc:
        sim.new_driver().run()
    assert str(exc.value) == (
        "the checkpointed snapshot of sink 'sink''s commit coordinator has commit user "
        "'../../../escape-cu' (it contains a slash, backslash or NUL byte); a commit user names "
        "a directory of the table, so the checkpoint was tampered with: restore another one"
    )
    assert sim.sink.log == log  # nothing committed


def test_the_parquet_sink_never_writes_or_deletes_outside_the_table(tmp_path: Path) -> None:
    import msgspec
    import pyarrow as pa

    from regional.errors import CommitError
    from regional.sinks.base import WriteContext
    from regional.sinks.parquet import ParquetSink, read_table

    table = tmp_path / "a" / "b" / "table"
    sink = ParquetSink(str(table))
    [good] = sink.write(
        [pa.record_batch({"x": [1]})],
        WriteContext(
            job_id="job",
            run_id="r1",
            checkpoint_id=1,
            attempt=0,
            unit_id=0,
            vertex_id="out",
            index=0,
        ),
    )
    with pytest.raises(CommitError) as exc:
        sink.commit("../../../escape-cu", 1, [good])
    assert str(exc.value) == (
        f"table {table}: commit user '../../../escape-cu' cannot name a directory under "
        "_commits/ (it contains a slash, backslash or NUL byte); nothing was committed"
    )
    canary = tmp_path / "canary.parquet"
    canary.write_text("canary")
    evil = msgspec.msgpack.encode(["data/../../../../canary.parquet", 1])
    with pytest.raises(CommitError) as exc:
        sink.commit("job-1", 1, [evil])
    assert str(exc.value) == (
        f"table {table}: a committable names data file 'data/../../../../canary.parquet' ('..' "
        "is not allowed); data files are staged under _staging/ in the table, so it was tampered "
        "with or written by another tool"
    )
    sink.discard([evil])
    assert canary.read_text() == "canary"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "canary.parquet"]
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["table"]
    sink.commit("job-1", 1, [good])
    assert read_table(str(table)).column("x").to_pylist() == [1]


def test_split_ids_that_leave_the_source_directory_are_refused(tmp_path: Path) -> None:
    from regional.sources.files import FileSource
    from regional.sources.log import LogSource

    (tmp_path / "in").mkdir()
    (tmp_path / "secret.jsonl").write_text('{"x": 1}\n')
    source = FileSource(str(tmp_path / "in"), format="jsonl")
    with pytest.raises(MetadataError) as exc:
        source.read("../secret.jsonl", b"", 10)
    assert str(exc.value) == (
        f"split id '../secret.jsonl' of the file source at {tmp_path}/in is not a file name (it "
        "contains a slash, backslash or NUL byte); split ids are restored from checkpoints, so "
        "that one was tampered with: restore another checkpoint"
    )
    with pytest.raises(MetadataError, match=r"^split id '\.\.' of the log source at "):
        LogSource(str(tmp_path / "in")).read("..", b"", 10)


@pytest.mark.parametrize("view", ["checkpoints", "validate", "retention", "events"])
def test_inspecting_a_directory_that_is_not_a_job_root_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], view: str
) -> None:
    (tmp_path / "etc" / "apt" / "sources.list.d").mkdir(parents=True)
    (tmp_path / "etc" / "apt" / "sources.list").write_text("deb http://x y z\n")
    assert main(["inspect", str(tmp_path / "etc"), "--job", "apt", view]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"regional inspect: {tmp_path}/etc/apt is not a regional job root: it holds none of "
        "chk-<id>/, _lease/, events/, savepoints/, shared/; check ROOT and --job\n"
    )
    (tmp_path / "etc" / "empty").mkdir()  # a job that has not checkpointed yet is fine
    assert main(["inspect", str(tmp_path / "etc"), "--job", "empty", view]) == 0
