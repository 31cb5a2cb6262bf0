"""`regional run`: loads the pipeline file, shows progress and a summary, resumes on restart."""

from __future__ import annotations

import textwrap

import pytest

from regional.cli import main
from regional.sinks.parquet import read_table

PIPELINE = textwrap.dedent(
    """
    import os
    from regional import GeneratorSource, ParquetSink, Pipeline
    from regional.runtime.spark import Faults

    pipeline = Pipeline("cli-job", records_per_epoch=5)
    src = pipeline.source(
        GeneratorSource(4, lambda s, n: {"s": s, "n": n}, records_per_split=10), parallelism=4
    )
    src.sink(ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table"))
    faults = Faults(units={(2, 1): "fail"})
    """
)


@pytest.mark.spark
def test_run_shows_progress_and_summary(spark, tmp_path, capsys):
    file = tmp_path / "job.py"
    file.write_text(PIPELINE)
    root = str(tmp_path / "ckpt")
    assert main(["run", str(file), "--checkpoint-dir", root]) == 0
    out = capsys.readouterr().out
    assert "pipeline 'cli-job': 2 vertices, 4 regions, 4 fallback units" in out
    assert "checkpoint    2  regional  fresh   3  fallback 1" in out
    assert "job finished" in out
    assert sorted(read_table(root + "-table").column("n").to_pylist()) == sorted(
        list(range(10)) * 4
    )
    # a second run on the same root restores from the final checkpoint and adds nothing
    assert main(["run", str(file), "--checkpoint-dir", root]) == 0
    out = capsys.readouterr().out
    assert "restored from checkpoint" in out
    # said when it happens (issue 36): before the checkpoint lines of the run, not after
    assert out.index("restored from checkpoint") < out.index("checkpoint  ")
    assert read_table(root + "-table").num_rows == 40


def test_file_without_pipeline_is_a_usage_error(tmp_path, capsys):
    file = tmp_path / "empty.py"
    file.write_text("x = 1\n")
    assert main(["run", str(file), "--checkpoint-dir", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err
    assert f"{file} defines no module-level `pipeline` (a regional.Pipeline)" in err
    assert main(["run", str(tmp_path / "nope.py")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_conf_must_be_key_equals_value(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["run", str(tmp_path / "job.py"), "--conf", "spark.executor.memory"])
    assert exit_info.value.code == 2
    assert (
        "argument --conf: expected KEY=VALUE (a Spark setting, e.g. spark.executor.memory=512m), "
        "got 'spark.executor.memory'" in capsys.readouterr().err
    )
