"""Event-time windows on real Spark, across a durable keyed exchange (`tests/windows_job.py`):
tumbling and sliding counts and sums equal Spark SQL ``groupBy(window(ts, ...), user)`` and
sessions equal ``session_window`` over the input without the records the job dead-lettered as
late (every one of them 40 s behind); through unit faults on both sides of the exchange and a
driver crash at each crash point, the committed rows equal the fault-free run's row for row.
With a failing map before the exchange, one dead-letter sink collects from both sides (two
sink vertices, one table): a crash at every crash point and a kill -9 mid-commit leave both
tables equal to the fault-free run's (read with DuckDB)."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import windows_job as job

from regional.policy import load_policy
from regional.runtime.spark import CRASH_STEPS, DriverCrash, Faults, SparkRuntime

pytestmark = pytest.mark.spark

#: upstream units 0-3 (a file each -> exchange writer), downstream units 4-6 (reader -> win)
FAULTS = {(2, 1): "fail", (3, 1): "fail", (3, 5): "fail", (4, 0): "fail", (5, 6): "fail"}
#: the records 40 s behind: every 23rd click of each file
FAR_BEHIND = [(s, n) for s in range(job.SPLITS) for n in range(22, job.PER_SPLIT, 23)]


def _run(spark: Any, base: Path, kind: str, faults: Faults | None = None) -> SparkRuntime:
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    p = job.file_pipeline(kind, str(base / "clicks"), str(base / "table"), str(base / "dead"))
    return SparkRuntime(p, spark, root=str(base / "ckpt"), policy=policy, faults=faults)


def _spark_sql(spark: Any, base: Path, kind: str, late: list[tuple[int, int]]) -> list[tuple]:
    """Spark SQL's windows over the input files without the `late` clicks."""
    spark.read.json(str(base / "clicks")).createOrReplaceTempView("clicks")
    spark.createDataFrame(late or [(-1, -1)], "split INT, n INT").createOrReplaceTempView("late")
    window = {
        "tumbling": "window(timestamp_millis(ts), '10 seconds')",
        "sliding": "window(timestamp_millis(ts), '10 seconds', '5 seconds')",
        "session": "session_window(timestamp_millis(ts), '2 seconds')",
    }[kind]
    name = "session_window" if kind == "session" else "window"
    rows = spark.sql(
        f"""
        SELECT user, unix_millis({name}.start) AS start, unix_millis({name}.end) AS end,
               count(*) AS clicks, sum(amount) AS amount
        FROM clicks LEFT ANTI JOIN late USING (split, n)
        GROUP BY {window}, user
        """
    ).collect()
    return sorted(tuple(r) for r in rows)


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_window_rows_equal_spark_sql_over_the_on_time_records(
    spark: Any, tmp_path: Path, kind: str
) -> None:
    job.write_clicks(str(tmp_path / "clicks"))
    assert _run(spark, tmp_path, kind).run().finished
    late = job.late_records(str(tmp_path / "dead"))
    assert late == FAR_BEHIND  # counted the same on both sides: these, and only these
    assert job.totals(str(tmp_path / "table")) == _spark_sql(spark, tmp_path, kind, late)


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_faults_on_both_sides_and_a_driver_crash_commit_the_fault_free_rows(
    spark: Any, tmp_path: Path, step: str
) -> None:
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    for base in (clean, faulty):
        job.write_clicks(str(base / "clicks"))
    assert _run(spark, clean, "sliding").run().finished
    with pytest.raises(DriverCrash, match=f"checkpoint 6, {step}"):
        _run(spark, faulty, "sliding", Faults(units=FAULTS, crash_at=(6, step))).run()
    summary = _run(spark, faulty, "sliding").run()
    assert summary.finished and summary.restored_from is not None
    assert job.totals(str(faulty / "table")) == job.totals(str(clean / "table"))
    assert job.late_records(str(faulty / "dead")) == FAR_BEHIND


def test_a_sessionizer_after_an_exchange_closes_every_quiet_users_session(
    spark: Any, tmp_path: Path
) -> None:
    table = str(tmp_path / "table")
    p = job.sessionizer(table, partitions=2)
    runtime = SparkRuntime(p, spark, root=str(tmp_path / "ckpt"))
    runtime.run(max_checkpoints=5)  # far from the end: the quiet users' timers have fired
    early = {r["user"]: (r["clicks"], r["end"]) for r in job.read_table(table).to_pylist()}
    assert {u: v for u, v in early.items() if u.startswith("q")} == {
        "q0": (10, 9_000 + job.GAP),
        "q1": (10, 9_000 + job.GAP),
    }
    assert SparkRuntime(p, spark, root=str(tmp_path / "ckpt")).run().finished
    got = sorted((r["user"], r["clicks"], r["end"]) for r in job.read_table(table).to_pylist())
    assert got == job.expected_sessions()


