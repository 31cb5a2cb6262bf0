"""The `_metadata` binary format: round trips, the committed v1 fixture, every error, fuzzing."""

from __future__ import annotations

import importlib.util
import pickle
import struct
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metadata.errors import MetadataError
from metadata.format import (
    FORMAT_MINOR,
    FORMAT_VERSION,
    MAGIC,
    decode_metadata,
    encode_metadata,
    segment_checksum,
)
from metadata.layout import name_problem, path_problem
from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    SplitState,
    StateHandle,
    SubtaskState,
    UnitState,
    VertexInfo,
)

FIXTURES = Path(__file__).parent / "fixtures" / "metadata"


def _fixture_module(name: str = "make_v1"):
    spec = importlib.util.spec_from_file_location(name, FIXTURES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _envelope(body: bytes, major: int = FORMAT_VERSION, minor: int = FORMAT_MINOR) -> bytes:
    """A file with a correct header and checksum around an arbitrary body."""
    header = struct.pack(">4sHHQ", MAGIC, major, minor, len(body))
    return header + body + segment_checksum(header + body)


FULL = _fixture_module().expected()


@pytest.mark.parametrize("kind", list(CheckpointKind))
def test_every_field_and_kind_round_trips(kind: CheckpointKind) -> None:
    md = msgspec.structs.replace(FULL, kind=kind)
    back = decode_metadata(encode_metadata(md), source="chk-5/_metadata")
    assert back == md
    assert back.kind is kind
    assert back.subtasks[1].handles[1].shared is True
    assert back.coordinators == {"source": b"enumerator-state", "sink": b"\x00\x01"}
    assert back.subtasks[3].committables == (b"c-3-1", b"c-3-2")


def test_defaults_round_trip() -> None:
    md = CheckpointMetadata(
        checkpoint_id=0, job_id="", kind="global", trigger_time_ms=0, completion_time_ms=0
    )
    assert decode_metadata(encode_metadata(md), source="x") == md


def test_reads_the_committed_version_1_fixture() -> None:
    data = (FIXTURES / "v1-regional.bin").read_bytes()
    assert data[:4] == b"RGNL" and struct.unpack(">HH", data[4:8]) == (1, 0)
    assert decode_metadata(data, source="v1-regional.bin") == FULL
    if (FORMAT_VERSION, FORMAT_MINOR) == (1, 0):  # the writer still produces the same bytes
        assert encode_metadata(FULL) == data


def test_bytes_per_subtask_stay_under_budget() -> None:
    def subtask(i: int) -> SubtaskState:
        handle = StateHandle(f"chk-12345/u{i}-a3.state", 0, 4096, 4096, bytes(16))
        return SubtaskState(
            f"vertex-{i % 8}", i, i, ref_checkpoint_id=12000 if i % 2 else None, handles=(handle,)
        )

    n = 2000
    md = CheckpointMetadata(
        checkpoint_id=12345,
        job_id="j",
        kind="regional",
        trigger_time_ms=1,
        completion_time_ms=2,
        units=tuple(UnitState(i, 12000 if i % 2 else None, "timeout") for i in range(n)),
        vertices=tuple(VertexInfo(f"vertex-{v}", n // 8, 32768) for v in range(8)),
        subtasks=tuple(subtask(i) for i in range(n)),
    )
    per_subtask = len(encode_metadata(md)) / n
    assert per_subtask < 300, per_subtask


def _corrupt(source: str = "/ckpt/job/chk-5/_metadata"):
    return pytest.raises(MetadataError, match=f"^{source}")


GOOD = encode_metadata(FULL)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"", "is truncated: 0 bytes"),
        (b"RG", "is truncated: 2 bytes"),
        (GOOD[:10], "is truncated: 10 bytes, shorter than the 16-byte header"),
        (GOOD[:-1], f"is truncated: {len(GOOD) - 1} of {len(GOOD)} bytes"),
        (GOOD + b"\x00", "has 1 unexpected trailing bytes"),
        (b"PK\x03\x04" + GOOD[4:], r"is not a regional .* \(bad magic b'PK\\x03\\x04'"),
        (GOOD[:-1] + bytes([GOOD[-1] ^ 1]), "fails its checksum"),
        (GOOD[:40] + bytes([GOOD[40] ^ 0x80]) + GOOD[41:], "fails its checksum"),
        (
            _envelope(b"", major=2, minor=0),
            "has format version 2.0, written by a newer regional.*upgrade",
        ),
        (
            _envelope(b"\x90", major=0, minor=0),
            "has format version 0.0, which no regional release writes",
        ),
        (_envelope(b"\xc1"), r"does not decode \(.*\); the file is damaged"),
        (_envelope(b"\x80"), r"does not decode \(Object missing required field"),
    ],
)
def test_unusable_files_raise_metadata_error_naming_the_file(data: bytes, message: str) -> None:
    with pytest.raises(MetadataError, match=f"^/ckpt/job/chk-5/_metadata {message}"):
        decode_metadata(data, source="/ckpt/job/chk-5/_metadata")


