"""Continuous mode through Kafka: checkpoint round trip, end-to-end and processing latency,
throughput at saturation against micro-epoch mode, and latency while a task is killed.

The job: a Kafka topic of 16 partitions (`KafkaSource`, 16 units) -> a map that stamps when
the record ran through the plan -> an exactly-once `KafkaSink` (one transaction per
checkpoint) on a second topic; the broker is the tests' tansu (`tests/kafka_broker.py`, in
memory, this machine). A producer thread writes records carrying their produce time at a
fixed rate; an independent `read_committed` consumer reads the output as it is committed.

* **checkpoint round trip**: marker sent -> every task's answers back on the driver
  (`ContinuousDispatcher.round_trips_ms`): snapshot, upload, ack;
* **end-to-end latency**: produce -> the output record visible to the `read_committed`
  consumer (both clocks are this machine's);
* **processing latency**: produce -> the record ran through the plan in its task (the map's
  stamp; staged for the checkpoint from then on);
* **throughput at saturation**: a topic filled beforehand, read by continuous mode and by
  micro-epoch mode (the same job, one Spark job per epoch), records per second until the
  consumer saw every output record;
* **a task killed every 10 s**: the task holding unit 1 kills its own Python worker
  (`os._exit`, on a switch file the benchmark touches every 10 s; `Stamp`); the p99
  end-to-end latency of the units on the other task against the fault-free run.

Takes the machine's Spark lock when run under `flock /tmp/regional-spark.lock`. Run:

    .venv/bin/python -m benchmarks.bench_kafka_latency [--seconds 20] [--rates 1000,20000]
        [--fill 40000] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

PARTITIONS = 16
TASKS = 2
INTERVAL = "100 ms"
WARM_UP_S = 3.0
KILL_EVERY_S = 10.0


def _quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


class Stamp:
    """The map of the job: the record's produce time and when it ran through the plan. With
    a `kill_switch` file, the task running partition `victim` kills its own Python worker
    (`os._exit`) when the file appears, and removes it: the benchmark's task killer."""

    def __init__(self, kill_switch: str | None = None, victim: int = 1) -> None:
        self.kill_switch, self.victim = kill_switch, victim

    def __call__(self, record: dict) -> dict:
        if (
            self.kill_switch is not None
            and record["partition"] == self.victim
            and os.path.exists(self.kill_switch)
        ):
            os.remove(self.kill_switch)
            os._exit(3)
        return _stamp(record)


def _stamp(record: dict) -> dict:
    value = record["value"]
    return {
        "n": value["n"],
        "partition": record["partition"],
        "produced_ms": value["ts"],
        "processed_ms": time.time() * 1000,
    }


def _pipeline(
    bootstrap: str, source: str, out: str, staging: str, per_epoch: int, kill_switch: str | None
) -> Any:
    from regional.dataflow.pipeline import Pipeline
    from regional.sinks.kafka import KafkaSink
    from regional.sources.kafka import KafkaSource

    p = Pipeline(f"latency-{source}", records_per_epoch=per_epoch)
    stream = p.source(
        KafkaSource(bootstrap, source, value="json", start="earliest", poll_timeout=0.05),
        parallelism=PARTITIONS,
        name="in",
    )
    stream.map(Stamp(kill_switch), name="stamp").sink(
        KafkaSink(bootstrap, out, staging=staging, key="partition"), name="out"
    )
    return p


def _topics(bootstrap: str, *names: str) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, PARTITIONS, 1) for n in names]).values():
        future.result(timeout=30)


class Producer(threading.Thread):
    """Writes `rate` records per second (`total` in all, or until `stop`), round-robin over
    the partitions, each value {"n", "ts": produce time in ms}."""

    def __init__(self, bootstrap: str, topic: str, rate: float, total: int | None = None):
        super().__init__(daemon=True)
        self.bootstrap, self.topic, self.rate, self.total = bootstrap, topic, rate, total
        self.stop = threading.Event()
        self.sent = 0

    def run(self) -> None:
        from confluent_kafka import Producer as KafkaProducer

        producer = KafkaProducer(
            {"bootstrap.servers": self.bootstrap, "linger.ms": 1, "log_level": 0}
        )
        started = time.perf_counter()
        while not self.stop.is_set() and (self.total is None or self.sent < self.total):
            due = int((time.perf_counter() - started) * self.rate) + 1
            if self.total is not None:
                due = min(due, self.total)
            while self.sent < due:
                value = json.dumps({"n": self.sent, "ts": time.time() * 1000}).encode()
                try:
                    producer.produce(self.topic, value, partition=self.sent % PARTITIONS)
                except BufferError:
                    producer.poll(0.01)
                    continue
                self.sent += 1
            producer.poll(0)
            time.sleep(0.001)
        producer.flush(60)


