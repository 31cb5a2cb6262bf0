"""The keyed exchange on real Spark: the two-stage orders job (`tests/orders_job.py`: files ->
parse -> exchange by customer -> running count -> Parquet) through unit faults on both sides of
the exchange, a killed Python worker and a driver crash at every step, compared with a fault-free
run and with Spark SQL over the input."""

from __future__ import annotations

from pathlib import Path

import orders_job as job
import pytest

from metadata.events import CheckpointEvent
from regional.policy import load_policy
from regional.runtime.spark import CRASH_STEPS, DriverCrash, Faults, SparkRuntime

pytestmark = pytest.mark.spark

#: upstream units are 0-2 (files, parse, writer), downstream units 3-6 (reader, totals, out)
FAULTS = {(2, 0): "fail", (2, 4): "fail", (3, 1): "crash", (3, 6): "fail", (4, 3): "fail"}


def _policy():  # type: ignore[no-untyped-def]
    overrides = {"checkpointing": {"timeout": "20 s", "region": {"max-failure-ratio": 0.5}}}
    return load_policy(env={}, overrides=overrides).policy


def _runtime(spark, tmp_path: Path, faults: Faults | None = None, **kw):  # type: ignore[no-untyped-def]
    p = job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    return SparkRuntime(
        p, spark, root=str(tmp_path / "ckpt"), policy=_policy(), faults=faults, **kw
    )


def _totals_by_spark_sql(spark, tmp_path: Path) -> dict[str, int]:  # type: ignore[no-untyped-def]
    orders = spark.read.json(str(tmp_path / "orders"))
    orders.createOrReplaceTempView("orders")
    rows = spark.sql("SELECT customer, count(*) AS n FROM orders GROUP BY customer").collect()
    return {r["customer"]: r["n"] for r in rows}


def _final_totals(spark, tmp_path: Path) -> dict[str, int]:  # type: ignore[no-untyped-def]
    out = spark.read.parquet(str(tmp_path / "table"))  # Spark reads the committed table
    return {
        r["customer"]: r["total"]
        for r in out.groupBy("customer")
        .max("count")
        .withColumnRenamed("max(count)", "total")
        .collect()
    }


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_faults_on_both_sides_and_a_driver_crash_commit_exactly_the_fault_free_rows(
    spark, tmp_path: Path, step: str
) -> None:
    job.write_orders(str(tmp_path / "orders"))
    events: list[CheckpointEvent] = []
    first = _runtime(
        spark, tmp_path, Faults(units=FAULTS, crash_at=(5, step)), progress=events.append
    )
    with pytest.raises(DriverCrash, match=f"checkpoint 5, {step}"):
        first.run()
    by_id = {e.checkpoint_id: e for e in events}
    # regional on both sides: upstream unit 0 and downstream unit 4 fell back on their own
    assert (by_id[2].kind, by_id[2].fallback_units) == ("regional", (0, 4))
    assert by_id[4].kind == "regional" and by_id[4].fallback_units == (3,)
    summary = _runtime(spark, tmp_path).run()
    assert summary.finished
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()
    assert _final_totals(spark, tmp_path) == _totals_by_spark_sql(spark, tmp_path)


def test_a_failing_upstream_never_stops_the_downstream_from_checkpointing(spark, tmp_path: Path):  # type: ignore[no-untyped-def]
    job.write_orders(str(tmp_path / "orders"))
    # upstream units fail in checkpoints 3 and 4, downstream units in 5 and 6
    faults = {(c, u): "fail" for c in (3, 4) for u in range(3)}
    faults |= {(c, u): "fail" for c in (5, 6) for u in range(3, 7)}
    overrides = {"checkpointing": {"timeout": "20 s", "region": {"max-failure-ratio": 0.6}}}
    policy = load_policy(env={}, overrides=overrides).policy
    p = job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    runtime = SparkRuntime(
        p, spark, root=str(tmp_path / "ckpt"), policy=policy, faults=Faults(units=faults)
    )
    summary = runtime.run()
    assert summary.finished
    by_id = {e.checkpoint_id: e for e in summary.checkpoints}
    for c in (3, 4):  # downstream still completes checkpoints and reads what upstream committed
        assert (by_id[c].kind, by_id[c].fallback_units) == ("regional", (0, 1, 2))
        assert by_id[c].records_exchanged > 0  # the exchange's reads (records_in: the input)
    for c in (5, 6):  # and upstream goes on while the downstream falls back
        assert (by_id[c].kind, by_id[c].fallback_units) == ("regional", (3, 4, 5, 6))
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()
    assert _final_totals(spark, tmp_path) == _totals_by_spark_sql(spark, tmp_path)
