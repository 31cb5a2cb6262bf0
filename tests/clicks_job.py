"""A small bounded clicks job shared by the savepoint and restore tests: 8 generated splits of
20 clicks, a per-(split, user) click count in keyed state (and a list state), a Parquet sink.
Its exact output is known (`expected_rows`), so a restored run can be compared row for row."""

from __future__ import annotations

from collections import Counter

from regional.dataflow.pipeline import Pipeline
from regional.policy import Policy, load_policy
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH = 8, 20, 7


def click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"u{(split * 7 + n) % 5}"}


def count(ctx, record):
    state = ctx.value_state("count", 0)
    state.update(state.value() + 1)
    ctx.list_state("seen").append(record["n"])
    yield {**record, "count": state.value()}


def pipeline(table: str, parallelism: int = 4) -> Pipeline:
    p = Pipeline("clicks", records_per_epoch=PER_EPOCH)
    src = p.source(
        GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT),
        parallelism=parallelism,
        name="src",
    )
    src.key_by(lambda r: r["user"]).process(count, name="count").sink(
        ParquetSink(table), name="out"
    )
    return p


def expected_rows() -> list[tuple]:
    rows = []
    for split in range(SPLITS):
        seen: Counter[str] = Counter()
        for n in range(PER_SPLIT):
            r = click(split, n)
            seen[r["user"]] += 1
            rows.append((split, n, r["user"], seen[r["user"]]))
    return sorted(rows)


def rows(table: str) -> list[tuple]:
    t = read_table(table)
    cols = [t.column(c).to_pylist() for c in ("split", "n", "user", "count")]
    return sorted(zip(*cols, strict=True))


def policy(num_retained: int = 1) -> Policy:
    overrides = {"checkpointing": {"timeout": "30 s", "num-retained": num_retained}}
    return load_policy(env={}, overrides=overrides).policy
