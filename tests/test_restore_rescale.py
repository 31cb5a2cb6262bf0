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
