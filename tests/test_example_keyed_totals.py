"""The keyed-totals example (`examples/keyed_totals.py`, the README's exchange section) on the
shared session: regional checkpoints on both sides of the exchange, and final per-customer
totals equal to Spark SQL's `groupBy(customer).count()` over the input."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

from regional.runtime.spark import SparkRuntime

pytestmark = pytest.mark.spark

_FILE = Path(__file__).parent.parent / "examples" / "keyed_totals.py"


def _example():
    spec = importlib.util.spec_from_file_location("keyed_totals_example", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_keyed_totals_fall_back_on_both_sides_and_equal_spark_sql_counts(spark, tmp_path):
    kt = _example()
    orders = kt.make_orders(str(tmp_path / "orders"))
    p = kt.build_pipeline(orders, str(tmp_path / "table"))
    assert p.regions().num_units == 8
    summary = SparkRuntime(p, spark, root=str(tmp_path / "ckpt"), faults=kt.FAULTS).run()
    assert summary.finished
    outcomes = [(c.kind, c.fallback_units) for c in summary.checkpoints[:6]]
    assert outcomes == [
        ("global", ()),
        ("regional", (1,)),  # upstream
        ("regional", (5,)),  # downstream
        ("regional", (5,)),
        ("regional", (0, 6)),  # both sides at once
        ("global", ()),
    ]
    assert kt.check_totals(spark, orders, str(tmp_path / "table")) == []


def test_the_check_names_each_customer_whose_totals_differ(spark, tmp_path):
    kt = _example()
    orders = kt.make_orders(str(tmp_path / "orders"), files=2)
    p = kt.build_pipeline(orders, str(tmp_path / "table"))
    assert SparkRuntime(p, spark, root=str(tmp_path / "ckpt")).run().finished
    more = tmp_path / "more"
    shutil.copytree(orders, more)
    (more / "orders-02.jsonl").write_text(
        '{"order": 9000, "customer": "c03", "amount": 250, "channel": "web"}\n'
        '{"order": 9001, "customer": "c99", "amount": 100, "channel": "app"}\n'
    )
    problems = kt.check_totals(spark, str(more), str(tmp_path / "table"))
    c03 = [
        json.loads(line)["amount"]
        for f in sorted(Path(orders).iterdir())
        for line in f.read_text().splitlines()
        if json.loads(line)["customer"] == "c03"
    ]
    n, cents = len(c03), sum(c03)
    assert problems == [
        f"c03: input {n + 1} orders, {cents + 250} cents; table: total {n} orders, {cents} "
        f"cents, {n} rows ({n} distinct counts)",
        "c99: input 1 orders, 100 cents; table: total 0 orders, 0 cents, 0 rows "
        "(0 distinct counts)",
    ]
