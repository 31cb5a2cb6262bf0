"""Restore with another parallelism: the pure mapping (`regional.runtime.rescale`, hypothesis) and
real
Spark runs restored at half and double the parallelism with exactly the fault-free output."""

from __future__ import annotations

import shutil
from collections import Counter

import pytest
from clicks_job import PER_SPLIT, SPLITS, click, expected_rows, pipeline, policy, rows
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.model import CheckpointMetadata, SplitState, StateHandle, SubtaskState, VertexInfo
from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.errors import RestoreError
from regional.runtime.rescale import (
    VertexShape,
    deal,
    place_splits,
    plan_restore,
    redistribute_state,
)
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

# --- the pure mapping --------------------------------------------------------------------------


@settings(max_examples=300, deadline=None)
@given(
    held=st.dictionaries(
        st.integers(0, 9), st.lists(st.integers(0, 10_000), max_size=4, unique=True), max_size=10
    ),
    parallelism=st.integers(1, 12),
)
def test_every_split_is_placed_exactly_once_and_evenly(held, parallelism):
    seen: set[int] = set()
    splits = {}
    for index, ids in held.items():
        fresh = [f"s{i}" for i in ids if i not in seen]
        seen.update(ids)
        splits[index] = fresh
    placed = place_splits(splits, parallelism)
    every = [s for ids in splits.values() for s in ids]
    assert sorted(placed) == sorted(every)  # each split once, none invented
    assert all(0 <= i < parallelism for i in placed.values())
    for index, ids in splits.items():  # a split whose subtask still exists stays there
        if index < parallelism:
            assert all(placed[s] == index for s in ids)
    # the splits of removed subtasks fill the least loaded first: no subtask ends above the
    # larger of its kept load and an even share
    load = Counter(placed.values())
    kept_max = max((len(ids) for i, ids in splits.items() if i < parallelism), default=0)
    even = -(-len(every) // parallelism)
    assert max(load.values(), default=0) <= max(kept_max, even)


@settings(max_examples=200, deadline=None)
@given(
    old=st.lists(
        st.tuples(
            st.lists(st.integers(0, 30), max_size=4, unique=True),  # splits with keyed state
            st.lists(st.integers(), max_size=6),  # list entries of list "a"
            st.lists(st.text(max_size=2), max_size=3),  # list entries of list "b"
        ),
        min_size=1,
        max_size=6,
    ),
    parallelism=st.integers(1, 9),
)
def test_redistributed_state_conserves_keyed_state_and_list_entries(old, parallelism):
    states, taken = [], set()
    for splits, a, b in old:
        keyed = {f"s{i}": {"k": {"n": i}} for i in splits if i not in taken}
        taken.update(splits)
        states.append(OperatorState(keyed, {"a": list(a), "b": list(b)}))
    assignment = {f"s{i}": i % parallelism for i in range(0, 31, 2)}  # odd splits: unknown
    new = redistribute_state(states, assignment, parallelism)
    assert len(new) == parallelism
    # keyed state: every split exactly once, where the assignment says (else old index mod p)
    where = {s: i for i, n in enumerate(new) for s in n.keyed}
    assert sum(len(n.keyed) for n in new) == sum(len(s.keyed) for s in states)
    for index, state in enumerate(states):
        for split, keyed in state.keyed.items():
            assert where[split] == assignment.get(split, index % parallelism)
            assert new[where[split]].keyed[split] == keyed
    # list state: every entry kept, in order when read round-robin, sizes within one
    for name in ("a", "b"):
        before = [e for s in states for e in s.lists[name]]
        parts = [n.lists[name] for n in new]
        assert sorted(map(repr, before)) == sorted(map(repr, [e for p in parts for e in p]))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1
        assert parts == deal(before, parallelism)


def _md(vertices, subtasks, cid=5):
    return CheckpointMetadata(
        checkpoint_id=cid,
        job_id="j",
        kind="global",
        trigger_time_ms=0,
        completion_time_ms=0,
        vertices=tuple(VertexInfo(*v) for v in vertices),
        subtasks=tuple(subtasks),
    )


_H = (StateHandle("chk-5/u0-a1.state", 0, 3, 3, b"x" * 16),)


def test_a_vertex_the_pipeline_no_longer_has_is_refused_unless_dropping_is_allowed():
    md = _md(
        [("src", 2, 128), ("old-count", 2, 128)],
        [
            SubtaskState("src", 0, 0, split_states=(SplitState("a", b"3"),)),
            SubtaskState("src", 1, 1),
            SubtaskState("old-count", 0, 0, handles=_H),
            SubtaskState("old-count", 1, 1),
        ],
    )
    shapes = [VertexShape("src", 4, 128, source=True)]
    with pytest.raises(RestoreError) as err:
        plan_restore(md, shapes)
    assert str(err.value) == (
        "cannot map checkpoint 5 onto the pipeline: vertex 'old-count' has state in checkpoint 5 "
        "but the pipeline has no such vertex (renamed or removed?). Restore with the pipeline "
        "that wrote it, or allow dropping that state (--allow-dropped-state / "
        "allow_dropped_state=True)"
    )
    plan = plan_restore(md, shapes, allow_dropped_state=True)
    assert plan.dropped == (
        "dropped: vertex 'old-count' has state in checkpoint 5 but the pipeline has no such "
        "vertex (renamed or removed?)",
    )
    assert [(p.index, p.split_states) for p in plan.subtasks] == [
        (0, (SplitState("a", b"3"),)),
        (1, ()),
        (2, ()),
        (3, ()),
    ]


def test_a_changed_max_parallelism_is_refused_and_dropping_resets_the_vertex():
    md = _md(
        [("count", 2, 128)],
        [SubtaskState("count", 0, 0, handles=_H), SubtaskState("count", 1, 1, handles=_H)],
    )
    shapes = [VertexShape("count", 2, 256, stateful=True)]
    with pytest.raises(
        RestoreError,
        match=r"vertex 'count' had max parallelism 128 in "
        r"checkpoint 5, the pipeline has 256\. Restore with",
    ):
        plan_restore(md, shapes)
    plan = plan_restore(md, shapes, allow_dropped_state=True)
    assert plan.state_mode == {"count": "empty"} and plan.reset == frozenset({"count"})


def test_only_fresh_committables_are_carried_and_none_is_lost():
    md = _md(
        [("sink", 3, 128)],
        [
            SubtaskState("sink", 0, 0, committables=(b"c0",)),
            SubtaskState("sink", 1, 1, ref_checkpoint_id=2, committables=(b"old",)),
            SubtaskState("sink", 2, 2, committables=(b"c2a", b"c2b")),
        ],
    )
    plan = plan_restore(md, [VertexShape("sink", 2, 128, sink=True)])
    assert [p.committables for p in plan.subtasks] == [(b"c0", b"c2a", b"c2b"), ()]


# --- Spark: restore at half and double the parallelism ---------------------------------------


@pytest.fixture(scope="module")
def run_at_4(spark, tmp_path_factory):
    """Three checkpoints at parallelism 4 (8 splits: some read, some finished, some waiting)."""
    base = tmp_path_factory.mktemp("rescale")
    rt = SparkRuntime(
        pipeline(str(base / "table"), 4), spark, root=str(base / "ckpt"), policy=policy()
    )
    summary = rt.run(max_checkpoints=3)
    assert [c.kind for c in summary.checkpoints] == ["global"] * 3
    return base


@pytest.mark.spark
@pytest.mark.parametrize("parallelism", [2, 8])
def test_restore_at_another_parallelism_gives_the_fault_free_output(
    spark, run_at_4, tmp_path, parallelism
):
    table = str(tmp_path / "table")
    shutil.copytree(run_at_4 / "table", table)
    rt = SparkRuntime(
        pipeline(table, parallelism),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=policy(),
        restore_from=str(run_at_4 / "ckpt" / "clicks" / "chk-3"),
    )
    summary = rt.run()
    assert summary.finished and summary.restored_from == 3
    assert summary.restore_notes == (
        f"src: 4 -> {parallelism}",
        f"count: 4 -> {parallelism}",
        f"out: 4 -> {parallelism}",
    )
    assert rows(table) == expected_rows()


@pytest.mark.spark
def test_a_rerun_with_a_new_parallelism_on_the_same_root_rescales(spark, run_at_4, tmp_path):
    shutil.copytree(run_at_4, tmp_path / "job")
    table, root = str(tmp_path / "job" / "table"), str(tmp_path / "job" / "ckpt")
    rt = SparkRuntime(pipeline(table, 2), spark, root=root, policy=policy())
    summary = rt.run()
    assert summary.finished and summary.restored_from == 3
    assert summary.checkpoints[0].kind == "global"
    assert rows(table) == expected_rows()
    # the rewritten state was staged for checkpoint 4 only: cleaned once it succeeded
    left = [f.path for f in JobStorage(root, "clicks").list_files()]
    assert not [p for p in left if p.endswith("-a0.state")], left


@pytest.mark.spark
def test_dropping_state_restores_the_rest(spark, run_at_4, tmp_path):
    """A pipeline without the counter and with another sink: refused, then restored with
    `allow_dropped_state`; the sources go on from their positions (no click read twice)."""
    p = Pipeline("clicks", records_per_epoch=7)
    p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT), parallelism=2, name="src"
    ).sink(ParquetSink(str(tmp_path / "table")), name="plain")
    source = str(run_at_4 / "ckpt" / "clicks" / "chk-3")

    def restore(allow: bool) -> SparkRuntime:
        return SparkRuntime(
            p,
            spark,
            root=str(tmp_path / f"ckpt-{allow}"),
            policy=policy(),
            restore_from=source,
            allow_dropped_state=allow,
        )

    with pytest.raises(RestoreError, match=r"vertex 'count' has state in checkpoint 3"):
        restore(False).run()
    summary = restore(True).run()
    assert summary.finished
    assert summary.restore_notes == (
        "src: 4 -> 2",
        "dropped: vertex 'count' has state in checkpoint 3 but the pipeline has no such vertex "
        "(renamed or removed?)",
        "dropped: vertex 'out' has state in checkpoint 3 but the pipeline has no such vertex "
        "(renamed or removed?)",
    )
    t = read_table(str(tmp_path / "table"))
    got = sorted(zip(t.column("split").to_pylist(), t.column("n").to_pylist(), strict=True))
    before = {(s, n) for s, n, _, _ in rows(str(run_at_4 / "table"))}
    assert len(got) == len(set(got))  # nothing twice
    assert set(got) | before == {(s, n) for s in range(SPLITS) for n in range(PER_SPLIT)}
    assert not set(got) & before  # nothing the checkpoint had read


