"""A small keyed job the in-process driver tests share: SPLITS splits of PER_SPLIT records,
PER_EPOCH per epoch, a running count per split into `sink`; EXACT is its committed output
as (split, n, count) rows."""

from __future__ import annotations

from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH = 4, 12, 3
EXACT = [(s, n, n + 1) for s in range(SPLITS) for n in range(PER_SPLIT)]


def record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def count(ctx, r):
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"split": r["split"], "n": r["n"], "c": c.value()}


def counted_pipeline(name: str, sink: Any) -> Pipeline:
    """generator -> key by split -> running count -> `sink` (vertex "out")."""
    p = Pipeline(name, records_per_epoch=PER_EPOCH)
    src = p.source(GeneratorSource(SPLITS, record, records_per_split=PER_SPLIT), parallelism=SPLITS)
    src.key_by(lambda r: r["split"]).process(count, name="count").sink(sink, name="out")
    return p
