"""The retention rule (`metadata.retention`): the incremental form against a rescanning model,
the batch form against the incremental one, the coordinator against the batch form, and the
job's recorded `num-retained` in the metadata format and in savepoints."""

from __future__ import annotations

import ast
import struct
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.errors import MetadataError
from metadata.format import (
    FORMAT_MINOR,
    FORMAT_VERSION,
    decode_metadata,
    encode_metadata,
    segment_checksum,
)
from metadata.inspect import Inspector, checkpoints_table
from metadata.model import CheckpointKind, CheckpointMetadata, SubtaskState, VertexInfo
from metadata.retention import (
    DEFAULT_NUM_RETAINED,
    NumRetained,
    Retention,
    owner_refs,
    recorded_num_retained,
    retain,
)
from metadata.savepoint import open_checkpoint, write_savepoint
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from regional.coordinator import (
    CheckpointCoordinator,
    JobLayout,
    NotifySubsumed,
    WriteMetadata,
)
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy

FIXTURES = Path(__file__).parent / "fixtures" / "metadata"


def md(
    cid: int,
    kind: str = "global",
    refs: tuple[int, ...] = (),
    num_retained: int | None = None,
) -> CheckpointMetadata:
    """A checkpoint whose fallback subtasks (one per ref) point at `refs`."""
    fallback = [SubtaskState("map", i + 1, i + 1, r) for i, r in enumerate(refs)]
    subtasks = (SubtaskState("map", 0, 0), *fallback)
    return CheckpointMetadata(
        checkpoint_id=cid,
        job_id="j",
        kind=kind,
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=subtasks,
        num_retained=num_retained,
    )


# -- the rule ---------------------------------------------------------------------------------


@st.composite
def histories(draw) -> tuple[int, list[tuple[int, frozenset[int], bool]]]:
    """num-retained and completed checkpoints (id, owners, savepoint?) as a coordinator makes
    them: ids increase (with gaps for aborts); a checkpoint's owners are live, i.e. retained
    or referenced by a retained checkpoint (only the latest state is re-used), or 0; savepoints
    reference nothing."""
    n = draw(st.integers(1, 4))
    rule = Retention(n)
    out: list[tuple[int, frozenset[int], bool]] = []
    cid = 0
    for _ in range(draw(st.integers(0, 25))):
        cid += draw(st.integers(1, 3))
        savepoint = draw(st.integers(0, 5)) == 0
        live = sorted({0, *rule.retained, *rule.references()})
        owners = frozenset() if savepoint else frozenset(draw(st.sets(st.sampled_from(live))))
        rule.add(cid, owners, savepoint=savepoint)
        out.append((cid, owners, savepoint))
    return n, out


def _live(n: int, added: list[tuple[int, frozenset[int], bool]]) -> set[int]:
    """The model: rescan everything. Live = the newest n checkpoints, every savepoint, and
    every owner they reference (0, the initial state, is never a checkpoint)."""
    regular = [c for c, _, sp in added if not sp]
    kept = set(regular[-n:]) | {c for c, _, sp in added if sp}
    refs = {r for c, owners, _ in added if c in kept for r in owners}
    return (kept | refs) - {0}


@settings(max_examples=300, deadline=None)
@given(histories())
def test_incremental_rule_matches_a_rescan_and_reports_each_id_once(history) -> None:
    n, checkpoints = history
    rule = Retention(n)
    reported: list[int] = []
    for i, (cid, owners, savepoint) in enumerate(checkpoints):
        before = _live(n, checkpoints[:i])
        subsumed = rule.add(cid, owners, savepoint=savepoint)
        assert list(subsumed) == sorted(subsumed)
        assert set(subsumed) == before - _live(n, checkpoints[: i + 1])
        reported += subsumed
    assert len(reported) == len(set(reported))
    regular = [c for c, _, sp in checkpoints if not sp]
    assert rule.retained == tuple(regular[-n:])
    assert rule.savepoints == tuple(c for c, _, sp in checkpoints if sp)


@settings(max_examples=100, deadline=None)
@given(histories())
def test_batch_rule_is_the_incremental_rule_over_a_history(history) -> None:
    n, checkpoints = history
    kinds = {True: "savepoint", False: "global"}
    metadata = [md(c, kinds[sp], tuple(sorted(o))) for c, o, sp in reversed(checkpoints)]
    batch = retain(metadata, n)  # any order
    rule = Retention(n)
    subsumed: list[int] = []
    for cid, owners, savepoint in checkpoints:
        subsumed += rule.add(cid, owners, savepoint=savepoint)
    assert batch.retained == rule.retained
    assert batch.savepoints == rule.savepoints
    assert batch.referenced_by == rule.references()
    assert batch.subsumed == tuple(sorted(subsumed))
    assert batch.kept == set(rule.retained) | set(rule.savepoints)


