"""Hostile input to the decoders of what storage holds: only the library's errors leave them.

The metadata fuzz builds a valid body with msgspec, mutates it (bytes, strings, integers,
nesting) and recomputes the checksum, so it reaches the msgpack body past the digest. The
events decoder gets deep nesting and invalid UTF-8. Regression tests pin the defects the fuzz
and the audit found (issue 12: `UnicodeDecodeError` escaping; issue 18: 2**64-1 timestamps).
"""

from __future__ import annotations

import contextlib
import struct

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import metadata.subtasks
from metadata.errors import MetadataError
from metadata.events import CheckpointEvent, Outcome, decode_event, encode_event, events_table
from metadata.format import FORMAT_MINOR, FORMAT_VERSION, MAGIC, decode_metadata, encode_metadata
from metadata.format import segment_checksum as checksum
from metadata.inspect import Inspector
from metadata.model import CheckpointMetadata
from metadata.store import CompletedCheckpointStore

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def envelope(body: bytes) -> bytes:
    """A `_metadata` file with a correct header and checksum around `body`."""
    header = struct.pack(">4sHHQ", MAGIC, FORMAT_VERSION, FORMAT_MINOR, len(body))
    return header + body + checksum(header + body)


def valid_fields() -> dict:
    """The body of a regional checkpoint with every kind of value, as plain msgpack fields."""
    return {
        "checkpoint_id": 5,
        "job_id": "job",
        "kind": "regional",
        "trigger_time_ms": 1_700_000_000_000,
        "completion_time_ms": 1_700_000_000_250,
        "reasons": ["unit 1 declined"],
        "vertices": [["map", 2, 128]],
        "units": [[0], [1, 3, "declined: boom"]],
        "coordinators": {"src": b"\x92\x01\x90"},
        "subtasks": [
            ["map", 0, 0, None, [["chk-5/u0-a0.state", 0, 4, 4, b"\x00" * 16]], [["s0", b"7"]]],
            ["map", 1, 1, 3, [["chk-3/u1-a0.state", 0, 2, 2, b"\x01" * 16]]],
        ],
    }


def decodes_or_refuses(data: bytes) -> CheckpointMetadata | None:
    try:
        return decode_metadata(data, source="chk-5/_metadata")
    except MetadataError as exc:
        assert str(exc).startswith("chk-5/_metadata")
        return None


def test_invalid_utf8_in_a_string_with_a_valid_checksum_is_damaged_metadata() -> None:
    body = msgspec.msgpack.encode({**valid_fields(), "job_id": "jo\u00ff"})
    body = body.replace("jo\u00ff".encode(), b"jo\xff\xfe")  # same length, not UTF-8
    with pytest.raises(MetadataError) as exc:
        decode_metadata(envelope(body), source="chk-5/_metadata")
    # ours: the file, that it does not decode, what to do; the decoder's own words in between
    # are detail, and their wording changes between msgspec releases
    message = str(exc.value)
    assert message.startswith("chk-5/_metadata does not decode (")
    assert message.endswith("); the file is damaged")


def test_a_store_and_the_cleaner_report_such_a_checkpoint_as_damaged(tmp_path) -> None:
    from cleaner.run import scan
    from metadata.storage import JobStorage

    storage = JobStorage(str(tmp_path), "job")
    body = msgspec.msgpack.encode({**valid_fields(), "job_id": "jo\u00ff", "subtasks": []})
    (tmp_path / "job" / "chk-5").mkdir(parents=True)
    (tmp_path / "job" / "chk-5" / "_metadata").write_bytes(
        envelope(body.replace("jo\u00ff".encode(), b"jo\xff\xfe"))
    )
    store = CompletedCheckpointStore.load(storage)
    assert [d.checkpoint_id for d in store.damaged] == [5] and len(store) == 0
    plan = scan(storage, num_retained=1)
    assert [(c.checkpoint_id, c.action.value, c.reason.value) for c in plan.checkpoints] == [
        (5, "keep", "damaged")
    ]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"trigger_time_ms": 2**64 - 1},
            r"Expected `int` <= 253402300799999 - at `\$.trigger_time_ms`",
        ),
        (
            {"completion_time_ms": 2**64 - 1},
            r"Expected `int` <= 253402300799999 - at `\$.completion_time_ms`",
        ),
        (
            {"checkpoint_id": 2**64 - 1},
            r"Expected `int` <= 9223372036854775807 - at `\$.checkpoint_id`",
        ),
        (
            {"subtasks": [["map", 0, 0, None, [["chk-5/a", 0, 1, 2**64 - 1, b""]]]]},
            r"Expected `int` <= 9223372036854775807 - at `\$.subtasks\[0\]\[4\]\[0\]\[3\]`",
        ),
    ],
)
def test_integers_beyond_what_a_writer_produces_make_the_file_damaged(
    change: dict, message: str
) -> None:
    body = msgspec.msgpack.encode({**valid_fields(), **change})
    with pytest.raises(MetadataError, match=rf"^chk-5/_metadata does not decode \({message}\)"):
        decode_metadata(envelope(body), source="chk-5/_metadata")


