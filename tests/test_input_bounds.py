"""Bounds on what the CLI reads and takes (issue 32 §4): files over their size limit (also
`/dev/zero`, a FIFO nobody writes), `--num-retained` out of the policy key's range, a pipeline
file raising a `BaseException` subclass, and a keyed-stream method on an unkeyed stream. Each
exits 2 with one line that names the file or option and the limit; nothing is written.

Files over a limit are sparse (`truncate`): no disk space, and the read stops at limit + 1
bytes, so every test here is bounded in time by construction, `/dev/zero` included."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from cli_refusals import one_line

from metadata.model import CheckpointMetadata
from metadata.storage import JobStorage
from regional.cli import main
from regional.cli.run import MAX_PIPELINE_FILE_BYTES
from regional.dataflow.pipeline import KeyedOnlyError, Pipeline
from regional.dataflow.windows import Tumbling, count
from regional.errors import GraphError
from regional.graph.files import MAX_GRAPH_FILE_BYTES
from regional.policy import MAX_POLICY_FILE_BYTES
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.usefixtures("no_policy_env")

DEV_ZERO = Path("/dev/zero")
needs_dev_zero = pytest.mark.skipif(not DEV_ZERO.exists(), reason="no /dev/zero here")

PIPELINE = textwrap.dedent(
    """
    from regional import GeneratorSource, ParquetSink, Pipeline

    pipeline = Pipeline("bounds-job", records_per_epoch=5)
    pipeline.source(GeneratorSource(1, lambda s, n: {"n": n}, records_per_split=2)).sink(
        ParquetSink("unused-table")
    )
    """
)




def sparse(path: Path, size: int) -> Path:
    """A file of `size` zero bytes that takes no disk space."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


# --- policy files -------------------------------------------------------------------------------

POLICY_TOO_LARGE = (
    "is larger than 1 MiB, the most a policy file may hold; a policy is a few lines of TOML: "
    "pass the right file"
)


def test_a_policy_file_over_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A TOML comment one byte over the limit (valid TOML: it was read whole and accepted)."""
    at_limit = tmp_path / "at-limit.toml"
    at_limit.write_bytes(b"#" * (MAX_POLICY_FILE_BYTES - 1) + b"\n")
    assert main(["policy", "check", str(at_limit), "--json"]) == 0
    capsys.readouterr()
    over = tmp_path / "over.toml"
    over.write_bytes(b"#" * MAX_POLICY_FILE_BYTES + b"\n")
    line = one_line(["policy", "check", str(over)], capsys)
    assert line == f"regional policy: policy file {over} {POLICY_TOO_LARGE}"


@needs_dev_zero
def test_policy_check_of_dev_zero_stops_at_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    """It read without end until the kernel killed it (24 GB)."""
    line = one_line(["policy", "check", str(DEV_ZERO)], capsys)
    assert line == f"regional policy: policy file /dev/zero {POLICY_TOO_LARGE}"


@pytest.mark.parametrize(
    "command",
    [["clean", "ROOT"], ["inspect", "ROOT", "retention"], ["run", "JOB", "--checkpoint-dir", "C"]],
    ids=["clean", "inspect", "run"],
)
def test_every_command_bounds_its_policy_file(
    tmp_path: Path, command: list[str], capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    root = tmp_path / "ckpt"
    _write_job(root)
    job = tmp_path / "job.py"
    job.write_text(PIPELINE)
    policy = sparse(tmp_path / "big.toml", MAX_POLICY_FILE_BYTES + 1)
    paths = {"ROOT": str(root), "JOB": str(job), "C": str(tmp_path / "run-root")}
    argv = [paths.get(a, a) for a in command] + ["--policy", str(policy)]
    line = one_line(argv, capsys)
    assert line == f"regional {command[0]}: policy file {policy} {POLICY_TOO_LARGE}"
    assert not (tmp_path / "run-root").exists()


def test_a_fifo_nobody_writes_reads_as_empty_instead_of_waiting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Opening a FIFO waits for a writer; the read opens it without waiting: no writer, no
    bytes, so the policy is all defaults (and a policy file written to a pipe is read whole)."""
    fifo = tmp_path / "policy.toml"
    os.mkfifo(fifo)
    assert main(["policy", "check", str(fifo), "--json"]) == 0
    assert '{"key":"checkpointing.num-retained","value":3,"source":"default"}' in (
        capsys.readouterr().out
    )


# --- job-graph and pipeline files ---------------------------------------------------------------


def test_a_graph_file_over_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    graph = sparse(tmp_path / "plan.json", MAX_GRAPH_FILE_BYTES + 1)
    assert one_line(["regions", str(graph)], capsys) == (
        f"regional regions: {graph}: larger than 64 MiB, the most a job-graph file may hold; "
        "pass a job-graph JSON/TOML or a Flink plan JSON"
    )


