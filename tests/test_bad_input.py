"""Bad input (issue 18 item 8): exit 2, exactly one line on stderr, nothing written under the
checkpoint root or the table, and Spark not started where the input is known before it starts."""

from __future__ import annotations

import datetime as dt
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pytest
from cli_refusals import one_line
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.cli import main
from regional.errors import CommitError, GraphError, PolicyError, RegionalError
from regional.graph.files import parse_graph
from regional.policy import CheckpointingPolicy, Policy, RegionPolicy, RestorePolicy, load_policy
from regional.sinks.base import WriteContext
from regional.sinks.parquet import ParquetSink, committed_files, read_table

pytestmark = pytest.mark.usefixtures("no_policy_env")

REPO = Path(__file__).resolve().parent.parent
DEEP = 100_000

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
DURATION = (
    'a duration > 0 and at most 365 d: "500 ms", "30 s", "2 min", "1 h", "1 d" '
    "or a number of seconds"
)
INTERVAL = (
    'a duration from 0 (no wait) to 365 d: "0", "500 ms", "30 s", "2 min", "1 h", "1 d" '
    "or a number of seconds"
)




def write(path: Path, data: bytes | str) -> Path:
    if isinstance(data, str):
        data = data.encode()
    path.write_bytes(data)
    return path


# --- policy files -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        b"x = " + b"[" * DEEP + b"]" * DEEP,
        b"[checkpointing]\ntimeout = " + b"{a = " * DEEP + b"1" + b"}" * DEEP,
    ],
    ids=["arrays", "inline-tables"],
)
def test_policy_nested_100k_deep(
    tmp_path: Path, text: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write(tmp_path / "deep.toml", text)
    assert one_line(["policy", "check", str(file)], capsys) == (
        f"regional policy: policy file {file} nests arrays or tables too deeply to be read; "
        "policy values are plain numbers, strings and booleans in tables at most two deep "
        "([checkpointing.region])"
    )


def test_policy_not_utf8(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Classified before the TOML parser sees it: the message is ours whatever msgspec says."""
    file = write(tmp_path / "p.toml", '# caf\u00e9\n[checkpointing]\n'.encode("latin-1"))
    assert one_line(["policy", "check", str(file)], capsys) == (
        f"regional policy: policy file {file} is not UTF-8 text (byte 0xe9 at offset 5); save "
        "it as UTF-8 TOML"
    )


@pytest.mark.parametrize(
    ("value", "shown"),
    [("1e308", "1e+308"), ('"999999999999 d"', '"999999999999 d"'), ('"366 d"', '"366 d"')],
)
def test_policy_durations_are_bounded(
    tmp_path: Path, value: str, shown: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write(tmp_path / "p.toml", f"[checkpointing]\ntimeout = {value}\n")
    assert one_line(["policy", "check", str(file)], capsys) == (
        f"regional policy: policy file {file}: checkpointing.timeout = {shown} is invalid; "
        f"expected {DURATION}"
    )


def test_a_year_is_the_longest_duration(tmp_path: Path) -> None:
    file = write(tmp_path / "p.toml", '[checkpointing]\ntimeout = "365 d"\n')
    assert load_policy(file, env={}).policy.checkpointing.timeout == 365 * 86400.0
    with pytest.raises(PolicyError) as info:
        load_policy(env={}, overrides={"checkpointing.interval": dt.timedelta(days=366)})
    assert str(info.value) == (
        f'policy override: checkpointing.interval = "P366D" is invalid; expected {INTERVAL}'
    )


def test_bad_policy_file_stops_run_before_spark(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    job = write(tmp_path / "job.py", PIPELINE)
    policy = write(tmp_path / "p.toml", "[checkpointing]\ninterval = 1e308\n")
    root = tmp_path / "ckpt"
    line = one_line(
        ["run", str(job), "--policy", str(policy), "--checkpoint-dir", str(root)], capsys
    )
    assert line == (
        f"regional run: policy file {policy}: checkpointing.interval = 1e+308 is invalid; "
        f"expected {INTERVAL}"
    )
    assert not root.exists()


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda: RegionPolicy(max_failure_ratio=1.5),
            "checkpointing.region.max-failure-ratio = 1.5 is invalid; expected a number from 0 "
            "to 1",
        ),
        (
            lambda: RegionPolicy(max_unit_fallbacks=-1),
            "checkpointing.region.max-unit-fallbacks = -1 is invalid; expected a whole number "
            "from 0 to 1000000",
        ),
        (
            lambda: RegionPolicy(max_consecutive_regional=-3),
            "checkpointing.region.max-consecutive-regional = -3 is invalid; expected a whole "
            'number from 0 to 1000000 or "unlimited"',
        ),
        (
            lambda: CheckpointingPolicy(num_retained=0),
            "checkpointing.num-retained = 0 is invalid; expected a whole number from 1 to 1000000",
        ),
        (
            lambda: CheckpointingPolicy(tolerable_failed_checkpoints=-1),
            "checkpointing.tolerable-failed-checkpoints = -1 is invalid; expected a whole "
            "number from 0 to 1000000",
        ),
        (
            lambda: CheckpointingPolicy(timeout=1e308),
            f"checkpointing.timeout = 1e+308 is invalid; expected {DURATION}",
        ),
        (
            lambda: CheckpointingPolicy(interval=float("nan")),
            f"checkpointing.interval = nan is invalid; expected {INTERVAL}",
        ),
        (
            lambda: RestorePolicy(mode="keep"),  # type: ignore[arg-type]
            'restore.mode = "keep" is invalid; expected one of "claim", "no-claim"',
        ),
        (
            lambda: Policy(checkpointing={"interval": 5}),  # type: ignore[arg-type]
            'checkpointing = {"interval":5} is invalid; expected a CheckpointingPolicy '
            "([checkpointing])",
        ),
    ],
)
def test_policy_built_in_code_is_validated(build, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(PolicyError) as info:
        build()
    assert str(info.value) == f"policy built in code: {message}"
    assert info.value.exit_code == 2


def test_policy_built_in_code_keeps_good_values() -> None:
    policy = Policy(
        checkpointing=CheckpointingPolicy(
            interval=30, region=RegionPolicy(max_failure_ratio=1, max_consecutive_regional=None)
        )
    )
    assert (
        policy
        == load_policy(
            env={},
            overrides={
                "checkpointing.interval": "30 s",
                "checkpointing.region.max-failure-ratio": 1.0,
                "checkpointing.region.max-consecutive-regional": "unlimited",
            },
        ).policy
    )


# --- graph files --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "problem"),
    [
        (
            "deep.json",
            b'{"vertices": ' + b"[" * DEEP + b"]" * DEEP + b"}",
            "nested too deeply to be read; a job graph nests objects and lists only a few "
            "levels deep",
        ),
        (
            "deep.toml",
            b"vertices = " + b"[" * DEEP + b"]" * DEEP,
            "nested too deeply to be read; a job graph nests objects and lists only a few "
            "levels deep",
        ),
        (
            "latin1.json",
            '{"vertices": [{"id": "caf\u00e9", "parallelism": 1}], "edges": []}'.encode("latin-1"),
            "not UTF-8 text (byte 0xe9 at offset 25); save it as UTF-8 JSON or TOML",
        ),
        (
            "utf16.toml",
            'vertices = [{id = "a", parallelism = 1}]'.encode("utf-16"),
            "not UTF-8 text (byte 0xff at offset 0); save it as UTF-8 JSON or TOML",
        ),
    ],
)
def test_bad_graph_files(
    tmp_path: Path, name: str, data: bytes, problem: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = write(tmp_path / name, data)
    assert one_line(["regions", str(file)], capsys) == f"regional regions: {file}: {problem}"


# --- pipeline files -----------------------------------------------------------------------------


def _pipeline_cases(tmp_path: Path) -> list[tuple[Path, str]]:
    syntax = write(tmp_path / "syntax.py", "from regional import Pipeline\npipeline = (\n")
    imports = write(tmp_path / "imports.py", "import os\nimport no_such_module_here\n")
    binary = write(tmp_path / "binary.py", bytes(range(256)))
    latin1 = write(tmp_path / "latin1.py", "name = 'caf\u00e9'\n".encode("latin-1"))
    raises = write(tmp_path / "raises.py", "x = 1\n\nraise ValueError('two\\nlines')\n")
    directory = tmp_path / "pipeline.py"
    directory.mkdir()
    return [
        (syntax, f"{syntax}, line 2 is not valid Python: '(' was never closed"),
        (
            imports,
            f"{imports}, line 2 raised ModuleNotFoundError: No module named "
            f"'no_such_module_here'; install the module for {sys.executable} or fix the import",
        ),
        (binary, f"{binary} is not valid Python: source code string cannot contain null bytes"),
        (
            latin1,
            f"{latin1}, line 1 is not valid Python: (unicode error) 'utf-8' codec can't decode "
            "byte 0xe9 in position 3: unexpected end of data",
        ),
        (raises, f"{raises}, line 3 raised ValueError: two lines; fix the file"),
        (directory, f"{directory} is a directory; pass a Python file that defines `pipeline`"),
    ]


def test_bad_pipeline_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    root = tmp_path / "ckpt"
    for file, problem in _pipeline_cases(tmp_path):
        line = one_line(["run", str(file), "--checkpoint-dir", str(root)], capsys)
        expected = f"regional run: pipeline file {problem}"
        if "is not valid Python" in problem:
            expected += "; pass a Python source file"
        assert line == expected
    assert not root.exists()
    assert not Path(f"{root}-table").exists()


# --- run options known before Spark starts ------------------------------------------------------


@pytest.mark.parametrize("given", ["", "  "])
def test_empty_from(
    tmp_path: Path, given: str, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    job = write(tmp_path / "job.py", PIPELINE)
    root = tmp_path / "ckpt"
    assert one_line(["run", str(job), "--checkpoint-dir", str(root), "--from", given], capsys) == (
        "regional run: --from is empty; give a savepoint directory (sp-<id>), a checkpoint "
        "directory (chk-<id>) or its _metadata file, local or a URI"
    )
    assert not root.exists()


def _closed_port() -> int:
    """A loopback port with nothing listening on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    job = write(tmp_path / "job.py", PIPELINE)
    root = tmp_path / "ckpt"
    source = (
        f"s3://key:secret@bucket/job/chk-3?endpoint_override=127.0.0.1:{_closed_port()}"
        "&scheme=http&region=us-east-1"
    )
    line = one_line(["run", str(job), "--checkpoint-dir", str(root), "--from", source], capsys)
    assert line.startswith(
        "regional run: --from cannot be reached: cannot look up s3://bucket/job/chk-3/_metadata: "
    )
    assert line.endswith("; check the path, the endpoint and the credentials")
    assert "secret" not in line
    assert not root.exists()


JOB_ID_FORM = "letters, digits, '.', '_' and '-', at most 100 characters (not '.' or '..' alone)"


@pytest.mark.parametrize(
    ("job_id", "shown", "problem"),
    [
        ("../x", "'../x'", "it contains '/'"),
        ("..", "'..'", "'..' alone is not allowed"),
        (".", "'.'", "'.' alone is not allowed"),
        ("a/b", "'a/b'", "it contains '/'"),
        ("a b", "'a b'", "it contains ' '"),
        ("x;rm", "'x;rm'", "it contains ';'"),
        ("\u00e9t\u00e9", "'\u00e9t\u00e9'", "it contains '\u00e9'"),
        ("", "''", "it is empty"),
        # issue 32 §4: 5,000 characters passed the check and failed on the file system (exit 1)
        ("j" * 5000, "'" + "j" * 12 + "..." + "j" * 13 + "'", "it is 5000 characters long"),
        ("j" * 101, "'" + "j" * 12 + "..." + "j" * 13 + "'", "it is 101 characters long"),
    ],
)
def test_unsafe_job_ids(
    tmp_path: Path,
    job_id: str,
    shown: str,
    problem: str,
    capsys: pytest.CaptureFixture[str],
    no_spark: None,
) -> None:
    job = write(tmp_path / "job.py", PIPELINE)
    root = tmp_path / "ckpt"
    line = one_line(["run", str(job), "--checkpoint-dir", str(root), "--job-id", job_id], capsys)
    assert line == (
        f"regional run: job id {shown} (--job-id) cannot name a directory under the "
        f"checkpoint root: {problem}; use {JOB_ID_FORM}"
    )
    assert not root.exists()


def test_a_job_id_of_the_longest_length_is_taken(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    """100 characters pass the check; the run gets as far as starting Spark."""
    job = write(tmp_path / "job.py", PIPELINE)
    root = tmp_path / "ckpt"
    argv = ["run", str(job), "--checkpoint-dir", str(root), "--job-id", "j" * 100]
    with pytest.raises(AssertionError, match="Spark was started"):
        main(argv)


def test_pipeline_name_must_be_a_safe_job_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], no_spark: None
) -> None:
    job = write(tmp_path / "job.py", PIPELINE.replace('"bad-input-job"', '"../../escape"'))
    root = tmp_path / "ckpt"
    assert one_line(["run", str(job), "--checkpoint-dir", str(root)], capsys) == (
        "regional run: job id '../../escape' (the pipeline's name; pass --job-id) cannot name a "
        f"directory under the checkpoint root: it contains '/'; use {JOB_ID_FORM}"
    )
    assert not root.exists()


def test_clean_with_an_empty_root_is_not_the_working_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "job" / "chk-1").mkdir(parents=True)
    (tmp_path / "job" / "chk-1" / "stray").write_text("x")
    monkeypatch.chdir(tmp_path)
    assert one_line(["clean", "", "--job", "job"], capsys) == (
        "regional clean: checkpoint root is empty; give a local path or a URI"
    )
    assert (tmp_path / "job" / "chk-1" / "stray").exists()


