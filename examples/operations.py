"""A bounded clicks job for the operations guide: savepoint, move, restore, rescale.

    regional run examples/operations.py --checkpoint-dir /tmp/regional-ops/ckpt \\
        --max-checkpoints 3 --stop-with-savepoint
    PARALLELISM=2 regional run examples/operations.py --checkpoint-dir /tmp/regional-ops/ckpt2 \\
        --from /tmp/regional-ops/ckpt/clicks/savepoints/sp-4
    python examples/operations.py check     # the table holds exactly the fault-free rows

16 generated splits of 400 clicks -> a running click count per (split, user) in keyed state ->
a Parquet table. `PARALLELISM` (default 4) sets the parallelism, `OPS_TABLE` (default
`/tmp/regional-ops/table`, under `$TMPDIR` when set) the table, which stays put when the job is
restored elsewhere.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter

from regional import GeneratorSource, ParquetSink, Pipeline, read_table

SPLITS, PER_SPLIT = 16, 400
TABLE = os.environ.get("OPS_TABLE", os.path.join(tempfile.gettempdir(), "regional-ops", "table"))


def click(split: int, n: int) -> dict:
    return {"split": split, "n": n, "user": f"user-{(split * 31 + n * 7) % 23:02d}"}


def count_clicks(ctx, record):
    clicks = ctx.value_state("clicks", 0)
    clicks.update(clicks.value() + 1)
    yield {**record, "clicks": clicks.value()}


pipeline = Pipeline("clicks", records_per_epoch=100)
source = pipeline.source(
    GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT),
    parallelism=int(os.environ.get("PARALLELISM", "4")),
    name="src",
)
source.key_by(lambda r: r["user"]).process(count_clicks, name="count").sink(
    ParquetSink(TABLE), name="table"
)


def expected() -> list[tuple]:
    """The fault-free output: every click once, counted in order per (split, user)."""
    rows = []
    for split in range(SPLITS):
        seen: Counter[str] = Counter()
        for n in range(PER_SPLIT):
            r = click(split, n)
            seen[r["user"]] += 1
            rows.append((split, n, r["user"], seen[r["user"]]))
    return sorted(rows)


def check() -> int:
    t = read_table(TABLE)
    if t.num_rows == 0:
        print(f"{TABLE}: no rows; run the job first (OPS_TABLE names the table)")
        return 1
    got = sorted(
        zip(*(t.column(c).to_pylist() for c in ("split", "n", "user", "clicks")), strict=True)
    )
    want = expected()
    if got == want:
        print(f"{TABLE}: {len(got)} rows, exactly the fault-free output")
        return 0
    dupes = len(got) - len(set(got))
    print(f"{TABLE}: {len(got)} rows, expected {len(want)} ({dupes} duplicates): DIFFERENT")
    return 1


if __name__ == "__main__":
    if sys.argv[1:] != ["check"]:
        sys.exit("usage: python examples/operations.py check")
    sys.exit(check())
