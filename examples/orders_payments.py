"""Joins with regional fallback on both sides: orders joined with their payments within 15
minutes of event time, and clicks enriched with the user profile valid when they happened
(the documentation page "Joins and deduplication", docs/joins.md).

    python examples/orders_payments.py              # the demo, about 40 s with Spark's start
    regional run examples/orders_payments.py --checkpoint-dir /tmp/op-ckpt

The demo writes JSON-lines files (deterministic): 4 files of orders, 4 of payments (every
seventh order is never paid, a few payments come more than 15 minutes after their order), 2 of
user-profile changes (upserts and deletes: a changelog) and 4 of clicks, and runs

    orders   (4) --exchange by order_id (4)--+-> interval join, 0..15 min, left outer -> paid
    payments (4) --exchange by order_id (4)--+
    clicks   (4) --exchange by user (4)------+-> temporal join as of the click's time -> enriched
    profiles (2) --exchange by user (4)------+

Each side's upstream units fall back on their own: an orders unit fails at checkpoints 3 and
4, a clicks unit at checkpoint 5, a join unit at checkpoint 6. The joined rows are those of a
fault-free run. At the end the demo checks both tables against Spark SQL over the input files:
a batch left outer join with the same bounds, and an as-of join computed with a window
function (the latest profile change at or before each click), and prints IDENTICAL.
"""

from __future__ import annotations

import datetime as dt
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

FILES, ORDERS_PER_FILE, USERS = 4, 60, 6
PARTITIONS = 4
START = dt.datetime(2026, 11, 26, 9, 0, tzinfo=dt.UTC)


def _write(path: str, rows: list[dict[str, Any]]) -> None:
    if os.path.exists(path):
        return
    with open(path + ".tmp", "w") as out:
        out.write("".join(json.dumps(r) + "\n" for r in rows))
    os.replace(path + ".tmp", path)  # files appear complete


def _at(seconds: float) -> str:
    return (START + dt.timedelta(seconds=seconds)).isoformat()