# --- known only when Spark starts: a subprocess, so no session of this process is reused --------


@pytest.mark.spark
@pytest.mark.parametrize(
    ("options", "master", "reason"),
    [
        (
            ["--master", "bogus://x"],
            "bogus://x",
            "Master must either be yarn or start with spark, k8s, or local",
        ),
        (["--conf", "spark.driver.memory=abc"], "local[*]", "Invalid maximum heap size: -Xmxabc"),
        (["--master", "local[abc]"], "local[abc]", "Could not parse Master URL: 'local[abc]'"),
    ],
    ids=["master", "driver-memory", "local-threads"],
)
def test_spark_that_does_not_start(
    tmp_path: Path, options: list[str], master: str, reason: str
) -> None:
    job = write(tmp_path / "job.py", PIPELINE)
    root = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "regional.cli", "run", str(job), "--checkpoint-dir", str(root)]
    done = subprocess.run(
        [*argv, *options],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"regional run: Spark did not start (master {master!r}): {reason}; check the master "
        "URL (--master) and the Spark settings (--conf); Spark's output is in "
        f"{root}-spark.log"
    ]
    assert not root.exists()
    assert not Path(f"{root}-table").exists()


# --- the Parquet sink's commit log --------------------------------------------------------------


def _table_with_two_commits(path: Path) -> tuple[ParquetSink, list[str]]:
    sink = ParquetSink(str(path))
    for cid in (1, 2):
        (c,) = sink.write(
            [pa.record_batch({"x": [cid, cid * 10]})],
            WriteContext(
                job_id="job",
                run_id="r1",
                checkpoint_id=cid,
                attempt=0,
                unit_id=0,
                vertex_id="out",
                index=0,
            ),
        )
        sink.commit("user-1", cid, [c])
    files = [Path(f).name for f in committed_files(str(path))]  # published in the table
    return sink, files