def test_savepoints_are_neither_counted_nor_subsumed() -> None:
    rule = Retention(1)
    assert rule.add(1) == ()
    assert rule.add(2, savepoint=True) == ()  # 1 stays: a savepoint does not push it out
    assert rule.add(3) == (1,)
    assert rule.add(4) == (3,)
    assert (rule.retained, rule.savepoints) == ((4,), (2,))


def test_a_referenced_checkpoint_outlives_the_window_until_its_last_referrer_goes() -> None:
    rule = Retention(2)
    assert [rule.add(1), rule.add(2, {1}), rule.add(3, {1, 0})] == [(), (), ()]
    assert rule.referenced_by(1) == (2, 3) and rule.references() == {1: (2, 3)}
    assert rule.add(4) == (2,)  # 2 leaves the window; 1 is still referenced by 3
    assert rule.add(5) == (1, 3)  # 3 leaves: nothing references 1 any more
    assert rule.referenced_by(1) == () and rule.retained == (4, 5)


def test_bad_input_names_the_values() -> None:
    with pytest.raises(ValueError, match=r"num-retained must be at least 1 \(got 0\)"):
        Retention(0)
    rule = Retention(3)
    rule.add(5)
    with pytest.raises(ValueError, match=r"checkpoint 5 added after checkpoint 5"):
        rule.add(5)
    with pytest.raises(ValueError, match=r"checkpoint 4 added after checkpoint 5"):
        rule.add(4, savepoint=True)


def test_owner_refs_leave_out_the_initial_state() -> None:
    assert owner_refs(md(4, "regional", (0, 2, 2))) == {2}
    assert owner_refs(md(1)) == frozenset()


def test_owner_refs_keep_the_directory_of_a_relocated_fallback_segment() -> None:
    """A compaction (`metadata.compaction`) copied unit 1's segment, owned by 2, into chk-3/:
    checkpoint 5 keeps both its owner and the directory holding the copy alive."""
    from metadata.model import StateHandle

    copy = StateHandle("chk-3/compacted-r.state", 0, 4, 4, b"")
    fresh = StateHandle("chk-5/u0-a1-r.state", 0, 4, 4, b"")
    relocated = CheckpointMetadata(
        checkpoint_id=5,
        job_id="j",
        kind="regional",
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=(
            SubtaskState("map", 0, 0, handles=(fresh,)),
            SubtaskState("map", 1, 1, 2, (copy,)),
        ),
    )
    assert owner_refs(relocated) == {2, 3}
    assert retain([relocated], 1).referenced_by == {2: (5,), 3: (5,)}


def test_the_module_is_pure() -> None:
    tree = ast.parse(Path("metadata/retention.py").read_text())
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= {"__future__", "collections", "typing", "msgspec", "metadata"}, roots


# -- the coordinator uses the same rule ---------------------------------------------------------


def _coordinator(num_retained: int, units: int = 4) -> CheckpointCoordinator:
    policy = Policy(
        checkpointing=CheckpointingPolicy(
            num_retained=num_retained,  # type: ignore[arg-type]
            tolerable_failed_checkpoints=100,  # type: ignore[arg-type]
            region=RegionPolicy(max_unit_fallbacks=5, max_failure_ratio=0.5),  # type: ignore[arg-type]
        )
    )
    layout = JobLayout(
        units=tuple((("map", u),) for u in range(units)),
        vertices=(VertexInfo("map", units, 128),),
    )
    return CheckpointCoordinator(layout, policy, job_id="job")


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 3),
    st.lists(st.sets(st.integers(0, 3), max_size=2), min_size=1, max_size=15),
)
def test_coordinator_subsumes_exactly_what_the_batch_rule_releases(
    num_retained: int, failures: list[set[int]]
) -> None:
    c = _coordinator(num_retained)
    written: list[CheckpointMetadata] = []
    subsumed: list[int] = []
    now = 0
    for failed in failures:
        now += 10
        t = c.trigger(now)
        out = []
        for u in range(4):
            if c.pending_checkpoint_id is None:
                break
            if u in failed:
                out += c.on_decline(t.checkpoint_id, u, t.attempt, "timeout", now)
            else:
                state = (SubtaskState("map", u, u, attempt=t.attempt),)
                out += c.on_ack(t.checkpoint_id, u, t.attempt, state, now)
        writes = [d.metadata for d in out if isinstance(d, WriteMetadata)]
        if writes:
            written.append(writes[0])
            done = c.on_metadata_durable(writes[0].checkpoint_id, now + 1)
            subsumed += [d.checkpoint_id for d in done if isinstance(d, NotifySubsumed)]
    assert all(m.num_retained == num_retained for m in written)
    batch = retain(written, num_retained)
    assert sorted(subsumed) == list(batch.subsumed)
    assert len(subsumed) == len(set(subsumed))


