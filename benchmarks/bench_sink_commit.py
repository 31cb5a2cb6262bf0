"""Iceberg sink: the cost of one commit as the table's history grows.

A table gets one snapshot per checkpoint, each of 8 data files of 100 rows (8 sink subtasks),
committed by `IcebergSink.commit` on local disk. At the 1st, 100th, 200th and 500th snapshot it
shows, side by side:

- the commit's wall time (the median of 5 commits from that snapshot on);
- the manifests the commit reads (its duplicate-file backstop reads only the snapshots marked
  with the same checkpoint id: none here);
- what pyiceberg's whole-table duplicate check (``add_files(..., check_duplicate_files=True)``,
  the sink's previous backstop) would add to that commit: it reads every manifest of the current
  snapshot, one per append;
- the size of the table's metadata file and manifest list, which every commit rewrites
  (Iceberg's own growth: `expire_snapshots` and manifest merging bound them).

pyiceberg's transaction deep-copies the whole table metadata (every snapshot) each time it reads
it, many times per commit, so a commit still grows with the snapshots the table keeps. With
``--keep-snapshots N`` snapshots beyond the newest N are expired between commits (as a streaming
job's table must be maintained anyway): the commit is then flat, while the whole-table check
still grows, since expiry keeps the manifests of live files.

Run: `.venv/bin/python -m benchmarks.bench_sink_commit [--quick] [--keep-snapshots N]
[--json PATH]`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from regional.sinks.base import WriteContext

if TYPE_CHECKING:
    from regional.sinks.iceberg import IcebergSink

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
USER = "bench-0123456789ab-out"
SUBTASKS, ROWS = 8, 100
SAMPLES = 5


def _stage(sink: IcebergSink, cid: int) -> list[bytes]:
    batch = pa.record_batch(
        {"user": [f"u{i % 17}" for i in range(ROWS)], "n": list(range(ROWS))}, schema=SCHEMA
    )
    return [
        c
        for index in range(SUBTASKS)
        for c in sink.write(
            [batch],
            WriteContext(
                job_id="bench",
                run_id="run",
                checkpoint_id=cid,
                attempt=0,
                unit_id=index,
                vertex_id="out",
                index=index,
            ),
        )
    ]


def _whole_table_check_ms(sink: Any, committables: list[bytes]) -> float:
    """pyiceberg's duplicate check alone (what `check_duplicate_files=True` adds to a commit)."""
    table = sink._refreshed()
    paths = sink.data_files(committables)
    start = time.perf_counter()
    table.transaction()._find_referenced_data_files(paths)  # private: the check add_files runs
    return (time.perf_counter() - start) * 1000


def _expire(sink: Any, keep: int) -> None:
    """Expire all but the newest `keep` snapshots (outside the timed commits)."""
    table = sink._refreshed()
    snapshots = sorted(table.snapshots(), key=lambda s: s.timestamp_ms)
    if len(snapshots) > keep + 50:  # in batches: an expiry is a commit too
        old = [s.snapshot_id for s in snapshots[:-keep]]
        table.maintenance.expire_snapshots().by_ids(old).commit()


def run(points: list[int], keep: int | None = None) -> list[dict[str, float]]:
    import pyiceberg.manifest

    from regional.sinks.iceberg import IcebergSink

    reads = [0]
    fetch = pyiceberg.manifest.ManifestFile.fetch_manifest_entry

    def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return fetch(self, *args, **kwargs)

    pyiceberg.manifest.ManifestFile.fetch_manifest_entry = counted  # type: ignore[method-assign]
    rows: list[dict[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-iceberg-") as tmp:
            sink = IcebergSink(tmp, "bench.commits", schema=SCHEMA)
            wanted = {p: p + SAMPLES - 1 if p > 1 else 1 for p in points}
            times: dict[int, float] = {}
            manifests: dict[int, int] = {}
            for cid in range(1, max(wanted.values()) + 1):
                staged = _stage(sink, cid)
                before = reads[0]
                start = time.perf_counter()
                sink.commit(USER, cid, staged)
                times[cid] = (time.perf_counter() - start) * 1000
                manifests[cid] = reads[0] - before
                if keep is not None:
                    _expire(sink, keep)
                if cid in points:
                    table = sink._refreshed()
                    snapshot = table.current_snapshot()
                    check_ms = _whole_table_check_ms(sink, staged)
                    rows.append(
                        {
                            "snapshot": cid,
                            "snapshots_kept": len(table.snapshots()),
                            "manifests_in_table": len(snapshot.manifests(table.io)),
                            "whole_table_check_ms": check_ms,
                            "metadata_kb": os.path.getsize(
                                table.metadata_location.removeprefix("file://")
                            )
                            / 1000,
                            "manifest_list_kb": os.path.getsize(
                                snapshot.manifest_list.removeprefix("file://")
                            )
                            / 1000,
                        }
                    )
            for row in rows:
                p = int(row["snapshot"])
                sample = range(p, wanted[p] + 1)
                row["commit_ms"] = statistics.median(times[c] for c in sample)
                row["manifests_read_per_commit"] = max(manifests[c] for c in sample)
    finally:
        pyiceberg.manifest.ManifestFile.fetch_manifest_entry = fetch  # type: ignore[method-assign]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="snapshots 1, 20, 50 only")
    parser.add_argument(
        "--keep-snapshots", type=int, help="expire all but the newest N snapshots as it goes"
    )
    parser.add_argument("--json", help="also write the rows as JSON to this path")
    args = parser.parse_args(argv)
    points = [1, 20, 50] if args.quick else [1, 100, 200, 500]
    rows = run(points, args.keep_snapshots)
    print(
        f"{'snapshot':>8}  {'kept':>4}  {'commit ms':>9}  {'manifests read':>14}  "
        f"{'whole-table check ms':>20}  {'manifests':>9}  {'metadata KB':>11}  "
        f"{'manifest list KB':>16}"
    )
    for r in rows:
        print(
            f"{int(r['snapshot']):>8}  {int(r['snapshots_kept']):>4}  {r['commit_ms']:>9.0f}  "
            f"{int(r['manifests_read_per_commit']):>14}  {r['whole_table_check_ms']:>20.0f}  "
            f"{int(r['manifests_in_table']):>9}  {r['metadata_kb']:>11.0f}  "
            f"{r['manifest_list_kb']:>16.1f}"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)


if __name__ == "__main__":
    main()