@needs_dev_zero
def test_regions_of_dev_zero_stops_at_the_limit(capsys: pytest.CaptureFixture[str]) -> None:
    assert one_line(["regions", "/dev/zero"], capsys).startswith(
        "regional regions: /dev/zero: larger than 64 MiB"
    )


PIPELINE_TOO_LARGE = (
    "is larger than 8 MiB, the most a pipeline file may hold; pass the Python file that "
    "defines `pipeline`"
)


@pytest.mark.parametrize("command", ["run", "regions"])
def test_a_pipeline_file_over_the_limit_is_refused(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    job = sparse(tmp_path / "job.py", MAX_PIPELINE_FILE_BYTES + 1)
    root = tmp_path / "ckpt"
    argv = [command, str(job)] + (["--checkpoint-dir", str(root)] if command == "run" else [])
    line = one_line(argv, capsys)
    assert line == f"regional {command}: pipeline file {job} {PIPELINE_TOO_LARGE}"
    assert not root.exists()


@needs_dev_zero
def test_run_of_dev_zero_says_it_is_too_large(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    """It said /dev/zero "does not exist"."""
    root = tmp_path / "ckpt"
    line = one_line(["run", "/dev/zero", "--checkpoint-dir", str(root)], capsys)
    assert line == f"regional run: pipeline file /dev/zero {PIPELINE_TOO_LARGE}"


# --- a pipeline file raising a BaseException subclass --------------------------------------------

RAISES_BASE_EXCEPTION = """\
class Stop(BaseException):
    pass

raise Stop("the file\\nstopped")
"""


@pytest.mark.parametrize("command", ["run", "regions"])
def test_a_base_exception_of_a_pipeline_file_is_one_line_naming_the_line(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    """It escaped as a traceback."""
    job = tmp_path / "job.py"
    job.write_text(RAISES_BASE_EXCEPTION)
    root = tmp_path / "ckpt"
    argv = [command, str(job)] + (["--checkpoint-dir", str(root)] if command == "run" else [])
    assert one_line(argv, capsys) == (
        f"regional {command}: pipeline file {job}, line 4 raised Stop: the file stopped; "
        "fix the file"
    )
    assert not root.exists()


def test_generator_exit_of_a_pipeline_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.py"
    job.write_text("x = 1\nraise GeneratorExit('done')\n")
    assert one_line(["regions", str(job)], capsys) == (
        f"regional regions: pipeline file {job}, line 2 raised GeneratorExit: done; fix the file"
    )


def test_keyboard_interrupt_while_loading_is_an_interrupt(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C while the file loads (or the file raising it) ends the command as interrupted."""
    job = tmp_path / "job.py"
    job.write_text("raise KeyboardInterrupt\n")
    assert main(["regions", str(job)]) == 130
    assert capsys.readouterr().err == "regional regions: interrupted\n"


def test_the_pipeline_module_is_gone_after_loading(tmp_path: Path) -> None:
    """As under `runpy.run_path`: the file runs as `regional_pipeline`, with `__file__` and
    `sys.argv[0]` set, and leaves no module behind (the workers get its functions by value)."""
    from regional.cli.run import load_pipeline_file

    job = tmp_path / "job.py"
    job.write_text(
        "import sys\nname, file, argv0 = __name__, __file__, sys.argv[0]\n"
        "loaded = 'regional_pipeline' in sys.modules\n"
        "def f(x: int) -> int:\n    return x\n"
        "hint = f.__annotations__['x']\n"
    )
    argv0 = sys.argv[0]
    got = load_pipeline_file(job)
    assert (got["name"], got["file"], got["argv0"], got["loaded"]) == (
        "regional_pipeline",
        str(job),
        str(job),
        True,
    )
    assert got["hint"] is int  # our `from __future__ import annotations` did not leak in
    assert "regional_pipeline" not in sys.modules
    assert sys.argv[0] == argv0


# --- --num-retained -----------------------------------------------------------------------------


def _write_job(root: Path) -> JobStorage:
    """One completed global checkpoint of job `orders` under `root`."""
    storage = JobStorage(str(root), "orders")
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=1,
            job_id="orders",
            kind="global",
            trigger_time_ms=1000,
            completion_time_ms=1010,
        )
    )
    return storage


@pytest.mark.parametrize(
    "command",
    [["clean"], ["inspect", "checkpoints"], ["inspect", "validate"]],
    ids=["clean", "inspect-checkpoints", "inspect-validate"],
)
@pytest.mark.parametrize("value", ["10000000000000000000000", "1000001", "0", "-3"])
def test_num_retained_outside_the_policy_range_is_refused(
    tmp_path: Path, command: list[str], value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """10**22 exited 0 (and `inspect validate` ignored any value)."""
    storage = _write_job(tmp_path)
    before = storage.list_files()
    argv = [command[0], str(tmp_path), *command[1:], "--num-retained", value]
    assert one_line(argv, capsys) == (
        f"regional {command[0]}: --num-retained {value} is out of range; give a whole number "
        "from 1 to 1000000, the range of checkpointing.num-retained"
    )
    assert storage.list_files() == before


def test_num_retained_at_the_top_of_the_range_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_job(tmp_path)
    assert main(["clean", str(tmp_path), "--dry-run", "--num-retained", "1000000"]) == 0
    assert "num-retained 1000000 (--num-retained)" in capsys.readouterr().out


# --- metadata and event files -------------------------------------------------------------------


def test_metadata_and_event_files_over_their_limit_are_skipped_as_damaged(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The limits are 1 GiB and 64 MiB; lowered here so the test writes bytes, not gigabytes."""
    storage = _write_job(tmp_path)
    (tmp_path / "orders" / "events").mkdir()
    sparse(tmp_path / "orders" / "events" / "000000000001-1000.json", 2048)
    monkeypatch.setattr("metadata.storage.MAX_METADATA_FILE_BYTES", 64)
    monkeypatch.setattr("metadata.events.MAX_EVENT_FILE_BYTES", 1024)
    assert main(["inspect", str(tmp_path), "checkpoints"]) == 0
    metadata = storage.describe("chk-1/_metadata")
    assert os.path.getsize(metadata) > 64
    assert capsys.readouterr().err == (
        f"warning: checkpoint 1 skipped: {metadata} is larger than 64 bytes, more than any "
        "checkpoint's metadata; the file was replaced or damaged\n"
    )
    assert main(["inspect", str(tmp_path), "events"]) == 0
    event = storage.describe("events/000000000001-1000.json")
    assert capsys.readouterr().err == (
        f"warning: event events/000000000001-1000.json skipped: {event} is larger than 1 KiB, "
        "more than such a file holds; it was replaced or damaged\n"
    )


# --- keyed-stream methods on a stream that is not keyed -----------------------------------------


def _numbers() -> Pipeline:
    return Pipeline("keyed")


def test_window_on_an_unkeyed_stream_says_to_key_by_first() -> None:
    """It was a raw AttributeError: 'Stream' object has no attribute 'window'."""
    nums = _numbers().source(GeneratorSource(1, lambda s, n: {"n": n}), name="nums")
    with pytest.raises(GraphError) as info:
        nums.window(Tumbling(10), aggregate=count())
    assert str(info.value) == (
        "window(...) after 'nums': window works on keyed records; key the stream first, e.g. "
        ".key_by(lambda r: r['user']).window(...)"
    )
    with pytest.raises(GraphError, match=r"^process\(\.\.\.\) after 'nums': process works on"):
        nums.process(lambda ctx, r: [r])
    assert not hasattr(nums, "window")  # also an AttributeError: hasattr stays False
    with pytest.raises(AttributeError, match="'Stream' object has no attribute 'windw'"):
        nums.windw  # noqa: B018  # any other name: a plain AttributeError


def test_a_stream_method_after_key_by_says_what_a_keyed_stream_takes() -> None:
    nums = _numbers().source(GeneratorSource(1, lambda s, n: {"n": n}), name="nums")
    with pytest.raises(KeyedOnlyError) as info:
        nums.key_by(lambda r: r["n"]).map(lambda r: r)
    assert str(info.value) == (
        "map(...) after key_by on 'nums': a keyed stream only takes process(...), window(...), "
        "aggregate(...), apply_in_arrow(...), the joins or drop_duplicates(...); call map(...) "
        "before key_by, or on the stream process or window returns"
    )


def test_window_on_an_unkeyed_stream_in_a_pipeline_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    job = tmp_path / "job.py"
    job.write_text(
        "from regional import GeneratorSource, Pipeline\n"
        "from regional.dataflow.windows import Tumbling, count\n"
        "pipeline = Pipeline('windows')\n"
        "nums = pipeline.source(GeneratorSource(1, lambda s, n: {'n': n}), name='nums')\n"
        "nums.window(Tumbling(10), aggregate=count())\n"
    )
    assert one_line(["regions", str(job)], capsys) == (
        "regional regions: window(...) after 'nums': window works on keyed records; key the "
        "stream first, e.g. .key_by(lambda r: r['user']).window(...)"
    )
