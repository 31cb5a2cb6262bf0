"""Orders joined with their payments within 15 minutes of event time: regional's interval join
against Spark Structured Streaming's stream-stream join, on the same files, in one run.

The input: `--upstream` partitions of orders and as many of payments (a directory each, a log
of JSON-lines segments), released chunk by chunk by a feeder thread (chunk k of every partition
at ``start + k * --interval`` s; with ``--interval 0`` everything is there before the start: a
throughput run). Chunk k of orders partition s holds `--records` orders whose event times
cover minute k; order n is paid ``(n * 7919) % 14`` minutes and some seconds later (every tenth
order never), its payment in the payments chunk of that minute. Contenders:

* `regional`: two LogSources (`--upstream` subtasks each) -> ``key_by("order_id")`` on both ->
  ``interval_join(between=("0 s", "15 min"), partitions=--partitions)`` -> Parquet, watermark
  bound 5 s on both sources; `regional-faults` the same with every (checkpoint, unit) failing
  with probability `--p` (seeded);
* `spark-ss`: ``readStream.json`` of both with ``withWatermark("ts", "5 seconds")``, joined on
  ``o.order_id = p.order_id AND p.ts BETWEEN o.ts AND o.ts + INTERVAL 15 MINUTES``, append
  mode, Parquet file sink (no failures: Spark has no partial failure to inject here).

**Measured.** Joined rows committed; input records per second (orders + payments / seconds from
the first release to the last commit); **event-to-result latency** of every joined row: its
commit time (our sink's commit record; Spark's ``_spark_metadata/<batch>`` entry) minus the
release of the later of its two records' chunks (the earliest any join can emit it). Every
contender must commit exactly the expected pairs (checked).

    .venv/bin/python -m benchmarks.bench_joins [--quick] [--interval 0]

Run by hand (not a test); writes benchmarks/results/joins.json (joins-quick.json).
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import shutil
import tempfile
import threading
import time
from typing import Any

import pyarrow.parquet as pq

from benchmarks.bench_partial_failures import TOLERABLE, percentile, schedule
from benchmarks.report import RESULTS, print_table, write_results
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.faults import Faults
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.log import LogSource

BASE = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
BASE_MS = int(BASE.timestamp() * 1000)
MINUTE = 60_000
SIDES = ("orders", "payments")


# --- the input --------------------------------------------------------------------------------


def order_ms(n: int, records: int) -> int:
    """The event time of order `n` (ms after BASE): in minute n // records, in order."""
    return (n // records) * MINUTE + (n % records) * MINUTE // records


def payment_ms(n: int, records: int) -> int | None:
    """When order `n` is paid (ms after BASE), or None: every tenth order never is."""
    if n % 10 == 0:
        return None
    return order_ms(n, records) + (n * 7919) % 14 * MINUTE + (n % 50) * 1000


def order_id(k: int, s: int, i: int, upstream: int, records: int) -> int:
    """Order i of chunk k of partition s, numbered so that its minute is id // records."""
    return (k * upstream + s) * records + i


def chunks(args: argparse.Namespace) -> dict[tuple[str, int, int], list[str]]:
    """(side, partition, chunk) -> its JSON lines, every side's chunk k covering minute k."""
    out: dict[tuple[str, int, int], list[str]] = {}
    per_minute = args.upstream * args.records
    for k in range(args.chunks):
        for s in range(args.upstream):
            for i in range(args.records):
                oid = order_id(k, s, i, args.upstream, args.records)
                ms = order_ms(oid, per_minute)
                row = {"order_id": oid, "ts": _iso(ms), "amount": oid % 97}
                out.setdefault(("orders", s, k), []).append(json.dumps(row))
                paid = payment_ms(oid, per_minute)
                if paid is not None and paid // MINUTE < args.chunks:
                    pay = {"order_id": oid, "ts": _iso(paid), "method": "card"}
                    out.setdefault(("payments", s, paid // MINUTE), []).append(json.dumps(pay))
    for lines in out.values():  # payments of a chunk in event-time order
        lines.sort(key=lambda line: json.loads(line)["ts"])
    return out


def expected(args: argparse.Namespace) -> dict[int, int]:
    """order id -> the chunk whose release makes the pair joinable (its payment's)."""
    per_minute = args.upstream * args.records
    out = {}
    for oid in range(args.chunks * per_minute):
        paid = payment_ms(oid, per_minute)
        if paid is not None and paid // MINUTE < args.chunks:
            out[oid] = paid // MINUTE
    return out


def _iso(ms: int) -> str:
    return (BASE + dt.timedelta(milliseconds=ms)).isoformat()


class Feeder(threading.Thread):
    """Writes every chunk to `staging`, then renames chunk k of every partition of both sides
    into ``target/<side>/p<s>/c<k>.jsonl`` at ``start + k * interval``; `released[k]` is when
    chunk k appeared. With interval 0 it releases everything in `__init__`."""

    def __init__(self, args: argparse.Namespace, staging: str, target: str) -> None:
        super().__init__(daemon=True)
        self.args, self.staging, self.target = args, staging, target
        self.released: dict[int, float] = {}
        for (side, s, k), lines in chunks(args).items():
            for base in (staging, target):
                os.makedirs(f"{base}/{side}/p{s:02d}", exist_ok=True)
            with open(f"{staging}/{side}/p{s:02d}/c{k:04d}.jsonl", "w") as f:
                f.write("\n".join(lines) + "\n")
        for side in SIDES:
            for s in range(args.upstream):
                os.makedirs(f"{target}/{side}/p{s:02d}", exist_ok=True)
        if args.interval == 0:
            self.run()

    def run(self) -> None:
        if len(self.released) == self.args.chunks:
            return
        start = time.time()
        for k in range(self.args.chunks):
            time.sleep(max(0.0, start + k * self.args.interval - time.time()))
            for side in SIDES:
                for s in range(self.args.upstream):
                    name = f"{side}/p{s:02d}/c{k:04d}.jsonl"
                    if os.path.exists(f"{self.staging}/{name}"):
                        os.replace(f"{self.staging}/{name}", f"{self.target}/{name}")
                        # modification times in chunk order, a second apart: a reader that
                        # orders files by them (Spark's file source) reads in event order
                        at = start + k
                        os.utime(f"{self.target}/{name}", (at, at))
            self.released[k] = time.time()


# --- regional ----------------------------------------------------------------------------------


def event_time(record: dict[str, Any]) -> Any:
    return dt.datetime.fromisoformat(record["ts"])


def paid_row(order: dict[str, Any], payment: dict[str, Any]) -> dict[str, Any]:
    return {"order_id": order["order_id"], "amount": order["amount"], "paid": payment["ts"]}


def joins_job(name: str, args: argparse.Namespace, data: str, table: str) -> Pipeline:
    p = Pipeline(name, records_per_epoch=args.records * 4)
    orders, payments = (
        p.source(
            LogSource(f"{data}/{side}"),
            parallelism=args.upstream,
            name=side,
            event_time=event_time,
            max_out_of_orderness="5 s",
        )
        for side in SIDES
    )
    (
        orders.key_by("order_id")
        .interval_join(
            payments.key_by("order_id"),
            between=("0 s", "15 min"),
            partitions=args.partitions,
            emit=paid_row,
            name="paid",
        )
        .sink(ParquetSink(table), name="out")
    )
    return p


def _committed(table: str, user: str, seen: dict[str, tuple[list[int], float]]) -> None:
    """Add the commit records of `table` not in `seen` (path -> order ids, commit time)."""
    for path in glob.glob(f"{table}/_commits/{user}/*/*.json"):
        if path in seen:
            continue
        with open(path) as f:
            record = json.load(f)
        ids = [
            i
            for file in record["files"]
            for i in pq.read_table(f"{table}/{file}", columns=["order_id"])
            .column("order_id")
            .to_pylist()
        ]
        seen[path] = (ids, os.stat(path).st_mtime)


def run_regional(
    spark: Any, mode: str, args: argparse.Namespace, work: str, faults: frozenset[Any]
) -> dict[str, Any]:
    base = f"{work}/{mode}"
    feeder = Feeder(args, f"{base}/staging", f"{base}/data")
    overrides: dict[str, Any] = {
        "checkpointing.tolerable-failed-checkpoints": TOLERABLE,
        "checkpointing.interval": "200 ms",
    }
    policy = load_policy(env={}, overrides=overrides).policy
    table = f"{base}/table"
    runtime = SparkRuntime(
        joins_job(mode, args, f"{base}/data", table),
        spark,
        root=f"{base}/ckpt",
        policy=policy,
        faults=Faults(units=dict.fromkeys(faults, "fail")),
    )
    want = len(expected(args))
    seen: dict[str, tuple[list[int], float]] = {}
    user = runtime.committers["out"].commit_user
    deadline = [float("inf")]

    def progress(event: Any) -> None:
        _committed(table, user, seen)
        if sum(len(ids) for ids, _ in seen.values()) >= want:
            runtime.request_stop()
        if not feeder.is_alive() and deadline[0] == float("inf"):
            deadline[0] = time.time() + args.drain
        if time.time() >= deadline[0]:
            runtime.request_stop()

    runtime.progress = progress
    started = time.time()
    if args.interval:
        feeder.start()
    summary = runtime.run()
    _committed(table, user, seen)
    events = summary.checkpoints
    return {
        "mode": mode,
        "rows": {i: at for ids, at in seen.values() for i in ids},
        "duplicates": sum(len(ids) for ids, _ in seen.values())
        - len({i for ids, _ in seen.values() for i in ids}),
        "released": feeder.released or {k: started for k in range(args.chunks)},
        "checkpoints": len(events),
        "regional": sum(1 for e in events if e.kind == "regional"),
    }


# --- Spark Structured Streaming -------------------------------------------------------------------


def run_spark_ss(spark: Any, args: argparse.Namespace, work: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    base = f"{work}/spark-ss"
    feeder = Feeder(args, f"{base}/staging", f"{base}/data")
    out = f"{base}/table"

    def side(name: str, schema: str) -> Any:
        return (
            spark.readStream.schema(schema)
            .option("maxFilesPerTrigger", args.upstream)
            .json(f"{base}/data/{name}/*/*.jsonl")
            .withWatermark("ts", "5 seconds")
        )

    orders = side("orders", "order_id LONG, ts TIMESTAMP, amount LONG").alias("o")
    payments = side("payments", "order_id LONG, ts TIMESTAMP, method STRING").alias("p")
    joined = orders.join(
        payments,
        F.expr("o.order_id = p.order_id AND p.ts BETWEEN o.ts AND o.ts + INTERVAL 15 MINUTES"),
    ).selectExpr("o.order_id AS order_id", "o.amount AS amount", "p.ts AS paid")
    query = (
        joined.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", f"{base}/ckpt")
        .outputMode("append")
        .start()
    )
    started = time.time()
    if args.interval:
        feeder.start()
        feeder.join()
        time.sleep(args.drain)
    else:
        query.processAllAvailable()
    query.stop()
    rows: dict[int, float] = {}
    duplicates = 0
    for path in glob.glob(f"{out}/_spark_metadata/*"):
        if not os.path.basename(path).isdigit():
            continue
        at = os.stat(path).st_mtime
        with open(path) as f:
            entries = [json.loads(line) for line in f.read().splitlines()[1:] if line]
        for entry in entries:
            file = entry["path"].removeprefix("file:")
            for i in pq.read_table(file, columns=["order_id"]).column("order_id").to_pylist():
                duplicates += i in rows
                rows[i] = at
    return {
        "mode": "spark-ss",
        "rows": rows,
        "duplicates": duplicates,
        "released": feeder.released or {k: started for k in range(args.chunks)},
        "checkpoints": 0,
        "regional": 0,
    }


# --- measuring -----------------------------------------------------------------------------------


def measure(run: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Rows, input records/s and event-to-result latency, and whether the rows are exact."""
    want = expected(args)
    released: dict[int, float] = run["released"]
    start = min(released.values())
    latencies = [
        (at - released[want[i]], 1) for i, at in run["rows"].items() if want.get(i) in released
    ]
    last = max(run["rows"].values(), default=start)
    inputs = args.chunks * args.upstream * args.records + len(want)
    return {
        "mode": run["mode"],
        "checkpoints": run["checkpoints"],
        "regional": run["regional"],
        "rows": len(run["rows"]),
        "exact": run["rows"].keys() == want.keys() and run["duplicates"] == 0,
        "records_per_s": round(inputs / max(1e-9, last - start)),
        "p50_s": round(percentile(latencies or [(0.0, 1)], 50), 2),
        "p99_s": round(percentile(latencies or [(0.0, 1)], 99), 2),
    }


COLUMNS = (
    ("mode", "mode", "<15"),
    ("checkpoints", "checkpoints", ">11"),
    ("regional", "regional", ">8"),
    ("rows", "joined rows", ">11"),
    ("exact", "exact", ">5"),
    ("records_per_s", "records/s", ">9"),
    ("p50_s", "p50 s", ">6"),
    ("p99_s", "p99 s", ">6"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", type=int, default=8, help="partitions of each side")
    ap.add_argument("--partitions", type=int, default=8, help="join subtasks")
    ap.add_argument("--records", type=int, default=500, help="orders per partition and minute")
    ap.add_argument("--chunks", type=int, default=30, help="minutes of event time")
    ap.add_argument("--interval", type=float, default=3.0, help="seconds between chunks (0: all)")
    ap.add_argument("--drain", type=float, default=30.0, help="seconds after the last chunk")
    ap.add_argument("--p", type=float, default=0.05, help="per unit and checkpoint")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="4 partitions, 20 minutes")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    if args.quick:
        args.upstream, args.partitions, args.chunks, args.records = 4, 4, 20, 100
        args.interval, args.drain = min(args.interval, 2.0), 15.0
    units = 2 * args.upstream + args.partitions
    faults = schedule(args.seed, args.p, 5000, units)
    work = tempfile.mkdtemp(prefix="regional-bench-joins-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    runs = []
    try:
        runs.append(run_regional(spark, "regional", args, work, frozenset()))
        print_table(COLUMNS, [measure(runs[-1], args)])
        runs.append(run_regional(spark, "regional-faults", args, work, faults))
        print_table(COLUMNS, [measure(runs[-1], args)])
        runs.append(run_spark_ss(spark, args, work))
        print_table(COLUMNS, [measure(runs[-1], args)])
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [measure(r, args) for r in runs]
    base = rows[-1]["records_per_s"] or 1
    for row in rows:
        row["vs_spark_ss"] = round(row["records_per_s"] / base, 2)
    print(
        f"\n{args.upstream} partitions of orders and of payments, {args.partitions} join "
        f"subtasks, {args.records} orders per partition and minute, {args.chunks} minutes "
        + (
            f"released every {args.interval:g} s"
            if args.interval
            else "all there at the start (throughput)"
        )
        + f", p = {args.p} for regional-faults, master {args.master}; latency: commit - "
        "release of the later record's chunk\n"
    )
    print_table((*COLUMNS, ("vs_spark_ss", "records/s vs SS", ">15")), rows)
    stem = "joins-quick" if args.quick else "joins"
    if not args.interval:
        stem += "-throughput"
    write_results(
        f"{args.out}/{stem}.json",
        master=args.master,
        config={k: v for k, v in vars(args).items() if k != "out"},
        faults=len(faults),
        rows=rows,
    )
    print(f"\nwrote {args.out}/{stem}.json")


if __name__ == "__main__":
    main()