def test_newer_minor_with_appended_fields_still_decodes() -> None:
    body = msgspec.msgpack.encode(
        {
            "checkpoint_id": 1,
            "job_id": "j",
            "kind": "global",
            "trigger_time_ms": 0,
            "completion_time_ms": 0,
            "vertices": [["v", 1, 1, "a field from the future"]],
            "field_from_the_future": 3,
        }
    )
    md = decode_metadata(_envelope(body, minor=7), source="f")
    assert md.vertices == (VertexInfo("v", 1, 1),)


def test_newer_minor_that_does_not_decode_asks_for_an_upgrade() -> None:
    body = msgspec.msgpack.encode(
        {"checkpoint_id": 1, "job_id": "j", "kind": "partial", "trigger_time_ms": 0}
    )
    with pytest.raises(MetadataError, match=r"format 1\.7 is newer than this regional.*upgrade"):
        decode_metadata(_envelope(body, minor=7), source="f")


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"checkpoint_id": -1}, "negative checkpoint id -1"),
        ({"units": [[1, 5]]}, "unit 1 refers to checkpoint 5"),
        ({"subtasks": [["map", 0, 0, 7]]}, r"subtask map\[0\] refers to checkpoint 7"),
        (
            {"subtasks": [["map", 2, 0, None, [["chk-5/a", 3, 8, 10, b""]]]]},
            r"subtask map\[2\] has segment 3\+8 outside file 'chk-5/a' of 10 bytes",
        ),
        ({"kind": "partial"}, r"does not decode \(Invalid enum value 'partial'"),
    ],
)
def test_values_no_writer_produces_are_refused(change: dict, message: str) -> None:
    fields = {
        "checkpoint_id": 5,
        "job_id": "j",
        "kind": "regional",
        "trigger_time_ms": 0,
        "completion_time_ms": 0,
        **change,
    }
    with pytest.raises(MetadataError, match=f"^f: .*{message}|^f {message}"):
        decode_metadata(_envelope(msgspec.msgpack.encode(fields)), source="f")


def test_no_pickle_in_the_metadata_package() -> None:
    root = Path(__file__).parent.parent / "metadata"
    for path in root.glob("*.py"):
        assert "pickle" not in path.read_text(), path


# -- fuzzing: the only outcome of bad input is MetadataError ---------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode_or_metadata_error(data: bytes) -> CheckpointMetadata | None:
    try:
        return decode_metadata(data, source="fuzz")
    except MetadataError as exc:
        assert str(exc).startswith("fuzz")
        return None


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_bytes(data: bytes) -> None:
    assert _decode_or_metadata_error(data) is None


@FUZZ
@given(st.binary(max_size=300))
def test_fuzz_random_body_in_a_valid_envelope(body: bytes) -> None:
    md = _decode_or_metadata_error(_envelope(body))
    if md is not None:  # it decoded: a well-formed checkpoint that round-trips
        assert isinstance(md, CheckpointMetadata)
        assert decode_metadata(encode_metadata(md), source="again") == md


@FUZZ
@given(st.integers(min_value=0, max_value=len(GOOD) - 1))
def test_fuzz_truncations(n: int) -> None:
    assert _decode_or_metadata_error(GOOD[:n]) is None


