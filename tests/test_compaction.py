"""Compaction of mostly-dead merged state files kept for fallback units
(`checkpointing.file-merging.min-live-share`; DESIGN §4 rule 16, docs/file-merging.md "Space
amplification"): the decision's properties, and a job whose unit stays on fallback for several
checkpoints while its owner's big task file goes after `num-retained` checkpoints, restores,
and writes exactly the fault-free output. The job runs the real task code in this process (no
Spark): every epoch's units run in one task, so each checkpoint writes one merged file."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cleaner.run import plan_root, read_root
from metadata.compaction import plan_compaction, relocated_units
from metadata.events import read_events
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState
from metadata.storage import JobStorage
from metadata.validate import validate_job
from regional.coordinator import NotifySubsumed, TriggerCheckpoint
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.compaction import compact
from regional.runtime.driver import JobDriver
from regional.runtime.faults import Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

# --- the decision ---------------------------------------------------------------------------


@st.composite
def _checkpoints(draw: Any) -> CheckpointMetadata:
    """Checkpoint 10 of a job whose units ran in tasks writing one merged file per checkpoint:
    some units fresh (their segments in chk-10's files), the others on fallback to an older
    owner's file, which may also hold segments of units no longer on it."""
    units = draw(st.integers(1, 12))
    subtasks, unit_states = [], []
    files: dict[str, list[int]] = {}  # path -> segment lengths (dead ones too)
    placed: dict[int, tuple[str, int]] = {}
    for u in range(units):
        fallback = draw(st.booleans())
        owner = draw(st.integers(1, 9)) if fallback else 10
        task = draw(st.integers(0, 2))
        path = f"chk-{owner}/u{task}-a1-r.state"
        lengths = files.setdefault(path, [])
        for _ in range(draw(st.integers(0, 3))):  # dead segments of units not using it now
            lengths.append(draw(st.integers(1, 50)))
        placed[u] = (path, len(lengths))
        lengths.append(draw(st.integers(0, 50)))
        unit_states.append(UnitState(u, owner if fallback else None))
    sizes = {p: sum(n) for p, n in files.items()}
    for u in range(units):
        path, i = placed[u]
        offset, length = sum(files[path][:i]), files[path][i]
        h = StateHandle(path, offset, length, sizes[path], b"c" * 16)
        ref = unit_states[u].ref_checkpoint_id
        subtasks.append(SubtaskState("op", u, u, ref, (h,)))
    return CheckpointMetadata(
        checkpoint_id=10,
        job_id="j",
        kind="regional",
        trigger_time_ms=0,
        completion_time_ms=0,
        units=tuple(unit_states),
        subtasks=tuple(subtasks),
    )


def _live(md: CheckpointMetadata) -> dict[str, tuple[int, int, set[int]]]:
    """Per file of an older checkpoint: (live bytes, size, fallback units), by brute force."""
    out: dict[str, tuple[set[tuple[int, int]], int, set[int]]] = {}
    for s in md.subtasks:
        for h in s.handles:
            if s.ref_checkpoint_id is not None:
                segs, _, units = out.setdefault(h.path, (set(), h.size, set()))
                segs.add((h.offset, h.length))
                units.add(s.unit_id)
    return {p: (sum(n for _, n in segs), size, units) for p, (segs, size, units) in out.items()}


@settings(max_examples=300, deadline=None)
@given(_checkpoints(), st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 1.0]))
def test_a_file_is_compacted_exactly_when_its_live_share_is_below_the_threshold(
    md: CheckpointMetadata, share: float
) -> None:
    plans = {p.path: p for p in plan_compaction(md, share)}
    live = _live(md)
    expected = {  # an empty file is all live (`metadata.liveness`)
        path for path, (n, size, _) in live.items() if size and Fraction(n, size) < Fraction(share)
    }
    assert set(plans) == (expected if share > 0 else set())
    fresh_units = {s.unit_id for s in md.subtasks if s.ref_checkpoint_id is None}
    for path, plan in plans.items():
        assert not path.startswith("chk-10/")  # never the checkpoint's own (fresh) files
        assert not set(plan.units) & fresh_units  # a fresh unit is never compacted
        assert (plan.live_bytes, plan.size, set(plan.units)) == live[path]
        assert sum(h.length for h in plan.handles) == plan.live_bytes < plan.size


@settings(max_examples=100, deadline=None)
@given(_checkpoints())
def test_zero_never_compacts(md: CheckpointMetadata) -> None:
    assert plan_compaction(md, 0.0) == ()


