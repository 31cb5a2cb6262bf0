"""The durable keyed exchange without Spark: its pure parts (partitioning, cursors, segment
retention) with hypothesis, the region analysis, the pipeline API, and the two-stage orders job
(`tests/orders_job.py`) run in this process through crashes, unit faults and a rescale."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import msgspec
import orders_job as job
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.commit_log import CommitRecord
from metadata.errors import MetadataError
from metadata.exchange import Cursor, ReaderView, SegmentName, kept_by, segment_of, split_id
from metadata.format import segment_checksum
from metadata.storage import JobStorage
from regional.dataflow.exchange import ExchangeReader, ExchangeWriter
from regional.dataflow.partitioning import partition_of
from regional.errors import CommitError, GraphError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv

# --- partitioning -------------------------------------------------------------------------

GOLDEN = [10, 1, 14, 1, 13, 14, 1]


def test_partitions_are_stable_across_processes_and_hash_seeds() -> None:
    keys = ["c07", "alice", 42, -1, ("eu", 3), b"raw", 2.5]
    here = [partition_of(k, 16) for k in keys]
    code = (
        "from regional.dataflow.partitioning import partition_of;"
        f"print([partition_of(k, 16) for k in {keys!r}])"
    )
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed, "PYTHONPATH": os.getcwd()}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        assert out.stdout.strip() == str(here), out.stderr
    # documented: BLAKE2b (8 bytes, big-endian) of the msgpack encoding, modulo the partitions
    digest = [hashlib.blake2b(msgspec.msgpack.encode(k), digest_size=8).digest() for k in keys]
    assert here == [int.from_bytes(d, "big") % 16 for d in digest]
    assert here == GOLDEN  # a change here moves every key of every running job


@given(st.one_of(st.text(), st.integers(-(2**63), 2**64 - 1), st.binary()), st.integers(1, 64))
def test_a_key_always_lands_in_one_partition_in_range(key: Any, partitions: int) -> None:
    p = partition_of(key, partitions)
    assert 0 <= p < partitions and p == partition_of(key, partitions)


def test_a_key_that_cannot_be_hashed_is_named() -> None:
    with pytest.raises(
        TypeError, match=r"the key <object object at .*> \(object\) cannot be hashed"
    ):
        partition_of(object(), 4)


# --- cursors and segment retention ----------------------------------------------------------

segments = st.lists(
    st.tuples(
        st.integers(1, 6), st.integers(0, 3), st.integers(0, 5)
    ),  # (checkpoint, writer, rows)
    max_size=12,
    unique_by=lambda t: t[:2],
)


def _partition_dir(tmp_path: Path, contents: list[tuple[int, int, int]]) -> ExchangeReader:
    reader = ExchangeReader("x", 1, bounded=True)
    reader.bind(str(tmp_path / "x"), None)
    directory = tmp_path / "x" / "n1" / "p0"
    directory.mkdir(parents=True, exist_ok=True)
    committed: dict[int, list[tuple[str, int, str]]] = {}
    for c, w, n in contents:
        rows = [{"c": c, "w": w, "i": i} for i in range(n)]
        table = pa.Table.from_pylist(
            rows, schema=pa.schema([("c", pa.int64()), ("w", pa.int64()), ("i", pa.int64())])
        )
        pq.write_table(table, directory / SegmentName(c, w).file_name())
        data = (directory / SegmentName(c, w).file_name()).read_bytes()
        file = f"n1/p0/{SegmentName(c, w).file_name()}"
        committed.setdefault(c, []).append((file, len(data), segment_checksum(data).hex()))
    writer = ExchangeWriter("x", lambda r: r, 1)  # the commit records a writer would leave
    writer.bind(str(tmp_path / "x"), None)
    for c, files in committed.items():
        writer.area.write_record(
            CommitRecord(
                "user",
                c,
                [f for f, _, _ in files],
                0,
                sizes=[n for _, n, _ in files],
                checksums=[h for _, _, h in files],
            )
        )
    return reader


@settings(max_examples=40, deadline=None)
@given(segments, st.lists(st.integers(1, 7), min_size=1, max_size=8))
def test_reading_in_any_budgets_reads_every_row_once_in_segment_order(
    tmp_path_factory: pytest.TempPathFactory,
    contents: list[tuple[int, int, int]],
    budgets: list[int],
) -> None:
    reader = _partition_dir(tmp_path_factory.mktemp("seg"), contents)
    position, got = b"", []
    total = sum(n for _, _, n in contents)
    for budget in budgets * (total + 1):  # each read takes one row at least while rows remain
        result = reader.read("n1-p0", position, budget)
        taken = sum(b.num_rows for b in result.batches)
        assert taken <= budget and not result.finished
        assert reader.backlog("n1-p0", result.position).records == total - len(got) - taken
        got += [(r["c"], r["w"], r["i"]) for b in result.batches for r in b.to_pylist()]
        position = result.position
    assert got == sorted((c, w, i) for c, w, n in contents for i in range(n))
    assert reader.backlog("n1-p0", position).records == 0


@given(
    st.lists(
        st.tuples(st.integers(1, 9), st.integers(0, 3), st.integers(0, 3)), min_size=1, max_size=5
    ),
    st.integers(1, 9),
    st.integers(0, 3),
)
def test_a_segment_is_kept_exactly_while_some_kept_checkpoint_has_not_passed_it(
    cursors: list[tuple[int, int, int]], checkpoint: int, writer: int
) -> None:
    segment = SegmentName(checkpoint, writer)
    file = segment_of(f"exchange/x/n2/p1/{segment.file_name()}")
    assert file is not None
    views = [ReaderView(10 + i, 2, {1: Cursor(*c)}) for i, c in enumerate(cursors)]
    assert kept_by(file, views) == [
        v.checkpoint_id for v in views if not v.cursors[1].passed(segment)
    ]
    # a checkpoint of another layout keeps only segments committed at or after it
    other = ReaderView(checkpoint, 4, {})
    assert kept_by(file, [other]) == [checkpoint]
    assert kept_by(file, [ReaderView(checkpoint + 1, 4, {})]) == []


def test_a_position_that_is_not_a_cursor_is_named(tmp_path: Path) -> None:
    reader = _partition_dir(tmp_path, [(1, 0, 2)])
    with pytest.raises(
        MetadataError,
        match=r"^the position of exchange split 'n1-p0' is b'garbage', not an exchange cursor "
        r"\(<checkpoint>:<writer>:<row>\); the checkpoint holding it is damaged",
    ):
        reader.read("n1-p0", b"garbage", 10)


# --- graph and API --------------------------------------------------------------------------


def test_the_two_stages_of_an_exchange_are_separate_fallback_units(tmp_path: Path) -> None:
    p = job.pipeline(str(tmp_path / "in"), str(tmp_path / "out"), upstream=3, partitions=4)
    plan = p.regions()
    assert plan.num_units == 7 and plan.regional_allowed
    assert [str(s) for s in plan.subtasks_of_unit(0)] == [
        "files#0",
        "parse#0",
        "by-customer-writer#0",
    ]
    assert [str(s) for s in plan.subtasks_of_unit(3)] == ["by-customer#0", "totals#0", "out#0"]
    assert plan.notes == (
        "edge by-customer-writer -> by-customer (hash, durable) is a durable exchange: "
        "'by-customer-writer' commits what it sends with its checkpoint and 'by-customer' reads "
        "it back from positions in its own state, so their units fall back on their own",
    )
    assert p.vertices["totals"].operator.scope == "key"


def test_regions_cli_explains_a_durable_edge(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from regional.cli import main

    graph = {
        "vertices": [
            {"id": "src", "parallelism": 2, "kind": "source"},
            {"id": "agg", "parallelism": 3},
        ],
        "edges": [{"from": "src", "to": "agg", "partitioner": "hash", "exchange": "durable"}],
    }
    (tmp_path / "g.json").write_text(json.dumps(graph))
    assert main(["regions", str(tmp_path / "g.json")]) == 0
    out = capsys.readouterr().out
    assert "2 vertices, 5 subtasks, 5 regions, 5 fallback units; regional checkpoints: yes" in out
    assert "note: edge src -> agg (hash, durable) is a durable exchange" in out


def test_exchange_api_errors_name_the_problem(tmp_path: Path) -> None:
    from regional.dataflow.pipeline import Pipeline
    from regional.sources.generator import GeneratorSource

    p = Pipeline("p")
    src = p.source(
        GeneratorSource(2, lambda s, n: {"k": n}, records_per_split=3), parallelism=2, name="src"
    )
    with pytest.raises(
        GraphError, match=r"exchange after 'src': partitions=0; give a whole number"
    ):
        src.key_by(lambda r: r["k"], partitions=0)
    with pytest.raises(
        GraphError, match=r"exchange after 'src': the key 3 is neither a field name nor callable"
    ):
        src.exchange(3, partitions=2)  # type: ignore[arg-type]
    keyed = src.exchange(lambda r: r["k"], partitions=2, name="x")
    with pytest.raises(
        GraphError, match=r"process 'agg' after exchange 'x' is keyed by another function"
    ):
        keyed.key_by(lambda r: r["k"]).process(lambda ctx, r: [r], name="agg")


# --- the orders job in this process ---------------------------------------------------------


def _driver(
    tmp_path: Path,
    p: Any,
    faults: Faults | None = None,
    ratio: float = 0.3,
    retained: int = 3,
    **kw: Any,
) -> JobDriver:
    root = str(tmp_path / "ckpt")
    overrides = {
        "checkpointing": {
            "timeout": "30 s",
            "num-retained": retained,
            "region": {"max-failure-ratio": ratio},
        }
    }
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        job.InProcessDispatcher(env),
        storage=JobStorage(root, "orders"),
        policy=policy,
        faults=faults,
        **kw,
    )


def _orders(tmp_path: Path, **kw: Any) -> Any:
    if not (tmp_path / "orders").exists():
        job.write_orders(str(tmp_path / "orders"))
    return job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"), **kw)


#: upstream units are 0-2, downstream units 3-6
UNIT_FAULTS = {(2, 0): "fail", (2, 4): "fail", (3, 1): "fail", (4, 5): "fail", (4, 6): "fail"}


def test_fault_free_run_counts_every_order_once(tmp_path: Path) -> None:
    summary = _driver(tmp_path, _orders(tmp_path)).run()
    assert summary.finished
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_unit_faults_and_a_driver_crash_commit_exactly_the_fault_free_rows(
    tmp_path: Path, step: str
) -> None:
    first = _driver(tmp_path, _orders(tmp_path), Faults(units=UNIT_FAULTS, crash_at=(5, step)))
    with pytest.raises(DriverCrash):
        first.run()
    summary = _driver(tmp_path, _orders(tmp_path)).run()
    assert summary.finished and summary.restored_from is not None
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def test_failing_upstream_units_never_stop_downstream_units_from_checkpointing(
    tmp_path: Path,
) -> None:
    # checkpoint 3: every upstream unit fails; checkpoint 4: every downstream unit fails
    faults = Faults(
        units={**{(3, u): "fail" for u in range(3)}, **{(4, u): "fail" for u in range(3, 7)}}
    )
    events = []
    driver = _driver(tmp_path, _orders(tmp_path), faults, ratio=0.6, progress=events.append)
    summary = driver.run()
    assert summary.finished
    by_id = {e.checkpoint_id: e for e in events}
    assert by_id[3].kind == "regional" and by_id[3].fallback_units == (0, 1, 2)
    assert by_id[3].records_exchanged > 0  # downstream read the segments committed by checkpoint 2
    assert by_id[4].kind == "regional" and by_id[4].fallback_units == (3, 4, 5, 6)
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def test_restore_with_fewer_partitions_moves_keys_and_backlog(tmp_path: Path) -> None:
    first = _driver(tmp_path, _orders(tmp_path, partitions=4), Faults(units={(2, 5): "fail"}))
    first.run(max_checkpoints=4)
    assert not first.finished
    second = _driver(tmp_path, _orders(tmp_path, partitions=2))
    summary = second.run()
    assert summary.finished and summary.restored_from == 4
    assert any("moved from 4 to 2 partitions" in n for n in summary.restore_notes)
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()
    # the new layout only: every partition of n2 holds the keys that hash to it
    for q in range(2):
        directory = tmp_path / "ckpt" / "orders" / "exchange" / "by-customer" / "n2" / f"p{q}"
        for f in sorted(directory.iterdir()):
            keys = set(pq.read_table(f).column("customer").to_pylist())
            assert {partition_of(k, 2) for k in keys} <= {q}


def test_restore_with_more_partitions_then_back_keeps_counts_exact(tmp_path: Path) -> None:
    _driver(tmp_path, _orders(tmp_path, partitions=2)).run(max_checkpoints=3)
    _driver(tmp_path, _orders(tmp_path, partitions=5)).run(max_checkpoints=3)
    summary = _driver(tmp_path, _orders(tmp_path, partitions=2)).run()
    assert summary.finished
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def test_a_fresh_start_deletes_an_earlier_runs_segments(tmp_path: Path) -> None:
    _driver(tmp_path, _orders(tmp_path)).run(max_checkpoints=3)
    storage = JobStorage(str(tmp_path / "ckpt"), "orders")
    for f in storage.list_files():
        if f.path.startswith("chk-"):
            storage.delete_file(f.path)
    (tmp_path / "table").rename(tmp_path / "table-old")
    summary = _driver(tmp_path, _orders(tmp_path)).run()
    assert summary.finished and summary.restored_from is None
    assert summary.restore_notes[0].startswith("exchange 'by-customer': deleted ")
    assert summary.restore_notes[0].endswith(" segment(s) of an earlier run")
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def test_writer_and_reader_refuse_tampered_names(tmp_path: Path) -> None:
    reader = ExchangeReader("x", 2, bounded=True)
    reader.bind(str(tmp_path), None)
    with pytest.raises(
        Exception, match=r"exchange 'x': split id '../p0' is not n<partitions>-p<partition>"
    ):
        reader.read("../p0", b"", 10)
    writer = ExchangeWriter("x", lambda r: r, 2)
    writer.bind(str(tmp_path), None)
    with pytest.raises(Exception, match=r"is not named n<N>-p<q>-c<checkpoint>-w<writer>"):
        writer._published("_staging/j/evil.staged")
    assert split_id(2, 1) == "n2-p1"


# --- retention ------------------------------------------------------------------------------


def test_the_cleaner_keeps_exactly_the_segments_the_kept_checkpoint_has_not_read(
    tmp_path: Path,
) -> None:
    from cleaner.run import scan

    driver = _driver(tmp_path, _orders(tmp_path), Faults(units={(3, 4): "fail"}), retained=1)
    driver.run(max_checkpoints=4)  # checkpoint 4 is the only kept one
    storage = JobStorage(str(tmp_path / "ckpt"), "orders")
    md = storage.read_metadata(4)
    cursors = {
        s.index: Cursor.decode(s.split_states[0].position)
        for s in md.subtasks
        if s.vertex_id == "by-customer"
    }
    segments = [f.path for f in storage.list_files() if segment_of(f.path) is not None]
    assert segments  # checkpoint 4's own commit published segments nobody read yet
    for path in segments:  # the cleaner ran at every checkpoint: nothing consumed is left
        file = segment_of(path)
        assert file is not None and not cursors[file.partition].passed(file.segment), path

    plan = scan(storage, num_retained=1)
    decisions = {d.path: d for d in plan.files if d.path.startswith("exchange/")}
    for path in segments:
        assert (decisions[path].action, decisions[path].reason) == ("keep", "exchange-backlog")
        assert decisions[path].detail == "exchange segment not yet read by kept checkpoint(s) 4"
    # a segment every kept checkpoint's reader passed is planned for deletion, and says why
    consumed = tmp_path / "ckpt" / "orders" / "exchange" / "by-customer" / "n4" / "p0"
    (consumed / SegmentName(1, 0).file_name()).write_bytes(b"old")
    plan = scan(storage, num_retained=1)
    [gone] = [d for d in plan.deletions if d.path.startswith("exchange/")]
    assert gone.path == "exchange/by-customer/n4/p0/00000000000000000001-00000.parquet"
    assert (gone.reason, gone.detail) == (
        "consumed",
        "exchange segment every kept checkpoint's reader has read",
    )
    records = [d for d in plan.files if "/_commits/" in d.path]
    assert records and {d.reason for d in records} == {"exchange"}


def test_inspect_shows_each_partitions_unread_backlog(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from regional.cli import main

    _driver(tmp_path, _orders(tmp_path)).run(max_checkpoints=3)
    assert main(["inspect", str(tmp_path / "ckpt"), "exchange", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["exchange"], r["partition"], r["partitions"], r["checkpoint_id"]) for r in rows] == [
        ("by-customer", q, 4, 3) for q in range(4)
    ]
    # independently: read each partition from its cursor to the end with the reader itself
    reader = ExchangeReader("by-customer", 4, bounded=True)
    reader.bind(str(tmp_path / "ckpt" / "orders" / "exchange" / "by-customer"), None)
    md = JobStorage(str(tmp_path / "ckpt"), "orders").read_metadata(3)
    for row in rows:
        [state] = [
            s for s in md.subtasks if s.vertex_id == "by-customer" and s.index == row["partition"]
        ]
        position = state.split_states[0].position if state.split_states else b""
        unread = reader.read(split_id(4, row["partition"]), position, 10**6)
        assert row["records"] == sum(b.num_rows for b in unread.batches)
        assert row["cursor"] == (position.decode() or "start")
    assert sum(r["records"] for r in rows) > 0  # checkpoint 3's own segments are not read yet
    assert main(["inspect", str(tmp_path / "ckpt"), "exchange"]) == 0
    out = capsys.readouterr().out
    records, size = sum(r["records"] for r in rows), sum(r["bytes"] for r in rows)
    last = f"checkpoint 3: {records} record(s), {size} byte(s) committed and not read yet"
    assert out.rstrip().endswith(last)


# --- savepoints -----------------------------------------------------------------------------


@pytest.mark.parametrize("partitions", [4, 3])
def test_a_savepoint_carries_the_backlog_to_another_root(tmp_path: Path, partitions: int) -> None:
    first = _driver(tmp_path, _orders(tmp_path), Faults(units={(2, 1): "fail"}))
    summary = first.run(max_checkpoints=3, stop_with_savepoint=True)
    assert summary.savepoint is not None and not summary.finished
    sp = Path(summary.savepoint)
    assert sorted(p.name for p in (sp / "exchange" / "by-customer").iterdir()) == ["n4"]
    other = tmp_path / "elsewhere"
    other.mkdir()
    p = job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"), partitions=partitions)
    env = TaskEnv(str(other / "ckpt"), "orders", p, unit_timeout=30)
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    second = JobDriver(
        p,
        job.InProcessDispatcher(env),
        storage=JobStorage(str(other / "ckpt"), "orders"),
        policy=policy,
        restore_from=summary.savepoint,
    )
    resumed = second.run()
    assert resumed.finished and resumed.restored_from == summary.checkpoints[-1].checkpoint_id
    assert any(f"moved from 4 to {partitions} partitions" in n for n in resumed.restore_notes)
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def test_restoring_a_checkpoint_whose_exchange_is_gone_is_refused(tmp_path: Path) -> None:
    import shutil

    from regional.errors import RestoreError

    _driver(tmp_path, _orders(tmp_path)).run(max_checkpoints=3)
    shutil.rmtree(tmp_path / "ckpt" / "orders" / "exchange")
    p = _orders(tmp_path)
    env = TaskEnv(str(tmp_path / "new"), "orders", p, unit_timeout=30)
    driver = JobDriver(
        p,
        job.InProcessDispatcher(env),
        storage=JobStorage(str(tmp_path / "new"), "orders"),
        restore_from=str(tmp_path / "ckpt" / "orders" / "chk-3"),
    )
    with pytest.raises(
        RestoreError,
        match=r"checkpoint 3 of .* holds exchange 'by-customer', but its segments are not at "
        r".*exchange/by-customer; restore a checkpoint of a job root that still holds them, or "
        r"a savepoint \(it carries its exchanges' backlog\)$",
    ):
        driver.run()


def test_restore_with_another_upstream_parallelism_keeps_counts_exact(tmp_path: Path) -> None:
    _driver(tmp_path, _orders(tmp_path, upstream=3), Faults(units={(2, 0): "fail"})).run(
        max_checkpoints=3
    )
    summary = _driver(tmp_path, _orders(tmp_path, upstream=2)).run()
    assert summary.finished and summary.restored_from == 3
    assert summary.restore_notes[0] == "files: 3 -> 2"
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()


def test_dead_letters_on_both_sides_of_an_exchange(tmp_path: Path) -> None:
    from regional.dataflow.pipeline import Pipeline
    from regional.sinks.parquet import ParquetSink, read_table
    from regional.sources.files import FileSource

    job.write_orders(str(tmp_path / "orders"))

    def parse(record: dict) -> dict:
        if record["order"] == 2005:
            raise ValueError("bad order 2005")
        return job.parse(record)

    def count(ctx: Any, record: dict) -> Any:
        if record["order"] == 3007:
            raise ValueError("bad order 3007")
        return job.running_count(ctx, record)

    p = Pipeline(
        "orders",
        records_per_epoch=15,
        on_error="dead-letter",
        dead_letter=ParquetSink(str(tmp_path / "dead")),
    )
    (
        p.source(FileSource(str(tmp_path / "orders"), format="jsonl"), parallelism=3, name="files")
        .map(parse, name="parse")
        .key_by(job.customer, partitions=4, name="by-customer")
        .process(lambda ctx, r: list(count(ctx, r)), name="totals")
        .sink(ParquetSink(str(tmp_path / "table")), name="out")
    )
    assert p.regions().num_units == 7  # a dead-letter sink per stage: no units merged
    assert _driver(tmp_path, p).run().finished
    dead = read_table(str(tmp_path / "dead")).to_pylist()
    assert sorted((d["operator"], d["error_message"]) for d in dead) == [
        ("parse", "bad order 2005"),
        ("totals", "bad order 3007"),
    ]
    assert sum(1 for _ in job.rows(str(tmp_path / "table"))) == len(job.expected_rows()) - 2


# --- on an object store ---------------------------------------------------------------------


@pytest.mark.s3
def test_the_exchange_on_s3_through_a_crash_and_a_rescale(s3_server: Any, tmp_path: Path) -> None:
    root = s3_server.uri(s3_server.new_bucket(), "ckpt")

    def driver(partitions: int, faults: Faults | None = None) -> JobDriver:
        p = _orders(tmp_path, partitions=partitions)
        faults = faults or Faults()
        env = TaskEnv(root, "orders", p, unit_timeout=60, faults=faults.unit_faults())
        storage = JobStorage(root, "orders")
        return JobDriver(p, job.InProcessDispatcher(env), storage=storage, faults=faults)

    crashing = driver(
        4, Faults(units={(2, 0): "fail", (3, 5): "fail"}, crash_at=(4, "after-metadata"))
    )
    with pytest.raises(DriverCrash):
        crashing.run()
    summary = driver(3).run()  # resumes from checkpoint 4 with 3 partitions instead of 4
    assert summary.finished and summary.restored_from == 4
    assert any("moved from 4 to 3 partitions" in n for n in summary.restore_notes)
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()
    from cleaner.run import scan

    # the driver's cleaning deleted every segment no kept checkpoint needs (the old layout's
    # too) as it went: a full plan now finds none to delete
    plan = scan(JobStorage(root, "orders"), num_retained=3)
    assert [d.path for d in plan.deletions if d.path.startswith("exchange/")] == []
    assert not any(segment_of(d.path) and "/n4/" in d.path for d in plan.files)


# --- committed segments are verified (issue 25 item 3) ----------------------------------------


def _unread_segment(tmp_path: Path) -> Path:
    """Run 3 checkpoints; the first committed segment of partition 0 that checkpoint 3's
    reader has not read yet."""
    _driver(tmp_path, _orders(tmp_path)).run(max_checkpoints=3)
    md = JobStorage(str(tmp_path / "ckpt"), "orders").read_metadata(3)
    [state] = [s for s in md.subtasks if s.vertex_id == "by-customer" and s.index == 0]
    cursor = Cursor.decode(state.split_states[0].position if state.split_states else b"")
    directory = tmp_path / "ckpt" / "orders" / "exchange" / "by-customer" / "n4" / "p0"
    unread = sorted(
        p
        for p in directory.iterdir()
        if (s := segment_of(f"exchange/by-customer/n4/p0/{p.name}")) is not None
        and not cursor.passed(s.segment)
    )
    return unread[0]


@pytest.mark.parametrize("damage", ["deleted", "truncated"])
def test_a_deleted_or_truncated_segment_is_refused_by_the_resume_and_validate(
    tmp_path: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from regional.cli import main
    from regional.errors import RestoreError

    segment = _unread_segment(tmp_path)
    if damage == "deleted":
        segment.unlink()
        what = "is missing (it was deleted)"
    else:
        data = segment.read_bytes()
        segment.write_bytes(data[: len(data) // 2])
        what = f"has {len(data) // 2} bytes, its commit record (checkpoint "
    relative = f"exchange/by-customer/n4/p0/{segment.name}"
    with pytest.raises(RestoreError) as refused:
        _driver(tmp_path, _orders(tmp_path)).run()
    message = str(refused.value)
    assert message.startswith(
        f"cannot resume from checkpoint 3: exchange 'by-customer': segment {segment}"
    )
    assert what in message
    assert main(["inspect", str(tmp_path / "ckpt"), "validate", "--json"]) == 1
    rows = json.loads(capsys.readouterr().out)
    problems = [r for r in rows if r["path"] == relative]
    assert 3 in {r["checkpoint_id"] for r in problems}  # and each older one that needs it
    assert ("missing" if damage == "deleted" else "truncated or replaced") in problems[0]["problem"]


def test_a_segment_replaced_with_other_rows_of_the_same_size_fails_its_checksum(
    tmp_path: Path,
) -> None:
    segment = _unread_segment(tmp_path)
    data = bytearray(segment.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    segment.write_bytes(bytes(data))
    reader = ExchangeReader("by-customer", 4, bounded=True)
    reader.bind(str(tmp_path / "ckpt" / "orders" / "exchange" / "by-customer"), None)
    md = JobStorage(str(tmp_path / "ckpt"), "orders").read_metadata(3)
    [state] = [s for s in md.subtasks if s.vertex_id == "by-customer" and s.index == 0]
    position = state.split_states[0].position if state.split_states else b""
    with pytest.raises(CommitError, match=rf"segment {segment} fails the checksum its commit"):
        reader.read(split_id(4, 0), position, 10**6)


def test_a_segment_without_a_commit_record_before_committed_ones_is_refused(
    tmp_path: Path,
) -> None:
    reader = _partition_dir(tmp_path, [(2, 0, 3)])  # committed, with its record
    forged = tmp_path / "x" / "n1" / "p0" / SegmentName(1, 0).file_name()
    pq.write_table(pa.table({"c": [9]}), forged)  # no commit wrote it
    with pytest.raises(CommitError, match=r"has no commit record, though later segments"):
        reader.read("n1-p0", b"", 100)
