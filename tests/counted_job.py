"""A small keyed job the in-process driver tests share: SPLITS splits of PER_SPLIT records,
PER_EPOCH per epoch, a running count per split into `sink`; EXACT is its committed output
as (split, n, count) rows. `user_counts` is the output of the sink tests' `regional run` job
(a running count per split and user)."""

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


def user_counts(splits: int, per_split: int) -> list[tuple[int, int, str, int]]:
    """What the sink tests' job writes when nothing fails, worked out without running it:
    record n of split s is user ``u<(s + n) % 3>`` with the running count of that user's
    records in the split (keyed state is per split and key on a forward chain); sorted
    (split, n, user, count) rows."""
    rows = []
    for split in range(splits):
        seen: dict[str, int] = {}
        for n in range(per_split):
            user = f"u{(split + n) % 3}"
            seen[user] = seen.get(user, 0) + 1
            rows.append((split, n, user, seen[user]))
    return sorted(rows)
