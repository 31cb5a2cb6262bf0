"""What the Kafka read's consumer lag in time costs: reads of a few records at moving offsets,
with the look at the next record's timestamp (`KafkaSource._peek`: a non-blocking `poll(0)`
into the consumer's queue) and without it, interleaved read by read in one run.

The broker is the tests' tansu (`tests/kafka_broker.py`, in memory, this machine); one topic
of one partition filled beforehand; every read assigns, polls its records, peeks (or not),
asks nothing more of the broker, and unassigns, as `KafkaSource.read` does. Prints the median
and p90 milliseconds per read of each kind and their ratio, and how often the peek found the
next record (its timestamp shown) rather than the read falling back to the last read one's.
No Spark.

    .venv/bin/python -m benchmarks.bench_kafka_lag_time [--reads 400] [--batch 10]
"""

from __future__ import annotations

import argparse
import importlib
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from regional.sources.kafka import KafkaSource


def _quantile(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=400, help="reads of each kind")
    ap.add_argument("--batch", type=int, default=10, help="records per read")
    ap.add_argument("--quick", action="store_true", help="40 reads of each kind")
    args = ap.parse_args()
    if args.quick:
        args.reads = 40
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    broker = importlib.import_module("kafka_broker").TansuBroker()
    broker.start()
    try:
        topic = f"lag-time-{uuid.uuid4().hex[:8]}"
        broker.create_topic(topic, 1)
        total = 2 * args.reads * args.batch + args.batch
        broker.produce(topic, [(0, None, b'{"n": 1}')] * total)
        source = KafkaSource(broker.bootstrap, topic)
        peek = KafkaSource._peek

        hits = [0]

        def counted_peek(consumer: Any, tp: Any, out: list[Any]) -> Any:
            m = peek(consumer, tp, out)
            hits[0] += m is not None
            return m

        def no_peek(consumer: Any, tp: Any, out: list[Any]) -> None:
            return None

        split = f"{topic}:0"
        source.read(split, b"0", args.batch)  # the consumer's start-up and first connection
        times: dict[str, list[float]] = {"with peek": [], "without": []}
        offset = args.batch
        for i in range(2 * args.reads):
            kind = "with peek" if i % 2 == 0 else "without"
            chosen = counted_peek if kind == "with peek" else no_peek
            KafkaSource._peek = staticmethod(chosen)  # type: ignore[method-assign]
            started = time.perf_counter()
            source.read(split, str(offset).encode(), args.batch)
            times[kind].append((time.perf_counter() - started) * 1000)
            offset += args.batch
        KafkaSource._peek = staticmethod(peek)  # type: ignore[method-assign]
    finally:
        broker.stop()
    print(f"{args.reads} reads of {args.batch} records of each kind, interleaved, tansu loopback")
    print(f"{'kind':<10}  {'median ms':>9}  {'p90 ms':>7}")
    for kind, xs in times.items():
        print(f"{kind:<10}  {statistics.median(xs):9.2f}  {_quantile(xs, 0.9):7.2f}")
    ratio = statistics.median(times["with peek"]) / statistics.median(times["without"])
    print(f"ratio with/without (median): {ratio:.3f}")
    print(f"reads whose peek found the next record in the fetch: {hits[0]}/{args.reads}")


if __name__ == "__main__":
    main()