def test_stray_file_in_commit_log_is_ignored(tmp_path: Path) -> None:
    sink, _ = _table_with_two_commits(tmp_path / "table")
    write(tmp_path / "table" / "_commits" / "user-1" / "notes.json", '{"note": "hello"}')
    write(tmp_path / "table" / "_commits" / "README.json", "not json")
    assert read_table(sink.path).column("x").to_pylist() == [1, 10, 2, 20]
    assert sink.latest_committed("user-1") == 2
    assert len(committed_files(sink.path)) == 2


def test_damaged_commit_record_is_named(tmp_path: Path) -> None:
    sink, _ = _table_with_two_commits(tmp_path / "table")
    record = tmp_path / "table" / "_commits" / "user-1" / f"{0:020d}" / f"{2:020d}.json"
    write(record, '{"note": "hello"}')
    with pytest.raises(CommitError) as info:
        read_table(sink.path)
    assert str(info.value) == (
        f"table {sink.path}: _commits/user-1/{0:020d}/{2:020d}.json is not a commit record (Object "
        "missing required field `commit_user`); restore it from a backup, or move it out of the "
        "table to drop that commit"
    )


def test_deleted_committed_data_file_names_commit_and_file(tmp_path: Path) -> None:
    sink, files = _table_with_two_commits(tmp_path / "table")
    (tmp_path / "table" / files[1]).unlink()
    message = (
        f"table {sink.path}: commit 2 of user 'user-1' lost {files[1]}; restore the data files "
        "from a backup (the commit records say which rows the table holds, so without them it "
        "cannot be read whole)"
    )
    for read in (read_table, committed_files):
        with pytest.raises(CommitError) as info:
            read(sink.path)
        assert str(info.value) == message


