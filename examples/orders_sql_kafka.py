"""Kafka JSON orders and payments, written as Spark SQL stages (needs `regional-checkpoints[kafka,
delta]` and a broker; the documentation page "Getting started", "The same job reading Kafka").

    KAFKA_BOOTSTRAP=localhost:9092 python examples/orders_sql_kafka.py --produce   # demo data
    KAFKA_BOOTSTRAP=localhost:9092 regional run examples/orders_sql_kafka.py \\
        --checkpoint-dir /tmp/osk-ckpt
    KAFKA_BOOTSTRAP=localhost:9092 python examples/orders_sql_kafka.py --read /tmp/osk-ckpt

Topics `orders` and `payments` (`PARTITIONS` partitions each) hold JSON values with a declared
schema (`ORDER`, `PAYMENT`); topic `paid-orders` must exist too. The job:

    orders   --sql: flatten, amount > 0, ms -> timestamp--+--> key_by user, 1 min windows:
                                                          |    orders, total, largest -> Delta
    payments --sql: flatten, ms -> timestamp--------------+--> interval join on order_id,
                                                               paid within 10 min, left ->
                                                               the exactly-once Kafka sink

An order whose value does not fit the schema (an amount of "n/a") is a dead letter in the Delta
table `<dir>-tables/dead`, naming the field; the per-user windows go to `<dir>-tables/per_user`.
Every stage after the sources runs over Arrow columns: the SQL stages in one vectorised call
per batch, the three window aggregates in one Arrow group-by each.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import pyarrow as pa

from regional.dataflow.dead_letters import DEAD_LETTER_SCHEMA
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Tumbling, count, max_of, sum_of
from regional.sinks.delta import DeltaSink
from regional.sinks.kafka import KafkaSink
from regional.sources.kafka import KafkaSource

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")
ORDERS, PAYMENTS, OUTPUT = "orders", "payments", "paid-orders"
PARTITIONS, WORKERS = 3, 2

# --8<-- [start:pipeline]
ORDER = pa.struct(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        pa.field("user", pa.string(), nullable=False),
        ("amount", pa.float64()),
        ("country", pa.string()),
        pa.field("ts", pa.int64(), nullable=False),  # ms since the epoch
    ]
)
PAYMENT = pa.struct(
    [
        pa.field("order_id", pa.int64(), nullable=False),
        ("paid", pa.float64()),
        pa.field("ts", pa.int64(), nullable=False),
    ]
)


def value_ts(record: dict[str, Any]) -> int:
    """A Kafka record's event time: its JSON value's ``ts`` (the sources' watermarks)."""
    return int(record["value"]["ts"])


def build_pipeline(
    bootstrap: str,
    tables: str,
    staging: str,
    *,
    topics: tuple[str, str, str] = (ORDERS, PAYMENTS, OUTPUT),
    records_per_epoch: int = 500,
) -> Pipeline:
    """Kafka orders and payments -> SQL -> windows to Delta, a left interval join to Kafka
    (`topics`: the orders', the payments' and the output's)."""
    orders_topic, payments_topic, output = topics
    p = Pipeline(
        "orders-sql-kafka",
        records_per_epoch=records_per_epoch,
        on_error="dead-letter",
        dead_letter=DeltaSink(f"{tables}/dead", schema=DEAD_LETTER_SCHEMA),
    )

    def read(topic: str, name: str, value: pa.DataType) -> Any:
        source = KafkaSource(bootstrap, topic, value="json", bounded=True)
        return p.source(source, parallelism=PARTITIONS, name=name, event_time=value_ts,
                        max_out_of_orderness="1 min",
                        schema=pa.schema([pa.field("value", value, nullable=False)]))  # fmt: skip

    orders = read(orders_topic, "orders", ORDER).sql(
        "SELECT value.order_id AS order_id, value.user AS user, value.amount AS amount, "
        "value.country AS country, timestamp_millis(value.ts) AS ts "
        "FROM input WHERE value.amount > 0",
        name="valid",
    )
    payments = read(payments_topic, "payments", PAYMENT).select(
        "value.order_id AS order_id", "value.paid AS paid", "timestamp_millis(value.ts) AS ts",
        name="paid-at",
    )  # fmt: skip
    per_user = orders.key_by("user", partitions=WORKERS).window(
        Tumbling("1 min"),
        aggregate=[count().alias("orders"), sum_of("amount").alias("total"),
                   max_of("amount").alias("largest")],
        event_time="ts",
        name="per-user",
    )  # fmt: skip
    per_user.sink(DeltaSink(f"{tables}/per_user", schema=per_user.schema), name="per-user-out")
    paid = orders.interval_join(
        payments, on="order_id", between=("0 s", "10 min"), how="left", partitions=WORKERS,
        event_time="ts", other_event_time="ts", name="paid",
    )  # fmt: skip
    paid.sink(KafkaSink(bootstrap, output, staging=staging, key="order_id"), name="paid-out")
    return p


# --8<-- [end:pipeline]


def demo_records(n: int = 120) -> tuple[list[tuple[int, dict]], list[tuple[int, dict]]]:
    """(partition, JSON value) of `n` orders and of their payments, each partition in event
    time order: an order every 7 s over 6 users, every fifth not paid, payments 30 s to 13 min
    later (some too late to join), order 17 with an amount of "n/a" (a dead letter) and every
    ninth a refund (amount < 0, left out by the WHERE)."""
    orders, payments = [], []
    for i in range(n):
        ts = 1_700_000_000_000 + i * 7_000
        amount: Any = "n/a" if i == 17 else (-5.0 if i % 9 == 4 else float((i * 37) % 200 + 1))
        order = {"order_id": i, "user": f"u{i % 6}", "amount": amount, "country": "DE", "ts": ts}
        orders.append((i % PARTITIONS, order))
        if i % 5 != 2:
            paid = {"order_id": i, "paid": 10.0, "ts": ts + 30_000 + (i * 7_919) % 750_000}
            payments.append((i % PARTITIONS, paid))
    return orders, sorted(payments, key=lambda r: (r[0], r[1]["ts"]))


def produce(bootstrap: str = BOOTSTRAP) -> None:
    """Create the three topics if missing and send `demo_records()`."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = admin.list_topics(timeout=10).topics
    new = [NewTopic(t, PARTITIONS, 1) for t in (ORDERS, PAYMENTS, OUTPUT) if t not in existing]
    for future in admin.create_topics(new).values() if new else ():
        future.result(timeout=30)
    # one message per request: with the producer's default batching, the job read 6 of these
    # 216 messages back from the tansu test broker (tests/kafka_broker.py); Kafka needs none
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "batch.num.messages": 1})
    orders, payments = demo_records()
    for topic, records in ((ORDERS, orders), (PAYMENTS, payments)):
        for partition, value in records:
            producer.produce(topic, json.dumps(value).encode(), partition=partition)
    producer.flush(60)
    print(f"sent {len(orders)} orders and {len(payments)} payments to {bootstrap}")


def read(tables: str) -> None:
    """Print the per-user windows and the dead letters, read back with deltalake."""
    from deltalake import DeltaTable

    for name in ("per_user", "dead"):
        rows = DeltaTable(f"{tables}/{name}").to_pyarrow_table().to_pylist()
        print(f"{name}: {len(rows)} rows")
        for row in rows[:5]:
            print(f"  {row}")


if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ["REGIONAL_CHECKPOINT_DIR"].rstrip("/")
    pipeline = build_pipeline(BOOTSTRAP, _root + "-tables", _root + "-staging")
elif __name__ == "__main__":
    if "--produce" in sys.argv:
        produce()
    elif "--read" in sys.argv:
        read(sys.argv[sys.argv.index("--read") + 1].rstrip("/") + "-tables")
    else:
        print(__doc__)
