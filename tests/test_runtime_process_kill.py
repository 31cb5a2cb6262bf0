"""Crash-then-resume with a real process kill: `regional run` is killed (os._exit) right after
a checkpoint's metadata is durable and before its commit; a second `regional run` on the same
root restores, re-commits, and the table holds exactly the fault-free rows."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from regional.sinks.parquet import read_table

pytestmark = pytest.mark.spark

PIPELINE = textwrap.dedent(
    """
    import os
    from regional import GeneratorSource, ParquetSink, Pipeline
    from regional.runtime.spark import Faults

    pipeline = Pipeline("killed", records_per_epoch=5)
    src = pipeline.source(
        GeneratorSource(4, lambda s, n: {"s": s, "n": n}, records_per_split=20), parallelism=4
    )
    src.sink(ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table"))
    if os.environ.get("KILL_AT"):
        faults = Faults(
            units={(2, 1): "fail"}, crash_at=(int(os.environ["KILL_AT"]), "after-metadata"),
            hard=True,
        )
    """
)


def _run(file, root, **env):
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[2]"]
    return subprocess.run(
        [*cmd, "--checkpoint-dir", root],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_driver_killed_after_metadata_resumes_exactly_once(tmp_path):
    file = tmp_path / "job.py"
    file.write_text(PIPELINE)
    root = str(tmp_path / "ckpt")
    killed = _run(file, root, KILL_AT="3")
    assert killed.returncode == 70, killed.stderr
    assert "checkpoint    2  regional" in killed.stdout
    assert "checkpoint    3" not in killed.stdout  # died before reporting it
    resumed = _run(file, root)
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint 3" in resumed.stdout and "job finished" in resumed.stdout
    rows = read_table(root + "-table")
    got = sorted(zip(rows.column("s").to_pylist(), rows.column("n").to_pylist(), strict=True))
    assert got == [(s, n) for s in range(4) for n in range(20)]


SLOW = textwrap.dedent(
    """
    import os
    import time
    from regional import GeneratorSource, ParquetSink, Pipeline

    def held(record):  # with HOLD set, the third epoch never ends (until the unit timeout)
        if os.environ.get("HOLD") and record["n"] >= 10:
            time.sleep(600)
        return record

    pipeline = Pipeline("leased", records_per_epoch=5)
    src = pipeline.source(
        GeneratorSource(4, lambda s, n: {"s": s, "n": n}, records_per_split=30), parallelism=4
    )
    src.map(held).sink(ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table"))
    """
)


def test_a_second_driver_is_refused_then_takes_over_once_the_first_is_killed(tmp_path):
    file = tmp_path / "job.py"
    file.write_text(SLOW)
    root = str(tmp_path / "ckpt")
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[2]"]
    first = subprocess.Popen(
        [*cmd, "--checkpoint-dir", root],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HOLD": "1"},
    )
    try:
        assert first.stdout is not None
        seen = []
        for line in first.stdout:  # the first driver holds the lease once it checkpoints
            seen.append(line)
            if line.startswith("checkpoint"):
                break
        assert any(line.startswith("checkpoint") for line in seen), seen
        second = _run(file, root)
        assert second.returncode == 2
        [message] = second.stderr.strip().splitlines()
        assert message.startswith(f"regional run: job root {root}/leased is in use by driver ")
        assert f"pid {first.pid})" in message
        assert "starting Spark" not in second.stdout  # refused before Spark starts
    finally:
        first.kill()
        first.wait()
    resumed = _run(file, root)  # the killed driver's lease is taken over at once
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint" in resumed.stdout and "job finished" in resumed.stdout
    rows = read_table(root + "-table")
    got = sorted(zip(rows.column("s").to_pylist(), rows.column("n").to_pylist(), strict=True))
    assert got == [(s, n) for s in range(4) for n in range(30)]


def test_two_drivers_started_together_one_runs_the_other_is_refused_and_no_row_doubles(tmp_path):
    file = tmp_path / "job.py"
    file.write_text(PIPELINE)
    root = str(tmp_path / "ckpt")
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[1]"]
    drivers = [
        subprocess.Popen(
            [*cmd, "--checkpoint-dir", root],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [d.communicate(timeout=300) for d in drivers]
    codes = sorted(d.returncode for d in drivers)
    assert codes == [0, 2], outputs
    [(ran, winner)] = [(o, d) for o, d in zip(outputs, drivers, strict=True) if d.returncode == 0]
    [refused] = [o for o, d in zip(outputs, drivers, strict=True) if d.returncode == 2]
    assert "job finished" in ran[0]
    [message] = refused[1].strip().splitlines()
    assert message.startswith(f"regional run: job root {root}/killed is in use by driver ")
    assert f"pid {winner.pid})" in message
    rows = read_table(root + "-table")
    got = sorted(zip(rows.column("s").to_pylist(), rows.column("n").to_pylist(), strict=True))
    assert got == [(s, n) for s in range(4) for n in range(20)]
