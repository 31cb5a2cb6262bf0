"""The Parquet sink's commit log: per-commit time as the job ages (issue 17).

Commits one small staged file per checkpoint into a `ParquetSink`, as the driver does
(`perform_commit`: the latest-committed check, publishing, the record), and prints the median
time of one commit (wall clock, and the process's CPU time, which other load on the machine
does not inflate) over the `WINDOW` commits before 100, 1,000, 10,000 and 20,000 earlier
commits, with the time a restarted driver's first lookup of the latest commit takes there. Before
the grouped log and the in-memory latest, one commit took 0.23 ms after 100 commits and 60 ms
after 20,000 (it listed the whole commit log twice). Staging is not timed.

The table lives on a tmpfs by default (`/dev/shm`, else the temp directory): the log's growth is
what is measured, not the disk's fsync latency (`--dir` to choose).

    python -m benchmarks.bench_commit_log [--quick] [--dir DIR]   # --quick: up to 10,000
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import pyarrow as pa

from regional.coordinator.commit import perform_commit
from regional.coordinator.decisions import Commit
from regional.sinks.base import WriteContext
from regional.sinks.parquet import ParquetSink

__all__ = ["main", "measure"]

MARKS = (100, 1_000, 10_000, 20_000)
QUICK_MARKS = (100, 1_000, 10_000)
WINDOW = 50  # commits timed before each mark
WARM_UP = 500  # commits into another table first (imports, caches), not reported
USER = "job-run-out"


def measure(path: str, marks: tuple[int, ...], *, user: str = USER) -> list[dict[str, float]]:
    """Per mark: the median ms of one commit over the `WINDOW` commits up to it, and the ms of
    a fresh sink's first `latest_committed` (a restarted driver's lookup)."""
    sink = ParquetSink(path)
    batch = [pa.record_batch({"v": [1, 2, 3]})]
    rows = []
    timed: list[tuple[float, float]] = []  # (wall, CPU) seconds of one commit
    for cid in range(1, marks[-1] + 1):
        staged = sink.write(
            batch,
            WriteContext(
                job_id="job",
                run_id="run",
                checkpoint_id=cid,
                attempt=0,
                unit_id=0,
                vertex_id="out",
                index=0,
            ),
        )
        started, cpu = time.perf_counter(), time.process_time()
        perform_commit(Commit(cid, "out", user, staged), sink)
        elapsed = (time.perf_counter() - started, time.process_time() - cpu)
        mark = next(m for m in marks if m >= cid)
        if cid > mark - WINDOW:
            timed.append(elapsed)
        if cid == mark:
            lookups = []
            for _ in range(5):
                started = time.perf_counter()
                ParquetSink(path).latest_committed(user)
                lookups.append(time.perf_counter() - started)
            rows.append(
                {
                    "commits": mark,
                    "commit_ms": statistics.median(t for t, _ in timed) * 1000,
                    "commit_cpu_ms": statistics.median(c for _, c in timed) * 1000,
                    "lookup_ms": statistics.median(lookups) * 1000,
                }
            )
            timed = []
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.bench_commit_log", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--quick", action="store_true", help="up to 10,000 commits")
    parser.add_argument("--dir", help="where the table is made (default: a tmpfs if there is one)")
    args = parser.parse_args(argv)
    marks = QUICK_MARKS if args.quick else MARKS
    parent = args.dir or ("/dev/shm" if os.path.isdir("/dev/shm") else None)
    path = tempfile.mkdtemp(prefix="bench-commit-log-", dir=parent)
    try:
        print(f"Parquet sink commit log in {path}: median of {WINDOW} commits before each mark")
        measure(os.path.join(path, "warm-up"), (WARM_UP,), user="warm-up")  # not reported
        rows = measure(os.path.join(path, "table"), marks)
    finally:
        shutil.rmtree(path, ignore_errors=True)
    print(f"{'commits':>8}  {'per commit ms':>13}  {'CPU ms':>7}  {'restart lookup ms':>17}")
    for r in rows:
        print(
            f"{r['commits']:>8,}  {r['commit_ms']:>13.3f}  {r['commit_cpu_ms']:>7.3f}  "
            f"{r['lookup_ms']:>17.3f}"
        )
    for key, what in (("commit_ms", "wall"), ("commit_cpu_ms", "CPU")):
        times = [r[key] for r in rows]
        ratio = max(times) / min(times)
        print(f"slowest / fastest per-commit median ({what}): {ratio:.2f}x (target: within 1.2x)")


if __name__ == "__main__":
    main()
