"""`regional clean` and `regional inspect` keep what the job kept: the `num-retained` recorded
in its checkpoints, unless `--num-retained N` or `--policy FILE` says otherwise (exact output,
exact files kept)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from metadata.model import CheckpointMetadata, SubtaskState
from metadata.storage import JobStorage
from regional.cli import main

DEFAULT_NOTE = (
    "num-retained 3 (default: no checkpoint records one; pass --num-retained N or --policy FILE "
    "if the job kept another number)"
)


def write_job(root: Path, count: int, num_retained: int | None) -> JobStorage:
    """Global checkpoints 1..count of one unit (one state file each), recording
    `num_retained` (None: metadata as written before it was recorded)."""
    storage = JobStorage(str(root), "orders")
    for cid in range(1, count + 1):
        handles = storage.write_segments(f"chk-{cid}/u0-a0.state", [b"state"])
        storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id="orders",
                kind="global",
                trigger_time_ms=1000 * cid,
                completion_time_ms=1000 * cid + 10,
                subtasks=(SubtaskState("map", 0, 0, handles=handles),),
                num_retained=num_retained,
            )
        )
    return storage


def checkpoint_dirs(storage: JobStorage) -> list[int]:
    return sorted({int(f.path.split("/")[0][4:]) for f in storage.list_files()})


def clean(capsys, root: Path, *argv: str) -> tuple[int, list[str], str]:
    code = main(["clean", str(root), *argv])
    out, err = capsys.readouterr()
    return code, out.splitlines(), err


def totals(lines: list[str]) -> list[str]:
    """The lines under the plan table, from the num-retained note on."""
    return lines[next(i for i, line in enumerate(lines) if line.startswith("num-retained")) :]


@pytest.fixture(autouse=True)
def _no_policy_environment(monkeypatch) -> None:
    monkeypatch.delenv("REGIONAL_CHECKPOINTING__NUM_RETAINED", raising=False)


def test_clean_keeps_the_num_retained_the_job_recorded(tmp_path, capsys) -> None:
    storage = write_job(tmp_path, 12, num_retained=10)
    code, lines, err = clean(capsys, tmp_path)
    assert (code, err) == (0, "")
    assert totals(lines)[:3] == [
        "num-retained 10 (recorded in checkpoint 12)",
        "retained checkpoints: 3, 4, 5, 6, 7, 8, 9, 10, 11, 12",
        "kept: 20 files, 2613 bytes; planned for deletion: 4 files, 522 bytes",
    ]
    assert checkpoint_dirs(storage) == list(range(3, 13))


def test_num_retained_option_overrides_the_recorded_value(tmp_path, capsys) -> None:
    storage = write_job(tmp_path, 12, num_retained=10)
    code, lines, _ = clean(capsys, tmp_path, "--num-retained", "2")
    assert code == 0
    assert totals(lines)[:2] == [
        "num-retained 2 (--num-retained)",
        "retained checkpoints: 11, 12",
    ]
    assert checkpoint_dirs(storage) == [11, 12]


def test_policy_file_overrides_the_recorded_value(tmp_path, capsys) -> None:
    storage = write_job(tmp_path / "ckpt", 12, num_retained=10)
    policy = tmp_path / "policy.toml"
    policy.write_text("[checkpointing]\nnum-retained = 4\n")
    code, lines, _ = clean(capsys, tmp_path / "ckpt", "--dry-run", "--policy", str(policy))
    assert code == 0
    assert totals(lines)[:2] == [
        f"num-retained 4 (policy file {policy})",
        "retained checkpoints: 9, 10, 11, 12",
    ]
    # both: the option wins, and the note says over what
    code, lines, _ = clean(
        capsys, tmp_path / "ckpt", "--policy", str(policy), "--num-retained", "5"
    )
    assert totals(lines)[0] == f"num-retained 5 (--num-retained, over 4 from policy file {policy})"
    assert checkpoint_dirs(storage) == [8, 9, 10, 11, 12]


def test_policy_file_values_come_with_their_source(tmp_path, capsys, monkeypatch) -> None:
    write_job(tmp_path / "ckpt", 4, num_retained=1)
    silent = tmp_path / "silent.toml"
    silent.write_text("[checkpointing]\ninterval = 30\n")
    _, lines, _ = clean(capsys, tmp_path / "ckpt", "--dry-run", "--policy", str(silent))
    assert totals(lines)[:2] == [
        f"num-retained 3 (policy default: {silent} does not set checkpointing.num-retained)",
        "retained checkpoints: 2, 3, 4",
    ]
    monkeypatch.setenv("REGIONAL_CHECKPOINTING__NUM_RETAINED", "2")
    _, lines, _ = clean(capsys, tmp_path / "ckpt", "--dry-run", "--policy", str(silent))
    assert totals(lines)[0] == (
        "num-retained 2 (environment variable REGIONAL_CHECKPOINTING__NUM_RETAINED, applied "
        f"over policy file {silent})"
    )
    # without --policy the environment is not the job's record: the recorded value applies
    _, lines, _ = clean(capsys, tmp_path / "ckpt", "--dry-run")
    assert totals(lines)[0] == "num-retained 1 (recorded in checkpoint 4)"


def test_old_metadata_without_the_field_falls_back_to_3_and_says_so(tmp_path, capsys) -> None:
    storage = write_job(tmp_path, 6, num_retained=None)
    code, lines, _ = clean(capsys, tmp_path)
    assert code == 0
    assert totals(lines)[:2] == [DEFAULT_NOTE, "retained checkpoints: 4, 5, 6"]
    assert checkpoint_dirs(storage) == [4, 5, 6]


def test_the_newest_recorded_value_applies(tmp_path, capsys) -> None:
    storage = write_job(tmp_path, 3, num_retained=None)  # written before it was recorded
    for cid in (4, 5):  # then the job ran on a version that records it
        handles = storage.write_segments(f"chk-{cid}/u0-a0.state", [b"state"])
        storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id="orders",
                kind="global",
                trigger_time_ms=0,
                completion_time_ms=0,
                subtasks=(SubtaskState("map", 0, 0, handles=handles),),
                num_retained=4,
            )
        )
    _, lines, _ = clean(capsys, tmp_path, "--dry-run")
    assert totals(lines)[:2] == [
        "num-retained 4 (recorded in checkpoint 5)",
        "retained checkpoints: 2, 3, 4, 5",
    ]


def test_clean_json_leads_with_the_num_retained_row(tmp_path, capsys) -> None:
    write_job(tmp_path, 12, num_retained=10)
    assert main(["clean", str(tmp_path), "--dry-run", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0] == {
        "row": "num-retained",
        "checkpoint_id": 12,
        "path": None,
        "action": "report",
        "reason": "recorded",
        "kept_by": [],
        "units": [],
        "kept_bytes": 0,
        "deleted_bytes": 0,
        "detail": "num-retained 10 (recorded in checkpoint 12)",
    }
    kept = [r["checkpoint_id"] for r in rows if r["row"] == "checkpoint" and r["action"] == "keep"]
    assert kept == list(range(3, 13))
    assert main(["clean", str(tmp_path), "--json", "--num-retained", "2"]) == 0
    first = json.loads(capsys.readouterr().out)[0]
    assert (first["reason"], first["checkpoint_id"], first["status"]) == ("option", None, None)
    assert first["detail"] == "num-retained 2 (--num-retained)"


def test_inspect_checkpoints_and_retention_use_the_recorded_value(tmp_path, capsys) -> None:
    write_job(tmp_path, 12, num_retained=10)
    assert main(["inspect", str(tmp_path), "checkpoints"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == "num-retained 10 (recorded in checkpoint 12)"
    assert main(["inspect", str(tmp_path), "checkpoints", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["checkpoint_id"] for r in rows if r["retained"]] == list(range(12, 2, -1))
    assert main(["inspect", str(tmp_path), "--num-retained", "2", "checkpoints", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["checkpoint_id"] for r in rows if r["retained"]] == [12, 11]
    assert main(["inspect", str(tmp_path), "retention", "--num-retained", "2"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert totals(out)[:2] == ["num-retained 2 (--num-retained)", "retained checkpoints: 11, 12"]
    assert main(["inspect", str(tmp_path), "retention", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)[0]
    assert first["detail"] == "num-retained 10 (recorded in checkpoint 12)"


def test_inspect_checkpoints_of_old_metadata_says_the_default_applies(tmp_path, capsys) -> None:
    write_job(tmp_path, 4, num_retained=None)
    policy = tmp_path / "p.toml"
    policy.write_text("[checkpointing]\nnum-retained = 1\n")
    assert main(["inspect", str(tmp_path), "checkpoints"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == DEFAULT_NOTE
    assert main(["inspect", str(tmp_path), "checkpoints", "--policy", str(policy)]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"num-retained 1 (policy file {policy})"


@pytest.mark.parametrize("command", [["clean"], ["inspect", "--job", "orders", "retention"]])
def test_bad_policy_file_and_bad_values_exit_2_naming_them(tmp_path, capsys, command) -> None:
    write_job(tmp_path / "ckpt", 2, num_retained=10)
    bad = tmp_path / "bad.toml"
    bad.write_text("[checkpointing]\nnum-retained = 0\n")
    root = str(tmp_path / "ckpt")
    assert main([command[0], root, *command[1:], "--policy", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"regional {command[0]}: policy file {bad}: checkpointing.num-retained")
    assert main([command[0], root, *command[1:], "--policy", str(tmp_path / "nope.toml")]) == 2
    assert f"policy file {tmp_path / 'nope.toml'} does not exist" in capsys.readouterr().err
    assert main([command[0], root, *command[1:], "--num-retained", "0"]) == 2
    assert (
        f"regional {command[0]}: --num-retained 0 is out of range; give a whole number from 1 to "
        "1000000, the range of checkpointing.num-retained\n"
    ) == capsys.readouterr().err
    assert sorted(f.path for f in JobStorage(root, "orders").list_files())[0] == "chk-1/_metadata"
