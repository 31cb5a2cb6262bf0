"""A join under a real kill -9: `regional run` of an interval join (two sources, two keyed
exchanges, the join, a Parquet table and dead letters) is killed with SIGKILL as soon as it
reports its third checkpoint, wherever the driver then is (the next epoch's tasks, a held
commit, cleaning); a second `regional run` on the same root resumes, and the table and the dead
letters hold exactly what a fault-free run of the same pipeline commits."""

from __future__ import annotations

import json
import os
import runpy
import signal
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import orders_job
import pytest

from metadata.storage import JobStorage
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import read_table

pytestmark = pytest.mark.spark

PIPELINE = textwrap.dedent(
    """
    import os
    from regional import GeneratorSource, ParquetSink, Pipeline

    def order(split, n):  # about one a second, up to 2 s out of order, every 17th 9 s late
        ts = 100_000 + n * 1_000 + split * 300 - (n * 7919 % 3) * 1_000
        return {"id": f"o{split}-{n}", "k": (n * 5 + split) % 7,
                "ts": ts - (9_000 if n % 17 == 16 else 0)}

    def payment(split, n):
        ts = 100_000 + n * 1_100 + split * 500 - (n * 31 % 3) * 1_000
        return {"id": f"p{split}-{n}", "k": (n * 3 + split) % 7,
                "ts": ts - (9_000 if n % 19 == 18 else 0)}

    def pair(left, right):
        return {"order": left and left["id"], "payment": right and right["id"]}

    out = os.environ["REGIONAL_CHECKPOINT_DIR"]
    pipeline = Pipeline("paid", records_per_epoch=6, on_error="dead-letter",
                        dead_letter=ParquetSink(out + "-dead"))
    orders, payments = (
        pipeline.source(GeneratorSource(3, fn, records_per_split=40), parallelism=3,
                        name=name, event_time="ts", max_out_of_orderness="2 s")
        for name, fn in (("orders", order), ("payments", payment))
    )
    orders.key_by("k").interval_join(
        payments.key_by("k"), between=("0 s", "5 s"), how="outer", emit=pair,
        partitions=3, on_late="dead-letter", name="join",
    ).sink(ParquetSink(out + "-table"), name="out")
    """
)


def _committed(root: str) -> tuple[Counter[tuple[Any, Any]], Counter[str]]:
    pairs = Counter((r["order"], r["payment"]) for r in read_table(root + "-table").to_pylist())
    dead = Counter(json.loads(r["record"])["id"] for r in read_table(root + "-dead").to_pylist())
    return pairs, dead


def _fault_free(file: Path, root: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same pipeline run to its end in this process (no Spark)."""
    monkeypatch.setenv("REGIONAL_CHECKPOINT_DIR", root)
    pipeline = runpy.run_path(str(file))["pipeline"]
    env = TaskEnv(root, "paid", pipeline, unit_timeout=30)
    driver = JobDriver(
        pipeline, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "paid")
    )
    assert driver.run().finished


def _command(file: Path, root: str) -> list[str]:
    return [
        sys.executable, "-m", "regional.cli", "run", str(file),
        "--master", "local[2]", "--checkpoint-dir", root,
    ]  # fmt: skip


def test_a_join_killed_with_sigkill_resumes_to_the_fault_free_rows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "join.py"
    file.write_text(PIPELINE)
    _fault_free(file, str(tmp_path / "clean"), monkeypatch)
    expected = _committed(str(tmp_path / "clean"))
    assert expected[0] and expected[1]  # pairs, and late records on the dead-letter side

    root = str(tmp_path / "ckpt")
    env = {**os.environ, "REGIONAL_CHECKPOINT_DIR": root}
    seen: list[str] = []
    with subprocess.Popen(
        _command(file, root), env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    ) as run:
        assert run.stdout is not None
        for line in run.stdout:
            seen.append(line)
            if line.lstrip().startswith("checkpoint    3"):
                run.send_signal(signal.SIGKILL)
                break
        run.wait(timeout=120)
    assert run.returncode == -signal.SIGKILL, "".join(seen)

    resumed = subprocess.run(
        _command(file, root), env=env, capture_output=True, text=True, timeout=300
    )
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint" in resumed.stdout and "job finished" in resumed.stdout
    assert _committed(root) == expected
