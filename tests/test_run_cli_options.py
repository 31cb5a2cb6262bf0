"""`regional run` without Spark: the checkpoint root it picks and says, the interval it hands the
driver, `--json`, `--verbose` after the subcommand, sibling imports, and nothing left behind by a
bad pipeline file. Spark itself is replaced by a runtime that reports fixed outcomes; the
end-to-end runs are in test_run_cli_spark.py."""

from __future__ import annotations

import sys
import tempfile
import textwrap
from typing import ClassVar

import msgspec
import pytest

import regional.runtime.session
import regional.runtime.spark
from metadata.events import CheckpointEvent, Outcome
from regional.cli import main
from regional.runtime.driver import RunSummary

PIPELINE = textwrap.dedent(
    """
    from regional import GeneratorSource, ParquetSink, Pipeline

    pipeline = Pipeline("opts-job", records_per_epoch=5)
    pipeline.source(GeneratorSource(2, lambda s, n: {"s": s, "n": n}, records_per_split=4)).sink(
        ParquetSink("unused-table")
    )
    """
)

EVENT = CheckpointEvent(
    job_id="opts-job",
    checkpoint_id=1,
    kind=Outcome.GLOBAL,
    trigger_time_ms=1_000,
    time_ms=1_500,
    fresh_units=1,
    records_in=8,
)


class FakeRuntime:
    """Stands in for `SparkRuntime`: keeps what the CLI gave it, reports one outcome."""

    made: ClassVar[list[FakeRuntime]] = []

    def __init__(self, pipeline, spark, **options) -> None:
        self.pipeline = pipeline
        self.options = options
        FakeRuntime.made.append(self)

    restored_from = None
    restored_location = None
    restore_notes = ()

    def request_stop(self) -> None:
        return None

    def start(self) -> bool:
        return True

    def run(self, *, max_checkpoints, stop_with_savepoint) -> RunSummary:
        self.options["progress"](EVENT)
        return RunSummary("opts-job", checkpoints=[EVENT], finished=True, seconds=0.5)


@pytest.fixture
def no_spark(monkeypatch, tmp_path):
    """`regional run` with the fake runtime; sys.path, the environment and the temp dir are
    restored after the test."""
    FakeRuntime.made.clear()
    monkeypatch.setattr(regional.runtime.spark, "SparkRuntime", FakeRuntime)
    monkeypatch.setattr(regional.runtime.session, "spark_context", lambda *a, **k: None)
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("REGIONAL_CHECKPOINT_DIR", "unset")
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    return FakeRuntime.made


def test_the_default_root_is_beside_the_pipeline_file_and_said_first(no_spark, tmp_path, capsys):
    job = tmp_path / "jobs" / "job.py"
    job.parent.mkdir()
    job.write_text(PIPELINE)
    assert main(["run", str(job)]) == 0
    root = str(tmp_path / "jobs" / ".regional" / "checkpoints")
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"starting Spark (local[*]); checkpoints under {root} "
        "(default: the pipeline file's folder; --checkpoint-dir to change)"
    )
    assert no_spark[0].options["root"] == root
    assert no_spark[0].options["code_dir"] == str(job.parent)
    # a second run gets the same root, so it resumes instead of writing the output again
    assert main(["run", str(job)]) == 0
    assert no_spark[1].options["root"] == root


def test_the_policy_interval_reaches_the_driver_and_interval_overrides_it(
    no_spark, tmp_path, capsys
):
    job = tmp_path / "job.py"
    job.write_text(PIPELINE)
    policy = tmp_path / "policy.toml"
    policy.write_text('[checkpointing]\ninterval = "30 s"\n')
    root = str(tmp_path / "ckpt")
    assert main(["run", str(job), "--policy", str(policy), "--checkpoint-dir", root]) == 0
    assert no_spark[-1].options["interval"] == 30.0
    assert "interval 30 s: the wait after an epoch that read no records" in capsys.readouterr().out
    assert main(["run", str(job), "--checkpoint-dir", root, "--interval", "500 ms"]) == 0
    assert no_spark[-1].options["interval"] == 0.5
    assert main(["run", str(job), "--checkpoint-dir", root]) == 0
    assert no_spark[-1].options["interval"] == 10.0  # the default policy's
    assert main(["run", str(job), "--checkpoint-dir", root, "--interval", "0"]) == 0
    assert no_spark[-1].options["interval"] == 0.0
    assert "interval 0: epochs follow each other without a wait" in capsys.readouterr().out


def test_a_bad_interval_is_a_usage_error(no_spark, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(tmp_path / "job.py"), "--interval", "soon"])
    assert exit_info.value.code == 2
    assert (
        "argument --interval: 'soon' is invalid; expected a duration from 0 (no wait) to 365 d: "
        '"0", "500 ms", "30 s", "2 min", "1 h", "1 d" or a number of seconds'
        in capsys.readouterr().err
    )


def test_json_prints_only_the_events_on_stdout(no_spark, tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text(PIPELINE)
    assert main(["run", str(job), "--checkpoint-dir", str(tmp_path / "c"), "--json"]) == 0
    captured = capsys.readouterr()
    assert [msgspec.json.decode(line, type=CheckpointEvent) for line in
            captured.out.splitlines()] == [EVENT]
    assert "starting Spark (local[*]); checkpoints under" in captured.err
    assert "done in 0.5 s: 1 global, 0 regional, 0 aborted checkpoints; job finished" in (
        captured.err
    )


def test_a_bad_pipeline_file_leaves_nothing_behind(no_spark, tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text("import os\nraise RuntimeError('no data yet')\n")
    assert main(["run", str(job)]) == 2
    assert capsys.readouterr().err == (
        f"regional run: pipeline file {job}, line 2 raised RuntimeError: no data yet; "
        "fix the file\n"
    )
    assert list((tmp_path / "tmp").iterdir()) == []  # no regional-* temporary root
    assert not (tmp_path / ".regional").exists()
    assert no_spark == []


def test_verbose_after_the_subcommand_shows_the_traceback(no_spark, tmp_path, capsys):
    job = tmp_path / "job.py"
    job.write_text("raise RuntimeError('no data yet')\n")
    for argv in (["run", "--verbose", str(job)], ["--verbose", "run", str(job)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("Traceback (most recent call last):")
        assert err.endswith(
            f"regional run: pipeline file {job}, line 1 raised RuntimeError: no data yet; "
            "fix the file\n"
        )
    assert main(["run", str(job)]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_pipeline_file_imports_its_sibling_module(no_spark, tmp_path, capsys):
    (tmp_path / "opts_sibling_rules.py").write_text("RECORDS = 4\n")
    job = tmp_path / "job.py"
    job.write_text(
        "from opts_sibling_rules import RECORDS\n"
        + PIPELINE.replace("records_per_split=4", "records_per_split=RECORDS")
    )
    try:
        assert main(["run", str(job), "--checkpoint-dir", str(tmp_path / "c")]) == 0
    finally:
        sys.modules.pop("opts_sibling_rules", None)
    assert no_spark[0].pipeline.name == "opts-job"
    assert "job finished" in capsys.readouterr().out
