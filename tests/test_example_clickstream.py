"""The clickstream example (`examples/clickstream_windows.py`, docs/event-time.md) on the shared
session: per-user per-minute counts and sessions across a durable exchange, units falling back
on both sides, equal to Spark SQL `window` / `session_window` over the on-time clicks."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest

from regional.runtime.spark import SparkRuntime

pytestmark = pytest.mark.spark

_FILE = Path(__file__).parent.parent / "examples" / "clickstream_windows.py"


def _example() -> Any:
    spec = importlib.util.spec_from_file_location("clickstream_windows_example", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_clickstream_windows_fall_back_on_both_sides_and_equal_spark_sql(
    spark: Any, tmp_path: Path
) -> None:
    cw = _example()
    clicks = cw.make_clicks(str(tmp_path / "clicks"))
    out = str(tmp_path / "out")
    p = cw.build_pipeline(clicks, out)
    assert p.regions().num_units == 10
    summary = SparkRuntime(p, spark, root=str(tmp_path / "ckpt"), faults=cw.FAULTS).run()
    assert summary.finished
    outcomes = [(c.kind, c.fallback_units) for c in summary.checkpoints[2:5]]
    assert outcomes == [("regional", (1,)), ("regional", (1,)), ("regional", (7,))]
    late = sorted(
        (r["f"], r["n"])
        for r in spark.read.parquet(f"{out}/late")
        .where("operator = 'minutes'")
        .selectExpr(
            "CAST(get_json_object(record, '$.f') AS INT) AS f",
            "CAST(get_json_object(record, '$.n') AS INT) AS n",
        )
        .collect()
    )
    # the clicks written 3 minutes behind, except those read in their file's first epoch
    # (no watermark yet): each file's every 50th click from the second epoch on
    per_epoch = p.records_per_epoch
    assert late == [
        (f, n) for f in range(cw.FILES) for n in range(49, cw.CLICKS_PER_FILE, 50) if n >= per_epoch
    ]
    previous = spark.conf.get("spark.sql.session.timeZone")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    try:
        assert cw.check_windows(spark, clicks, out) == []
    finally:
        spark.conf.set("spark.sql.session.timeZone", previous)
