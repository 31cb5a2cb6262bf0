"""The partial-failure benchmark's measurements, on a hand-made run (no Spark): commit latency
counts from a record's first read, re-reads count as re-processed, lag counts epochs behind,
and a table that is not exactly-once is refused."""

from __future__ import annotations

import pathlib

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from benchmarks import bench_partial_failures as bench


def _file(path: pathlib.Path, *ranges: tuple[int, int, int]) -> str:
    """A Parquet file holding records lo..hi-1 of each (split, lo, hi)."""
    splits = [s for s, lo, hi in ranges for _ in range(lo, hi)]
    ns = [n for _, lo, hi in ranges for n in range(lo, hi)]
    pq.write_table(pa.table({"split": splits, "n": ns}), path)
    return str(path)


def _outcome(tmp_path: pathlib.Path, commits: list[tuple[float, list[str]]]) -> bench.Outcome:
    # split 0: 0..9 read at t=100 (attempt discarded), re-read at 101, 10..19 read at 102
    # split 1: 0..9 read at t=100, 10..19 at 101
    log = tmp_path / "reads"
    log.write_text("0 0 10 100\n1 0 10 100\n0 0 10 101\n1 10 20 101\n0 10 20 102\n")
    epochs = [(False, frozenset({0, 1})), (True, frozenset({0})), (True, frozenset())]
    return bench.Outcome("x", 0.05, 99.0, 10.0, epochs, commits, str(log))


def test_latency_counts_from_the_first_read_and_rereads_are_reprocessed(tmp_path):
    commits = [
        (101.5, [_file(tmp_path / "a", (1, 0, 10))]),
        (103.0, [_file(tmp_path / "b", (0, 0, 20), (1, 10, 20))]),  # several splits in a file
    ]
    row = bench.measure(_outcome(tmp_path, commits))
    assert (row["records_read"], row["records_committed"], row["records_reprocessed"]) == (
        50,
        40,
        10,
    )
    # latencies (x10 records each): split 1 0..9: 1.5 s, 10..19: 2.0 s; split 0 0..9: 3.0 s
    # (first read at 100, not the re-read at 101), 10..19: 1.0 s
    assert (row["p50_latency_s"], row["p99_latency_s"]) == (1.75, 3.0)
    assert row["committed_over_time"] == [(2.5, 10), (4.0, 40)]
    assert (row["completed"], row["aborted"], row["max_unit_lag"]) == (2, 1, 2)


def test_a_record_committed_twice_is_refused(tmp_path):
    commits = [
        (101.5, [_file(tmp_path / "a", (1, 0, 20))]),
        (103.0, [_file(tmp_path / "b", (1, 10, 20))]),
    ]
    with pytest.raises(AssertionError, match="split 1 committed ranges"):
        bench.measure(_outcome(tmp_path, commits))


def test_the_failure_schedule_is_seeded_and_shared():
    a = bench.schedule(7, 0.05, 50, 64)
    assert a == bench.schedule(7, 0.05, 50, 64) != bench.schedule(8, 0.05, 50, 64)
    assert bench.schedule(7, 0.0, 50, 64) == frozenset()
    assert all(1 <= e <= 50 and 0 <= u < 64 for e, u in a)