class Consumer(threading.Thread):
    """A `read_committed` consumer of the output: every record's (input partition, produce
    ms, processed ms, seen ms)."""

    def __init__(self, bootstrap: str, topic: str):
        super().__init__(daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.stop = threading.Event()
        self.seen: list[tuple[int, float, float, float]] = []

    def run(self) -> None:
        from confluent_kafka import Consumer as KafkaConsumer
        from confluent_kafka import TopicPartition

        consumer = KafkaConsumer(
            {
                "bootstrap.servers": self.bootstrap,
                "group.id": f"bench-{uuid.uuid4().hex[:6]}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 5,
                "log_level": 0,
            }
        )
        consumer.assign([TopicPartition(self.topic, p, 0) for p in range(PARTITIONS)])
        try:
            while not self.stop.is_set():
                for m in consumer.consume(1000, 0.05):
                    data = m.value()
                    if m.error() is not None or not data:
                        continue
                    now = time.time() * 1000
                    try:
                        r = json.loads(data)
                    except ValueError:
                        continue  # the sink's transaction markers are not rows
                    if isinstance(r, dict) and "produced_ms" in r:
                        self.seen.append((r["partition"], r["produced_ms"], r["processed_ms"], now))
        finally:
            consumer.close()


def _runtime(
    spark: Any, bootstrap: str, mode: str, kill_switch: str | None = None, per_epoch: int = 500
) -> tuple[Any, str, str]:
    from regional.policy import load_policy
    from regional.runtime.spark import SparkRuntime

    tag = uuid.uuid4().hex[:6]
    source, out = f"in-{tag}", f"out-{tag}"
    _topics(bootstrap, source, out)
    work = tempfile.mkdtemp(prefix="bench-kafka-latency-")
    options: dict[str, Any] = {"checkpoint_interval": INTERVAL} if mode == "continuous" else {}
    # the killed task holds half the units: its checkpoints stay regional, not aborted
    overrides = {"checkpointing": {"region": {"max-failure-ratio": 0.5}}}
    options["policy"] = load_policy(env={}, overrides=overrides).policy
    rt = SparkRuntime(
        _pipeline(bootstrap, source, out, f"{work}/staging", per_epoch, kill_switch),
        spark,
        root=f"{work}/ckpt",
        mode=mode,
        tasks=TASKS,
        **options,
    )
    return rt, source, out


def latency(spark: Any, bootstrap: str, rate: float, seconds: float, kill: bool = False):
    """One continuous run at `rate` records/s for `seconds` (after `WARM_UP_S`)."""
    victim_unit = 1  # reads partition 1
    switch = f"{tempfile.gettempdir()}/bench-kill-{uuid.uuid4().hex[:8]}" if kill else None
    rt, source, out = _runtime(spark, bootstrap, "continuous", switch)
    producer = Producer(bootstrap, source, rate)
    consumer = Consumer(bootstrap, out)
    loads = [os.getloadavg()[0]]
    runner = threading.Thread(target=lambda: rt.run(), daemon=True)
    rt.start()
    consumer.start()
    runner.start()
    producer.start()
    time.sleep(WARM_UP_S)
    measured_from = time.time() * 1000  # records produced after the warm-up count
    end = time.monotonic() + seconds
    while switch is not None and time.monotonic() + KILL_EVERY_S < end:
        time.sleep(KILL_EVERY_S)
        Path(switch).touch()  # the task of unit 1 kills its worker at its next record
    time.sleep(max(0.0, end - time.monotonic()))
    loads.append(os.getloadavg()[0])
    producer.stop.set()
    producer.join()
    time.sleep(1.0)
    rt.request_stop()
    runner.join(60)
    consumer.stop.set()
    consumer.join()
    seen = [s for s in consumer.seen if s[1] >= measured_from]
    victims: set[int] = set()
    if kill:
        from regional.runtime.continuous import ContinuousDispatcher

        assert isinstance(rt.dispatcher, ContinuousDispatcher)
        task = rt.dispatcher.placement.task_of.get(victim_unit)
        units = [u for u, t in rt.dispatcher.placement.task_of.items() if t == task]
        victims = {int(split.rsplit(":", 1)[1]) for u in units for split in rt.unit_reads(u)}
    others = [s for s in seen if s[0] not in victims]  # the partitions of the killed task
    rts = list(getattr(rt.dispatcher, "round_trips_ms", []))
    return {
        "rate": rate,
        "produced": producer.sent,
        "seen": len(consumer.seen),
        "round_trip_p50": _quantile(rts, 0.5),
        "round_trip_p99": _quantile(rts, 0.99),
        "e2e_p50": _quantile([s[3] - s[1] for s in others], 0.5),
        "e2e_p99": _quantile([s[3] - s[1] for s in others], 0.99),
        "processing_p99": _quantile([s[2] - s[1] for s in others], 0.99),
        "load": loads,
        "restarts": sum(1 for e in getattr(rt.dispatcher, "events", []) if e.kind == "restarted"),
        "victims": sorted(victims),
    }


def throughput(spark: Any, bootstrap: str, mode: str, fill: int) -> dict[str, float]:
    """Records per second of `mode` over a topic filled with `fill` records beforehand, until
    the `read_committed` consumer saw them all."""
    rt, source, out = _runtime(spark, bootstrap, mode, per_epoch=2000)
    producer = Producer(bootstrap, source, rate=1e9, total=fill)
    producer.start()
    producer.join()
    consumer = Consumer(bootstrap, out)
    consumer.start()
    rt.start()
    started = time.perf_counter()
    runner = threading.Thread(target=lambda: rt.run(), daemon=True)
    runner.start()
    while len(consumer.seen) < fill and time.perf_counter() - started < 600:
        time.sleep(0.05)
    took = time.perf_counter() - started
    rt.request_stop()
    runner.join(120)
    consumer.stop.set()
    consumer.join()
    return {"records": len(consumer.seen), "seconds": took, "per_s": len(consumer.seen) / took}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rates", default="1000,20000")
    parser.add_argument("--fill", type=int, default=40_000)
    parser.add_argument("--kill-seconds", type=float, default=30.0)
    parser.add_argument("--master", default=f"local[{TASKS + 2}]")
    parser.add_argument("--quick", action="store_true", help="8 s runs, 10,000 records filled")
    parser.add_argument("--only-kill", action="store_true", help="only the fault-free/killed pair")
    parser.add_argument("--json", help="also write the results as JSON here")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.fill, args.kill_seconds = 8.0, 10_000, 21.0
    from regional.runtime.session import spark_session

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    broker = importlib.import_module("kafka_broker").TansuBroker()
    broker.start()
    spark = spark_session(args.master, app_name="bench-kafka-latency")
    results: dict[str, Any] = {"load_before": os.getloadavg(), "cpus": os.cpu_count()}
    try:
        for rate in [] if args.only_kill else [float(r) for r in args.rates.split(",")]:
            results[f"latency@{rate:g}"] = latency(spark, broker.bootstrap, rate, args.seconds)
        rate = float(args.rates.split(",")[0])
        results["fault-free"] = latency(spark, broker.bootstrap, rate, args.kill_seconds)
        results["killed"] = latency(spark, broker.bootstrap, rate, args.kill_seconds, kill=True)
        for mode in () if args.only_kill else ("micro-epoch", "continuous"):
            results[f"throughput-{mode}"] = throughput(spark, broker.bootstrap, mode, args.fill)
    finally:
        spark.stop()
        broker.stop()
    _report(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str))
    return 0


