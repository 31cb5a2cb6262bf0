"""Reading Kafka with regional checkpoints (needs `regional-checkpoints[kafka]` and a broker).

    KAFKA_BOOTSTRAP=localhost:9092 python examples/kafka_source.py --produce   # demo records
    KAFKA_BOOTSTRAP=localhost:9092 regional run examples/kafka_source.py \\
        --checkpoint-dir /tmp/kafka-ckpt --max-checkpoints 5

Topic `KAFKA_TOPIC` (default `clicks`, 8 partitions) holds JSON clicks {"user", "page"}. The
pipeline reads every partition (a split each, the offset as its position), counts clicks per
user with keyed state, and writes Parquet to `<checkpoint dir>-table`. Set `KAFKA_BOUNDED=1` to
read only what the topic holds at the start (a backfill: the job then finishes).
"""

from __future__ import annotations

import json
import os
import sys

from regional.dataflow.pipeline import Pipeline
from regional.sinks.parquet import ParquetSink
from regional.sources.kafka import KafkaSource

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")
TOPIC = os.environ.get("KAFKA_TOPIC", "clicks")
PARTITIONS = 8


def count_clicks(ctx, record):
    clicks = ctx.value_state("clicks", 0)
    clicks.update(clicks.value() + 1)
    click = record["value"]
    yield {
        "partition": record["partition"],
        "offset": record["offset"],
        "user": click["user"],
        "page": click["page"],
        "clicks": clicks.value(),
    }


def build_pipeline(table: str) -> Pipeline:
    """8 regions: Kafka partitions -> per-user click count -> Parquet."""
    p = Pipeline("kafka-clicks", records_per_epoch=500)
    source = KafkaSource(
        BOOTSTRAP, TOPIC, value="json", bounded=os.environ.get("KAFKA_BOUNDED") == "1"
    )
    clicks = p.source(source, parallelism=PARTITIONS, name="clicks")
    counted = clicks.key_by(lambda r: r["value"]["user"]).process(count_clicks, name="count")
    counted.sink(ParquetSink(table), name="out")
    return p


def produce(n: int = 2000) -> None:
    """Create the topic if missing and send `n` demo clicks."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    if TOPIC not in admin.list_topics(timeout=10).topics:
        for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
            future.result(timeout=30)
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(n):
        click = {"user": f"user-{i % 13}", "page": f"/p/{i % 7}"}
        producer.produce(TOPIC, json.dumps(click).encode(), key=click["user"].encode())
        producer.poll(0)
    producer.flush(60)
    print(f"sent {n} clicks to {TOPIC} at {BOOTSTRAP}")


if __name__ == "__main__" and "--produce" in sys.argv:
    produce()
elif "REGIONAL_CHECKPOINT_DIR" in os.environ:  # under `regional run`
    pipeline = build_pipeline(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table")
