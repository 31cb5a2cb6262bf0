"""The joins example (`examples/orders_payments.py`, docs/joins.md) on the shared session: an
interval join and a temporal join whose sides fall back on their own, equal to Spark SQL (a
batch left outer join with the same bounds, an as-of join by window function)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from regional.runtime.spark import SparkRuntime

pytestmark = pytest.mark.spark

_FILE = Path(__file__).parent.parent / "examples" / "orders_payments.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("orders_payments_example", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_both_joins_fall_back_side_by_side_and_equal_spark_sql(spark: Any, tmp_path: Path) -> None:
    op = _example()
    data = op.make_data(str(tmp_path / "data"))
    out = str(tmp_path / "out")
    p = op.build_pipeline(data, out)
    assert p.regions().num_units == 22
    summary = SparkRuntime(p, spark, root=str(tmp_path / "ckpt"), faults=op.FAULTS).run()
    assert summary.finished
    outcomes = [(c.kind, c.fallback_units) for c in summary.checkpoints[2:6]]
    # an orders unit, then a clicks unit, then a unit of the interval join: each alone
    assert outcomes == [
        ("regional", (1,)),
        ("regional", (1,)),
        ("regional", (9,)),
        ("regional", (15,)),
    ]
    assert op.check_joins(spark, data, out) == []
    paid = spark.read.parquet(f"{out}/paid")
    assert paid.where("paid_at IS NULL").count() > 0  # unpaid orders: one row each
    assert spark.read.parquet(f"{out}/enriched").where("tier IS NULL").count() > 0  # u5 deleted
