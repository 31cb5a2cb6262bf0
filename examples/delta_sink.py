"""Exactly-once output into a Delta Lake table (needs `regional-checkpoints[delta]`).

    python examples/delta_sink.py                  # the demo: a driver crash, then resume
    regional run examples/delta_sink.py --checkpoint-dir /tmp/dl-ckpt --max-checkpoints 2
    regional run examples/delta_sink.py --checkpoint-dir /tmp/dl-ckpt   # resumes, finishes
    python examples/delta_sink.py --read /tmp/dl-ckpt-delta            # versions and rows

A pipeline of 8 regions: generated clicks (8 splits x 200) -> a per-user click count (keyed
state, scoped by split) -> the Delta table at `<dir>/clicks`. Unit 2 fails at checkpoint 2,
which completes as a regional checkpoint: the version of checkpoint 2 records unit 2 as a
fallback unit. In the demo the driver then dies right after checkpoint 3's metadata is written
(before its commit); a new driver resumes on the same checkpoint directory, re-commits checkpoint
3 and finishes. The rows read back with deltalake, and with DuckDB over the files the Delta log
lists, must equal the expected rows exactly.
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
from regional.sinks.delta import DeltaSink
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH = 8, 200, 50
SCHEMA = pa.schema(
    [("split", pa.int64()), ("n", pa.int64()), ("user", pa.string()), ("clicks", pa.int64())]
)


def click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"user-{(split * 7 + n * 3) % 11}"}


def count_clicks(ctx, record):
    clicks = ctx.value_state("clicks", 0)
    clicks.update(clicks.value() + 1)
    yield {**record, "clicks": clicks.value()}


def build_pipeline(table: str) -> Pipeline:
    """8 parallel regions: generated clicks -> keyed count -> the Delta table at `table`."""
    p = Pipeline("delta-demo", records_per_epoch=PER_EPOCH)
    clicks = p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT), parallelism=8, name="clicks"
    )
    counted = clicks.key_by(lambda c: c["user"]).process(count_clicks, name="count")
    counted.sink(DeltaSink(table, schema=SCHEMA), name="delta")
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


def read_back(table: str) -> tuple[list[dict], list[tuple], list[tuple]]:
    """The table's commits (newest first), its rows read with deltalake alone, and its rows read
    with DuckDB over the data files the Delta log lists."""
    import duckdb
    from deltalake import DeltaTable

    dt = DeltaTable(table)
    t = dt.to_pyarrow_table()
    rows = sorted(zip(*(t.column(c).to_pylist() for c in SCHEMA.names), strict=True))
    columns = ", ".join(f'"{c}"' for c in SCHEMA.names)
    files = dt.file_uris()
    via_duckdb = (
        sorted(duckdb.execute(f"SELECT {columns} FROM read_parquet({files!r})").fetchall())
        if files
        else []
    )
    return dt.history(), rows, via_duckdb


def report(table: str) -> bool:
    history, rows, via_duckdb = read_back(table)
    for h in reversed(history):
        if "regional.checkpoint-id" in h:
            print(
                f"  version {h['version']}: checkpoint {h['regional.checkpoint-id']}  "
                f"user {h['regional.commit-user']}  "
                f"fallback units {h['regional.fallback-units']}"
            )
        else:
            print(f"  version {h['version']}: {h['operation']}")
    expected = expected_rows()
    same = rows == expected and via_duckdb == expected
    print(
        f"rows read back: deltalake {len(rows)}, DuckDB {len(via_duckdb)}, expected "
        f"{len(expected)} -> " + ("IDENTICAL (exactly-once)" if same else "DIFFERENT")
    )
    return same


#: Unit 2 fails at checkpoint 2 (an exception in the task: a decline, then a fallback).
FAULTS = Faults(units={(2, 2): "fail"})

if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(tempfile.gettempdir(), "dl"))
    pipeline = build_pipeline(_root.rstrip("/") + "-delta")
    faults = FAULTS


def main(argv: list[str]) -> int:
    if argv[:1] == ["--read"] and len(argv) == 2:
        return 0 if report(argv[1]) else 1
    from regional.runtime.session import spark_session
    from regional.runtime.spark import DriverCrash, SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-delta-")
    table, root = os.path.join(work, "clicks"), os.path.join(work, "ckpt")
    print("starting Spark (local[*]; Spark's own log goes to spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "spark.log"))

    def show(r) -> None:
        fb = ",".join(map(str, r.fallback_units)) or "-"
        print(f"  checkpoint {r.checkpoint_id}  {r.kind:<8}  fallback {fb}", flush=True)

    print("run 1: unit 2 fails at checkpoint 2; the driver dies after checkpoint 3's metadata")
    crash = Faults(units=FAULTS.units, crash_at=(3, "after-metadata"))
    try:
        SparkRuntime(build_pipeline(table), spark, root=root, faults=crash, progress=show).run()
    except DriverCrash as exc:
        print(f"  -> driver crash: {exc}")
    print("run 2: a new driver on the same checkpoint directory")
    summary = SparkRuntime(build_pipeline(table), spark, root=root, progress=show).run()
    print(f"  -> restored from checkpoint {summary.restored_from}, finished: {summary.finished}")
    print(f"Delta table {table}:")
    same = report(table)
    print(f"total {time.monotonic() - started:.1f} s")
    spark.stop()
    return 0 if same and summary.finished else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