# --- fuzz: only the library's errors leave the decoders -----------------------------------------

POLICY_EXAMPLE = (REPO / "examples" / "policy.toml").read_bytes()
GRAPH_EXAMPLES = [p.read_bytes() for p in sorted((REPO / "examples" / "graphs").iterdir())]


def _mutated(seed: bytes) -> st.SearchStrategy[bytes]:
    """`seed` with a slice replaced by random bytes or by deep brackets."""
    filler = st.one_of(
        st.binary(max_size=16),
        st.sampled_from([b"[" * 5000, b"{" * 5000, b"{a = " * 3000, b"\xff\xfe", b"\x00"]),
    )
    return st.tuples(st.integers(0, len(seed)), st.integers(0, 32), filler).map(
        lambda t: seed[: t[0]] + t[2] + seed[t[0] + t[1] :]
    )


@settings(max_examples=150, deadline=None)
@given(data=_mutated(POLICY_EXAMPLE))
def test_fuzzed_policy_files_raise_only_policy_errors(tmp_path_factory, data: bytes) -> None:  # type: ignore[no-untyped-def]
    file = tmp_path_factory.mktemp("fuzz") / "p.toml"
    file.write_bytes(data)
    try:
        load_policy(file, env={})
    except PolicyError as exc:
        assert "\n" not in str(exc)


@settings(max_examples=150, deadline=None)
@given(data=st.sampled_from(GRAPH_EXAMPLES).flatmap(_mutated))
def test_fuzzed_graph_files_raise_only_graph_errors(data: bytes) -> None:
    try:
        parse_graph(data, source="fuzz.json")
    except GraphError as exc:
        assert "\n" not in str(exc)
    except RegionalError as exc:  # pragma: no cover - reported with its class name
        raise AssertionError(f"{type(exc).__name__} instead of GraphError: {exc}") from exc
