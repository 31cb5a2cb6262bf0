"""Exactly-once output into an Apache Iceberg table (needs `regional-checkpoints[iceberg]`).

    python examples/iceberg_sink.py                  # the demo: a driver crash, then resume
    regional run examples/iceberg_sink.py --checkpoint-dir /tmp/ib-ckpt --max-checkpoints 2
    regional run examples/iceberg_sink.py --checkpoint-dir /tmp/ib-ckpt   # resumes, finishes
    python examples/iceberg_sink.py --read /tmp/ib-ckpt-iceberg            # snapshots and rows

A pipeline of 8 regions: generated clicks (8 splits x 200) -> a per-user click count (keyed
state, scoped by split) -> the Iceberg table `demo.clicks` in a warehouse directory with an
embedded SQLite catalog (`catalog.db`). Unit 2 fails at checkpoint 2, which completes as a
regional checkpoint: the snapshot of checkpoint 2 records unit 2 as a fallback unit. In the demo
the driver then dies right after checkpoint 3's commit (the commit landed, the driver never
learnt it); a new driver resumes on the same checkpoint directory, finds checkpoint 3 in the
table's snapshots, does not commit it again, and finishes. The rows read back with pyiceberg, and
with DuckDB over the data files of the current snapshot, must equal the expected rows exactly.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections import Counter

import pyarrow as pa

from regional.dataflow.pipeline import Pipeline
from regional.runtime.faults import Faults
from regional.sinks.iceberg import IcebergSink
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH = 8, 200, 50
TABLE = "demo.clicks"
SCHEMA = pa.schema(
    [("split", pa.int64()), ("n", pa.int64()), ("user", pa.string()), ("clicks", pa.int64())]
)


def click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"user-{(split * 7 + n * 3) % 11}"}


def count_clicks(ctx, record):
    clicks = ctx.value_state("clicks", 0)
    clicks.update(clicks.value() + 1)
    yield {**record, "clicks": clicks.value()}


def build_pipeline(warehouse: str) -> Pipeline:
    """8 parallel regions: generated clicks -> keyed count -> Iceberg table `demo.clicks`."""
    p = Pipeline("iceberg-demo", records_per_epoch=PER_EPOCH)
    clicks = p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT), parallelism=8, name="clicks"
    )
    counted = clicks.key_by(lambda c: c["user"]).process(count_clicks, name="count")
    counted.sink(IcebergSink(warehouse, TABLE, schema=SCHEMA), name="iceberg")
    return p


def expected_rows() -> list[tuple]:
    rows = []
    for split in range(SPLITS):
        seen: Counter[str] = Counter()
        for n in range(PER_SPLIT):
            c = click(split, n)
            seen[c["user"]] += 1
            rows.append((split, n, c["user"], seen[c["user"]]))
    return sorted(rows)


def read_back(warehouse: str) -> tuple[list, list[tuple], list[tuple]]:
    """The table's snapshots (oldest first), its rows read with pyiceberg, and its rows read
    with DuckDB over the data files listed by the current snapshot's manifests."""
    import duckdb
    from pyiceberg.catalog import load_catalog
    from pyiceberg.table.snapshots import ancestors_of

    catalog = load_catalog(
        "regional",
        type="sql",
        uri=f"sqlite:///{os.path.abspath(warehouse)}/catalog.db",
        warehouse=f"file://{os.path.abspath(warehouse)}",
    )
    table = catalog.load_table(TABLE)
    snapshot = table.current_snapshot()
    snapshots = list(reversed(list(ancestors_of(snapshot, table.metadata))))
    t = table.scan().to_arrow()
    rows = sorted(zip(*(t.column(c).to_pylist() for c in SCHEMA.names), strict=True))
    files = [
        e.data_file.file_path.removeprefix("file://")
        for m in (snapshot.manifests(table.io) if snapshot else [])
        for e in m.fetch_manifest_entry(table.io)
    ]
    by_duckdb = (
        sorted(duckdb.execute(f"select * from read_parquet({files!r})").fetchall()) if files else []
    )
    return snapshots, rows, by_duckdb


def report(warehouse: str) -> bool:
    snapshots, rows, by_duckdb = read_back(warehouse)
    for s in snapshots:
        p = s.summary.model_dump()
        print(
            f"  snapshot {s.snapshot_id}: user {p['regional.commit-user']}  checkpoint "
            f"{p['regional.checkpoint-id']}  +{p['added-records']} rows  "
            f"fallback {p['regional.fallback-units']}"
        )
    same = rows == by_duckdb == expected_rows()
    print(
        f"rows read back: pyiceberg {len(rows)}, DuckDB {len(by_duckdb)}, expected "
        f"{len(expected_rows())} -> " + ("IDENTICAL (exactly-once)" if same else "DIFFERENT")
    )
    return same


#: Unit 2 fails at checkpoint 2 (an exception in the task: a decline, then a fallback).
FAULTS = Faults(units={(2, 2): "fail"})

if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(tempfile.gettempdir(), "ib"))
    pipeline = build_pipeline(_root.rstrip("/") + "-iceberg")
    faults = FAULTS


def main(argv: list[str]) -> int:
    if argv[:1] == ["--read"] and len(argv) == 2:
        return 0 if report(argv[1]) else 1
    from regional.runtime.session import spark_session
    from regional.runtime.spark import DriverCrash, SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-iceberg-")
    warehouse, root = os.path.join(work, "warehouse"), os.path.join(work, "ckpt")
    print("starting Spark (local[*]; Spark's own log goes to spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "spark.log"))

    def show(r) -> None:
        fb = ",".join(map(str, r.fallback_units)) or "-"
        print(f"  checkpoint {r.checkpoint_id}  {r.kind:<8}  fallback {fb}", flush=True)

    print("run 1: unit 2 fails at checkpoint 2; the driver dies after checkpoint 3's commit")
    crash = Faults(units=FAULTS.units, crash_at=(3, "after-commit"))
    try:
        SparkRuntime(build_pipeline(warehouse), spark, root=root, faults=crash, progress=show).run()
    except DriverCrash as exc:
        print(f"  -> driver crash: {exc}")
    print("run 2: a new driver on the same checkpoint directory")
    summary = SparkRuntime(build_pipeline(warehouse), spark, root=root, progress=show).run()
    print(f"  -> restored from checkpoint {summary.restored_from}, finished: {summary.finished}")
    print(f"table {TABLE} in {warehouse}:")
    same = report(warehouse)
    print(f"total {time.monotonic() - started:.1f} s")
    spark.stop()
    return 0 if same and summary.finished else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
