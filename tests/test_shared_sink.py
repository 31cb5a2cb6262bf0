"""One table written by several sink vertices (issue 32 §1): the dead-letter sink of both sides
of an exchange, one sink object given to two `.sink()` calls, two sink objects on one
location. A driver's start cleans staged files per table, keeping every vertex's, so a crash
at any point resumes to the fault-free rows of every table. The driver runs the real task code
in this process (no Spark)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import counted_job
import orders_job
import pyarrow as pa
import pytest
import windows_job as job

from metadata.model import CheckpointMetadata, SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.commit import CommitCoordinator
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.restore import clean_staged_sinks
from regional.runtime.task import TaskEnv
from regional.sinks.base import WriteContext
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _driver(root: Path, job_id: str, p: Pipeline, faults: Faults | None = None) -> JobDriver:
    overrides = {"checkpointing": {"timeout": "30 s"}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(str(root), job_id, p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(str(root), job_id),
        policy=policy,
        faults=faults,
    )


def _clicks(base: Path, faults: Faults | None = None) -> JobDriver:
    """Clicks -> check (poison: dead letter) -> exchange -> sliding window (late: dead letter):
    `dead-letters` and `dead-letters-2` write one ParquetSink."""
    p = job.pipeline(
        "sliding",
        str(base / "table"),
        partitions=3,
        parallelism=job.SPLITS,
        on_late="dead-letter",
        dead_letter=ParquetSink(str(base / "dead")),
        checked=True,
    )
    return _driver(base / "ckpt", "clicks", p, faults)


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Any], list[Any], int]:
    """The fault-free run's window rows and dead letters, and the first checkpoint in which
    both dead-letter vertices committed rows."""
    base = tmp_path_factory.mktemp("fault-free")
    assert _clicks(base).run().finished
    dead = read_table(str(base / "dead")).to_pylist()
    by = {op: {r["checkpoint_id"] for r in dead if r["operator"] == op} for op in ("check", "win")}
    both = min(by["check"] & by["win"])
    return job.rows(str(base / "table")), job.dead_letters(str(base / "dead")), both


def test_the_dead_letter_sink_of_both_sides_of_an_exchange_is_one_table(fault_free) -> None:
    p = job.pipeline("sliding", "t", partitions=3, dead_letter=ParquetSink("d"), checked=True)
    dead = {v: spec.inputs for v, spec in p.sinks.items() if spec.dead_letter}
    assert dead == {"dead-letters": ("check",), "dead-letters-2": ("win",)}
    assert p.sink_of("dead-letters") is p.sink_of("dead-letters-2")
    rows, letters, _ = fault_free
    late = [(s, n) for op, _, s, n in letters if op == "win"]
    assert late == [(s, n) for s in range(job.SPLITS) for n in range(22, job.PER_SPLIT, 23)]
    assert letters == job.expected_dead_letters(late)  # a row tells its operator
    assert rows


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_a_crash_at_every_step_keeps_both_vertices_staged_dead_letters(
    tmp_path: Path, fault_free: tuple[list[Any], list[Any], int], step: str
) -> None:
    rows, letters, both = fault_free
    crashing = _clicks(tmp_path, Faults(crash_at=(both, step)))
    with pytest.raises(DriverCrash, match=f"checkpoint {both}, {step}"):
        crashing.run()
    summary = _clicks(tmp_path).run()
    assert summary.finished and summary.restored_from is not None
    assert job.rows(str(tmp_path / "table")) == rows
    assert job.dead_letters(str(tmp_path / "dead")) == letters


def _tagged(tag: str) -> Any:
    return lambda r: {**r, "tag": tag}


def _two_sink_calls(name: str, first: ParquetSink, second: ParquetSink) -> Pipeline:
    """Counted records, tagged "a" and "b" on two branches, into `first` and `second`."""
    p = Pipeline(name, records_per_epoch=counted_job.PER_EPOCH)
    src = p.source(
        GeneratorSource(counted_job.SPLITS, counted_job.record, records_per_split=12),
        parallelism=counted_job.SPLITS,
    )
    src.map(_tagged("a"), name="tag-a").sink(first, name="a")
    src.map(_tagged("b"), name="tag-b").sink(second, name="b")
    return p


EXACT_TAGGED = sorted((t, s, n) for t in "ab" for s in range(counted_job.SPLITS) for n in range(12))


def _tagged_rows(path: str) -> list[tuple[str, int, int]]:
    t = read_table(path)
    return sorted(zip(*(t.column(c).to_pylist() for c in ("tag", "split", "n")), strict=True))


@pytest.mark.parametrize(
    "second_path",
    [None, "{path}/", "file://{path}"],
    ids=["one-sink-object", "two-objects-trailing-slash", "two-objects-file-uri"],
)
def test_two_sink_vertices_writing_one_table_resume_exactly_after_a_crash(
    tmp_path: Path, second_path: str | None
) -> None:
    """One sink object given to two `.sink()` calls is allowed (each vertex commits under its
    own commit user); so are two sink objects naming one location however it is spelled."""
    path = str(tmp_path / "t")

    def pipeline() -> Pipeline:
        first = ParquetSink(path)
        second = first if second_path is None else ParquetSink(second_path.format(path=path))
        return _two_sink_calls("tagged", first, second)

    crashing = _driver(
        tmp_path / "ckpt", "tagged", pipeline(), Faults(crash_at=(2, "after-metadata"))
    )
    with pytest.raises(DriverCrash):
        crashing.run()  # checkpoint 2 of "a" and "b" is durable, its files staged only
    summary = _driver(tmp_path / "ckpt", "tagged", pipeline()).run()
    assert summary.finished and summary.restored_from == 2
    assert _tagged_rows(path) == EXACT_TAGGED


def _stage(sink: ParquetSink, vertex_id: str, checkpoint_id: int, run: str) -> tuple[bytes, ...]:
    context = WriteContext(
        job_id="job",
        run_id=run,
        checkpoint_id=checkpoint_id,
        attempt=0,
        unit_id=0,
        vertex_id=vertex_id,
        index=0,
    )
    return sink.write([pa.record_batch({"v": [checkpoint_id]})], context)


def test_a_starting_driver_cleans_a_shared_table_once_keeping_every_vertexs_files(
    tmp_path: Path,
) -> None:
    sink = ParquetSink(str(tmp_path / "t"))
    a_state, b_state = _stage(sink, "a", 4, "r0"), _stage(sink, "b", 4, "r0")
    b_pending = _stage(sink, "b", 3, "r0")  # a commit b's restored coordinator re-commits
    lost = _stage(sink, "a", 5, "r0") + _stage(sink, "b", 5, "r0")  # after checkpoint 4
    committers = {v: CommitCoordinator(v, commit_user=f"job-r0-{v}") for v in ("a", "b")}
    committers["b"].checkpoint_complete(3, b_pending, recommit=True)
    restored = CheckpointMetadata(
        checkpoint_id=4,
        job_id="job",
        kind="global",
        trigger_time_ms=1,
        completion_time_ms=2,
        subtasks=(
            SubtaskState("a", 0, 0, committables=a_state),
            SubtaskState("b", 0, 0, committables=b_state),
        ),
    )
    p = Pipeline("job")
    src = p.source(GeneratorSource(1, lambda split, i: {"v": i}))
    src.sink(sink, name="a")
    src.sink(sink, name="b")
    notes = clean_staged_sinks(p, committers, "job", restored)
    assert notes == ("sink 'a', 'b': deleted 2 staged file(s) of lost attempts",)
    assert sink.missing_files(a_state + b_state + b_pending) == []
    assert len(sink.missing_files(lost)) == 2


ROWS_SCHEMA = pa.schema([("tag", pa.string()), ("n", pa.int64())])


def _commit(sink: Any, vertex_id: str, checkpoint_id: int) -> None:
    """Stage and commit one row (`vertex_id`, `checkpoint_id`) as the vertex's commit user."""
    context = WriteContext(
        job_id="job",
        run_id="r1",
        checkpoint_id=checkpoint_id,
        attempt=0,
        unit_id=0,
        vertex_id=vertex_id,
        index=0,
    )
    batch = pa.RecordBatch.from_pylist([{"tag": vertex_id, "n": checkpoint_id}], ROWS_SCHEMA)
    sink.commit(f"job-r1-{vertex_id}", checkpoint_id, sink.write([batch], context))


