"""Requests per checkpoint on an S3-compatible server (moto, loopback), at 1,024 regions.

A stateful job (generator -> keyed count -> Parquet table), its checkpoint root and its table
both on S3, run on local Spark; every request the server receives is counted by kind (PUT,
GET, HEAD, LIST, DELETE, POST) and by where it goes (the checkpoint root or the table), per
checkpoint, with file merging (one physical state file and one staged data file per Spark
task, DESIGN §4 rule 16) and without (a state file and a staged file per unit). Cleaning runs
in the background as in production and is drained after every epoch, so its deletions count
towards the checkpoint that made them due.
The LIST column of the checkpoint root is 0 in the steady state (no listing of `_lease/`, no
pyarrow directory probes; `tests/test_s3_requests.py` checks it on a small job). The request
counting itself is `benchmarks.s3_counting`.

    .venv/bin/python -m benchmarks.bench_s3_requests [--regions 1024] [--epochs 3]
        [--master local[2]] [--quick] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import uuid
from collections.abc import Iterable
from typing import Any

from benchmarks.report import RESULTS, print_table, write_results
from benchmarks.s3_counting import KINDS, start_server, uri
from regional.dataflow.pipeline import Pipeline
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def count(ctx: Any, r: dict[str, int]) -> Iterable[dict[str, int]]:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    yield {"s": r["s"], "n": r["n"], "c": c.value()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regions", type=int, default=1024)
    ap.add_argument("--records", type=int, default=10)
    ap.add_argument("--epochs", type=int, default=3, help="measured epochs (after 2 warm-up)")
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="64 regions, 1 measured epoch")
    ap.add_argument("--out", default=RESULTS, help="directory of the results JSON")
    args = ap.parse_args()
    if args.quick:
        args.regions, args.epochs = 64, 1
    server, counter, endpoint = start_server()
    from pyarrow import fs

    s3 = fs.S3FileSystem(access_key="testing", secret_key="testing", endpoint_override=endpoint,
                         scheme="http", region="us-east-1", allow_bucket_creation=True)  # fmt: skip
    work = tempfile.mkdtemp(prefix="regional-bench-s3-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    tasks = spark.sparkContext.defaultParallelism
    per_checkpoint: dict[str, dict[str, float]] = {}
    try:
        for name, merge in (("merged", True), ("per-unit", False)):
            ckpt, table = f"ckpt-{uuid.uuid4().hex[:8]}", f"table-{uuid.uuid4().hex[:8]}"
            s3.create_dir(ckpt)
            s3.create_dir(table)
            p = Pipeline(f"s3-{name}", records_per_epoch=args.records)
            src = p.source(GeneratorSource(args.regions, record), parallelism=args.regions)
            src.key_by(lambda r: r["s"]).process(count).sink(ParquetSink(uri(endpoint, table, "t")))
            rt = SparkRuntime(
                p,
                spark,
                root=uri(endpoint, ckpt, "root"),
                tasks=tasks,
                merge_state=merge,
                merge_sink_files=merge,
            )
            rt.start()
            for _ in range(2):  # warm-up: first checkpoints, the cleaner's first full scan
                rt.epoch()
                rt.cleaning.drain()
            before = counter.snapshot()
            for _ in range(args.epochs):
                rt.epoch()
                rt.cleaning.drain()
            after = counter.snapshot()
            rt.cleaning.close()
            rt.lease.release()
            for where, bucket in (("checkpoint root", ckpt), ("table", table)):
                per_checkpoint[f"{name} / {where}"] = {
                    kind: (after[bucket, kind] - before[bucket, kind]) / args.epochs
                    for kind in KINDS
                }
    finally:
        spark.stop()
        server.stop()
    print(
        f"\n{args.regions} regions x {args.records} records per epoch, Spark master "
        f"{args.master} ({tasks} tasks); requests per checkpoint, mean of {args.epochs} "
        "checkpoints after 2 warm-up ones (moto S3 on loopback)\n"
    )
    rows = [
        {"where": where, **{k: f"{v:.1f}" for k, v in counts.items()},
         "total": f"{sum(counts.values()):.1f}"}
        for where, counts in per_checkpoint.items()
    ]  # fmt: skip
    print_table(
        [("where", "variant / bucket", "<28")]
        + [(k, k, ">7") for k in KINDS]
        + [("total", "total", ">8")],
        rows,
    )
    write_results(
        os.path.join(args.out, f"s3_requests{'-quick' if args.quick else ''}.json"),
        master=args.master,
        config={"regions": args.regions, "records": args.records, "epochs": args.epochs},
        requests_per_checkpoint=per_checkpoint,
    )


if __name__ == "__main__":
    main()