def _report(r: dict[str, Any]) -> None:
    print(f"Kafka -> continuous mode ({PARTITIONS} units, {TASKS} tasks, checkpoint interval "
          f"{INTERVAL}) -> exactly-once Kafka; tansu in memory; {r['cpus']} cores, load "
          f"{r['load_before'][0]:.1f} before")  # fmt: skip
    head = f"{'run':<18}{'rec/s':>8}{'rt p50':>9}{'rt p99':>9}{'e2e p50':>9}{'e2e p99':>9}"
    print(head + f"{'proc p99':>10}{'seen/sent':>14}{'load':>12}")
    for name, x in r.items():
        if not name.startswith(("latency@", "fault-free", "killed")):
            continue
        print(
            f"{name:<18}{x['rate']:>8.0f}{x['round_trip_p50']:>8.1f}ms{x['round_trip_p99']:>7.1f}ms"
            f"{x['e2e_p50']:>7.0f}ms{x['e2e_p99']:>7.0f}ms{x['processing_p99']:>8.0f}ms"
            f"{x['seen']:>7}/{x['produced']:<6}{x['load'][0]:>5.1f}-{x['load'][1]:.1f}"
        )
    ff, killed = r["fault-free"], r["killed"]
    print(f"task killed every {KILL_EVERY_S:g} s ({killed['restarts']} restarts; partitions "
          f"{killed['victims']} on the killed task left out): other units' e2e p99 "
          f"{killed['e2e_p99']:.0f} ms vs {ff['e2e_p99']:.0f} ms fault-free = "
          f"{killed['e2e_p99'] / ff['e2e_p99']:.2f}x")  # fmt: skip
    if "throughput-continuous" not in r:
        return
    micro, cont = r["throughput-micro-epoch"], r["throughput-continuous"]
    print(f"throughput at saturation: continuous {cont['per_s']:,.0f} rec/s, micro-epoch "
          f"{micro['per_s']:,.0f} rec/s = {cont['per_s'] / micro['per_s']:.2f}x "
          f"({cont['records']:,} / {micro['records']:,} records)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