def _checked(spark: Any, base: Path, faults: Faults | None = None) -> SparkRuntime:
    """The file job with `check` before the exchange: poison clicks and late clicks go to one
    dead-letter ParquetSink (vertices `dead-letters` and `dead-letters-2`)."""
    p = job.file_pipeline(
        "sliding", str(base / "clicks"), str(base / "table"), str(base / "dead"), checked=True
    )
    return SparkRuntime(p, spark, root=str(base / "ckpt"), faults=faults)


def _duckdb(table: Path, columns: str) -> list[tuple[Any, ...]]:
    """The committed rows of a Parquet table as DuckDB reads it (an independent reader)."""
    import duckdb

    query = f"SELECT {columns} FROM read_parquet('{table}/**/*.parquet') ORDER BY ALL"
    return duckdb.sql(query).fetchall()


DEAD_COLUMNS = "operator, error_type, record"
TOTAL_COLUMNS = 'user, start, "end", clicks, amount'


@pytest.fixture(scope="module")
def checked_fault_free(spark: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("checked-fault-free")
    job.write_clicks(str(base / "clicks"))
    assert _checked(spark, base).run().finished
    assert job.dead_letters(str(base / "dead")) == job.expected_dead_letters(FAR_BEHIND)
    return base


def test_one_dead_letter_sink_for_both_sides_of_an_exchange_survives_every_crash_point(
    spark: Any, tmp_path: Path, checked_fault_free: Path
) -> None:
    """Crash points in one job's life: each restart resumes where the last crash left it.
    Checkpoint 4 (the first after-metadata crash) holds staged dead letters of both sides."""
    job.write_clicks(str(tmp_path / "clicks"))
    crashes = [(4, "after-metadata"), (7, "after-acks"), (10, "after-commit"), (12, "mid-clean")]
    assert sorted(step for _, step in crashes) == sorted(CRASH_STEPS)
    for cid, step in crashes:
        with pytest.raises(DriverCrash, match=f"checkpoint {cid}, {step}"):
            _checked(spark, tmp_path, Faults(crash_at=(cid, step))).run()
    summary = _checked(spark, tmp_path).run()
    assert summary.finished and summary.restored_from is not None
    for table, columns in (("table", TOTAL_COLUMNS), ("dead", DEAD_COLUMNS)):
        assert _duckdb(tmp_path / table, columns) == _duckdb(checked_fault_free / table, columns)


KILLED = textwrap.dedent(
    """
    import os
    import signal
    import sys

    sys.path.insert(0, os.environ["JOB_DIR"])
    import windows_job as job
    from regional.sinks import staging

    base = os.environ["BASE"]
    pipeline = job.file_pipeline(
        "sliding", base + "/clicks", base + "/table", base + "/dead", checked=True
    )
    if os.environ.get("KILL_AT_PUBLISH"):  # SIGKILL before this driver's n-th file publish
        publish, published = staging.StagingArea._publish, []

        def publish_or_die(self, fs, staged, target):
            published.append(target)
            if len(published) == int(os.environ["KILL_AT_PUBLISH"]):
                os.kill(os.getpid(), signal.SIGKILL)
            publish(self, fs, staged, target)

        staging.StagingArea._publish = publish_or_die
    """
)


def test_one_dead_letter_sink_for_both_sides_survives_kill_9_mid_commit(
    spark: Any, tmp_path: Path, checked_fault_free: Path
) -> None:
    """`regional run` killed with SIGKILL at a seeded moment: before the n-th file a commit
    publishes (sink rows, dead letters or exchange segments), so a commit is cut halfway;
    the next run completes it and both tables equal the fault-free run's. (One kill: a
    `regional run` costs a JVM start; tests/test_shared_sink.py kills at more moments.)"""
    job.write_clicks(str(tmp_path / "clicks"))
    file = tmp_path / "job.py"
    file.write_text(KILLED)
    env = {**os.environ, "JOB_DIR": str(Path(job.__file__).parent), "BASE": str(tmp_path)}
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[1]"]
    cmd += ["--checkpoint-dir", str(tmp_path / "ckpt")]
    n = random.Random(32).randrange(3, 16)
    killed = subprocess.run(
        cmd, env={**env, "KILL_AT_PUBLISH": str(n)}, capture_output=True, text=True
    )
    assert killed.returncode == -9, (n, killed.stdout, killed.stderr)
    summary = _checked(spark, tmp_path).run()  # the same job root: the pipeline is "clicks"
    assert summary.finished and summary.restored_from is not None
    for table, columns in (("table", TOTAL_COLUMNS), ("dead", DEAD_COLUMNS)):
        assert _duckdb(tmp_path / table, columns) == _duckdb(checked_fault_free / table, columns)
