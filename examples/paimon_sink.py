"""Exactly-once output into an Apache Paimon append table (needs `regional-checkpoints[paimon]`).

    python examples/paimon_sink.py                  # the demo: a driver crash, then resume
    regional run examples/paimon_sink.py --checkpoint-dir /tmp/pm-ckpt --max-checkpoints 2
    regional run examples/paimon_sink.py --checkpoint-dir /tmp/pm-ckpt   # resumes, finishes
    python examples/paimon_sink.py --read /tmp/pm-ckpt-paimon            # snapshots and rows

A pipeline of 8 regions: generated clicks (8 splits x 200) -> a per-user click count (keyed
state, scoped by split) -> the Paimon table `demo.clicks` in a filesystem warehouse. Unit 2 fails
at checkpoint 2, which completes as a regional checkpoint: the snapshot of checkpoint 2 records
unit 2 as a fallback unit. In the demo the driver then dies right after checkpoint 3's metadata is
written (before its commit); a new driver resumes on the same checkpoint directory, re-commits
checkpoint 3 and finishes. The rows read back with pypaimon must equal the expected rows exactly.
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
from regional.sinks.paimon import PaimonSink
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
    """8 parallel regions: generated clicks -> keyed count -> Paimon table `demo.clicks`."""
    p = Pipeline("paimon-demo", records_per_epoch=PER_EPOCH)
    clicks = p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT), parallelism=8, name="clicks"
    )
    counted = clicks.key_by(lambda c: c["user"]).process(count_clicks, name="count")
    counted.sink(PaimonSink(warehouse, TABLE, schema=SCHEMA), name="paimon")
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


def read_back(warehouse: str) -> tuple[list, list[tuple]]:
    """The table's snapshots and its rows, read with pypaimon alone."""
    from pypaimon import CatalogFactory

    table = CatalogFactory.create({"warehouse": warehouse}).get_table(TABLE)
    snapshots = table.snapshot_manager().list_snapshots()
    rb = table.new_read_builder()
    t = rb.new_read().to_arrow(rb.new_scan().plan().splits())
    rows = sorted(zip(*(t.column(c).to_pylist() for c in SCHEMA.names), strict=True))
    return snapshots, rows


def report(warehouse: str) -> bool:
    snapshots, rows = read_back(warehouse)
    for s in snapshots:
        print(
            f"  snapshot {s.id}: user {s.commit_user}  identifier {s.commit_identifier}  "
            f"+{s.delta_record_count} rows  {s.properties}"
        )
    same = rows == expected_rows()
    print(
        f"rows read back: {len(rows)}, expected {len(expected_rows())} -> "
        + ("IDENTICAL (exactly-once)" if same else "DIFFERENT")
    )
    return same


#: Unit 2 fails at checkpoint 2 (an exception in the task: a decline, then a fallback).
FAULTS = Faults(units={(2, 2): "fail"})

if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(tempfile.gettempdir(), "pm"))
    pipeline = build_pipeline(_root.rstrip("/") + "-paimon")
    faults = FAULTS


def main(argv: list[str]) -> int:
    if argv[:1] == ["--read"] and len(argv) == 2:
        return 0 if report(argv[1]) else 1
    from regional.runtime.session import spark_session
    from regional.runtime.spark import DriverCrash, SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-paimon-")
    warehouse, root = os.path.join(work, "warehouse"), os.path.join(work, "ckpt")
    print("starting Spark (local[*]; Spark's own log goes to spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "spark.log"))

    def show(r) -> None:
        fb = ",".join(map(str, r.fallback_units)) or "-"
        print(f"  checkpoint {r.checkpoint_id}  {r.kind:<8}  fallback {fb}", flush=True)

    print("run 1: unit 2 fails at checkpoint 2; the driver dies after checkpoint 3's metadata")
    crash = Faults(units=FAULTS.units, crash_at=(3, "after-metadata"))
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
