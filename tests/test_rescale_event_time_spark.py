"""Rescaling the downstream of an exchange on real Spark (issue 32 §2): a job with tumbling,
sliding and session windows and event-time timers after an exchange by user, with late data
dead-lettered, run at 5, 3 and then 4 partitions on one job root, the last run through unit
faults on both sides (one killing the Python worker) and an injected driver crash, commits
exactly the rows and dead letters of the fault-free run (read with DuckDB); so does a rescaled
`regional run` killed with SIGKILL inside a commit and resumed. The pure rule and
the same job in this process are in `tests/test_rescale_event_time.py`."""

from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import windows_job as job
from test_rescale_event_time import LATE, _driver, outputs

from regional.policy import load_policy
from regional.runtime.spark import DriverCrash, Faults, SparkRuntime

pytestmark = pytest.mark.spark


def _runtime(spark, tmp_path: Path, partitions: int, faults: Faults | None = None):  # type: ignore[no-untyped-def]
    overrides = {"checkpointing": {"timeout": "20 s", "region": {"max-failure-ratio": 0.5}}}
    return SparkRuntime(
        job.all_operators(str(tmp_path / "out"), partitions),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=load_policy(env={}, overrides=overrides).policy,
        faults=faults,
    )


def test_rescaled_5_3_4_through_faults_and_a_crash_gives_the_fault_free_rows(
    spark, tmp_path: Path
) -> None:
    assert _driver(tmp_path / "fault-free", 5).run().finished  # the reference, in this process
    want = outputs(tmp_path / "fault-free")
    assert want["dead"] == LATE

    for partitions in (5, 3):
        summary = _runtime(spark, tmp_path, partitions).run(max_checkpoints=3)
        assert not summary.finished
    # at 4 partitions from checkpoint 7 (global until one succeeds): upstream units 0-3 and
    # downstream units 4-7 fall back, one by losing its Python worker; the driver crashes
    units = {(8, 1): "fail", (8, 5): "crash", (9, 6): "fail", (9, 2): "fail"}
    with pytest.raises(DriverCrash):
        _runtime(spark, tmp_path, 4, Faults(units=units, crash_at=(10, "after-commit"))).run()
    summary = _runtime(spark, tmp_path, 4).run()
    assert summary.finished and summary.restored_from is not None
    assert outputs(tmp_path) == want


KILLED = textwrap.dedent(
    """
    import os
    import signal
    import sys

    sys.path.insert(0, os.environ["JOB_DIR"])
    import windows_job as job
    from regional.sinks import staging

    pipeline = job.all_operators(os.environ["OUT"], int(os.environ["PARTITIONS"]))
    publish, published = staging.StagingArea._publish, []

    def publish_or_die(self, fs, staged, target):  # SIGKILL before the n-th file publish
        published.append(target)
        if len(published) == int(os.environ["KILL_AT_PUBLISH"]):
            os.kill(os.getpid(), signal.SIGKILL)
        publish(self, fs, staged, target)

    staging.StagingArea._publish = publish_or_die
    """
)


def test_rescaled_then_killed_with_sigkill_resumes_to_the_fault_free_rows(
    spark, tmp_path: Path
) -> None:
    """5 -> 3 partitions in this session, then `regional run` at 4 partitions (the rescale
    that moves the backlog) killed with SIGKILL at a seeded moment inside a commit; resumed
    at 4, the rows and dead letters equal the fault-free run's."""
    assert _driver(tmp_path / "fault-free", 5).run().finished
    want = outputs(tmp_path / "fault-free")
    for partitions in (5, 3):
        assert not _runtime(spark, tmp_path, partitions).run(max_checkpoints=3).finished
    file = tmp_path / "job.py"
    file.write_text(KILLED)
    n = random.Random(322).randrange(4, 20)
    env = {
        **os.environ,
        "JOB_DIR": str(Path(job.__file__).parent),
        "OUT": str(tmp_path / "out"),
        "PARTITIONS": "4",
        "KILL_AT_PUBLISH": str(n),
    }
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[1]"]
    cmd += ["--checkpoint-dir", str(tmp_path / "ckpt")]
    killed = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert killed.returncode == -9, (n, killed.stdout[-2000:], killed.stderr[-2000:])
    summary = _runtime(spark, tmp_path, 4).run()
    assert summary.finished and summary.restored_from is not None
    assert outputs(tmp_path) == want