def test_a_failed_copy_keeps_the_handles_and_says_why(tmp_path: Path) -> None:
    storage = JobStorage(str(tmp_path), "job")
    handles = storage.write_segments("chk-1/u0-a1-r.state", [b"a" * 90, b"live"])
    md = CheckpointMetadata(
        checkpoint_id=2,
        job_id="job",
        kind="regional",
        trigger_time_ms=0,
        completion_time_ms=0,
        subtasks=(SubtaskState("op", 1, 1, 1, (handles[1],)),),
    )
    (tmp_path / "job" / "chk-1" / "u0-a1-r.state").write_bytes(b"b" * 94)  # corrupt: checksum
    done = compact(storage, md, min_live_share=0.5, run_id="r")
    assert done.metadata is md and not done.moved
    assert done.warning is not None and "chk-1/u0-a1-r.state were not compacted" in done.warning
    assert "fails its checksum" in done.warning
    assert not (tmp_path / "job" / "chk-2").exists()  # no copy left behind


# --- a job ----------------------------------------------------------------------------------

SPLITS, PER_SPLIT, PER_EPOCH, STUCK = 8, 24, 6, 3


def _record(split: int, n: int) -> dict:
    return {"s": split, "n": n}


def _count(ctx: Any, r: dict) -> Any:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"s": r["s"], "n": r["n"], "c": c.value()}


