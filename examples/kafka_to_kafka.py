"""Kafka to Kafka, exactly-once: read a topic, count per key, write a topic (needs
`regional-checkpoints[kafka]` and a broker).

    KAFKA_BOOTSTRAP=localhost:9092 python examples/kafka_to_kafka.py --produce   # demo clicks
    KAFKA_BOOTSTRAP=localhost:9092 regional run examples/kafka_to_kafka.py \\
        --checkpoint-dir /tmp/k2k-ckpt
    KAFKA_BOOTSTRAP=localhost:9092 python examples/kafka_to_kafka.py --check    # read it back

Topic `KAFKA_TOPIC` (default `clicks`, 4 partitions) holds JSON clicks {"user", "page"}; topic
`KAFKA_OUTPUT` (default `click-counts`) must exist too. The pipeline reads every partition of
the input (bounded: what the topic holds at the start), sends each click through a durable
keyed exchange to the subtask owning its user, counts clicks per user there (keyed state), and
writes one record per click to the output: key = the user, value = {"user", "count"}, in one
Kafka transaction per checkpoint (`regional.sinks.kafka.KafkaSink`). A `read_committed` consumer
of the output sees, per user, the counts 1..n once each, in order, whatever failed on the way:
units, the driver, or a `kill -9` of `regional run` (run it again on the same checkpoint
directory to resume). Rows are staged in `<checkpoint dir>-staging` until committed.
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.runtime.faults import Faults
from regional.sinks.kafka import KafkaSink
from regional.sources.kafka import KafkaSource

BOOTSTRAP = os.environ.get("KAFKA_BOOTSTRAP", "localhost:9092")
TOPIC = os.environ.get("KAFKA_TOPIC", "clicks")
OUTPUT = os.environ.get("KAFKA_OUTPUT", "click-counts")
PARTITIONS, COUNTERS = 4, 2

#: Units 0-3 read the input's partitions (and write the exchange), units 4-5 count and write
#: the output: an upstream unit fails at checkpoint 2, a downstream one at checkpoint 3.
FAULTS = Faults(units={(2, 1): "fail", (3, 4): "fail"})


def user(click: dict[str, Any]) -> str:
    return str(click["value"]["user"])


def count(ctx: Any, click: dict[str, Any]) -> Any:
    """Clicks per user so far (keyed state: per user, across every input partition)."""
    clicks = ctx.value_state("clicks", 0)
    clicks.update(clicks.value() + 1)
    yield {"user": user(click), "count": clicks.value()}


def build_pipeline(
    bootstrap: str, topic: str, output: str, staging: str, *, records_per_epoch: int = 500
) -> Pipeline:
    """Kafka partitions -> keyed exchange by user -> count -> Kafka, keyed by user."""
    p = Pipeline("kafka-to-kafka", records_per_epoch=records_per_epoch)
    source = KafkaSource(bootstrap, topic, value="json", bounded=True)
    (
        p.source(source, parallelism=PARTITIONS, name="clicks")
        .key_by(user, partitions=COUNTERS, name="by-user")
        .process(count, name="count")
        .sink(KafkaSink(bootstrap, output, staging=staging, key="user"), name="counts")
    )
    return p


def produce(n: int = 400, users: int = 7) -> None:
    """Create both topics if missing and send `n` demo clicks."""
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    existing = admin.list_topics(timeout=10).topics
    new = [NewTopic(t, PARTITIONS, 1) for t in (TOPIC, OUTPUT) if t not in existing]
    for future in admin.create_topics(new).values() if new else ():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": BOOTSTRAP})
    for i in range(n):
        click = {"user": f"user-{i % users}", "page": f"/p/{i % 5}"}
        producer.produce(TOPIC, json.dumps(click).encode(), partition=i % PARTITIONS)
        producer.poll(0)
    producer.flush(60)
    print(f"sent {n} clicks to {TOPIC} at {BOOTSTRAP}")


def read_values(bootstrap: str, topic: str, timeout: float = 30.0) -> Iterator[dict[str, Any]]:
    """The JSON values of every record of `topic` as a `read_committed` consumer sees them,
    partition by partition in offset order, to the partitions' current end."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "kafka-to-kafka-check",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        partitions = consumer.list_topics(topic, timeout=timeout).topics[topic].partitions
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_ = set(partitions)
        while open_:
            m = consumer.poll(timeout)
            if m is None:
                raise TimeoutError(f"{topic}: partitions {sorted(open_)} did not end")
            error = m.error()
            if error is not None:
                if error.code() != KafkaError._PARTITION_EOF:
                    raise RuntimeError(f"{topic}: {error.str()}")
                open_.discard(m.partition())
            elif (value := m.value()) is not None:
                yield json.loads(value)
    finally:
        consumer.close()


def check(bootstrap: str, topic: str, output: str) -> list[str]:
    """What differs from exactly-once: per user, the output must hold 1..n once each, in order,
    with n the user's clicks in the input. Empty: exactly-once."""
    clicks = Counter(str(click["user"]) for click in read_values(bootstrap, topic))
    got: dict[str, list[int]] = {}
    for record in read_values(bootstrap, output):
        got.setdefault(str(record["user"]), []).append(int(record["count"]))
    return [
        f"{u}: {clicks[u]} clicks in, counts out {got.get(u, [])}"
        for u in sorted(clicks.keys() | got.keys())
        if got.get(u, []) != list(range(1, clicks[u] + 1))
    ]


if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ["REGIONAL_CHECKPOINT_DIR"].rstrip("/")
    pipeline = build_pipeline(
        BOOTSTRAP,
        TOPIC,
        OUTPUT,
        _root + "-staging",
        records_per_epoch=int(os.environ.get("KAFKA_RECORDS_PER_EPOCH", "500")),
    )
    if os.environ.get("KAFKA_FAULTS") == "1":
        faults = FAULTS
elif __name__ == "__main__":
    if "--produce" in sys.argv:
        produce()
    elif "--check" in sys.argv:
        problems = check(BOOTSTRAP, TOPIC, OUTPUT)
        print(
            "\n".join(problems) or f"{OUTPUT}: every user's counts 1..n, each once (exactly-once)"
        )
        sys.exit(1 if problems else 0)
    else:
        print(__doc__)
