"""Keyed totals: per-customer running totals across a durable keyed exchange, with regional
checkpoints on both sides of it.

    python examples/keyed_totals.py                      # the demo, about 30 s with Spark's start
    regional run examples/keyed_totals.py --checkpoint-dir /tmp/kt-ckpt

The demo writes 8 JSON-lines files of 150 orders (1,200 orders of 12 customers) and runs

    files (4 subtasks) -> parse -> key_by(customer, partitions=4) -> totals (4 subtasks) -> table

The `key_by(..., partitions=4)` ends the first stage with a durable exchange: each order is
written to the partition its customer hashes to, committed with the checkpoint, and read back
by the downstream subtask owning that partition one epoch later. So `totals` keeps one running
total per customer across every input file (key-scoped state), not one per file. The two stages
are separate fallback units (4 upstream, 4 downstream): upstream unit 1 fails at checkpoint 2,
downstream unit 5 at checkpoints 3 and 4, upstream unit 0 and downstream unit 6 at checkpoint 5.
Each of those checkpoints completes as a *regional* checkpoint around the failing unit. At the
end the demo checks the committed table with Spark SQL: every customer's final total must equal
``groupBy(customer).count()`` (and the sum of its amounts) over the input, and its running
counts must be exactly 1..n, each once.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.runtime.faults import Faults
from regional.sinks.parquet import ParquetSink
from regional.sources.files import FileSource

FILES, ORDERS_PER_FILE, CUSTOMERS = 8, 150, 12
CHANNELS = ("web", "app", "store")
UPSTREAM, PARTITIONS = 4, 4


def make_orders(directory: str, *, files: int = FILES, per_file: int = ORDERS_PER_FILE) -> str:
    """Write `files` JSON-lines files of `per_file` orders each (deterministic); returns the dir."""
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        path = os.path.join(directory, f"orders-{f:02d}.jsonl")
        if os.path.exists(path):
            continue
        lines = []
        for n in range(per_file):
            k = f * per_file + n
            order = {
                "order": k,
                "customer": f"c{(k * 7 + f) % CUSTOMERS:02d}",
                "amount": 100 + (k * 37) % 900,  # cents
                "channel": CHANNELS[(k * 5 + f) % len(CHANNELS)],
            }
            lines.append(json.dumps(order))
        with open(path + ".tmp", "w") as out:
            out.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)  # files appear complete
    return directory


def parse(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "customer": str(record["customer"]),
        "order": int(record["order"]),
        "amount": int(record["amount"]),
        "channel": str(record["channel"]),
    }


def customer(order: dict[str, Any]) -> str:
    return str(order["customer"])


def running_total(ctx: Any, order: dict[str, Any]) -> Any:
    """Per customer, over every file: orders so far, cents spent so far (value state) and
    orders per channel (map state)."""
    orders = ctx.value_state("orders", 0)
    spent = ctx.value_state("spent", 0)
    channels = ctx.map_state("channels")
    orders.update(orders.value() + 1)
    spent.update(spent.value() + order["amount"])
    channels[order["channel"]] = channels.get(order["channel"], 0) + 1
    yield {
        "customer": order["customer"],
        "orders": orders.value(),
        "spent": spent.value(),
        "channel": order["channel"],
        "channel_orders": channels[order["channel"]],
    }


def build_pipeline(orders_dir: str, table_dir: str) -> Pipeline:
    """Two stages joined by a durable keyed exchange: 4 + 4 fallback units."""
    p = Pipeline("keyed-totals", records_per_epoch=50)
    (
        p.source(FileSource(orders_dir, format="jsonl"), parallelism=UPSTREAM, name="files")
        .map(parse, name="parse")
        .key_by(customer, partitions=PARTITIONS, name="by-customer")
        .process(running_total, name="totals")
        .sink(ParquetSink(table_dir), name="table")
    )
    return p


#: Units 0-3 run files -> parse -> the exchange's writer; units 4-7 the exchange's reader ->
#: totals -> table. One or two units fail at checkpoints 2 to 5, on both sides.
FAULTS = Faults(
    units={(2, 1): "fail", (3, 5): "fail", (4, 5): "fail", (5, 0): "fail", (5, 6): "fail"}
)

_WORK = os.path.join(tempfile.gettempdir(), "regional-keyed-totals")


def beside(root: str, suffix: str) -> str:
    """A location next to the checkpoint root, keeping a URI's query (endpoint, scheme).

    >>> beside("s3://bucket/ckpt?scheme=http", "-table"), beside("/tmp/ckpt/", "-table")
    ('s3://bucket/ckpt-table?scheme=http', '/tmp/ckpt-table')
    """
    path, mark, query = root.partition("?")
    return path.rstrip("/") + suffix + mark + query


if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(_WORK, "ckpt"))
    pipeline = build_pipeline(make_orders(os.path.join(_WORK, "orders")), beside(_root, "-table"))
    faults = FAULTS


def check_totals(spark: Any, orders_dir: str, table_dir: str) -> list[str]:
    """What differs between the committed table and Spark SQL over the input, one line per
    customer at fault (empty: identical). Per customer the table must hold the running counts
    1..n, each once, with n = ``groupBy(customer).count()``, and its last row's `spent` must be
    the sum of its amounts."""
    from pyspark.sql import functions as F

    want = {
        r["customer"]: (r["count"], r["spent"])
        for r in spark.read.json(orders_dir)
        .groupBy("customer")
        .agg(F.count("*").alias("count"), F.sum("amount").alias("spent"))
        .collect()
    }
    got = {
        r["customer"]: (r["rows"], r["distinct"], r["orders"], r["spent"])
        for r in spark.read.parquet(table_dir)
        .groupBy("customer")
        .agg(
            F.count("*").alias("rows"),
            F.countDistinct("orders").alias("distinct"),
            F.max("orders").alias("orders"),
            F.max("spent").alias("spent"),
        )
        .collect()
    }
    problems = []
    for c in sorted(want.keys() | got.keys()):
        count, spent = want.get(c, (0, 0))
        rows, distinct, orders, total = got.get(c, (0, 0, 0, 0))
        if (rows, distinct, orders, total) != (count, count, count, spent):
            problems.append(
                f"{c}: input {count} orders, {spent} cents; table: total {orders} orders, "
                f"{total} cents, {rows} rows ({distinct} distinct counts)"
            )
    return problems


def show(event: Any) -> None:
    """One line per checkpoint outcome."""
    fb = ",".join(map(str, event.fallback_units)) or "-"
    print(
        f"  checkpoint {event.checkpoint_id:>2}  {event.kind:<8}  fresh units {event.fresh_units}"
        f"  fallback {fb:<3}  records read (both stages) "
        f"{event.records_in + event.records_exchanged}",
        flush=True,
    )


def main() -> int:
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-keyed-totals-")
    orders = make_orders(os.path.join(work, "orders"))
    print(f"orders: {FILES} files x {ORDERS_PER_FILE} orders of {CUSTOMERS} customers in {orders}")
    print("starting Spark (local[*]; its log goes to keyed-totals-spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "keyed-totals-spark.log"))
    table = os.path.join(work, "table")
    p = build_pipeline(orders, table)
    plan = p.regions()
    print(
        f"\n{plan.num_units} fallback units: 0-{UPSTREAM - 1} files -> parse -> exchange writer, "
        f"{UPSTREAM}-{plan.num_units - 1} exchange reader -> totals -> table"
    )
    print("faults: unit 1 at checkpoint 2, unit 5 at 3 and 4, units 0 and 6 at 5")
    summary = SparkRuntime(p, spark, root=os.path.join(work, "ckpt"), faults=FAULTS, progress=show)
    result = summary.run()
    print(
        f"  -> {result.count('regional')} regional, {result.count('global')} global, "
        f"{result.count('aborted')} aborted checkpoints in {result.seconds:.1f} s"
    )
    problems = check_totals(spark, orders, table)
    print(
        "\nfinal totals per customer vs Spark SQL groupBy(customer).count() over the input -> "
        + ("IDENTICAL (exactly-once)" if not problems else "DIFFERENT")
    )
    for line in problems:
        print(f"  {line}")
    print(f"total {time.monotonic() - started:.1f} s; files in {work}")
    spark.stop()
    return 0 if not problems and result.finished else 1


if __name__ == "__main__":
    sys.exit(main())