def test_the_views_show_the_largest_timestamps_a_file_may_hold() -> None:
    last_ms = 253_402_300_799_999  # 9999-12-31T23:59:59.999Z
    body = msgspec.msgpack.encode(
        {**valid_fields(), "trigger_time_ms": last_ms, "completion_time_ms": last_ms}
    )
    md = decode_metadata(envelope(body), source="chk-5/_metadata")
    row = Inspector(CompletedCheckpointStore([md])).checkpoints().to_pylist()[0]
    assert row["checkpoint_id"] == 5
    assert str(row["complete_time"]) == "9999-12-31 23:59:59.999000+00:00"


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("../../x", "'..' is not allowed"),
        ("/etc/passwd", "it is absolute or a URI"),
        ("s3://other/x", "it is absolute or a URI"),
        ("chk-5//u0.state", "it has an empty component"),
        ("chk-5/..\\..\\x", "it contains a slash, backslash or NUL byte"),
        ("chk-5/u0\x00.state", "it contains a slash, backslash or NUL byte"),
        ("C:/x", "it is absolute or a URI"),
    ],
)
def test_state_handle_paths_that_leave_the_job_root_are_refused_at_decode(
    path: str, problem: str
) -> None:
    fields = valid_fields()
    fields["subtasks"][0][4][0][0] = path
    with pytest.raises(MetadataError) as exc:
        decode_metadata(envelope(msgspec.msgpack.encode(fields)), source="chk-5/_metadata")
    assert str(exc.value) == (
        f"chk-5/_metadata: subtask map[0] has state handle path {path!r} ({problem}); state "
        "paths are relative to the job root and never leave it; the metadata of checkpoint 5 "
        "is damaged"
    )


# -- fuzz: a valid body, mutated, with a correct checksum ----------------------------------


def _mutations() -> st.SearchStrategy:
    """A function mutating a msgpack-able tree: replace a leaf, wrap it deep, drop a field."""
    leaf = (
        st.integers(min_value=-(2**64), max_value=2**64 - 1)
        | st.text(max_size=6)
        | st.binary(max_size=6)
        | st.none()
        | st.booleans()
        | st.floats(allow_nan=True)
        | st.sampled_from(["..", "/etc/passwd", "../../../escape", "", "chk-5/../.."])
    )
    return st.tuples(st.integers(min_value=0, max_value=10_000), leaf, st.integers(0, 3))