def make_data(directory: str) -> str:
    """Write the four inputs under `directory` (orders/, payments/, clicks/, profiles/);
    returns it. Order n of file f is placed 20 s after order n-1 and paid 1 to 20 minutes
    later (never when n % 7 == 3); click n of file f is 15 s after click n-1; a user's
    profile changes every 4 minutes, and u5's profile is deleted at minute 12."""
    for name in ("orders", "payments", "clicks", "profiles"):
        os.makedirs(os.path.join(directory, name), exist_ok=True)
    for f in range(FILES):
        orders: list[dict[str, Any]] = []
        payments: list[dict[str, Any]] = []
        clicks: list[dict[str, Any]] = []
        for n in range(ORDERS_PER_FILE):
            oid = f * 1000 + n
            placed = f * 5 + n * 20
            orders.append({"order_id": oid, "ts": _at(placed), "amount": (oid * 37) % 500})
            if n % 7 != 3:
                delay = 60 + (oid * 7919) % (20 * 60)
                payments.append({"order_id": oid, "ts": _at(placed + delay), "method": "card"})
            clicks.append(
                {"user": f"u{(n + f) % USERS}", "ts": _at(f * 3 + n * 15), "n": n, "f": f}
            )
        payments.sort(key=lambda r: str(r["ts"]))
        _write(os.path.join(directory, "orders", f"orders-{f}.jsonl"), orders)
        _write(os.path.join(directory, "payments", f"payments-{f}.jsonl"), payments)
        _write(os.path.join(directory, "clicks", f"clicks-{f}.jsonl"), clicks)
    for f in range(2):
        changes = []
        for minute in range(0, 20, 4):
            for u in range(f, USERS, 2):
                if u == 5 and minute >= 12:
                    if minute == 12:
                        changes.append({"user": "u5", "ts": _at(minute * 60 + u), "deleted": True})
                    continue
                tier = ("bronze", "silver", "gold")[(u + minute // 4) % 3]
                changes.append(
                    {"user": f"u{u}", "ts": _at(minute * 60 + u), "tier": tier, "deleted": False}
                )
        _write(os.path.join(directory, "profiles", f"profiles-{f}.jsonl"), changes)
    return directory


def event_time(record: dict[str, Any]) -> dt.datetime:
    """The record's time (the JSON reader already made the ISO text a datetime)."""
    ts = record["ts"]
    return ts if isinstance(ts, dt.datetime) else dt.datetime.fromisoformat(ts)


def _ms(ts: Any) -> int:
    return int(event_time({"ts": ts}).timestamp() * 1000)


# --8<-- [start:paid]
def paid_row(order: dict[str, Any] | None, payment: dict[str, Any] | None) -> dict[str, Any]:
    """One row per order and payment within 15 minutes; an order never paid in time gets one
    row with paid_at None (a left outer join), once the watermark shows no payment can come."""
    assert order is not None  # a left join: every row has its order
    return {
        "order_id": order["order_id"],
        "amount": order["amount"],
        "ordered_at": _ms(order["ts"]),
        "paid_at": None if payment is None else _ms(payment["ts"]),
    }


# --8<-- [end:paid]


# --8<-- [start:enriched]
def enriched_row(click: dict[str, Any], profile: dict[str, Any] | None) -> dict[str, Any]:
    """A click with the tier its user had when it happened (None: no profile then)."""
    return {
        "user": click["user"],
        "f": click["f"],
        "n": click["n"],
        "tier": None if profile is None else profile["tier"],
    }


# --8<-- [end:enriched]


def build_pipeline(data_dir: str, out_dir: str) -> Pipeline:
    """Four sources, two joins, each side of each join its own fallback units."""
    # --8<-- [start:pipeline]
    p = Pipeline(
        "orders-payments",
        records_per_epoch=15,
        on_error="dead-letter",
        dead_letter=ParquetSink(os.path.join(out_dir, "dead-letters")),
    )

    def source(name: str, files: int) -> Any:
        return p.source(
            FileSource(os.path.join(data_dir, name), format="jsonl"),
            parallelism=files,
            name=name,
            event_time=event_time,
            max_out_of_orderness="30 s",
        )

    orders, payments = source("orders", FILES), source("payments", FILES)
    (
        orders.key_by("order_id")
        .interval_join(
            payments.key_by("order_id"),
            between=("0 s", "15 min"),  # paid at most 15 minutes after the order
            how="left",  # and the orders that were not
            emit=paid_row,
            partitions=PARTITIONS,
            on_late="dead-letter",
            name="paid",
        )
        .sink(ParquetSink(os.path.join(out_dir, "paid")), name="paid_out")
    )
    clicks, profiles = source("clicks", FILES), source("profiles", 2)
    (
        clicks.key_by("user")
        .temporal_join(
            profiles.key_by("user"),  # a changelog: upserts, and deletes
            how="left",
            is_delete="deleted",
            emit=enriched_row,
            partitions=PARTITIONS,
            on_late="dead-letter",
            name="with_profile",
        )
        .sink(ParquetSink(os.path.join(out_dir, "enriched")), name="enriched_out")
    )
    # --8<-- [end:pipeline]
    return p


#: Units 0-3 orders, 4-7 payments, 8-11 clicks, 12-13 profiles (each side's own units); then
#: the joins' units: 14-17 paid, 18-21 with_profile.
FAULTS = Faults(units={(3, 1): "fail", (4, 1): "fail", (5, 9): "fail", (6, 15): "fail"})

_WORK = os.path.join(tempfile.gettempdir(), "regional-orders-payments")


if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(_WORK, "ckpt"))
    pipeline = build_pipeline(make_data(os.path.join(_WORK, "data")), _root.rstrip("/") + "-out")
    faults = FAULTS


def _dead(spark: Any, out_dir: str, operator: str, field: str) -> set[Any]:
    path = os.path.join(out_dir, "dead-letters")
    if not os.path.exists(path):
        return set()
    rows = spark.read.parquet(path).where(f"operator = '{operator}'").collect()
    return {json.loads(r["record"])[field] for r in rows}


def check_joins(spark: Any, data_dir: str, out_dir: str) -> list[str]:
    """What differs between the committed tables and Spark SQL over the input files without
    the records the joins dead-lettered as late, one line per table at fault (empty:
    identical): a batch left outer join with the same bounds, and an as-of join (the latest
    profile change at or before each click, by a window function)."""
    read = spark.read.json
    late_orders = _dead(spark, out_dir, "paid", "order_id")
    read(os.path.join(data_dir, "orders")).selectExpr(
        "order_id", "amount", "to_timestamp(ts) AS ts"
    ).createOrReplaceTempView("orders")
    read(os.path.join(data_dir, "payments")).selectExpr(
        "order_id", "to_timestamp(ts) AS ts"
    ).createOrReplaceTempView("payments")
    want_paid = {
        (r[0], r[1], r[2], r[3])
        for r in spark.sql(
            """
            SELECT o.order_id, o.amount, unix_millis(o.ts), unix_millis(p.ts)
            FROM orders o LEFT JOIN payments p
              ON o.order_id = p.order_id
             AND p.ts BETWEEN o.ts AND o.ts + INTERVAL 15 MINUTES
            """
        ).collect()
        if r[0] not in late_orders
    }
    got_paid = {tuple(r) for r in spark.read.parquet(os.path.join(out_dir, "paid")).collect()}
    read(os.path.join(data_dir, "clicks")).selectExpr(
        "user", "to_timestamp(ts) AS ts", "f", "n"
    ).createOrReplaceTempView("clicks")
    read(os.path.join(data_dir, "profiles")).selectExpr(
        "user", "to_timestamp(ts) AS ts", "tier", "deleted"
    ).createOrReplaceTempView("profiles")
    want_enriched = {
        tuple(r)
        for r in spark.sql(
            """
            SELECT user, f, n, IF(deleted, NULL, tier) AS tier FROM (
              SELECT c.user, c.f, c.n, p.tier, p.deleted,
                     row_number() OVER (PARTITION BY c.user, c.f, c.n ORDER BY p.ts DESC) AS i
              FROM clicks c LEFT JOIN profiles p ON c.user = p.user AND p.ts <= c.ts
            ) WHERE i = 1
            """
        ).collect()
    }
    got_enriched = {
        tuple(r) for r in spark.read.parquet(os.path.join(out_dir, "enriched")).collect()
    }
    problems = []
    for table, want, got in (
        ("paid", want_paid, got_paid),
        ("enriched", want_enriched, got_enriched),
    ):
        if want != got:
            problems.append(
                f"{table}: {len(want - got)} row(s) of Spark SQL missing, {len(got - want)} extra"
            )
    return problems


def show(event: Any) -> None:
    """One line per checkpoint outcome."""
    fb = ",".join(map(str, event.fallback_units)) or "-"
    print(
        f"  checkpoint {event.checkpoint_id:>2}  {event.kind:<8}  fallback {fb:<5}  "
        f"records read {event.records_in:>4}",
        flush=True,
    )


def main() -> int:
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-orders-payments-")
    data = make_data(os.path.join(work, "data"))
    print(f"orders, payments, clicks and profile changes in {data}")
    print("starting Spark (local[*]; its log goes to orders-payments-spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "orders-payments-spark.log"))
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    out = os.path.join(work, "out")
    p = build_pipeline(data, out)
    print(f"\n{p.regions().num_units} fallback units; faults: orders unit 1 at checkpoints 3-4, "
          "clicks unit 9 at 5, paid unit 15 at 6")  # fmt: skip
    runtime = SparkRuntime(p, spark, root=os.path.join(work, "ckpt"), faults=FAULTS, progress=show)
    result = runtime.run()
    print(
        f"  -> {result.count('regional')} regional, {result.count('global')} global, "
        f"{result.count('aborted')} aborted checkpoints in {result.seconds:.1f} s"
    )
    problems = check_joins(spark, data, out)
    print(
        "\npaid orders and enriched clicks vs Spark SQL (a left outer interval join, an as-of "
        "join by window function) -> " + ("IDENTICAL" if not problems else "DIFFERENT")
    )
    for line in problems:
        print(f"  {line}")
    print(f"total {time.monotonic() - started:.1f} s; files in {work}")
    spark.stop()
    return 0 if not problems and result.finished else 1


if __name__ == "__main__":
    sys.exit(main())
