"""Decoding large `_metadata` files: the value checks run over whole columns, and a damaged
value anywhere is still refused with the subtask that holds it."""

from __future__ import annotations

import msgspec
import pytest

from metadata.errors import MetadataError
from metadata.format import decode_metadata, encode_metadata
from metadata.model import CheckpointKind, CheckpointMetadata, StateHandle, SubtaskState

N = 20_000


def _checkpoint(n: int = N, **last: object) -> CheckpointMetadata:
    """Checkpoint 9 of `n` single-segment subtasks; `last` overrides fields of the last one's
    handle (`ref` its `ref_checkpoint_id`)."""
    subtasks = []
    for i in range(n):
        h = StateHandle(f"chk-9/u{i}-a1.state", 0, 10, 10, b"c" * 16)
        ref = None
        if i == n - 1:
            ref = last.pop("ref", None)
            h = msgspec.structs.replace(h, **last)
        subtasks.append(SubtaskState("map", i, i, ref, handles=(h,)))
    return CheckpointMetadata(
        checkpoint_id=9,
        job_id="job",
        kind=CheckpointKind.REGIONAL,
        trigger_time_ms=1,
        completion_time_ms=2,
        subtasks=tuple(subtasks),
    )


def test_a_large_checkpoint_round_trips() -> None:
    md = _checkpoint()
    assert decode_metadata(encode_metadata(md), source="chk-9/_metadata") == md


def test_a_path_the_fast_check_does_not_know_is_checked_in_full_and_kept() -> None:
    md = _checkpoint(path=".state/u-last")  # a leading dot is a safe name
    got = decode_metadata(encode_metadata(md), source="chk-9/_metadata")
    assert got.subtasks[-1].handles[0].path == ".state/u-last"


@pytest.mark.parametrize(
    ("last", "what"),
    [
        (
            {"path": "chk-9/../../etc/passwd"},
            "has state handle path 'chk-9/../../etc/passwd' ('..' is not allowed)",
        ),
        ({"path": "/etc/passwd"}, "has state handle path '/etc/passwd' (it is absolute or a URI)"),
        ({"path": "s3://b/x"}, "has state handle path 's3://b/x' (it is absolute or a URI)"),
        ({"path": "chk-9//x"}, "has state handle path 'chk-9//x' (it has an empty component)"),
        ({"offset": 5}, "has segment 5+10 outside file 'chk-9/u19999-a1.state' of 10 bytes"),
        ({"ref": 9}, "refers to checkpoint 9"),
    ],
)
def test_one_damaged_value_in_the_last_of_many_subtasks_is_named(
    last: dict[str, object], what: str
) -> None:
    data = encode_metadata(_checkpoint(**last))
    with pytest.raises(MetadataError) as err:
        decode_metadata(data, source="chk-9/_metadata")
    assert str(err.value).startswith(f"chk-9/_metadata: subtask map[{N - 1}] {what}")
    assert str(err.value).endswith("; the metadata of checkpoint 9 is damaged")
