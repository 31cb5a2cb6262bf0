"""Quickstart: a clickstream pipeline with regional checkpoints and exactly-once Parquet output.

    python examples/quickstart.py                       # the full demo, about a minute
    regional run examples/quickstart.py --checkpoint-dir /tmp/qs-ckpt

The demo writes a small clickstream (16 JSON-lines files) to a temporary directory and runs a
pipeline of 8 regions over it, written as a PySpark user writes a query: the files are read with
a declared schema (`CLICKS`), `where("NOT bot")` drops bot clicks and `select` keeps the columns
needed (both vectorised over Arrow batches, no Python per record), then a per-user click count in
100 ms event-time windows (`key_by("user")`, `event_time="ts"`, state scoped by input file),
whose rows (user, window_start, window_end, clicks) go to a Parquet table. Region (unit) 3 fails
at checkpoints 2, 3 and 4: those checkpoints complete as *regional* checkpoints (unit 3 falls
back to its last good state, the other 7 regions commit their output). After checkpoint 4 unit 3
has fallen back 3 times in a row (max-unit-fallbacks = 3): it is reported *stuck*, by its name
(`clicks[3]`: subtask 3 of the source), while the other units keep committing; at
checkpoint 5 it succeeds again, catches up and the checkpoint is global. (Had it stayed stuck
longer than max-stuck-time, 15 min by default, the job would have failed naming it.) At the
end it checks that the committed table equals a fault-free run's, row for row.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile
import time

import pyarrow as pa

from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Tumbling, count
from regional.runtime.faults import Faults
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource

USERS = [f"user-{i:02d}" for i in range(40)]
PAGES = ["home", "search", "product", "cart", "checkout"]


def make_clickstream(directory: str, *, files: int = 16, rows: int = 300) -> str:
    """Write `files` JSON-lines files of `rows` clicks each (deterministic); returns the dir."""
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(42)
    for f in range(files):
        path = os.path.join(directory, f"clicks-{f:03d}.jsonl")
        lines = [
            json.dumps(
                {
                    "user": rng.choice(USERS),
                    "page": rng.choice(PAGES),
                    "bot": rng.random() < 0.1,
                    "ts": f * 10_000 + n,
                }
            )
            for n in range(rows)
        ]
        if not os.path.exists(path):
            tmp = path + ".tmp"
            with open(tmp, "w") as out:
                out.write("\n".join(lines) + "\n")
            os.replace(tmp, path)  # files appear complete
    return directory


# --8<-- [start:pipeline]
#: What a click is (the files are JSON lines; a line that does not fit is a misfit, named).
CLICKS = pa.schema(
    [
        pa.field("user", pa.string(), nullable=False),
        ("page", pa.string()),
        ("bot", pa.bool_()),
        pa.field("ts", pa.int64(), nullable=False),  # event time, ms since the epoch
    ]
)


def build_pipeline(data_dir: str, table_dir: str) -> Pipeline:
    """8 parallel regions: files -> where -> select -> windowed count per user -> Parquet."""
    p = Pipeline("quickstart", records_per_epoch=150)
    clicks = p.source(
        FileSource(data_dir, format="jsonl"),
        parallelism=8,
        name="clicks",
        schema=CLICKS,
        event_time="ts",
    )
    humans = clicks.where("NOT bot", name="humans").select("user", "page", "ts", name="fields")
    per_user = humans.key_by("user").window(
        Tumbling("100 ms"), aggregate=count().alias("clicks"), name="count"
    )
    per_user.sink(ParquetSink(table_dir), name="table")
    return p


# --8<-- [end:pipeline]


#: Unit 3 fails at checkpoints 2, 3 and 4 (an exception in the task: a decline).
FAULTS = Faults(units={(2, 3): "fail", (3, 3): "fail", (4, 3): "fail"})

_WORK = os.path.join(tempfile.gettempdir(), "regional-quickstart")


def beside(root: str, suffix: str) -> str:
    """A location next to the checkpoint root, keeping a URI's query (endpoint, scheme).

    >>> beside("s3://bucket/ckpt?scheme=http", "-table"), beside("/tmp/ckpt/", "-table")
    ('s3://bucket/ckpt-table?scheme=http', '/tmp/ckpt-table')
    """
    path, mark, query = root.partition("?")
    return path.rstrip("/") + suffix + mark + query


if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(_WORK, "ckpt"))
    _data = make_clickstream(os.path.join(_WORK, "data"))
    pipeline = build_pipeline(_data, beside(_root, "-table"))
    faults = FAULTS


COLUMNS = ("user", "window_start", "window_end", "clicks")


def _rows(table_dir: str) -> list[tuple]:
    t = read_table(table_dir)
    return sorted(zip(*(t.column(c).to_pylist() for c in COLUMNS), strict=True))


def main() -> int:
    from regional.graph.unit_names import names_of_plan
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-quickstart-")
    data = make_clickstream(os.path.join(work, "data"))
    print(f"clickstream: 16 files x 300 clicks in {data}")
    print("starting Spark (local[*]; Spark's own log goes to quickstart-spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "quickstart-spark.log"))

    def show(r) -> None:
        fb = ",".join(map(str, r.fallback_units)) or "-"
        print(
            f"  checkpoint {r.checkpoint_id:>2}  {r.kind:<8}  fresh units {r.fresh_units}  "
            f"fallback {fb:<3}  commit lag {r.commit_lag}  records read {r.records_in}",
            flush=True,
        )
        for line in r.stuck_lines(names=mentions):  # "stuck: clicks[3] (unit 3) for 1 s ..."
            print(f"      {line}", flush=True)

    print("\nrun 1: unit 3 fails at checkpoints 2, 3, 4 (stuck after 3 in a row, then back)")
    faulty = build_pipeline(data, os.path.join(work, "table-faulty"))
    regions = faulty.regions()
    print(f"  {regions.num_units} regions (fallback units)")
    names = names_of_plan(regions)  # units named by what they read: clicks[3]
    mentions = {u: names.mention(u) for u in range(regions.num_units)}
    summary = SparkRuntime(
        faulty, spark, root=os.path.join(work, "ckpt-faulty"), faults=FAULTS, progress=show
    ).run()
    print(
        f"  -> {summary.count('regional')} regional, {summary.count('global')} global "
        f"checkpoints in {summary.seconds:.1f} s"
    )
    print("\nrun 2: the same pipeline without faults")
    clean = build_pipeline(data, os.path.join(work, "table-clean"))
    summary2 = SparkRuntime(clean, spark, root=os.path.join(work, "ckpt-clean")).run()
    print(f"  -> {summary2.count('global')} global checkpoints in {summary2.seconds:.1f} s")
    got, want = _rows(os.path.join(work, "table-faulty")), _rows(os.path.join(work, "table-clean"))
    same = got == want
    print(
        f"\ncommitted rows: {len(got)} with faults, {len(want)} without -> "
        + ("IDENTICAL (exactly-once)" if same else "DIFFERENT")
    )
    print(f"total {time.monotonic() - started:.1f} s; files in {work}")
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