@pytest.mark.parametrize("objects", ["one-object", "two-objects"])
@pytest.mark.parametrize("kind", ["parquet", "iceberg"])
def test_a_restore_rolls_back_every_vertex_of_a_shared_table_and_only_its_commits(
    tmp_path: Path, kind: str, objects: str
) -> None:
    """Vertices "a" and "b" commit in turns to one table; newer checkpoints than 1 are
    damaged. Both are rolled back to 1, whether the table moves back per commit user
    (Parquet) or as a whole (Iceberg: a snapshot, once for every user of the job)."""
    from regional.runtime.restore import roll_back_sinks
    from regional.sinks.iceberg import IcebergSink

    def sink() -> Any:
        if kind == "parquet":
            return ParquetSink(str(tmp_path / "t"))
        return IcebergSink(str(tmp_path / "warehouse"), "db.t", schema=ROWS_SCHEMA)

    a = sink()
    sinks = {"a": a, "b": a if objects == "one-object" else sink(), "c": sink()}
    for cid in (1, 2, 3):
        for vertex_id in ("a", "b", "c") if cid == 1 else ("a", "b"):  # c: nothing after 1
            _commit(sinks[vertex_id], vertex_id, cid)
    p = Pipeline("job")
    src = p.source(GeneratorSource(1, lambda split, i: {"n": i}))
    for vertex_id, s in sinks.items():
        src.sink(s, name=vertex_id)
    committers = {v: CommitCoordinator(v, commit_user=f"job-r1-{v}") for v in sinks}
    notes = roll_back_sinks(p, committers, 1, own_root=True)
    assert [n.split(" holds")[0] + n.split(":")[-1] for n in notes] == [
        "sink 'a' commit(s) 2, 3 rolled back, their output is written again",
        "sink 'b' commit(s) 2, 3 rolled back, their output is written again",
    ]
    if kind == "parquet":
        t = read_table(str(tmp_path / "t"))
    else:
        t = IcebergSink(str(tmp_path / "warehouse"), "db.t").read()
    assert sorted(zip(t.column("tag").to_pylist(), t.column("n").to_pylist(), strict=True)) == [
        ("a", 1),
        ("b", 1),
        ("c", 1),
    ]
    fresh = sink()
    assert [fresh.latest_committed(f"job-r1-{v}") for v in "abc"] == [1, 1, 1]