@FUZZ
@given(st.integers(min_value=0, max_value=len(GOOD) * 8 - 1))
def test_fuzz_bit_flips(bit: int) -> None:
    flipped = bytearray(GOOD)
    flipped[bit // 8] ^= 1 << (bit % 8)
    assert _decode_or_metadata_error(bytes(flipped)) is None


@FUZZ
@given(st.integers(min_value=0, max_value=len(GOOD) - 1), st.binary(min_size=1, max_size=8))
def test_fuzz_splices(at: int, junk: bytes) -> None:
    assert _decode_or_metadata_error(GOOD[:at] + junk + GOOD[at + len(junk) :]) in (None, FULL)


@st.composite
def checkpoints(draw) -> CheckpointMetadata:
    """Arbitrary well-formed checkpoints (refs older than the checkpoint, segments inside)."""
    cid = draw(st.integers(min_value=1, max_value=2**53))
    small = st.integers(min_value=0, max_value=2**40)
    text = st.text(max_size=12)
    name = st.text(min_size=1, max_size=8).filter(lambda n: name_problem(n) is None)
    path = (
        st.lists(name, min_size=1, max_size=3)
        .map("/".join)
        .filter(lambda p: path_problem(p) is None)
    )
    ref = st.none() | st.integers(min_value=0, max_value=cid - 1)

    @st.composite
    def handles(draw) -> StateHandle:
        offset, length, extra = draw(small), draw(small), draw(small)
        return StateHandle(
            draw(path), offset, length, offset + length + extra, draw(st.binary(max_size=16)),
            draw(st.booleans()),
        )  # fmt: skip

    subtask = st.builds(
        SubtaskState,
        text,
        small,
        small,
        ref,
        st.lists(handles(), max_size=3).map(tuple),
        st.lists(st.builds(SplitState, text, st.binary(max_size=8)), max_size=2).map(tuple),
        st.lists(st.binary(max_size=8), max_size=2).map(tuple),
        small,
    )
    return CheckpointMetadata(
        checkpoint_id=cid,
        job_id=draw(text),
        kind=draw(st.sampled_from(list(CheckpointKind))),
        trigger_time_ms=draw(small),
        completion_time_ms=draw(small),
        policy_fingerprint=draw(text),
        graph_fingerprint=draw(text),
        reasons=tuple(draw(st.lists(text, max_size=2))),
        vertices=tuple(draw(st.lists(st.builds(VertexInfo, text, small, small), max_size=3))),
        units=tuple(draw(st.lists(st.builds(UnitState, small, ref, st.none() | text), max_size=3))),
        coordinators=draw(st.dictionaries(text, st.binary(max_size=8), max_size=2)),
        subtasks=tuple(draw(st.lists(subtask, max_size=4))),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checkpoints())
def test_any_checkpoint_round_trips(md: CheckpointMetadata) -> None:
    assert decode_metadata(encode_metadata(md), source="x") == md


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checkpoints())
def test_the_columns_answer_what_the_rows_do(md: CheckpointMetadata) -> None:
    data = encode_metadata(md)
    rows = tuple(md.subtasks)
    one_by_one = decode_metadata(data, source="x")  # rows read singly, none built before
    assert [one_by_one.subtasks[i] for i in range(len(rows))] == list(rows)
    for vertex_id in {s.vertex_id for s in rows} | {"absent"}:
        wanted = tuple(s for s in rows if s.vertex_id == vertex_id)
        assert decode_metadata(data, source="x").subtasks_of(vertex_id) == wanted
    back = decode_metadata(data, source="x")
    assert back.handle_paths == {h.path for s in rows for h in s.handles}
    assert back.referenced_checkpoint_ids == {s.ref_checkpoint_id for s in rows} - {None}
    assert back.state_bytes == sum(h.length for s in rows for h in s.handles)
    table = back.subtask_table
    assert table.unit_ids() == {s.unit_id for s in rows}
    assert table.unit_ids(fallback=True) == {s.unit_id for s in rows if s.is_fallback}
    assert table.unit_ids(fallback=False) == {s.unit_id for s in rows if not s.is_fallback}
    assert table.fallback_count() == sum(s.is_fallback for s in rows)
    made = md.subtask_table  # made from rows in code: the same answers without columns
    assert made.unit_ids(fallback=True) == table.unit_ids(fallback=True)
    assert made.fallback_count() == table.fallback_count()
    assert made.handle_paths() == back.handle_paths
    assert pickle.loads(pickle.dumps(back)) == md  # Spark ships metadata pickled