def _paths(tree: object, at: tuple = ()) -> list[tuple]:
    out = [at]
    if isinstance(tree, dict):
        for k, v in tree.items():
            out += _paths(v, (*at, k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _paths(v, (*at, i))
    return out


def _mutate(tree: dict, pick: int, value: object, how: int) -> object:
    paths = _paths(tree)[1:]
    at = paths[pick % len(paths)]
    parent: object = tree
    for key in at[:-1]:
        parent = parent[key]  # type: ignore[index]
    key = at[-1]
    if how == 0:
        parent[key] = value  # type: ignore[index]
    elif how == 1:  # deep nesting where a value was
        deep: object = value
        for _ in range(200):
            deep = [deep]
        parent[key] = deep  # type: ignore[index]
    elif how == 2:
        del parent[key]  # type: ignore[attr-defined]
    else:  # a value of another type in a list, or an unknown key
        if isinstance(parent, list):
            parent.append(value)
        else:
            parent["x-unknown"] = value  # type: ignore[index]
    return tree


@FUZZ
@given(st.lists(_mutations(), min_size=1, max_size=4))
def test_fuzz_mutated_bodies_with_valid_checksums(mutations: list) -> None:
    tree = valid_fields()
    for pick, value, how in mutations:
        _mutate(tree, pick, value, how)
    try:
        body = msgspec.msgpack.encode(tree)
    except (OverflowError, ValueError):
        return  # not representable in msgpack: nothing to decode
    md = decodes_or_refuses(envelope(body))
    if md is not None:  # it decoded: a checkpoint whose values are all in range
        assert decode_metadata(encode_metadata(md), source="again") == md
        Inspector(CompletedCheckpointStore([md])).checkpoints()  # the views can show it


@FUZZ
@given(st.binary(min_size=1, max_size=8), st.integers(min_value=0, max_value=400))
def test_fuzz_raw_byte_splices_in_the_body_with_valid_checksums(junk: bytes, at: int) -> None:
    body = msgspec.msgpack.encode(valid_fields())
    at %= len(body)
    decodes_or_refuses(envelope(body[:at] + junk + body[at + len(junk) :]))


def test_deeply_nested_metadata_body_is_damaged_not_a_crash() -> None:
    body = b"\x91" * 100_000 + b"\x00"  # an array of an array of ... 100k deep
    with pytest.raises(MetadataError, match=r"^chk-5/_metadata does not decode"):
        decode_metadata(envelope(body), source="chk-5/_metadata")


# -- the subtask columns of format 1.5 ---------------------------------------------------


@pytest.fixture(params=["python", "arrow"])
def column_checks(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Both ways the columns are checked: in Python (small files) and in Arrow (large ones)."""
    if request.param == "arrow":
        monkeypatch.setattr(metadata.subtasks, "ARROW_FROM_ROWS", 0)
    return request.param


def valid_columns() -> dict:
    """`valid_fields()` as format 1.5 writes it: the subtasks as columns (a msgpack map)."""
    md = decode_metadata(envelope(msgspec.msgpack.encode(valid_fields())), source="x")
    tree = msgspec.msgpack.decode(encode_metadata(md)[16:-16])
    assert tree["subtasks"]["count"] == 2 and tree["subtasks"]["paths"] == [
        "chk-5/u0-a0.state",
        "chk-3/u1-a0.state",
    ]
    return tree


@pytest.mark.parametrize(
    ("columns", "problem"),
    [
        (
            {"index": b"\x00\x01\x02"},
            "subtask column `index` holds 3 bytes for 2 rows, not 1, 2, 4 or 8 bytes each",
        ),
        (
            {"unit_id": b"\x00\x00\x00\x00\x00\x01"},
            "subtask column `unit_id` holds 6 bytes for 2 rows, not 1, 2, 4 or 8 bytes each",
        ),
        (
            {"handle_count": 3},
            "subtask column `path` holds 2 bytes for 3 rows, not 1, 2, 4 or 8 bytes each",
        ),
        ({"handles": 2}, "subtask column `handles` counts 4 handles, `handle_count` 2"),
        (
            {"checksums": b"\x00" * 31},
            "subtask column `checksums` holds 31 bytes for 2 handles, not one length each",
        ),
        ({"checksums": [b"\x00"]}, "subtask column `checksums` holds 1 of 2 handles"),
        (
            {"split_states": {7: [["s", b""]]}},
            "subtask column `split_states` names row 7 of 2 subtasks",
        ),
        ({"committables": {2: [b"c"]}}, "subtask column `committables` names row 2 of 2 subtasks"),
        ({"vertex": b"\x00\x05"}, "subtask column `vertex` holds 5, past its 1 vertex ids"),
        ({"vertex": 1}, "subtask column `vertex` holds 1, past its 1 vertex ids"),
        ({"path": b"\x00\x00"}, "subtask column `path` uses 1 of 2 paths, each listed once"),
        (
            {"paths": ["chk-5/u0-a0.state", "chk-5/u0-a0.state"]},
            "subtask column `path` uses 2 of 2 paths, each listed once",
        ),
        (
            {"offset": b"\xff" * 16},
            "subtask column `offset` holds 18446744073709551615, more than a 64-bit count",
        ),
        ({"index": "0"}, "Expected `int | bytes`, got `str` - at `$.subtasks.index`"),
        ({"index": -1}, "Expected `int` >= 0 - at `$.subtasks.index`"),
        ({"paths": [1, 2]}, "Expected `str`, got `int` - at `$.subtasks.paths[0]`"),
        ({"count": "2"}, "Expected `int`, got `str` - at `$.subtasks.count`"),
    ],
    ids=lambda v: next(iter(v)) if isinstance(v, dict) else None,
)
def test_subtask_columns_that_do_not_fit_are_damaged_naming_the_column(
    columns: dict, problem: str, column_checks: str
) -> None:
    tree = valid_columns()
    tree["subtasks"].update(columns)
    with pytest.raises(MetadataError) as exc:
        decode_metadata(envelope(msgspec.msgpack.encode(tree)), source="chk-5/_metadata")
    assert str(exc.value) == f"chk-5/_metadata does not decode ({problem}); the file is damaged"


@pytest.mark.parametrize(
    ("columns", "what"),
    [
        ({"ref": b"\x00\x06"}, "subtask map[1] refers to checkpoint 5"),
        ({"ref": 7}, "subtask map[0] refers to checkpoint 6"),
        (
            {"paths": ["chk-5/u0-a0.state", "../../x"]},
            "subtask map[1] has state handle path '../../x' ('..' is not allowed); state paths "
            "are relative to the job root and never leave it",
        ),
        (
            {"offset": b"\x00\x01"},
            "subtask map[1] has segment 1+2 outside file 'chk-3/u1-a0.state' of 2 bytes",
        ),
        ({"size": 3}, "subtask map[0] has segment 0+4 outside file 'chk-5/u0-a0.state' of 3 bytes"),
    ],
)
def test_damaged_values_in_columns_name_the_first_subtask_that_holds_one(
    columns: dict, what: str, column_checks: str
) -> None:
    tree = valid_columns()
    tree["subtasks"].update(columns)
    with pytest.raises(MetadataError) as exc:
        decode_metadata(envelope(msgspec.msgpack.encode(tree)), source="chk-5/_metadata")
    assert str(exc.value) == (f"chk-5/_metadata: {what}; the metadata of checkpoint 5 is damaged")


@settings(FUZZ, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(mutations=st.lists(_mutations(), min_size=1, max_size=4))
def test_fuzz_mutated_columns_with_valid_checksums(mutations: list, column_checks: str) -> None:
    tree = valid_columns()
    for pick, value, how in mutations:
        _mutate(tree["subtasks"], pick, value, how)
    try:
        body = msgspec.msgpack.encode(tree)
    except (OverflowError, ValueError):
        return  # not representable in msgpack: nothing to decode
    md = decodes_or_refuses(envelope(body))
    if md is not None:  # it decoded: every row builds, and the views can show it
        assert len(tuple(md.subtasks)) == len(md.subtasks)
        assert decode_metadata(encode_metadata(md), source="again") == md
        Inspector(CompletedCheckpointStore([md])).checkpoints()


@FUZZ
@given(st.binary(min_size=1, max_size=8), st.integers(min_value=0, max_value=400))
def test_fuzz_raw_byte_splices_in_the_columns_with_valid_checksums(junk: bytes, at: int) -> None:
    body = msgspec.msgpack.encode(valid_columns())
    start = body.index(b"subtasks")
    at = start + at % (len(body) - start)
    md = decodes_or_refuses(envelope(body[:at] + junk + body[at + len(junk) :]))
    if md is not None:
        assert len(tuple(md.subtasks)) == len(md.subtasks)


# -- events ----------------------------------------------------------------------------------

EVENT = CheckpointEvent(
    job_id="j",
    checkpoint_id=2,
    kind=Outcome.REGIONAL,
    trigger_time_ms=1000,
    time_ms=1250,
    fresh_units=7,
    fallback_units=(3,),
    causes={3: "declined: boom"},
)


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 100_000 + b"]" * 100_000,
        b'{"event":"checkpoint","job_id":' + b"[" * 100_000,
        encode_event(EVENT).replace(b'"j"', b'"\xff"'),
        encode_event(EVENT).replace(b"1250", b"18446744073709551615"),
        encode_event(EVENT).replace(b"1000", b"99999999999999999999999"),
        b"\xef\xbb\xbf" + encode_event(EVENT),
    ],
    ids=["deep-array", "deep-field", "invalid-utf8", "u64-time", "huge-int", "bom"],
)
def test_hostile_event_files_are_refused_with_the_file_named(data: bytes) -> None:
    with pytest.raises(MetadataError, match=r"^event file events/x.json is not a checkpoint"):
        decode_event(data, source="events/x.json")


@FUZZ
@given(st.binary(min_size=1, max_size=8), st.integers(min_value=0, max_value=400))
def test_fuzz_event_splices(junk: bytes, at: int) -> None:
    line = encode_event(EVENT)
    at %= len(line)
    try:
        event = decode_event(line[:at] + junk + line[at + len(junk) :], source="events/x.json")
    except MetadataError:
        return
    events_table([event])  # whatever decodes, the events view can show


@FUZZ
@given(st.binary(max_size=200))
def test_fuzz_event_random_bytes(data: bytes) -> None:
    with contextlib.suppress(MetadataError):  # anything else fails the test
        decode_event(data, source="events/x.json")