# --- two exchanges with the same partition count ---------------------------------------------


def test_two_sources_may_name_splits_alike_and_each_is_placed_on_its_own() -> None:
    """Every keyed exchange with 3 partitions reads splits n3-p0..n3-p2; rescaling one reader
    to 2 while the other stays at 3 used to be refused ("give the sources' splits distinct
    ids", which a user cannot do). Each source's splits are placed on their own."""
    names = [f"n3-p{q}" for q in range(3)]
    md = CheckpointMetadata(
        checkpoint_id=4, job_id="j", kind="global", trigger_time_ms=0, completion_time_ms=0,
        vertices=(VertexInfo("a", 3, 128), VertexInfo("b", 3, 128)),
        subtasks=tuple(
            SubtaskState(v, q, q, split_states=(SplitState(names[q], b"%d" % q),))
            for v in ("a", "b") for q in range(3)
        ),
    )  # fmt: skip
    plan = plan_restore(
        md,
        [VertexShape("a", 3, 128, source=True), VertexShape("b", 2, 128, source=True)],
        split_owners={v: {n: q for q, n in enumerate(names)} for v in ("a", "b")},
    )
    assert plan.assignments == {
        "a": {"n3-p0": 0, "n3-p1": 1, "n3-p2": 2},
        "b": {"n3-p0": 0, "n3-p1": 1, "n3-p2": 0},
    }
    held = {(t.vertex_id, t.index): [s.split_id for s in t.split_states] for t in plan.subtasks}
    assert held == {
        ("a", 0): ["n3-p0"], ("a", 1): ["n3-p1"], ("a", 2): ["n3-p2"],
        ("b", 0): ["n3-p0", "n3-p2"], ("b", 1): ["n3-p1"],
    }  # fmt: skip
    # split-scoped state of a vertex reading both sources cannot tell such splits apart
    with pytest.raises(RestoreError) as info:
        plan.placement(["a", "b"], holder="u")
    assert str(info.value) == (
        "vertex 'u' keeps state by split, and sources 'a' and 'b' both read a split named "
        "'n3-p2', which the new parallelism places on subtasks 2 and 0; restore with the "
        "parallelism the checkpoint was written with, or give the two sources of 'u' the "
        "same parallelism"
    )


