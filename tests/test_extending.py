"""The "Extending" page's code (examples/sqlite_sink.py): a sink and a source written against
the contracts alone are exactly-once through unit faults and a driver crash at each crash
point, read back with sqlite3 (not through our code)."""

from __future__ import annotations

import importlib.util
import sqlite3
from collections import Counter
from pathlib import Path
from types import ModuleType

import pyarrow as pa
import pytest

from regional.errors import CommitError
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.sinks.base import Sink, TableStaging, WriteContext
from regional.sources.base import Source


def _load_example() -> ModuleType:
    path = Path(__file__).resolve().parent.parent / "examples" / "sqlite_sink.py"
    spec = importlib.util.spec_from_file_location("sqlite_sink_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


example = _load_example()


def _context(checkpoint: int, attempt: int = 0, index: int = 0) -> WriteContext:
    return WriteContext(
        job_id="job",
        run_id="r1",
        checkpoint_id=checkpoint,
        attempt=attempt,
        unit_id=index,
        vertex_id="out",
        index=index,
    )


def _rows(database: Path) -> Counter[tuple[str, int]]:
    with sqlite3.connect(database) as db:
        return Counter(db.execute("SELECT word, n FROM words").fetchall())


def test_the_examples_implement_the_contracts(tmp_path: Path) -> None:
    sink = example.SQLiteSink(str(tmp_path / "t.db"), "words", ["word", "n"])
    assert isinstance(sink, Sink) and isinstance(sink, TableStaging)
    assert isinstance(example.LinesSource(str(tmp_path)), Source)


def test_the_sink_commits_once_and_cleans_what_a_crash_left(tmp_path: Path) -> None:
    database = tmp_path / "t.db"
    sink = example.SQLiteSink(str(database), "words", ["word", "n"])
    batch = pa.record_batch({"word": ["a", "b"], "n": [1, 1]})
    first = sink.write([batch], _context(1))
    lost = sink.write([batch], _context(1, attempt=1, index=1))  # a lost attempt's rows
    assert sink.write([], _context(2)) == ()
    assert sink.missing_files(first) == []
    sink.commit("user", 1, first)
    assert _rows(database) == {("a", 1): 1, ("b", 1): 1}
    assert sink.latest_committed("user") == 1 and sink.latest_committed("other") is None
    with pytest.raises(CommitError, match="commit 1 of 'user' is not after its latest commit 1"):
        sink.commit("user", 1, first)
    assert sink.missing_files(first) == ["job/r1/1/out/0/a0"]  # moved into the table
    assert sink.clean_staged("job", keep=[]) == [lost[0].decode()]
    assert sink.clean_staged("other-job", keep=[]) == []
    staged = sink.write([batch], _context(3))
    sink.discard(staged)
    assert sink.missing_files(staged) == [staged[0].decode()]
    assert _rows(database) == {("a", 1): 1, ("b", 1): 1}


def test_the_source_reads_deterministically_from_a_position(tmp_path: Path) -> None:
    example.write_lines(str(tmp_path), files=1, lines=5)
    source = example.LinesSource(str(tmp_path))
    assert source.discover() == ["part-0.txt"]
    first = source.read("part-0.txt", b"", 3)
    rest = source.read("part-0.txt", first.position, 10)
    again = source.read("part-0.txt", first.position, 10)
    assert not first.finished and rest.finished and rest == again
    assert [r["line"] for b in first.batches + rest.batches for r in b] == [
        "w0 w0",
        "w1 w1",
        "w2 w2",
        "w3 w0",
        "w4 w1",
    ]


@pytest.fixture(scope="module")
def fault_free(spark, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Counter]:
    """The input files, and the rows a fault-free run commits from them."""
    from regional.runtime.spark import SparkRuntime

    work = tmp_path_factory.mktemp("fault-free")
    example.write_lines(str(work / "data"))
    database = work / "expected.db"
    pipeline = example.build_pipeline(str(work / "data"), str(database))
    assert SparkRuntime(pipeline, spark, root=str(work / "ckpt")).run().finished
    expected = _rows(database)
    assert sum(expected.values()) == 4 * 30 * 2
    return work / "data", expected


@pytest.mark.spark
@pytest.mark.parametrize("step", CRASH_STEPS)
def test_the_example_job_is_exactly_once_through_faults_and_a_driver_crash(
    spark, fault_free: tuple[Path, Counter], tmp_path: Path, step: str
) -> None:
    from regional.runtime.spark import SparkRuntime

    data, expected = fault_free

    database = tmp_path / "words.db"
    root = str(tmp_path / "ckpt")
    crash_at = 4 if step == "mid-clean" else 3
    faults = Faults(units={(2, 1): "fail", (3, 2): "fail"}, crash_at=(crash_at, step))
    with pytest.raises(DriverCrash):
        SparkRuntime(
            example.build_pipeline(str(data), str(database)), spark, root=root, faults=faults
        ).run()
    summary = SparkRuntime(example.build_pipeline(str(data), str(database)), spark, root=root).run()
    assert summary.finished and summary.restored_from is not None
    assert _rows(database) == expected
    with sqlite3.connect(database) as db:  # nothing left staged once the job finished
        assert db.execute('SELECT count(*) FROM "_staged_words"').fetchone() == (0,)
