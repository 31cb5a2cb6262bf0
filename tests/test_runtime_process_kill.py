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
