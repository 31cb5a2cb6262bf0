"""State without pickle on Spark: a job keeping tuple keys, Decimals and a declared Struct
crashes, restores in a second run, and writes exactly the fault-free rows. This module is
shipped to the Python workers by value; the Struct class is imported there by reference."""

from __future__ import annotations

from collections import defaultdict
from decimal import Decimal

import pytest

from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.spark import DriverCrash, Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource
from tests.state_types_job import Last

pytestmark = pytest.mark.spark

SPLITS, PER_SPLIT, PER_EPOCH = 4, 12, 4


def _order(split: int, n: int) -> dict:
    return {
        "split": split,
        "n": n,
        "user": f"u{(split + n) % 3}",
        "item": f"i{n % 2}",
        "cents": 100 * split + 7 * n + 1,
    }


def _amount(order: dict) -> Decimal:
    return Decimal(order["cents"]) / 100


def _totals(ctx, order):
    total = ctx.value_state("total", Decimal(0))
    total.update(total.value() + _amount(order))
    by_item = ctx.map_state("by_item")
    key = (order["item"], order["n"] % 2 == 0)  # a tuple key in map state
    by_item[key] = by_item.get(key, Decimal(0)) + _amount(order)
    before = ctx.value_state("last").value()
    ctx.value_state("last").update(Last(order["n"], _amount(order)))
    yield {
        "split": order["split"],
        "n": order["n"],
        "total": str(total.value()),
        "item_total": str(by_item[key]),
        "before": -1 if before is None else before.n,
        "key": repr(ctx.key),
    }


def _pipeline(table: str) -> Pipeline:
    p = Pipeline("orders", records_per_epoch=PER_EPOCH, state_types=[Last])
    src = p.source(
        GeneratorSource(SPLITS, _order, records_per_split=PER_SPLIT), parallelism=2, name="src"
    )
    keyed = src.key_by(lambda o: (o["user"], o["split"] % 2))  # a tuple key of keyed state
    keyed.process(_totals, name="totals").sink(ParquetSink(table), name="out")
    return p


def _expected() -> list[tuple]:
    rows = []
    for split in range(SPLITS):
        total: dict = defaultdict(Decimal)
        items: dict = defaultdict(Decimal)
        last: dict = {}
        for n in range(PER_SPLIT):
            o = _order(split, n)
            key = (o["user"], split % 2)
            total[key] += _amount(o)
            items[key, o["item"], n % 2 == 0] += _amount(o)
            rows.append(
                (
                    split,
                    n,
                    str(total[key]),
                    str(items[key, o["item"], n % 2 == 0]),
                    last.get(key, -1),
                    repr(key),
                )
            )
            last[key] = n
    return sorted(rows)


def _rows(table: str) -> list[tuple]:
    t = read_table(table)
    cols = [t.column(c).to_pylist() for c in ("split", "n", "total", "item_total", "before", "key")]
    return sorted(zip(*cols, strict=True))


def test_tuple_keys_decimals_and_a_struct_survive_a_crash_and_restore(spark, tmp_path):
    table, root = str(tmp_path / "table"), str(tmp_path / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    first = SparkRuntime(
        _pipeline(table),
        spark,
        root=root,
        policy=policy,
        faults=Faults(crash_at=(3, "after-metadata")),
    )
    with pytest.raises(DriverCrash, match="checkpoint 3, after-metadata"):
        first.run()
    summary = SparkRuntime(_pipeline(table), spark, root=root, policy=policy).run()
    assert summary.restored_from == 3 and summary.finished
    assert _rows(table) == _expected()
