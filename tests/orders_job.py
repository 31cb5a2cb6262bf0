"""A two-stage job for the keyed-exchange tests: order files -> parse -> exchange by customer ->
running count per customer -> Parquet sink.

Every output row is (customer, count) after one more order of that customer, so whatever order
the orders reach the counter in, a run that processes every order exactly once writes exactly
the rows {(c, 1), ..., (c, n_c)} for every customer c with n_c orders (`expected_rows`). A lost
order leaves a customer short of n_c, a duplicate gives it n_c + 1 or a repeated count.

`InProcessDispatcher` (`regional.runtime.local`, kept here under its name for the tests that
import it from this module) runs the units in this process (no Spark), for fast driver-level tests;
the Spark tests run the same job through `SparkRuntime`.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pyarrow as pa

from regional.dataflow.pipeline import Pipeline
from regional.runtime.local import InProcessDispatcher as InProcessDispatcher
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource

FILES, ORDERS_PER_FILE, CUSTOMERS = 6, 40, 9


def order(file: int, n: int) -> dict:
    return {"order": file * 1000 + n, "customer": f"c{(file * 7 + n * 3) % CUSTOMERS:02d}"}


def write_orders(directory: str, files: int = FILES, per_file: int = ORDERS_PER_FILE) -> None:
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        with open(os.path.join(directory, f"orders-{f:02d}.jsonl"), "w") as out:
            for n in range(per_file):
                out.write(json.dumps(order(f, n)) + "\n")


def parse(record: dict) -> dict:
    return {"customer": record["customer"], "order": int(record["order"])}


def customer(record: dict) -> str:
    return str(record["customer"])


def running_count(ctx, record):
    count = ctx.value_state("count", 0)
    count.update(count.value() + 1)
    yield {"customer": record["customer"], "count": count.value()}


def pipeline(
    orders: str, table: str, *, upstream: int = 3, partitions: int = 4, per_epoch: int = 15
) -> Pipeline:
    p = Pipeline("orders", records_per_epoch=per_epoch)
    (
        p.source(FileSource(orders, format="jsonl"), parallelism=upstream, name="files")
        .map(parse, name="parse")
        .key_by(customer, partitions=partitions, name="by-customer")
        .process(running_count, name="totals")
        .sink(ParquetSink(table), name="out")
    )
    return p


def expected_rows(files: int = FILES, per_file: int = ORDERS_PER_FILE) -> list[tuple[str, int]]:
    counts = Counter(order(f, n)["customer"] for f in range(files) for n in range(per_file))
    return sorted((c, k) for c, n in counts.items() for k in range(1, n + 1))


def rows(table: str) -> list[tuple[str, int]]:
    t = read_table(table)
    if t.num_rows == 0:
        return []
    return sorted(zip(t.column("customer").to_pylist(), t.column("count").to_pylist(), strict=True))


def empty_batch() -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([])