def _two_exchanges(table: str, first: int, second: int) -> Pipeline:
    """Clicks counted per user after one exchange, the counts counted again per parity after
    a second: two keyed exchanges whose readers may have the same partition count."""

    def per_user(ctx, c):  # type: ignore[no-untyped-def]
        n = ctx.value_state("n", 0)
        n.update(n.value() + 1)
        yield {"user": c["user"], "n": n.value()}

    def per_parity(ctx, r):  # type: ignore[no-untyped-def]
        total = ctx.value_state("total", 0)
        total.update(total.value() + r["n"])
        yield {"parity": r["n"] % 2, "user": r["user"], "total": total.value()}

    p = Pipeline("two", records_per_epoch=40)
    clicks = p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT), name="src", parallelism=2
    )
    counts = clicks.key_by(lambda c: c["user"], partitions=first).process(per_user, name="u")
    counts.key_by(lambda r: r["n"] % 2, partitions=second).process(per_parity, name="v").sink(
        ParquetSink(table), name="out"
    )
    return p


def _run_two(tmp_path, first: int, second: int, max_checkpoints: int | None = None):  # type: ignore[no-untyped-def]
    import orders_job

    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv

    p = _two_exchanges(str(tmp_path / "out"), first, second)
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "two", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "two"))
    return driver.run(max_checkpoints=max_checkpoints)


def test_a_job_rescales_one_exchange_to_another_exchanges_partition_count(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """3 and 3 partitions, then 3 and 2, then 2 and 2: accepted, and each parity's final
    total is the fault-free run's (the rows before it depend on epochs, rule 21)."""
    assert _run_two(tmp_path / "clean", 3, 3).finished
    for first, second in ((3, 3), (3, 2)):
        assert not _run_two(tmp_path, first, second, max_checkpoints=2).finished
    summary = _run_two(tmp_path, 2, 2)
    assert summary.finished and summary.restored_from is not None

    def last_totals(path) -> dict[int, int]:  # type: ignore[no-untyped-def]
        out: dict[int, int] = {}
        for r in read_table(str(path / "out")).to_pylist():
            out[r["parity"]] = max(out.get(r["parity"], 0), r["total"])
        return out

    assert last_totals(tmp_path) == last_totals(tmp_path / "clean")
