"""Integration tests of the Spark runtime on the shared local[2] session: regional completion,
timeouts, fencing, staleness limits, the final global checkpoint, crash-then-resume."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.errors import JobFailedError
from regional.policy import load_policy
from regional.runtime.spark import CRASH_STEPS, DriverCrash, Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.spark

SPLITS, PER_SPLIT, PER_EPOCH = 4, 30, 10


def _click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}


def _count(ctx, record):
    state = ctx.value_state("count", 0)
    state.update(state.value() + 1)
    yield {**record, "count": state.value()}


def _pipeline(table: str) -> Pipeline:
    p = Pipeline("job", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, _click, records_per_split=PER_SPLIT), parallelism=4, name="src"
    )
    counted = src.key_by(lambda r: r["user"]).process(_count, name="count")
    counted.sink(ParquetSink(table), name="out")
    return p


def _expected() -> list[tuple]:
    rows = []
    for split in range(SPLITS):
        seen: Counter[str] = Counter()
        for n in range(PER_SPLIT):
            r = _click(split, n)
            seen[r["user"]] += 1
            rows.append((split, n, r["user"], seen[r["user"]]))
    return sorted(rows)


def _rows(table: str) -> list[tuple]:
    t = read_table(table)
    cols = [t.column(c).to_pylist() for c in ("split", "n", "user", "count")]
    return sorted(zip(*cols, strict=True))


def _policy(**region):
    region = {k.replace("_", "-"): v for k, v in region.items()}
    return load_policy(env={}, overrides={"checkpointing": {"region": region}}).policy


def _run(spark, tmp_path, faults=None, policy=None, **kw):
    table = str(tmp_path / "table")
    rt = SparkRuntime(
        _pipeline(table),
        spark,
        root=str(tmp_path / "ckpt"),
        faults=faults,
        policy=policy or _policy(timeout="20 s"),
        **kw,
    )
    return rt, rt.run(), table


def test_failing_region_falls_back_while_others_commit(spark, tmp_path):
    _, summary, table = _run(spark, tmp_path, Faults(units={(2, 1): "fail"}))
    kinds = [(c.checkpoint_id, c.kind, c.fallback_units) for c in summary.checkpoints]
    assert kinds[:2] == [(1, "global", ()), (2, "regional", (1,))]
    cause = summary.checkpoints[1].causes[1]
    assert cause.startswith("declined: InjectedFault: unit 1 fails checkpoint 2")
    assert summary.finished
    assert _rows(table) == _expected()


def test_hung_region_is_cut_off_by_its_timeout(spark, tmp_path):
    _, summary, table = _run(
        spark, tmp_path, Faults(units={(2, 2): "hang"}), policy=_policy(timeout="3 s")
    )
    second = summary.checkpoints[1]
    assert (second.kind, second.fallback_units) == ("regional", (2,))
    assert second.causes[2].startswith("declined: timeout: unit ran over 1.5 s")
    assert _rows(table) == _expected()


def test_late_ack_of_a_fenced_attempt_is_ignored_and_its_files_discarded(spark, tmp_path):
    from regional.coordinator.messages import Ack, UnitWork
    from regional.runtime.task import run_units

    rt, _, table = _run(spark, tmp_path)
    storage = JobStorage(str(tmp_path / "ckpt"), "job")
    # an attempt of checkpoint 2 that answers long after checkpoint 2 was decided
    work = UnitWork(2, 7, 0, rt.coordinator.unit_states(0))
    [late] = run_units(rt.env, [work])
    late_file = f"chk-2/u0-a7-{rt.run_id}.state"
    assert isinstance(late, Ack) and storage.exists(late_file)
    before = _rows(table)
    rt.handle_answer(late)
    assert not storage.exists(late_file)
    assert _rows(table) == before == _expected()


def test_forced_global_after_the_consecutive_limit(spark, tmp_path):
    faults = Faults(units={(2, 1): "fail", (3, 2): "fail"})
    _, summary, table = _run(
        spark, tmp_path, faults, policy=_policy(timeout="20 s", max_consecutive_regional=1)
    )
    kinds = [c.kind for c in summary.checkpoints[:4]]
    assert kinds == ["global", "regional", "aborted", "global"]
    assert "rule 3a" in summary.checkpoints[2].message
    assert _rows(table) == _expected()


def test_force_fresh_unit_level_limit_forces_the_unit_fresh(spark, tmp_path):
    faults = Faults(units={(2, 1): "fail", (3, 1): "fail", (4, 1): "fail"})
    policy = _policy(timeout="20 s", max_unit_fallbacks=2, on_unit_fallback_limit="force-fresh")
    _, summary, table = _run(spark, tmp_path, faults, policy=policy)
    kinds = [c.kind for c in summary.checkpoints[:5]]
    assert kinds == ["global", "regional", "regional", "aborted", "global"]
    assert "src[1] (unit 1) had to be fresh" in summary.checkpoints[3].message
    assert _rows(table) == _expected()


def test_by_default_a_unit_over_the_limit_is_stuck_and_checkpoints_complete(spark, tmp_path):
    faults = Faults(units={(2, 1): "fail", (3, 1): "fail", (4, 1): "fail"})
    _, summary, table = _run(
        spark, tmp_path, faults, policy=_policy(timeout="20 s", max_unit_fallbacks=2)
    )
    kinds = [c.kind for c in summary.checkpoints[:5]]
    assert kinds == ["global", "regional", "regional", "regional", "global"]
    assert [[s.name for s in c.stuck] for c in summary.checkpoints[:5]] == [
        [], [], ["unit 1 (g1)"], ["unit 1 (g1)"], []
    ]  # fmt: skip
    assert _rows(table) == _expected()


def test_bounded_job_ends_with_a_global_checkpoint(spark, tmp_path):
    _, summary, table = _run(spark, tmp_path, Faults(units={(3, 0): "fail"}))
    last = summary.checkpoints[-1]
    assert summary.finished and last.kind == "global"
    assert "every bounded source has finished" in last.message
    assert last.commit_lag == 0
    assert _rows(table) == _expected()


def test_too_many_aborted_checkpoints_fail_the_job(spark, tmp_path):
    faults = Faults(units={(c, 0): "fail" for c in range(1, 10)})
    region = {"timeout": 20, "on-unit-fallback-limit": "force-fresh"}  # aborts after 3 fallbacks
    policy = load_policy(
        env={},
        overrides={"checkpointing": {"tolerable-failed-checkpoints": 1, "region": region}},
    ).policy
    with pytest.raises(JobFailedError, match="unit"):
        _run(spark, tmp_path, faults, policy=policy)


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_crash_then_resume_commits_exactly_once(spark, tmp_path, step):
    table = str(tmp_path / "table")
    root = str(tmp_path / "ckpt")
    # checkpoint 2 falls back to 1, so 1 and 2 are subsumed (and cleaned) when 5 completes
    crash_at = 5 if step == "mid-clean" else 4
    first = SparkRuntime(
        _pipeline(table),
        spark,
        root=root,
        policy=_policy(timeout="20 s"),
        faults=Faults(units={(2, 1): "fail"}, crash_at=(crash_at, step)),
    )
    with pytest.raises(DriverCrash, match=f"checkpoint {crash_at}, {step}"):
        first.run()
    second = SparkRuntime(_pipeline(table), spark, root=root, policy=_policy(timeout="20 s"))
    summary = second.run()
    expected_restore = crash_at - 1 if step == "after-acks" else crash_at
    assert summary.restored_from == expected_restore
    assert summary.checkpoints[0].checkpoint_id == crash_at + 1
    assert summary.finished
    assert _rows(table) == _expected()


def test_unbounded_log_source_picks_up_appended_records_exactly_once(spark, tmp_path):
    from regional.sources.log import LogSource

    logdir = tmp_path / "log"
    for part in ("p0", "p1"):
        (logdir / part).mkdir(parents=True)
        (logdir / part / "000.jsonl").write_text("".join(f'{{"v": {i}}}\n' for i in range(5)))
    p = Pipeline("log-job", records_per_epoch=4)
    p.source(LogSource(str(logdir)), parallelism=2, name="log").sink(
        ParquetSink(str(tmp_path / "t")), name="out"
    )
    rt = SparkRuntime(p, spark, root=str(tmp_path / "ckpt"), policy=_policy(timeout="20 s"))
    first = rt.run(max_checkpoints=3)
    assert not first.finished and [c.kind for c in first.checkpoints] == ["global"] * 3
    with open(logdir / "p1" / "000.jsonl", "a") as f:
        f.write('{"v": 100}\n')
    rt.run(max_checkpoints=1)
    values = sorted(read_table(str(tmp_path / "t")).column("v").to_pylist())
    assert values == sorted([*range(5), *range(5), 100])


def test_restoring_without_the_stateful_vertices_is_refused_and_leaves_the_root_alone(
    spark, tmp_path
):
    from regional.errors import RestoreError

    _run(spark, tmp_path)
    storage = JobStorage(str(tmp_path / "ckpt"), "job")

    def files() -> list[object]:  # the lease's own record is the refused driver's to write
        return [f for f in storage.list_files() if not f.path.startswith("_lease/")]

    before = files()
    p = Pipeline("job", records_per_epoch=PER_EPOCH)
    p.source(
        GeneratorSource(SPLITS, _click, records_per_split=PER_SPLIT), parallelism=2, name="src"
    )
    rt = SparkRuntime(p, spark, root=str(tmp_path / "ckpt"))
    with pytest.raises(
        RestoreError,
        match=r"^cannot map checkpoint \d+ onto the pipeline: vertex 'count' has state in "
        r"checkpoint \d+ but the pipeline has no such vertex \(renamed or removed\?\)\. "
        r"Restore with the pipeline that wrote it, or allow dropping",
    ):
        rt.run()
    assert files() == before


@pytest.mark.s3
def test_checkpoints_and_table_on_s3(spark, s3_server, tmp_path):
    bucket = s3_server.new_bucket()
    root, table = s3_server.uri(bucket, "ckpt"), s3_server.uri(bucket, "table")
    rt = SparkRuntime(
        _pipeline(table),
        spark,
        root=root,
        policy=_policy(timeout="20 s"),
        faults=Faults(units={(2, 3): "fail"}),
    )
    summary = rt.run()
    assert summary.finished and summary.checkpoints[1].kind == "regional"
    assert _rows(table) == _expected()
    assert JobStorage(root, "job").find_latest_restorable().checkpoint_id == len(
        summary.checkpoints
    )


def test_worker_crash_loses_only_its_unit_after_the_lost_units_rerun_alone(spark, tmp_path):
    _, summary, table = _run(spark, tmp_path, Faults(units={(2, 2): "crash"}))
    second = summary.checkpoints[1]
    assert (second.kind, second.fallback_units) == ("regional", (2,))
    # issue 26 defect 4: the lost unit and Spark's reason, not Py4J's "An error occurred
    # while calling z:...PythonRDD.collectAndServe."
    assert second.causes[2].startswith("declined: Spark lost the task running unit 2 (task 0 "), (
        second.causes[2]
    )
    assert second.causes[2].endswith("): Python worker exited unexpectedly (crashed)")
    assert _rows(table) == _expected()


def test_stalled_unit_is_cancelled_at_the_deadline_and_finished_tasks_still_count(spark, tmp_path):
    _, summary, table = _run(
        spark, tmp_path, Faults(units={(2, 2): "stall"}), policy=_policy(timeout="3 s"), tasks=4
    )
    second = summary.checkpoints[1]
    assert (second.kind, second.fallback_units) == ("regional", (2,))
    assert second.causes[2].startswith("timeout: no answer after")
    assert _rows(table) == _expected()


def test_a_bit_flip_in_the_newest_state_restores_the_previous_checkpoint_exactly(spark, tmp_path):
    table = str(tmp_path / "table")
    root = str(tmp_path / "ckpt")
    policy = _policy(timeout="20 s")
    SparkRuntime(_pipeline(table), spark, root=root, policy=policy).run(max_checkpoints=2)
    storage = JobStorage(root, "job")
    newest = storage.read_metadata(2)
    [handle, *_] = [h for s in newest.subtasks for h in s.handles]
    full = f"{storage.job_path}/{handle.path}"
    with open(full, "r+b") as f:  # same size, other bytes: only the checksum can tell
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0x01]))
    resumed = SparkRuntime(_pipeline(table), spark, root=root, policy=policy)
    summary = resumed.run()
    assert summary.restored_from == 1  # validate and restore agree: 2 is damaged
    assert summary.restore_notes[-1].endswith(
        "newer than the restored checkpoint 1: commit(s) 2 rolled back, their output is written "
        "again"
    )
    assert summary.finished and _rows(table) == _expected()


@pytest.mark.s3
def test_an_s3_outage_of_three_checkpoint_timeouts_aborts_checkpoints_then_the_job_catches_up(
    spark, s3_server, tmp_path
):
    from tcp_proxy import TcpProxy

    proxy = TcpProxy((s3_server.host, s3_server.port))
    proxy.start()
    bucket = s3_server.new_bucket()
    root = s3_server.uri(bucket, "ckpt").replace(s3_server.endpoint, proxy.endpoint)
    table = str(tmp_path / "table")
    timeout = 3.0
    policy = load_policy(
        env={},
        overrides={
            "checkpointing": {
                "timeout": f"{timeout:g} s",
                "tolerable-failed-checkpoints": 1000,
                "region": {"timeout": f"{timeout:g} s"},
            }
        },
    ).policy
    outage = threading.Event()

    def cut_after_the_second_checkpoint(event) -> None:
        if event.checkpoint_id == 2 and not outage.is_set():
            outage.set()
            proxy.stop()
            threading.Timer(3 * timeout, proxy.start).start()

    rt = SparkRuntime(
        _pipeline(table),
        spark,
        root=root,
        policy=policy,
        interval=0.5,
        progress=cut_after_the_second_checkpoint,
    )
    try:
        summary = rt.run()
    finally:
        proxy.stop()
    kinds = [c.kind for c in summary.checkpoints]
    assert outage.is_set() and "aborted" in kinds and summary.finished
    assert _rows(table) == _expected()
