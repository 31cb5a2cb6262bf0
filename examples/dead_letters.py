"""Dead letters you can act on: orders whose amount is not a number are set aside, then
exported, fixed and replayed (docs/how-to/dead-letters.md; `scripts/docs-outputs` runs it for
that page's command outputs).

    regional run examples/dead_letters.py --checkpoint-dir /tmp/ckpt

Two files of ten orders each; every fourth order from the second has the amount "x". `parse`
fails on those: they are dead letters. The job counts orders per customer after a keyed
exchange, so a replayed order meets its customer's count whichever split it comes from.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.sinks.parquet import ParquetSink
from regional.sources.files import FileSource


def make_data(directory: str) -> str:
    """Write the two order files (deterministic) into `directory`; returns it."""
    os.makedirs(directory, exist_ok=True)
    for f in range(2):
        with open(os.path.join(directory, f"orders-{f}.jsonl"), "w") as out:
            for n in range(10):
                amount = "x" if n % 4 == 1 else str(10 * n + f)
                out.write(json.dumps({"customer": "abc"[n % 3], "amount": amount}) + "\n")
    return directory


# --8<-- [start:pipeline]
def parse(order: dict[str, Any]) -> dict[str, Any]:
    return {"customer": order["customer"], "amount": int(order["amount"])}  # "x" raises


def count(ctx: Any, order: dict[str, Any]) -> Any:
    orders = ctx.value_state("orders", 0)
    orders.update(orders.value() + 1)
    yield {"customer": order["customer"], "orders": orders.value()}


def build_pipeline(data_dir: str, out_dir: str) -> Pipeline:
    p = Pipeline(
        "orders",
        records_per_epoch=4,
        on_error="dead-letter",  # a record parse raises on is a dead letter, not a failure
        dead_letter=ParquetSink(os.path.join(out_dir, "dead")),
    )
    orders = p.source(FileSource(data_dir, format="jsonl"), parallelism=2, name="orders")
    (
        orders.map(parse, name="parse")
        .key_by("customer", partitions=2)
        .process(count, name="count")
        .sink(ParquetSink(os.path.join(out_dir, "counts")), name="counts")
    )
    return p


# --8<-- [end:pipeline]

_WORK = os.path.join(tempfile.gettempdir(), "regional-dead-letters")

if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(_WORK, "ckpt"))
    pipeline = build_pipeline(make_data(os.path.join(_WORK, "data")), _root.rstrip("/") + "-out")