V1_4 = _fixture_module("make_v1_4").expected()


def test_reads_the_committed_version_1_4_fixture_in_the_row_layout() -> None:
    data = (FIXTURES / "v1.4-regional.bin").read_bytes()
    assert struct.unpack(">HH", data[4:8]) == (1, 4)
    md = decode_metadata(data, source="v1.4-regional.bin")
    assert md == V1_4
    assert md.subtasks[1].handles == V1_4.subtasks[1].handles  # two segments, one shared
    assert md.sinks == V1_4.sinks and md.consecutive_regional == 2 and md.num_retained == 3
    assert md.handle_paths == {"chk-8/u0-a1.state", "shared/sst-000042", "chk-6/u1-a0.state"}
    assert md.referenced_checkpoint_ids == {6} and md.state_bytes == 46
    assert [s.committables for s in md.subtasks_of("sink")] == [(b"c-8-0",), (b"c-6-1", b"c-6-2")]


def test_the_writer_writes_1_5_with_the_subtasks_as_columns_which_a_1_4_reader_refuses() -> None:
    data = encode_metadata(V1_4)
    assert struct.unpack(">HH", data[4:8]) == (1, 5)
    columns = msgspec.msgpack.decode(data[16:-16])["subtasks"]
    assert columns["vertex_ids"] == ["source", "sink"]
    assert columns["paths"] == ["chk-8/u0-a1.state", "shared/sst-000042", "chk-6/u1-a0.state"]
    assert (columns["count"], columns["handle_count"], columns["handles"]) == (4, 5, b"\1\2\1\1")
    assert columns["ref"] == b"\0\0\7\7"  # the owner's id + 1
    assert decode_metadata(data, source="x") == V1_4
    # what 1.4 did with the body: its subtasks are an array of `SubtaskState` arrays
    with pytest.raises(msgspec.ValidationError, match=r"Expected `array`, got `object`"):
        msgspec.convert(columns, tuple[SubtaskState, ...])


def test_a_checkpoint_without_subtasks_keeps_the_row_layout_any_1_x_reader_reads() -> None:
    md = msgspec.structs.replace(V1_4, subtasks=())
    body = msgspec.msgpack.decode(encode_metadata(md)[16:-16])
    assert "subtasks" not in body
    assert decode_metadata(encode_metadata(md), source="x") == md


def test_one_width_of_column_each_from_one_value_to_64_bits() -> None:
    big = 2**63 - 1
    handles = [StateHandle("chk-9/a", big - n, n, big, bytes(n % 17)) for n in (0, 1, 300, 70_000)]
    subtasks = tuple(SubtaskState("v", n, 2**32 + n, handles=(h,)) for n, h in enumerate(handles))
    md = CheckpointMetadata(
        checkpoint_id=9, job_id="j", kind="global", trigger_time_ms=1, completion_time_ms=2,
        subtasks=subtasks,
    )  # fmt: skip
    columns = msgspec.msgpack.decode(encode_metadata(md)[16:-16])["subtasks"]
    assert columns["size"] == big  # one value every row holds
    assert len(columns["index"]) == 4 and len(columns["unit_id"]) == 32  # 1 and 8 bytes each
    assert len(columns["length"]) == 16  # 4 bytes each
    assert isinstance(columns["checksums"], list)  # four lengths: one per handle
    assert decode_metadata(encode_metadata(md), source="x") == md


def test_a_writer_bug_that_would_store_a_negative_count_is_named() -> None:
    md = msgspec.structs.replace(V1_4, subtasks=(SubtaskState("v", 0, 0), SubtaskState("v", -3, 0)))
    with pytest.raises(MetadataError) as exc:
        encode_metadata(md)
    assert str(exc.value) == (
        "subtask column `index` cannot hold -3: a checkpoint records no negative or wider than "
        "64-bit counts, ids or sizes; fix the writer"
    )
