"""Several aggregates in one window, and the approximate `count_distinct`, at the operator
(no Spark, no storage), side by side in one run, interleaved round by round.

Per round, one epoch of `--batches` Arrow batches of `--rows` records (`KEYS` keys, event
times over 10 one-minute windows) through a window operator whose state goes through its
snapshot, then the watermark closes every window:

1. **one window, a list**: ``aggregate=[count(), sum_of("v"), max_of("v")]`` (columnar: one
   group-by per aggregate);
2. **three windows**: the same three, one window operator each (what a user wrote before);
3. **one window, a list, record by record** (the same list as a plain `Aggregate`);
4. **count_distinct exact** and 5. **count_distinct(exact=False)** (both record by record).

Prints each variant's median time per round, per record, and the ratios.

    .venv/bin/python -m benchmarks.bench_several_aggregates [--batches 8] [--rows 20000] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa

from benchmarks.report import print_table
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.keys import FieldKey
from regional.dataflow.operators import WindowOp
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.window_operator import WindowSpec
from regional.dataflow.windows import (
    Aggregate,
    Tumbling,
    combine,
    count,
    count_distinct,
    max_of,
    sum_of,
)

KEYS = 200


def _batches(batches: int, rows: int) -> list[pa.RecordBatch]:
    out = []
    for b in range(batches):
        n = range(b * rows, (b + 1) * rows)
        out.append(
            pa.RecordBatch.from_pydict(
                {
                    "k": [f"u{i * 7 % KEYS}" for i in n],
                    "ts": [i * 600_000 // (batches * rows) for i in n],  # 10 min, in ms
                    "v": [i % 1_000 for i in n],
                }
            )
        )
    return out


def _window(agg: Aggregate, name: str) -> WindowOp:
    spec = WindowSpec(Tumbling("1 min"), agg, time_of=lambda r: r["ts"], time_field="ts")
    return WindowOp(spec, FieldKey("k"), name=name, scope="key")


def _epoch(ops: list[WindowOp], batches: list[Any]) -> int:
    """One epoch of `ops` over `batches`, state through its snapshot; the rows emitted."""
    rows = 0
    for op in ops:
        state = OperatorState.from_bytes(b"", operator=op.name)
        time_ = EpochTime(0, start={KEY_SCOPE: MIN_WATERMARK}, end={KEY_SCOPE: MIN_WATERMARK},
                          key_split="p")  # fmt: skip
        chunks = [("p", b) for b in batches]
        op.run(chunks, [MIN_WATERMARK] * len(chunks), state, DeadLetters(0, {"p": "0"}), time_)
        blob = op.snapshot(state, [KEY_SCOPE]) or b""
        state = OperatorState.from_bytes(blob, operator=op.name)
        time_ = EpochTime(1, start={KEY_SCOPE: MIN_WATERMARK}, end={KEY_SCOPE: MAX_WATERMARK},
                          key_split="p")  # fmt: skip
        out, _ = op.run([], [], state, DeadLetters(1, {"p": "0"}), time_)
        rows += sum(len(b) for _, b in out)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=8)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="2 batches x 2,000, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.batches, args.rows, args.rounds = 2, 2_000, 2
    batches = _batches(args.batches, args.rows)
    records = [b.to_pylist() for b in batches]
    three = [count(), sum_of("v"), max_of("v")]
    listed = combine(three, "bench")
    variants: dict[str, tuple[Callable[[], list[WindowOp]], list[Any]]] = {
        "one window, a list (columnar)": (lambda: [_window(listed, "w")], batches),
        "three windows (columnar)": (
            lambda: [_window(a, f"w{i}") for i, a in enumerate(three)],
            batches,
        ),
        "one window, a list (record-wise)": (
            lambda: [_window(Aggregate(*listed[:4]), "w")],
            records,
        ),
        "count_distinct exact": (lambda: [_window(count_distinct("v"), "w")], batches),
        "count_distinct(exact=False)": (
            lambda: [_window(count_distinct("v", exact=False), "w")],
            batches,
        ),
    }
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, (make, data) in variants.items():
            ops = make()
            start = time.perf_counter()
            _epoch(ops, data)
            times[name].append(time.perf_counter() - start)
    total = args.batches * args.rows
    base = statistics.median(times["one window, a list (columnar)"])
    rows = []
    for name, ts in times.items():
        median = statistics.median(ts)
        us, ratio = f"{median / total * 1e6:.2f}", f"{median / base:.2f}"
        rows.append({"name": name, "ms": f"{median * 1e3:.1f}", "us": us, "ratio": ratio})
    print(f"{args.batches} batches x {args.rows} records, {KEYS} keys, 10 windows; "
          f"median of {args.rounds} interleaved rounds")  # fmt: skip
    columns = [
        ("name", "variant", "<34"),
        ("ms", "ms per epoch", ">12"),
        ("us", "µs per record", ">13"),
        ("ratio", "vs a list (columnar)", ">20"),
    ]
    print_table(columns, rows)  # fmt: skip


if __name__ == "__main__":
    main()
