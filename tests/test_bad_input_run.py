"""Bad `regional run` input found by the outside attack (issue 25 item 6): exit 2, one line on
stderr, nothing written under the checkpoint root, and Spark not started."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from regional.cli import main

PIPELINE = textwrap.dedent(
    """
    import os
    from regional import GeneratorSource, ParquetSink, Pipeline

    pipeline = Pipeline("bad-input-job", records_per_epoch=5)
    src = pipeline.source(
        GeneratorSource(2, lambda s, n: {"s": s, "n": n}, records_per_split=10), parallelism=2
    )
    src.sink(ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table"))
    """
)


@pytest.fixture(autouse=True)
def no_spark(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if `regional run` gets as far as starting Spark; no REGIONAL_ variables."""
    for name in list(os.environ):
        if name.startswith("REGIONAL_"):
            monkeypatch.delenv(name)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("Spark was started for input known to be bad before it starts")

    monkeypatch.setattr("regional.runtime.session.spark_context", refuse)


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def job(tmp_path: Path) -> Path:
    path = tmp_path / "job.py"
    path.write_text(PIPELINE)
    return path


def test_a_whole_number_policy_key_beyond_its_bound(tmp_path, job, capsys):
    policy = tmp_path / "p.toml"
    policy.write_text("[checkpointing]\nnum-retained = 99999999999999999999999\n")
    line = one_line(["policy", "check", str(policy)], capsys)
    assert line == (
        f"regional policy: policy file {policy}: checkpointing.num-retained = "
        "99999999999999999999999 is invalid; expected a whole number from 1 to 1000000"
    )
    before = listing(tmp_path)
    line = one_line(["run", str(job), "--policy", str(policy)], capsys)
    assert line.startswith("regional run: policy file ") and line.endswith("1 to 1000000")
    assert listing(tmp_path) == before


@pytest.mark.parametrize(
    ("key", "bound"),
    [
        ("checkpointing.tolerable-failed-checkpoints", "from 0 to 1000000"),
        ("checkpointing.region.max-unit-fallbacks", "from 0 to 1000000"),
        ("checkpointing.region.max-consecutive-regional", 'from 0 to 1000000 or "unlimited"'),
    ],
)
def test_every_whole_number_key_has_an_upper_bound(tmp_path, key, bound, capsys):
    table, _, name = key.rpartition(".")
    policy = tmp_path / "p.toml"
    policy.write_text(f"[{table}]\n{name} = 1000001\n")
    assert one_line(["policy", "check", str(policy)], capsys) == (
        f"regional policy: policy file {policy}: {key} = 1000001 is invalid; expected a "
        f"whole number {bound}"
    )


def test_a_checkpoint_dir_that_cannot_be_created(tmp_path, job, capsys):
    line = one_line(["run", str(job), "--checkpoint-dir", "/proc/x"], capsys)
    assert line == (
        "regional run: checkpoint root /proc/x (--checkpoint-dir) cannot be created: No such "
        "file or directory in /proc; give a directory you can write"
    )
    assert not os.path.exists("/proc/x-spark.log")


def test_a_file_as_checkpoint_dir(tmp_path, job, capsys):
    file = tmp_path / "afile"
    file.write_text("not a directory")
    before = listing(tmp_path)
    assert one_line(["run", str(job), "--checkpoint-dir", str(file)], capsys) == (
        f"regional run: checkpoint root {file} (--checkpoint-dir) is a file, not a directory; "
        "give a directory"
    )
    under = tmp_path / "afile" / "sub"
    assert one_line(["run", str(job), "--checkpoint-dir", str(under)], capsys) == (
        f"regional run: checkpoint root {under} (--checkpoint-dir) cannot be created: {file} "
        "is a file, not a directory; give a directory"
    )
    assert listing(tmp_path) == before


@pytest.mark.parametrize("count", ["-1", "0", "1000000001"])
def test_max_checkpoints_out_of_range(tmp_path, job, count, capsys):
    root = tmp_path / "ckpt"
    assert one_line(
        ["run", str(job), "--checkpoint-dir", str(root), "--max-checkpoints", count], capsys
    ) == (
        f"regional run: --max-checkpoints {count} is out of range; give 1 to 1,000,000,000 "
        "epochs, or leave it out to run until the sources end"
    )
    assert listing(tmp_path) == ["job.py"]


def test_metrics_port_without_prometheus_client(tmp_path, job, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails: not installed
    root = tmp_path / "ckpt"
    line = one_line(
        ["run", str(job), "--checkpoint-dir", str(root), "--metrics-port", "9464"], capsys
    )
    assert line == (
        "regional run: --metrics-port needs prometheus-client, which is not installed for "
        f"{sys.executable}: pip install 'regional-checkpoints[prometheus]', or leave "
        "--metrics-port out"
    )
    assert listing(tmp_path) == ["job.py"]


def test_from_a_truncated_metadata_file(tmp_path, job, capsys):
    source = tmp_path / "old" / "bad-input-job" / "chk-3"
    source.mkdir(parents=True)
    (source / "_metadata").write_bytes(b"RGNL\x01")
    root = tmp_path / "ckpt"
    line = one_line(
        ["run", str(job), "--checkpoint-dir", str(root), "--from", str(source / "_metadata")],
        capsys,
    )
    assert line.startswith(f"regional run: --from {source}/_metadata cannot be restored: ")
    assert line.endswith("; give another checkpoint or savepoint")
    assert not root.exists()


def test_a_pipeline_file_that_exits(tmp_path, capsys):
    file = tmp_path / "exits.py"
    file.write_text("import sys\nsys.exit(3)\n")
    root = tmp_path / "ckpt"
    assert one_line(["run", str(file), "--checkpoint-dir", str(root)], capsys) == (
        f"regional run: pipeline file {file} called sys.exit(3) while it was loaded; a "
        "pipeline file defines `pipeline` and returns, it does not exit: remove the call or "
        "guard it with `if __name__ == '__main__':`"
    )
    assert listing(tmp_path) == ["exits.py"]
