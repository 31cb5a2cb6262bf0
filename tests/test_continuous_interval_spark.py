"""Continuous mode with a checkpoint interval on the shared local[2] session
(`regional.runtime.open_epoch`): long-lived tasks read batch after batch between markers and
commit exactly what micro-epoch mode commits, on a keyed, windowed event-time job with poison
and late records dead-lettered, through unit faults and a killed Python worker (whose task is
started again alone while the other task's units keep committing) and driver crash points;
a run stopped with a savepoint resumes, rescaled, to exactly the rows of an unbroken run."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import windows_job as job

from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.continuous import ContinuousDispatcher
from regional.runtime.spark import DriverCrash, Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink

pytestmark = pytest.mark.spark

INTERVAL = "100 ms"


def _pipeline(base: Path) -> Pipeline:
    return job.pipeline(
        "sliding",
        str(base / "table"),
        on_late="dead-letter",
        dead_letter=ParquetSink(str(base / "dead")),
        checked=True,
    )


def _runtime(
    spark: Any, base: Path, mode: str, faults: Faults | None = None, **options: Any
) -> SparkRuntime:
    overrides = {"checkpointing": {"timeout": "20 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    if mode == "continuous":
        options.setdefault("checkpoint_interval", INTERVAL)
    return SparkRuntime(
        _pipeline(base),
        spark,
        root=str(base / "ckpt"),
        mode=mode,
        tasks=2,
        policy=policy,
        faults=faults,
        **options,
    )


def _outcome(base: Path) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    return job.rows(str(base / "table")), job.dead_letters(str(base / "dead"))


@pytest.fixture(scope="module")
def micro_epoch(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> tuple[list, list]:
    base = tmp_path_factory.mktemp("micro")
    assert _runtime(spark, base, "micro-epoch").run().finished
    return _outcome(base)


def test_a_checkpoint_interval_needs_continuous_mode(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="checkpoint_interval='100 ms' needs mode='continuous'"):
        _runtime(spark, tmp_path, "micro-epoch", checkpoint_interval="100 ms")
    with pytest.raises(ValueError, match="is not a duration"):
        _runtime(spark, tmp_path, "continuous", checkpoint_interval="soon")
    with pytest.raises(ValueError, match="must be positive"):
        _runtime(spark, tmp_path, "continuous", checkpoint_interval="0 ms")


def test_open_epochs_commit_the_micro_epoch_rows_and_dead_letters(
    spark: Any, tmp_path: Path, micro_epoch: tuple[list, list]
) -> None:
    rt = _runtime(spark, tmp_path, "continuous")
    summary = rt.run()
    assert summary.finished and summary.checkpoints[-1].kind == "global"
    assert _outcome(tmp_path) == micro_epoch
    # several batches per checkpoint: fewer checkpoints than micro-epoch's one batch each
    batches = job.PER_SPLIT * job.SPLITS // 2 // job.PER_EPOCH  # per source unit
    assert len(summary.checkpoints) < batches
    assert isinstance(rt.dispatcher, ContinuousDispatcher)
    assert Counter(e.kind for e in rt.dispatcher.events) == {"submitted": 2, "connected": 2}


def test_unit_faults_and_a_killed_worker_in_open_epochs_commit_the_micro_epoch_rows(
    spark: Any, tmp_path: Path, micro_epoch: tuple[list, list]
) -> None:
    # unit 0 fails at 2; unit 1's Python worker dies at 3 (its task is lost and started again)
    faults = Faults(units={(2, 0): "fail", (3, 1): "crash"})
    rt = _runtime(spark, tmp_path, "continuous", faults)
    summary = rt.run()
    assert summary.finished
    by_id = {c.checkpoint_id: c for c in summary.checkpoints}
    assert by_id[2].fallback_units == (0,)
    # while unit 1's task was down, the other task's unit committed checkpoint 3
    assert (by_id[3].kind, by_id[3].fallback_units) == ("regional", (1,))
    # not re-run alone (a cold Spark job would hold every unit's checkpoint): it declines
    assert "lost: connection dropped (unit 1)" in by_id[3].causes[1]
    assert _outcome(tmp_path) == micro_epoch
    assert isinstance(rt.dispatcher, ContinuousDispatcher)
    lost = rt.dispatcher.placement.task_of[1]
    events = [(e.kind, e.task) for e in rt.dispatcher.events]
    assert ("lost", lost) in events and events.count(("submitted", lost)) == 2
    assert events.count(("submitted", 1 - lost)) == 1  # the other task ran on, untouched
    # the checkpoints' events (progress lines, event log) say a single task was lost and
    # started again
    said = [w for c in summary.checkpoints for w in c.warnings]
    assert any(f"task {lost} (Spark attempt" in w and "lost" in w for w in said), said
    assert any(f"task {lost} started again" in w for w in said), said


def test_driver_crash_points_in_open_epochs_resume_to_the_micro_epoch_rows(
    spark: Any, tmp_path: Path, micro_epoch: tuple[list, list]
) -> None:
    """Crash points in one job's life (checkpoint 1 committed, checkpoint 2's metadata
    written but not committed): each restart resumes where the crash left it."""
    for cid, step in ((1, "after-commit"), (2, "after-metadata")):
        with pytest.raises(DriverCrash, match=f"checkpoint {cid}, {step}"):
            _runtime(spark, tmp_path, "continuous", Faults(crash_at=(cid, step))).run()
    summary = _runtime(spark, tmp_path, "continuous").run()
    assert summary.finished and summary.restored_from == 2
    assert _outcome(tmp_path) == micro_epoch
    assert not spark.sparkContext.statusTracker().getActiveJobsIds()  # no task left behind


# --- stop with a savepoint, resume in another shape ---------------------------------------

COUNT_SPLITS, COUNT_PER_SPLIT = 4, 5_000


def _click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}


def _count(ctx: Any, record: dict) -> Any:
    state = ctx.value_state("count", 0)
    state.update(state.value() + 1)
    yield {**record, "count": state.value()}


def _counting(table: str, parallelism: int) -> Pipeline:
    """A count per user within each split (keyed state scoped by split): exact whatever the
    batches, so the rows of a run stopped and resumed in another shape are known."""
    from regional.sources.generator import GeneratorSource

    p = Pipeline("counts", records_per_epoch=5)  # a thousand batches per split
    src = GeneratorSource(COUNT_SPLITS, _click, records_per_split=COUNT_PER_SPLIT)
    stream = p.source(src, parallelism=parallelism, name="src")
    stream.key_by(lambda r: r["user"]).process(_count, name="count").sink(
        ParquetSink(table), name="out"
    )
    return p


def _counted(table: str) -> list[tuple]:
    t = job.read_table(table)
    cols = [t.column(c).to_pylist() for c in ("split", "n", "user", "count")]
    return sorted(zip(*cols, strict=True))


def _all_counts() -> list[tuple]:
    rows = []
    for split in range(COUNT_SPLITS):
        seen: Counter[str] = Counter()
        for n in range(COUNT_PER_SPLIT):
            r = _click(split, n)
            seen[r["user"]] += 1
            rows.append((split, n, r["user"], seen[r["user"]]))
    return sorted(rows)


def test_stop_with_a_savepoint_then_resume_rescaled_in_continuous_mode_is_exact(
    spark: Any, tmp_path: Path
) -> None:
    table = str(tmp_path / "table")

    def runtime(parallelism: int, root: str, **options: Any) -> SparkRuntime:
        return SparkRuntime(
            _counting(table, parallelism),
            spark,
            root=root,
            mode="continuous",
            checkpoint_interval=INTERVAL,
            tasks=2,
            **options,
        )

    first = runtime(4, str(tmp_path / "ckpt")).run(max_checkpoints=1, stop_with_savepoint=True)
    assert [c.kind for c in first.checkpoints] == ["global", "savepoint"]
    assert not first.finished and first.savepoint is not None
    assert 0 < len(_counted(table)) < COUNT_SPLITS * COUNT_PER_SPLIT  # stopped midway
    # the savepoint restarts the job at half the parallelism, in a new job root
    resumed = runtime(2, str(tmp_path / "ckpt2"), restore_from=first.savepoint).run()
    assert resumed.finished and resumed.restored_from == first.checkpoints[-1].checkpoint_id
    assert any("src" in note for note in resumed.restore_notes)  # rescaled 4 -> 2
    assert _counted(table) == _all_counts()
