"""Issue 41 item 8, the small defects: each test failed before its fix.

1. `regional regions PIPELINE.py` loads a file that reads `REGIONAL_CHECKPOINT_DIR`;
2. a policy file's `interval = "0"` is what `--interval 0` is (one rule);
3. `inspect ROOT watermarks` says `ended` for a split whose input ended;
4. the Kafka sink's retention check against the test broker (tests/test_sink_kafka.py);
5. `records_late` documented as what windows, joins and deduplication judged late."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from regional.cli import main
from regional.cli.run import _interval
from regional.errors import PolicyError
from regional.policy import load_policy

ROOT = Path(__file__).resolve().parent.parent

PIPELINE = """
import os
from pathlib import Path
from regional.dataflow.pipeline import Pipeline
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

_root = os.environ["REGIONAL_CHECKPOINT_DIR"]
Path({seen!r}).write_text(_root)
pipeline = Pipeline("reads-root")
src = pipeline.source(GeneratorSource(2, lambda s, n: {{"n": n}}), parallelism=2, name="src")
src.sink(ParquetSink(_root + "-table"), name="out")
"""


def test_regions_sets_the_checkpoint_dir_as_run_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("REGIONAL_CHECKPOINT_DIR", raising=False)
    seen = tmp_path / "seen"
    file = tmp_path / "jobs" / "reads_root.py"
    file.parent.mkdir()
    file.write_text(PIPELINE.format(seen=str(seen)))
    # the root `regional run FILE` uses without options: named, not created
    assert main(["regions", str(file), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["num_units"] == 2
    assert seen.read_text() == str(tmp_path / "jobs" / ".regional" / "checkpoints")
    assert not (tmp_path / "jobs" / ".regional").exists()
    assert "REGIONAL_CHECKPOINT_DIR" not in os.environ  # as it was
    assert main(["regions", str(file), "--checkpoint-dir", "s3://bucket/ckpt"]) == 0
    assert capsys.readouterr().out.startswith(f"{file}: 2 vertices, 4 subtasks, 2 regions")
    assert seen.read_text() == "s3://bucket/ckpt"


def test_regions_of_the_kafka_to_kafka_example_in_a_fresh_process() -> None:
    env = {k: v for k, v in os.environ.items() if k != "REGIONAL_CHECKPOINT_DIR"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "regional.cli", "regions", "examples/kafka_to_kafka.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(
        "examples/kafka_to_kafka.py: 5 vertices, 14 subtasks, 6 regions, 6 fallback units; "
        "regional checkpoints: yes\n"
    )


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("0", 0.0), ("0 s", 0.0), ("0 ms", 0.0), ("500 ms", 0.5), ("365 d", 365 * 86400.0)],
)
def test_an_interval_the_cli_takes_the_policy_file_takes(
    tmp_path: Path, text: str, seconds: float
) -> None:
    file = tmp_path / "p.toml"
    file.write_text(f'[checkpointing]\ninterval = "{text}"\n')
    assert load_policy(file, env={}).policy.checkpointing.interval == seconds
    assert _interval(text) == seconds
    env = {"REGIONAL_CHECKPOINTING__INTERVAL": text}
    assert load_policy(env=env).policy.checkpointing.interval == seconds


@pytest.mark.parametrize("text", ["-1 s", "366 d", "soon", "inf"])
def test_an_interval_the_cli_refuses_the_policy_file_refuses(tmp_path: Path, text: str) -> None:
    allowed = (
        'expected a duration from 0 (no wait) to 365 d: "0", "500 ms", "30 s", "2 min", "1 h", '
        '"1 d" or a number of seconds'
    )
    file = tmp_path / "p.toml"
    file.write_text(f'[checkpointing]\ninterval = "{text}"\n')
    with pytest.raises(PolicyError) as info:
        load_policy(file, env={})
    assert str(info.value) == (
        f'policy file {file}: checkpointing.interval = "{text}" is invalid; {allowed}'
    )
    with pytest.raises(Exception) as cli:  # argparse.ArgumentTypeError: a usage error, exit 2
        _interval(text)
    assert str(cli.value) == f"{text!r} is invalid; {allowed}"


def test_policy_check_shows_an_interval_of_0_as_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("REGIONAL_")]:
        monkeypatch.delenv(name)
    file = tmp_path / "p.toml"
    file.write_text('[checkpointing]\ninterval = "0"\n')
    assert main(["policy", "check", str(file)]) == 0
    out = capsys.readouterr().out.splitlines()
    [row] = [line for line in out if line.startswith("checkpointing.interval ")]
    assert row.split() == ["checkpointing.interval", "0", "file", str(file)]


def test_inspect_watermarks_says_ended_for_a_split_whose_input_ended(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import orders_job

    from metadata.storage import JobStorage
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    p = Pipeline("wm", records_per_epoch=4)
    p.source(
        GeneratorSource(2, lambda s, n: {"n": n, "ts": 1000 * n + s}, records_per_split=6),
        parallelism=2,
        name="src",
        event_time="ts",
    ).sink(ParquetSink(str(tmp_path / "t")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "wm", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "wm"))
    assert driver.run().finished
    capsys.readouterr()
    assert main(["inspect", root, "watermarks"]) == 0
    header, _, *rows = capsys.readouterr().out.splitlines()
    assert header.split() == [
        "checkpoint_id",
        "kind",
        "vertex",
        "subtask",
        "unit",
        "unit_name",
        "split",
        "watermark_ms",
        "watermark",
        "held_by",
    ]
    assert [r.split()[:9] for r in rows] == [
        ["3", "split", "src", "0", "0", "src[0]", "g0", "ended", "+inf"],
        ["3", "split", "src", "1", "1", "src[1]", "g1", "ended", "+inf"],
    ]
    assert "9223372036854775807" not in "".join(rows)
    assert main(["inspect", root, "watermarks", "--json"]) == 0  # machines: the int64 +inf
    assert [r["watermark_ms"] for r in json.loads(capsys.readouterr().out)] == [2**63 - 1] * 2


def _delivery(split: int, n: int) -> dict[str, int]:
    """Event n of split 0 at 10 s * n, except record 3, an old one (behind the watermark)."""
    return {"event": n, "ts": 1_000 if n == 3 else 10_000 * n}


def test_records_late_counts_what_drop_duplicates_judged_late_and_is_documented_so(
    tmp_path: Path,
) -> None:
    import inspect

    import orders_job

    from metadata.events import CheckpointEvent
    from metadata.storage import JobStorage
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink, read_table
    from regional.sources.generator import GeneratorSource

    p = Pipeline("dedup", records_per_epoch=2)
    (
        p.source(
            GeneratorSource(1, _delivery, records_per_split=6),
            parallelism=1,
            name="deliveries",
            event_time="ts",
        )
        .key_by("event")
        .drop_duplicates(within="1 s", name="once")
        .sink(ParquetSink(str(tmp_path / "t")), name="out")
    )
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "dedup", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "dedup"))
    summary = driver.run()
    assert summary.finished
    # no window in the job: the one late record is drop_duplicates'
    assert sorted(r["event"] for r in read_table(str(tmp_path / "t")).to_pylist()) == [
        0, 1, 2, 4, 5
    ]  # fmt: skip
    assert sum(e.records_late for e in summary.checkpoints) == 1
    assert driver.metrics.records_late == 1
    said = " ".join((inspect.getdoc(CheckpointEvent) or "").split())
    assert (
        "`records_late` counts the records judged late in it by every operator that judges "
        "lateness: windows (an event time behind the watermark past the window's allowed "
        "lateness), interval and temporal joins and `drop_duplicates`"
    ) in said
    docs = " ".join((ROOT / "docs" / "event-time.md").read_text().split())
    assert "counts every record an event-time operator judged late, not windows' alone" in docs