def _expected() -> list[tuple[int, int, int]]:
    return sorted((s, n, n // 3 + 1) for s in range(SPLITS) for n in range(PER_SPLIT))


def _rows(table: str) -> list[tuple[int, int, int]]:
    t = read_table(table)
    return sorted(zip(*(t.column(c).to_pylist() for c in ("s", "n", "c")), strict=True))


def _driver(
    tmp_path: Path,
    share: float,
    run_id: str,
    faults: dict[tuple[int, int], str],
    subsumed: list[list[int]] | None = None,
    parallelism: int = SPLITS,
) -> JobDriver:
    """The job with `min-live-share` = `share`; `subsumed` gets, per checkpoint, the ids the
    coordinator notified as subsumed."""
    p = Pipeline("compact", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, _record, records_per_split=PER_SPLIT), parallelism=parallelism
    )
    src.key_by(lambda r: r["n"] % 3).process(_count, name="count").sink(
        ParquetSink(str(tmp_path / "table")), name="out"
    )
    policy = load_policy(
        env={},
        overrides={
            "checkpointing.num-retained": 2,
            "checkpointing.file-merging.min-live-share": share,
        },
    ).policy
    root = str(tmp_path / "ckpt")
    faulty = Faults(units=faults)
    env = TaskEnv(root, "compact", p, unit_timeout=30, run_id=run_id, faults=faulty.unit_faults())
    storage = JobStorage(root, "compact")

    def observe(d: Any) -> None:
        if subsumed is not None:
            if isinstance(d, TriggerCheckpoint):
                subsumed.append([])
            elif isinstance(d, NotifySubsumed):
                subsumed[-1].append(d.checkpoint_id)

    return JobDriver(
        p,
        InProcessDispatcher(env),
        storage=storage,
        policy=policy,
        faults=faulty,
        run_id=run_id,
        observe=observe,
    )


def _state_files(tmp_path: Path) -> dict[str, int]:
    storage = JobStorage(str(tmp_path / "ckpt"), "compact")
    return {f.path: f.size for f in storage.list_files() if f.path.endswith(".state")}


@pytest.mark.parametrize("share", [0.5, 0.0])
def test_a_unit_on_fallback_no_longer_keeps_its_owners_task_file(
    tmp_path: Path, share: float
) -> None:
    # unit 3 fails checkpoints 2..4: it stays on checkpoint 1's state (in chk-1's task file,
    # with the 7 other units' segments) while checkpoints 2, 3 and 4 complete regionally
    faults = {(c, STUCK): "fail" for c in (2, 3, 4)}
    subsumed: list[list[int]] = []
    first = _driver(tmp_path, share, "r1", faults, subsumed)
    summary = first.run(max_checkpoints=4)
    assert [e.kind for e in summary.checkpoints] == ["global", "regional", "regional", "regional"]
    storage = JobStorage(str(tmp_path / "ckpt"), "compact")
    latest = storage.read_metadata(4)
    [unit] = [s for s in latest.subtasks if s.unit_id == STUCK and s.handles]
    assert unit.ref_checkpoint_id == 1  # the owner stays the checkpoint that wrote the state
    files = _state_files(tmp_path)
    if share:
        # checkpoint 2 copied unit 3's segment out of chk-1's file (1 of 8 segments live);
        # chk-1 left the two retained checkpoints, and its file went with it
        assert set(files) == {
            "chk-2/compacted-r1.state",
            "chk-3/u0-a1-r1.state",
            "chk-4/u0-a1-r1.state",
        }
        assert unit.handles[0].path == "chk-2/compacted-r1.state"
        assert files["chk-2/compacted-r1.state"] == unit.handles[0].length
        assert relocated_units(latest) == {STUCK: (1, frozenset({2}))}
        assert not storage.exists("chk-2/_metadata")  # chk-2's metadata went; its copy stayed
        # never notified subsumed while a retained checkpoint re-uses the copy in its directory
        assert subsumed == [[], [], [], []]
    else:
        # without the key, chk-1's whole task file stays for unit 3's one segment
        assert set(files) == {
            "chk-1/u0-a1-r1.state",
            "chk-3/u0-a1-r1.state",
            "chk-4/u0-a1-r1.state",
        }
        assert unit.handles[0].path == "chk-1/u0-a1-r1.state"
        assert files["chk-1/u0-a1-r1.state"] > 5 * unit.handles[0].length
        assert subsumed == [[], [], [], [2]]
    # a full scan (what `regional clean` plans) agrees with the driver's incremental cleaning
    plan = plan_root(read_root(storage), num_retained=2)
    assert [d.path for d in plan.deletions] == []
    kept = {f.path for f in plan.files if f.path.endswith(".state")}
    assert kept == set(files)
    if share:  # the copy is explained by the units re-using it, its directory by their users
        [copy] = [f for f in plan.files if f.path == "chk-2/compacted-r1.state"]
        assert copy.detail == (
            "segment of unit 3 referenced by chk-3, chk-4 (fallback owner 1); "
            f"live {copy.size} of {copy.size} bytes"
        )
        assert plan.checkpoint(2).detail == (
            f"1 file ({copy.size} bytes) kept for checkpoint 3 (units 3); checkpoint 4 (units 3)"
        )
    # validate: every retained checkpoint is restorable, the relocated handle too
    validation = validate_job(storage, verify_checksums=True)
    assert validation.restore_checkpoint_id == 4 and not validation.problems

    # a new driver restores checkpoint 4 (unit 3 still on fallback) and finishes the job
    subsumed.clear()
    second = _driver(tmp_path, share, "r2", {}, subsumed)
    done = second.run()
    # unit 3 is fresh again in checkpoint 5; once 4 leaves the window, its owner 1 and (with
    # the key) checkpoint 2, whose directory holds the copy, are subsumed, not before
    assert subsumed[:2] == [[], [1, 2, 4] if share else [1, 4]]
    assert done.finished and done.restored_from == 4
    assert _rows(str(tmp_path / "table")) == _expected()
    files = _state_files(tmp_path)
    assert not any(p.startswith(("chk-1/", "chk-2/")) for p in files)  # all gone now
    events, _ = read_events(storage)
    assert not any(e.warnings for e in events)


def test_kept_bytes_with_and_without_the_key(tmp_path: Path) -> None:
    """The measurement the docs quote: bytes of state files kept after checkpoint 4."""
    kept = {}
    for share in (0.5, 0.0):
        where = tmp_path / str(share)
        _driver(where, share, "r1", {(c, STUCK): "fail" for c in (2, 3, 4)}).run(max_checkpoints=4)
        kept[share] = sum(_state_files(where).values())
    assert kept[0.5] < kept[0.0]
    print(f"state bytes kept after checkpoint 4: with the key {kept[0.5]}, without {kept[0.0]}")


def test_a_failed_copy_never_fails_the_checkpoint_and_is_recorded_in_its_event(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_segments = JobStorage.write_segments

    def failing(self: JobStorage, relpath: str, segments: Any) -> Any:
        if "/compacted-" in relpath:
            raise OSError(28, "No space left on device")
        return write_segments(self, relpath, segments)

    monkeypatch.setattr(JobStorage, "write_segments", failing)
    faults = {(c, STUCK): "fail" for c in (2, 3)}
    summary = _driver(tmp_path, 0.5, "r1", faults).run(max_checkpoints=3)
    assert [e.kind for e in summary.checkpoints] == ["global", "regional", "regional"]
    [warning] = summary.checkpoints[1].warnings
    assert warning.startswith("checkpoint 2: fallback segments of chk-1/u0-a1-r1.state were not")
    assert "No space left on device" in warning
    storage = JobStorage(str(tmp_path / "ckpt"), "compact")
    events, _ = read_events(storage)
    assert [bool(e.warnings) for e in events] == [False, True, True]
    # the original handles stay: chk-1's whole file is kept for unit 3, as without the key
    assert set(_state_files(tmp_path)) == {
        "chk-1/u0-a1-r1.state",
        "chk-2/u0-a1-r1.state",
        "chk-3/u0-a1-r1.state",
    }
    monkeypatch.setattr(JobStorage, "write_segments", write_segments)
    assert _driver(tmp_path, 0.5, "r2", {}).run().finished
    assert _rows(str(tmp_path / "table")) == _expected()


def test_a_relocated_handle_restores_with_another_parallelism(tmp_path: Path) -> None:
    _driver(tmp_path, 0.5, "r1", {(c, STUCK): "fail" for c in (2, 3, 4)}).run(max_checkpoints=4)
    assert "chk-2/compacted-r1.state" in _state_files(tmp_path)
    done = _driver(tmp_path, 0.5, "r2", {}, parallelism=3).run()
    assert done.finished and done.restored_from == 4 and done.restore_notes
    assert _rows(str(tmp_path / "table")) == _expected()