KILLED_IN_PROCESS = """
import os, signal, sys
from pathlib import Path
sys.path.insert(0, os.environ["TESTS"])
import test_shared_sink
from regional.sinks import staging

publish, published = staging.StagingArea._publish, []

def publish_or_die(self, fs, staged, target):
    published.append(target)
    if len(published) == int(os.environ["KILL_AT_PUBLISH"]):
        os.kill(os.getpid(), signal.SIGKILL)
    publish(self, fs, staged, target)

staging.StagingArea._publish = publish_or_die
test_shared_sink._clicks(Path(os.environ["BASE"])).run()
"""


def test_kill_9_at_seeded_moments_mid_commit_resumes_to_the_fault_free_tables(
    tmp_path: Path, fault_free: tuple[list[Any], list[Any], int]
) -> None:
    """The driver process is killed with SIGKILL before its n-th file publish (n seeded),
    three times in one job's life, each run resuming the last; then a run to the end."""
    import os
    import random
    import subprocess
    import sys

    rows, letters, _ = fault_free
    env = {**os.environ, "TESTS": str(Path(__file__).parent), "BASE": str(tmp_path)}
    for n in random.Random(32).sample(range(2, 40), 3):
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_IN_PROCESS],
            env={**env, "KILL_AT_PUBLISH": str(n)},
            capture_output=True,
            text=True,
        )
        assert killed.returncode == -9, (n, killed.stderr)
    assert _clicks(tmp_path).run().finished
    assert job.rows(str(tmp_path / "table")) == rows
    assert job.dead_letters(str(tmp_path / "dead")) == letters
