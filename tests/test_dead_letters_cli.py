"""`regional dead-letters ROOT list|export|replay` (issue 45 item 3): dead letters a user can
act on. The must-show: a job sets bad records aside; they are exported, fixed and replayed into
their source; the next run's rows equal a run where those records were good from the start,
with a unit reading the replay falling back on the way (no replayed record lost or doubled).
In-process runs (no Spark): the replay is the source's and the checkpoint's, not Spark's."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyarrow import fs as pafs

from metadata.events import read_events
from metadata.storage import JobStorage
from regional.cli import main
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource
from regional.sources.replay import (
    BatchManifest,
    FixedRecord,
    ReplayError,
    ReplayingSource,
    batch_file_name,
    encode_batch,
    parse_fixed_records,
)

JOB = "orders"


def parse(record: dict[str, Any]) -> dict[str, Any]:
    return {"k": record["k"], "n": int(record["n"])}  # "x" raises: a dead letter


def count(ctx: Any, record: dict[str, Any]) -> Any:
    seen = ctx.value_state("seen", 0)
    seen.update(seen.value() + 1)
    yield {"k": record["k"], "count": seen.value()}


def write_orders(data: Path, bad: str) -> None:
    """Two files of 10 orders; every fourth from the second has n = `bad`."""
    data.mkdir(parents=True)
    for f in range(2):
        with (data / f"orders-{f}.jsonl").open("w") as out:
            for n in range(10):
                value = bad if n % 4 == 1 else str(n)
                out.write(json.dumps({"k": "abc"[n % 3], "n": value}) + "\n")


def run(work: Path, faults: Faults | None = None) -> Any:
    """The job: parse (bad records are dead letters), a running count per key after a keyed
    exchange (so the count does not depend on which split a record came from), and the parsed
    records themselves; run in process to the end of its input."""
    p = Pipeline(
        JOB,
        records_per_epoch=4,
        on_error="dead-letter",
        dead_letter=ParquetSink(str(work / "dead")),
    )
    parsed = p.source(FileSource(str(work / "data"), format="jsonl"), parallelism=2, name="orders")
    parsed = parsed.map(parse, name="parse")
    parsed.sink(ParquetSink(str(work / "parsed")), name="parsed_out")
    parsed.key_by("k", partitions=2).process(count, name="count").sink(
        ParquetSink(str(work / "counts")), name="counts_out"
    )
    root = str(work / "ckpt")
    faults = faults or Faults()
    env = TaskEnv(root, JOB, p, unit_timeout=30, faults=faults.unit_faults())
    driver = JobDriver(
        p,
        InProcessDispatcher(env),
        storage=JobStorage(root, JOB),
        policy=load_policy(env={}).policy,
        faults=faults,
    )
    return driver.run()


def rows(work: Path) -> tuple[Counter[tuple[Any, ...]], Counter[tuple[Any, ...]]]:
    parsed = Counter((r["k"], r["n"]) for r in read_table(str(work / "parsed")).to_pylist())
    counts = Counter((r["k"], r["count"]) for r in read_table(str(work / "counts")).to_pylist())
    return parsed, counts


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def bad_job(tmp_path: Path) -> Path:
    work = tmp_path / "bad"
    write_orders(work / "data", bad="x")
    assert run(work).finished
    return work


def test_export_fix_replay_equals_a_run_with_good_records(
    bad_job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tmp_path / "good"
    write_orders(good / "data", bad="7")
    assert run(good).finished
    root = str(bad_job / "ckpt")
    assert rows(bad_job) != rows(good)

    exported = tmp_path / "dead.jsonl"
    code, out, _ = cli(capsys, "dead-letters", root, "export", "-o", str(exported))
    assert code == 0 and "6 dead letter(s) written" in out
    lines = [json.loads(line) for line in exported.read_text().splitlines()]
    assert len(lines) == 6 and {line["reason"] for line in lines} == {"user function error"}
    assert all(line["record"]["n"] == "x" for line in lines)  # decoded back to JSON
    fixed = tmp_path / "fixed.jsonl"
    fixes = [{**line, "record": {**line["record"], "n": "7"}} for line in lines]
    fixed.write_text("".join(json.dumps(line) + "\n" for line in fixes))
    code, out, _ = cli(capsys, "dead-letters", root, "replay", str(fixed), "--into", "orders")
    assert code == 0 and "6 record(s) into source 'orders'" in out

    # the next run reads the batch; the unit reading the replay split fails its first
    # checkpoint (7: run 1 took 1-6) and falls back: it re-reads from its owner's position
    summary = run(bad_job, Faults(units={(7, 0): "fail", (7, 1): "fail", (8, 0): "fail"}))
    assert summary.finished and summary.restored_from is not None
    assert any(e.fallback_units for e in summary.checkpoints)
    assert rows(bad_job) == rows(good)

    # the event log says who replayed how many records when, once
    storage = JobStorage(root, JOB)
    replays = [line for e in read_events(storage)[0] for line in e.replays]
    batch = _batch_of(bad_job)
    assert len(replays) == 1 and replays[0].startswith(
        f"replay batch {batch} into 'orders': 6 record(s), replayed by "
    )
    assert all(line["id"] in replays[0] for line in lines)

    # a third run replays nothing again, and records no replay again
    assert run(bad_job).finished
    assert rows(bad_job) == rows(good)
    assert len([x for e in read_events(storage)[0] for x in e.replays]) == 1
    code, out, _ = cli(capsys, "dead-letters", root, "list", "--json")
    listed = json.loads(out)
    assert {r["replayed"] for r in listed} == {_batch_of(bad_job)}


def _batch_of(work: Path) -> str:
    """The id of the one batch in the inbox of `orders` (its manifest's)."""
    (batch,) = (work / "ckpt" / JOB / "replay" / "orders").glob("*.jsonl")
    assert batch.name == "000001.jsonl"
    return str(json.loads(batch.read_text().splitlines()[0])["batch"])


def test_a_batch_and_a_record_are_replayed_once(
    bad_job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(bad_job / "ckpt")
    exported = tmp_path / "dead.jsonl"
    assert cli(capsys, "dead-letters", root, "export", "-o", str(exported))[0] == 0
    lines = exported.read_text().splitlines()
    first = tmp_path / "first.jsonl"
    first.write_text("\n".join(lines[:2]) + "\n")
    assert cli(capsys, "dead-letters", root, "replay", str(first), "--into", "orders")[0] == 0

    code, _, err = cli(capsys, "dead-letters", root, "replay", str(first), "--into", "orders")
    assert code == 2 and "was replayed into 'orders'" in err and "a batch is replayed once" in err

    overlapping = tmp_path / "overlapping.jsonl"
    overlapping.write_text("\n".join(lines[1:4]) + "\n")
    code, _, err = cli(capsys, "dead-letters", root, "replay", str(overlapping), "--into", "orders")
    assert code == 2
    assert f"{overlapping} line 1: dead letter {json.loads(lines[1])['id']} was replayed" in err

    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text(lines[3] + "\n" + json.dumps({"id": "0123456789abcdef", "record": {}}))
    code, _, err = cli(capsys, "dead-letters", root, "replay", str(unknown), "--into", "orders")
    assert code == 2 and f"{unknown} line 2: job " in err and "0123456789abcdef" in err

    code, _, err = cli(capsys, "dead-letters", root, "replay", str(first), "--into", "parse")
    assert code == 2 and "no source vertex 'parse' (its sources: orders)" in err

    broken = tmp_path / "broken.jsonl"
    broken.write_text(lines[4] + "\n{not json\n")
    code, _, err = cli(capsys, "dead-letters", root, "replay", str(broken), "--into", "orders")
    assert code == 2 and f"{broken} line 2: not JSON" in err

    # batch files are numbered without a gap (a running job asks for the next number)
    second = tmp_path / "second.jsonl"
    second.write_text(lines[4] + "\n")
    assert cli(capsys, "dead-letters", root, "replay", str(second), "--into", "orders")[0] == 0
    inbox = bad_job / "ckpt" / JOB / "replay" / "orders"
    assert sorted(p.name for p in inbox.iterdir()) == ["000001.jsonl", "000002.jsonl"]
    (inbox / "000001.jsonl").rename(tmp_path / "000001.jsonl")
    third = tmp_path / "third.jsonl"
    third.write_text(lines[5] + "\n")
    code, _, err = cli(capsys, "dead-letters", root, "replay", str(third), "--into", "orders")
    assert code == 2 and f"{inbox} lacks 000001.jsonl: its batch files are numbered" in err


def test_list_filters_and_export_parquet(
    bad_job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = str(bad_job / "ckpt")
    code, out, _ = cli(capsys, "dead-letters", root, "list")
    assert code == 0 and "6 dead letter(s)" in out
    assert out.splitlines()[0].split() == [
        "id", "checkpoint", "operator", "reason", "position", "record", "error", "replayed"
    ]  # fmt: skip
    code, out, _ = cli(capsys, "dead-letters", root, "list", "--checkpoint", "1", "--json")
    one = json.loads(out)
    assert len(one) == 2 and {r["checkpoint_id"] for r in one} == {1}
    code, out, _ = cli(capsys, "dead-letters", root, "list", "--limit", "1", "--json")
    assert len(json.loads(out)) == 1
    code, out, _ = cli(capsys, "dead-letters", root, "list", "--operator", "count", "--json")
    assert json.loads(out) == []
    target = tmp_path / "dead.parquet"
    code, _, _ = cli(
        capsys, "dead-letters", root, "export", "--format", "parquet", "-o", str(target),
        "--reason", "user function error",
    )  # fmt: skip
    import pyarrow.parquet as pq

    table = pq.read_table(target)
    assert code == 0 and table.num_rows == 6 and "id" in table.column_names


@settings(max_examples=50, deadline=None)
@given(
    records=st.lists(st.integers(), min_size=1, max_size=30),
    reads=st.lists(st.integers(min_value=0, max_value=7), min_size=1, max_size=40),
)
def test_a_replay_split_gives_every_record_once_in_order_whatever_the_read_sizes(
    tmp_path_factory: pytest.TempPathFactory, records: list[int], reads: list[int]
) -> None:
    inbox = tmp_path_factory.mktemp("inbox")
    fixed = [FixedRecord(f"d{i}", {"v": v}) for i, v in enumerate(records)]
    ids = tuple(f.id for f in fixed)
    manifest = BatchManifest(batch="b1", source="s", by="t", at_ms=0, ids=ids)
    (inbox / batch_file_name(1)).write_bytes(encode_batch(manifest, fixed))

    class Nothing:
        bounded = True

        def discover(self) -> list[str]:
            return []

        def read(self, split: str, position: bytes, max_records: int) -> Any:
            raise AssertionError(split)

    source = ReplayingSource(Nothing(), str(inbox), pafs.LocalFileSystem())  # type: ignore[arg-type]
    got: list[Any] = []
    position, finished = b"", False
    for size in [*reads, len(records)]:  # the last read takes the rest
        result = source.read("replay:000001", position, size)
        got += [r for batch in result.batches for r in batch]
        position, finished = result.position, result.finished
        if finished:
            break
    assert finished and got == [{"v": v} for v in records]


def test_a_fixed_records_file_is_checked_line_by_line() -> None:
    with pytest.raises(ReplayError, match=r"f.jsonl line 2: a fixed record is an object"):
        parse_fixed_records('{"id": "a", "record": 1}\n[1]\n', file="f.jsonl")
    with pytest.raises(ReplayError, match=r"f.jsonl line 3: dead letter a is on line 1 too"):
        parse_fixed_records('{"id": "a", "record": 1}\n\n{"id": "a", "record": 2}', file="f.jsonl")
    with pytest.raises(ReplayError, match="no fixed record"):
        parse_fixed_records("\n", file="f.jsonl")
    assert parse_fixed_records('{"id": "a", "record": null}', file="f") == [FixedRecord("a", None)]


def test_a_pipeline_bound_to_another_root_reads_that_roots_inbox_only(tmp_path: Path) -> None:
    p = Pipeline(JOB)
    p.source(FileSource(str(tmp_path / "data"), format="jsonl"), name="orders").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    p.bind(str(tmp_path / "one" / JOB))
    p.bind(str(tmp_path / "two" / JOB))
    source = p.vertices["orders"].source
    assert isinstance(source, ReplayingSource)
    assert source.inbox == f"{tmp_path}/two/{JOB}/replay/orders"
    assert isinstance(source.source, FileSource)


@pytest.mark.spark
def test_replay_on_spark_equals_a_run_with_good_records(
    tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example job of docs/how-to/dead-letters.md on Spark: the replaying source is
    shipped to the Python workers and reads the inbox there."""
    import importlib.util

    from regional.runtime.spark import SparkRuntime

    spec = importlib.util.spec_from_file_location(
        "dead_letters_example", Path(__file__).parent.parent / "examples" / "dead_letters.py"
    )
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    data = example.make_data(str(tmp_path / "data"))
    root = str(tmp_path / "ckpt")

    def run_on_spark() -> Any:
        p = example.build_pipeline(data, str(tmp_path / "out"))
        return SparkRuntime(p, spark, root=root, policy=load_policy(env={}).policy).run()

    assert run_on_spark().finished
    exported, fixed = tmp_path / "dead.jsonl", tmp_path / "fixed.jsonl"
    assert cli(capsys, "dead-letters", root, "export", "-o", str(exported))[0] == 0
    fixed.write_text(exported.read_text().replace('"amount": "x"', '"amount": "0"'))
    assert cli(capsys, "dead-letters", root, "replay", str(fixed), "--into", "orders")[0] == 0
    assert run_on_spark().finished
    got = Counter(
        (r["customer"], r["orders"])
        for r in read_table(str(tmp_path / "out" / "counts")).to_pylist()
    )
    want = Counter(
        (c, n) for c, total in (("a", 8), ("b", 6), ("c", 6)) for n in range(1, total + 1)
    )
    assert got == want
