"""State that stays hot between epochs (`regional.runtime.hot_state`, DESIGN §6): a unit's
next epoch in the same worker restores the decoded state its ack left, only when the
coordinator names exactly that state; a unit that failed, or a fallback to older state, decodes
the bytes. With the cache on or off a job commits exactly the same rows. Everything runs the
real task code in this process (no Spark): every epoch's units run in one task."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import StateHandle, SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Answer, Decline, UnitWork
from regional.dataflow.operators import Operator
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.dataflow.state_codec import StateCodec
from regional.policy import load_policy
from regional.runtime.dispatch import Dispatch
from regional.runtime.driver import JobDriver
from regional.runtime.faults import Faults
from regional.runtime.hot_state import HotState, HotStateCache, HotStates, process_cache
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH = 4, 12, 3

#: (split, n) -> how many more times the count raises on that record (a user function failing
#: on data after the unit restored its state: the epoch declines with its state spoiled)
POISON: dict[tuple[int, int], int] = {}


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def _count(ctx: Any, r: dict[str, int]) -> Any:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)  # mutated before it may fail: a spoiled state if it does
    seen = ctx.map_state("seen")
    seen[r["n"]] = (r["n"], [c.value()])
    left = POISON.get((r["s"], r["n"]), 0)
    if left > 0:
        POISON[r["s"], r["n"]] = left - 1
        raise ValueError(f"record {r['n']} of split {r['s']} fails")
    yield {"s": r["s"], "n": r["n"], "c": c.value(), "seen": len(seen)}


def _expected() -> list[tuple[int, int, int, int]]:
    return sorted((s, n, n // 3 + 1, n // 3 + 1) for s in range(SPLITS) for n in range(PER_SPLIT))


def _rows(table: str) -> list[tuple[int, int, int, int]]:
    t = read_table(table)
    columns = (t.column(c).to_pylist() for c in ("s", "n", "c", "seen"))
    return sorted(zip(*columns, strict=True))


def _pipeline(table: str) -> Pipeline:
    p = Pipeline("hot", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, _record, records_per_split=PER_SPLIT),
        parallelism=SPLITS,
        name="src",
    )
    src.key_by(lambda r: r["n"] % 3).process(_count, name="count").sink(
        ParquetSink(table), name="out"
    )
    return p


class Recording:
    """A dispatcher running every unit in this process, all in one task, keeping the answers."""

    def __init__(self, env: TaskEnv) -> None:
        self.env = env
        self.answers: list[list[Answer]] = []

    def start(self) -> None:
        pass

    def run(self, works: Any, deadline_ms: int, *, isolated: bool = False) -> Dispatch:
        answers = list(run_units(self.env, works))
        self.answers.append(answers)
        return Dispatch(answers)


def _run_job(
    root: Path, *, hot: bool, faults: dict[tuple[int, int], str], task_pass: bool = True
) -> tuple[list[tuple[int, int, int, int]], Recording]:
    """The job to its end under `faults`; its committed rows and its dispatcher."""
    table = str(root / "table")
    p = _pipeline(table)
    policy = load_policy(env={}, overrides={"checkpointing.num-retained": 3}).policy
    faulty = Faults(units=faults)
    env = TaskEnv(
        str(root / "ckpt"),
        "hot",
        p,
        unit_timeout=30,
        run_id="r",
        faults=faulty.unit_faults(),
        hot_state=hot,
        task_pass=task_pass,
    )
    dispatcher = Recording(env)
    driver = JobDriver(
        p,
        dispatcher,
        storage=JobStorage(str(root / "ckpt"), "hot"),
        policy=policy,
        faults=faulty,
        run_id="r",
    )
    summary = driver.run(max_checkpoints=30)
    assert summary.finished
    return _rows(table), dispatcher


def _acks(dispatcher: Recording) -> list[Ack]:
    return [a for epoch in dispatcher.answers for a in epoch if isinstance(a, Ack)]


# --- the cache ------------------------------------------------------------------------------


def _entry(size: int) -> HotState:
    codec = StateCodec()
    return HotState(OperatorState(codec=codec), size, False, codec)


def _key(n: int) -> tuple[str, str, str, tuple[StateHandle, ...]]:
    return ("root", "job", "count", (StateHandle(f"chk-{n}/u0.state", 0, 1, 1, b"c" * 16),))


def test_the_cache_keeps_the_most_recent_states_within_its_budget() -> None:
    cache = HotStateCache(100)
    for n in range(4):
        cache.put(_key(n), _entry(40))
    assert [k for k in range(4) if _key(k) in cache] == [2, 3]  # 80 bytes of 100
    assert cache.size == 80
    cache.put(_key(9), _entry(101))  # larger than the whole budget: not kept
    assert _key(9) not in cache and cache.size == 80
    cache.resize(50)
    assert [k for k in range(4) if _key(k) in cache] == [3]
    assert cache.take(_key(3)) is not None
    assert cache.take(_key(3)) is None  # taking removes
    assert cache.size == 0 and len(cache) == 0


def test_a_state_of_other_state_types_is_not_restored_hot() -> None:
    class Point(msgspec.Struct):
        x: int

    op = Operator(name="count")
    kept = _entry(10)
    assert kept.restored(op, StateCodec()) is not None  # an equal codec, another object
    assert kept.restored(op, StateCodec([Point])) is None


# --- the task -------------------------------------------------------------------------------


def _next_works(acks: list[Ack], checkpoint_id: int) -> list[UnitWork]:
    return [UnitWork(checkpoint_id, 1, a.unit, a.states) for a in acks]


def _first_works(p: Pipeline) -> list[UnitWork]:
    order = p.topological_order()
    return [
        UnitWork(1, 1, u, tuple(SubtaskState(v, u, u) for v in order), (("src", u, f"g{u}"),))
        for u in range(SPLITS)
    ]


def test_hits_only_on_the_exact_handle_a_fallback_to_older_state_decodes_bytes(
    tmp_path: Path,
) -> None:
    p = _pipeline(str(tmp_path / "t"))
    env = TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=30, run_id="r")
    first = run_units(env, _first_works(p))
    assert all(isinstance(a, Ack) and (a.state_hits, a.state_misses) == (0, 0) for a in first)
    second = run_units(env, _next_works(first, 2))  # type: ignore[arg-type]
    assert [(a.state_hits, a.state_misses) for a in second] == [(1, 0)] * SPLITS  # type: ignore[union-attr]
    # checkpoint 2 fell back: the coordinator names checkpoint 1's state again, which the
    # epoch of checkpoint 2 took (and spoiled): every unit decodes it from its bytes
    again = run_units(env, _next_works(first, 3))  # type: ignore[arg-type]
    assert [(a.state_hits, a.state_misses) for a in again] == [(0, 1)] * SPLITS  # type: ignore[union-attr]
    cold = TaskEnv(str(tmp_path / "cold"), "job", p, unit_timeout=30, run_id="r", hot_state=False)
    cold_first = run_units(cold, _first_works(p))
    cold_again = run_units(cold, _next_works(cold_first, 3))  # type: ignore[arg-type]
    assert all(isinstance(a, Ack) and a.state_hits == 0 for a in cold_again)
    # the same state either way: the snapshots are the same bytes
    storage, cold_storage = JobStorage(env.root, "job"), JobStorage(cold.root, "job")
    for hot_ack, cold_ack in zip(again, cold_again, strict=True):
        assert isinstance(hot_ack, Ack) and isinstance(cold_ack, Ack)
        for h, c in zip(hot_ack.states, cold_ack.states, strict=True):
            assert [storage.read_segment(x) for x in h.handles] == [
                cold_storage.read_segment(x) for x in c.handles
            ]


def test_a_hit_reads_nothing_from_checkpoint_storage(tmp_path: Path, monkeypatch: Any) -> None:
    p = _pipeline(str(tmp_path / "t"))
    env = TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=30, run_id="r")
    first = run_units(env, _first_works(p))
    reads: list[str] = []
    read = JobStorage.read_segment

    def counting(self: JobStorage, handle: StateHandle, **kw: Any) -> bytes:
        reads.append(handle.path)
        return read(self, handle, **kw)

    monkeypatch.setattr(JobStorage, "read_segment", counting)
    second = run_units(env, _next_works(first, 2))  # type: ignore[arg-type]
    assert all(isinstance(a, Ack) and a.state_hits == 1 for a in second)
    assert reads == []


def test_a_hit_does_not_read_the_segment_so_damage_is_found_by_the_next_decode(
    tmp_path: Path,
) -> None:
    p = _pipeline(str(tmp_path / "t"))
    env = TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=30, run_id="r")
    first = run_units(env, _first_works(p))
    [handle] = first[0].states[1].handles  # type: ignore[union-attr]
    full = f"{JobStorage(env.root, 'job').job_path}/{handle.path}"
    with open(full, "r+b") as f:  # damaged after its upload was verified
        f.seek(handle.offset)
        byte = f.read(1)
        f.seek(handle.offset)
        f.write(bytes([byte[0] ^ 0xFF]))
    second = run_units(env, _next_works(first, 2))  # type: ignore[arg-type]
    assert all(isinstance(a, Ack) and a.state_hits == 1 for a in second)  # the kept states
    # a fallback to checkpoint 1 decodes its segments: the damage is found, naming the file
    again = run_units(env, _next_works(first, 3))  # type: ignore[arg-type]
    assert isinstance(again[0], Decline)
    assert handle.path in again[0].reason and "checksum" in again[0].reason


def test_a_unit_that_failed_after_restoring_decodes_its_bytes_and_commits_the_right_rows(
    tmp_path: Path,
) -> None:
    POISON.clear()
    POISON[2, 4] = 1  # unit 2 fails once in its second epoch, its state already mutated
    try:
        rows, dispatcher = _run_job(tmp_path, hot=True, faults={})
    finally:
        POISON.clear()
    assert rows == _expected()
    answers = dispatcher.answers
    failed = next(i for i, epoch in enumerate(answers) if isinstance(epoch[2], Decline))
    retried = answers[failed + 1][2]
    assert isinstance(retried, Ack)
    assert (retried.state_hits, retried.state_misses) == (0, 1)  # from the bytes
    others = [answers[failed + 1][u] for u in (0, 1, 3)]
    assert all(isinstance(a, Ack) and a.state_hits == 1 for a in others)


def test_a_unit_that_declines_leaves_nothing_in_the_cache(tmp_path: Path) -> None:
    p = _pipeline(str(tmp_path / "t"))
    env = TaskEnv(str(tmp_path / "ckpt"), "job", p, unit_timeout=30, run_id="r")
    first = run_units(env, _first_works(p))
    cache = process_cache(env.hot_state_bytes)
    provider = HotStates(cache, env.root, env.job_id, lambda s: (b"", "nowhere"))
    assert all(provider.key(s) in cache for a in first for s in a.states if s.handles)  # type: ignore[union-attr]
    POISON.clear()
    POISON[1, 3] = 1
    try:
        second = run_units(env, _next_works(first, 2))  # type: ignore[arg-type]
    finally:
        POISON.clear()
    assert [type(a) for a in second] == [Ack, Decline, Ack, Ack]
    restored = first[1].states  # type: ignore[union-attr]
    assert not any(provider.key(s) in cache for s in restored if s.handles)
    assert (
        sum(provider.key(s) in cache for a in second if isinstance(a, Ack) for s in a.states) == 3
    )


# --- exactness: on equals off ------------------------------------------------------------------


@settings(max_examples=12, deadline=None)
@given(
    faults=st.dictionaries(
        st.tuples(st.integers(2, 5), st.integers(0, SPLITS - 1)),
        st.sampled_from(["fail", "poison"]),
        max_size=4,
    ),
    task_pass=st.booleans(),
)
def test_a_job_commits_the_same_rows_with_hot_state_as_without(
    faults: dict[tuple[int, int], str], task_pass: bool
) -> None:
    """Random fault schedules: injected unit failures (before the unit restores) and records
    that fail once (after it restored and mutated its state); both runs commit exactly the
    fault-free rows."""
    injected = {k: v for k, v in faults.items() if v == "fail"}
    poisoned = {
        (unit, (checkpoint - 1) * PER_EPOCH): 1
        for (checkpoint, unit), kind in faults.items()
        if kind == "poison"
    }
    results = {}
    for hot in (True, False):
        root = Path(tempfile.mkdtemp(prefix="regional-hot-"))
        POISON.clear()
        POISON.update(poisoned)
        try:
            rows, dispatcher = _run_job(root, hot=hot, faults=injected, task_pass=task_pass)
        finally:
            POISON.clear()
            shutil.rmtree(root, ignore_errors=True)
        results[hot] = rows
        hits = sum(a.state_hits for a in _acks(dispatcher))
        assert (hits > 0) == hot
    assert results[True] == results[False] == _expected()