# -- the recorded num-retained ----------------------------------------------------------------


def test_recorded_num_retained_is_the_newest_recorded_value() -> None:
    newest_first = [md(9), md(8, num_retained=10), md(7, num_retained=4)]
    assert recorded_num_retained(newest_first) == NumRetained(
        10, "recorded", "recorded in checkpoint 8", 8
    )
    assert recorded_num_retained([]) == NumRetained(
        DEFAULT_NUM_RETAINED, "default", "default: no checkpoint records one"
    )

    def lazy():
        yield md(3, num_retained=2)
        raise AssertionError("read past the newest checkpoint that records num-retained")

    assert recorded_num_retained(lazy()).value == 2


def test_num_retained_round_trips_and_old_bodies_decode_without_it() -> None:
    assert FORMAT_MINOR >= 1
    assert decode_metadata(encode_metadata(md(5, num_retained=10)), source="x").num_retained == 10
    # a format 1.0 body, as written before the field existed: no "num_retained" key
    body = msgspec.msgpack.encode(
        {"checkpoint_id": 5, "job_id": "j", "kind": "global", "trigger_time_ms": 0,
         "completion_time_ms": 0, "subtasks": [["map", 0, 0]]}
    )  # fmt: skip
    header = struct.pack(">4sHHQ", b"RGNL", FORMAT_VERSION, 0, len(body))
    old = decode_metadata(header + body + segment_checksum(header + body), source="chk-5/_metadata")
    assert old == md(5) and old.num_retained is None
    fixture = decode_metadata((FIXTURES / "v1-regional.bin").read_bytes(), source="v1")
    assert fixture.num_retained is None
    with pytest.raises(MetadataError, match=r"chk-5/_metadata: num-retained 0 \(at least 1"):
        decode_metadata(encode_metadata(md(5, num_retained=0)), source="chk-5/_metadata")


def test_a_savepoint_keeps_the_recorded_num_retained(tmp_path) -> None:
    storage = JobStorage(str(tmp_path), "job")
    [h] = storage.write_segments("chk-3/u0-a1.state", [b"state"])
    sp = CheckpointMetadata(
        checkpoint_id=3,
        job_id="job",
        kind=CheckpointKind.SAVEPOINT,
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=(SubtaskState("op", 0, 0, handles=(h,)),),
        num_retained=10,
    )
    assert open_checkpoint(write_savepoint(storage, sp)).metadata.num_retained == 10


def _checkpoint(c: CheckpointCoordinator, failed: set[int], now: int) -> list:
    """One checkpoint of the 4-unit job: `failed` units decline, the others ack."""
    t = c.trigger(now)
    out: list = []
    for u in range(4):
        if c.pending_checkpoint_id is None:
            break
        if u in failed:
            out += c.on_decline(t.checkpoint_id, u, t.attempt, "timeout", now)
        else:
            state = (SubtaskState("map", u, u, attempt=t.attempt),)
            out += c.on_ack(t.checkpoint_id, u, t.attempt, state, now)
    [write] = [d.metadata for d in out if isinstance(d, WriteMetadata)]
    done = c.on_metadata_durable(write.checkpoint_id, now + 1)
    return [write, *(d.checkpoint_id for d in done if isinstance(d, NotifySubsumed))]


def test_a_restored_checkpoint_and_its_owners_are_retained_like_any_other() -> None:
    first = _coordinator(2)
    _checkpoint(first, set(), 10)  # 1
    restored, *_ = _checkpoint(first, {1}, 20)  # 2: unit 1 falls back to 1
    assert owner_refs(restored) == {1}
    c = _coordinator(2)
    c.restore(restored)  # 2 is retained, and keeps 1 alive
    three, *subsumed = _checkpoint(c, {1}, 30)
    assert (owner_refs(three), subsumed) == ({1}, [])  # 3 re-uses 1's state too
    assert _checkpoint(c, set(), 40)[1:] == [2]  # 2 leaves the window; 3 still references 1
    assert _checkpoint(c, set(), 50)[1:] == [1, 3]


def test_inspector_defaults_to_the_recorded_num_retained(tmp_path) -> None:
    history = [md(c, num_retained=2) for c in (1, 2, 3, 4)]
    assert checkpoints_table(history)["retained"].to_pylist() == [True, True, False, False]
    assert checkpoints_table(history, num_retained=3)["retained"].to_pylist().count(True) == 3
    storage = JobStorage(str(tmp_path), "j")
    for m in history:
        storage.write_metadata(m)
    inspector = Inspector(CompletedCheckpointStore.load(storage))
    assert inspector.num_retained == 2
    assert str(inspector.num_retained_in_force) == "num-retained 2 (recorded in checkpoint 4)"
    assert Inspector(inspector.store, num_retained=1).num_retained == 1
