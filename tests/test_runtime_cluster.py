"""The quickstart on a real Spark standalone cluster (master + worker on loopback, see
`cluster.py`): `regional run --master spark://...` in a subprocess (one SparkContext per
process; the suite's local session lives in this one), unit 3 failing at checkpoints 2-4, and
the committed table checked against the rows a fault-free run must commit, computed here from
the input files, and the job's event log read back by the inspector. Once with checkpoints on
local disk, once on the S3-compatible test server with credentials that reach the executors only
through `spark.executorEnv.*`."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import regional
from metadata.events import read_events
from metadata.storage import JobStorage
from regional.cli import main
from regional.sinks.parquet import read_table

pytestmark = [pytest.mark.spark, pytest.mark.cluster]

_QUICKSTART = Path(__file__).parent.parent / "examples" / "quickstart.py"
#: Where this test's `regional` is imported from: executors must import the same code.
_SOURCE_ROOT = str(Path(regional.__file__).parent.parent)


def _run_quickstart(cluster, tmp_path: Path, root: str, *conf: str) -> subprocess.CompletedProcess:
    """`regional run examples/quickstart.py` on the cluster; its data under `tmp_path`."""
    settings = [
        "spark.executor.memory=512m",
        f"spark.executorEnv.PYTHONPATH={_SOURCE_ROOT}",
        *conf,
    ]
    cmd = [sys.executable, "-m", "regional.cli", "run", str(_QUICKSTART)]
    cmd += ["--master", cluster.master_url, "--checkpoint-dir", root]
    for setting in settings:
        cmd += ["--conf", setting]
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": _SOURCE_ROOT}
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def _fault_free_rows(data_dir: Path) -> list[tuple]:
    """What the quickstart must commit: per input file (keyed state is scoped by split), user
    and 100 ms window of event time, the number of human clicks."""
    counts: dict[tuple, int] = {}
    for path in sorted(data_dir.glob("clicks-*.jsonl")):
        for line in path.read_text().splitlines():
            click = json.loads(line)
            if not click["bot"]:
                start = click["ts"] - click["ts"] % 100
                key = (path.name, click["user"], start, start + 100)
                counts[key] = counts.get(key, 0) + 1
    return sorted((user, s, e, n) for (_, user, s, e), n in counts.items())


def _committed_rows(table: str) -> list[tuple]:
    """(user, window start and end in ms, clicks) of the committed table, sorted."""
    t = read_table(table)
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    ms = [[(v - epoch) // dt.timedelta(milliseconds=1) for v in t.column(c).to_pylist()]
          for c in ("window_start", "window_end")]  # fmt: skip
    return sorted(zip(t.column("user").to_pylist(), *ms, t.column("clicks").to_pylist(),
                      strict=True))  # fmt: skip


def _apps(cluster) -> dict[str, dict]:
    """Every application the master knows (running or finished, which it learns a moment
    after the driver process ended), by id."""
    status = cluster.status()
    return {a["id"]: a for a in status["activeapps"] + status["completedapps"]}


def _check_run(run: subprocess.CompletedProcess, cluster, apps_before: dict) -> None:
    assert run.returncode == 0, f"{run.stdout}\n{run.stderr}\n{cluster.logs()}"
    out = run.stdout
    assert f"starting Spark ({cluster.master_url})" in out
    for cid in (2, 3, 4):  # unit 3 fails: regional checkpoints, the other 7 units fresh
        assert f"checkpoint    {cid}  regional  fresh   7  fallback 3 " in out, out
    assert "    stuck: clicks[3] (unit 3) for " in out, out  # after 3 fallbacks in a row: reported
    assert "checkpoint    5  global    fresh   8" in out, out  # unit 3 caught up
    assert "0 aborted checkpoints; job finished" in out, out
    new = [a for i, a in _apps(cluster).items() if i not in apps_before]
    assert [a["name"] for a in new] == ["regional"]  # it ran as an application of the master
    executor_logs = list((cluster.log_dir / "work" / new[0]["id"]).glob("*/stderr"))
    assert executor_logs, "no executor ran on the worker"


#: The quickstart's outcomes: (checkpoint id, kind, fallback units, max unit lag).
_OUTCOMES = [
    (1, "global", [], 0),
    (2, "regional", [3], 1),
    (3, "regional", [3], 2),
    (4, "regional", [3], 3),
    (5, "global", [], 0),
    (6, "global", [], 0),
    (7, "global", [], 0),
]


@pytest.mark.s3
def test_quickstart_on_a_standalone_cluster_with_checkpoints_on_s3(
    spark_cluster, s3_server, tmp_path, capsys, monkeypatch
):
    """The quickstart's story on a standalone cluster (executors in their own JVMs and Python
    workers, reaching the root over S3): the fault-free rows exactly once, the outcomes
    checkpoint by checkpoint, and what the cleaner left, as `regional inspect` reads it."""
    bucket = s3_server.new_bucket()
    query = f"?endpoint_override={s3_server.endpoint}&scheme=http&region=us-east-1"
    root = f"s3://{bucket}/ckpt{query}"  # no credentials in the URI
    credentials = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    before = _apps(spark_cluster)
    run = _run_quickstart(
        spark_cluster,
        tmp_path,
        root,
        *(f"spark.executorEnv.{k}={v}" for k, v in credentials.items()),
    )
    _check_run(run, spark_cluster, before)
    want = _fault_free_rows(tmp_path / "regional-quickstart" / "data")
    assert len(want) == 1713
    assert _committed_rows(f"s3://{bucket}/ckpt-table{query}") == want
    events, problems = read_events(JobStorage(root, "quickstart"))
    assert problems == []
    got = [
        (e.checkpoint_id, e.kind, list(e.fallback_units), max(e.unit_lag.values(), default=0))
        for e in events
    ]
    assert got == _OUTCOMES
    fs = s3_server.filesystem()
    from pyarrow import fs as pafs

    listed = fs.get_file_info(pafs.FileSelector(f"{bucket}/ckpt/quickstart", recursive=True))
    state_files = {
        i.path.split("/quickstart/", 1)[1] for i in listed if i.type == pafs.FileType.File
    }
    assert "chk-7/_metadata" in state_files  # the last (global) checkpoint, on S3
    assert any(p.startswith("chk-7/u") and p.endswith(".state") for p in state_files)
    # the cleaner dropped checkpoints 1-4 and left the whole event log (and the lease's records)
    assert {p.split("/", 1)[0] for p in state_files} == {
        "_lease",
        "chk-5",
        "chk-6",
        "chk-7",
        "events",
    }
    for key, value in credentials.items():
        monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert main(["inspect", root, "events", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [e["oldest_ref_checkpoint_id"] for e in shown] == [None, 1, 1, 1, None, None, None]
    assert shown[-1]["regional_checkpoint_count"] == 3
