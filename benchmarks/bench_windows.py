"""Per-minute windows over a keyed stream under partial failures: regional vs global checkpoints
vs Spark Structured Streaming (`withWatermark` + `window`), side by side in one run.

The same input for every contender: `--upstream` partitions of clicks (a directory each, a log
of JSON-lines segments), released chunk by chunk by a feeder thread (chunk k of every partition
at ``start + k * --interval`` s, each segment renamed into place complete). Chunk k of
partition s holds `--records` clicks whose event times cover minute k (up to 3 s out of order),
keys ``(n * 7919 + s) % --keys``. Contenders:

* `regional`: LogSource (`--upstream` subtasks, a partition each, one chunk per epoch) ->
  durable exchange by key (`--partitions` subtasks) -> ``window(Tumbling("1 min"),
  aggregate=count())`` -> Parquet, watermark bound 5 s; every (checkpoint, unit) fails with
  probability `--p` (seeded, the same schedule for both checkpoint modes);
* `global`: the same job with ``checkpointing.region.enabled = false`` (one failure aborts the
  checkpoint; every unit re-runs its epoch);
* `spark-ss`: ``readStream.json(dir, maxFilesPerTrigger=upstream).withWatermark("ts", "5
  seconds").groupBy(window("ts", "1 minute"), "key").count()``, append mode, Parquet file
  sink, default trigger (no failures: Spark has no partial failure to inject here).

**Measured.** Window rows committed by the time the feeder finished plus `--drain` seconds;
window results committed per second (rows / seconds from the first release to the last commit);
**event-to-result latency** of every row: its commit time (our sink's commit record; Spark's
`_spark_metadata/<batch>` entry) minus the release time of the chunk whose clicks first pass
the window's end (the earliest a watermark can close it: the floor every contender shares).
Rows must agree: every window both regional modes committed has the same count, and so has
every window Spark committed.

    .venv/bin/python -m benchmarks.bench_windows [--quick]

Run by hand (not a test); writes benchmarks/results/windows.json (windows-quick.json).
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
from regional.dataflow.windows import Tumbling, Window, count
from regional.policy import load_policy
from regional.runtime.faults import Faults
from regional.runtime.session import spark_session
from regional.runtime.spark import SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.log import LogSource

BASE = dt.datetime(2026, 11, 27, tzinfo=dt.UTC)
BASE_MS = int(BASE.timestamp() * 1000)
MINUTE = 60_000


# --- the input --------------------------------------------------------------------------------


def chunk_lines(k: int, s: int, records: int, keys: int) -> str:
    """Chunk k of split s: `records` clicks over minute k, up to 3 s out of order."""
    lines = []
    for i in range(records):
        n = k * records + i
        ms = k * MINUTE + i * MINUTE // records + s * 37 - (n * 7919 % 4) * 1000
        ts = BASE + dt.timedelta(milliseconds=max(0, ms))
        lines.append(json.dumps({"key": (n * 7919 + s) % keys, "ts": ts.isoformat(), "n": n}))
    return "\n".join(lines) + "\n"


class Feeder(threading.Thread):
    """Writes the chunks to `staging`, then renames chunk k of every partition into
    ``target/p<s>/c<k>.jsonl`` at ``start + k * interval``; `released[k]` is when chunk k
    appeared."""

    def __init__(self, args: argparse.Namespace, staging: str, target: str) -> None:
        super().__init__(daemon=True)
        self.args, self.staging, self.target = args, staging, target
        self.released: dict[int, float] = {}
        for s in range(args.upstream):
            os.makedirs(f"{staging}/p{s:02d}", exist_ok=True)
            os.makedirs(f"{target}/p{s:02d}", exist_ok=True)
            for k in range(args.chunks):
                with open(f"{staging}/p{s:02d}/c{k:04d}.jsonl", "w") as f:
                    f.write(chunk_lines(k, s, args.records, args.keys))

    def run(self) -> None:
        start = time.time()
        for k in range(self.args.chunks):
            time.sleep(max(0.0, start + k * self.args.interval - time.time()))
            for s in range(self.args.upstream):
                name = f"p{s:02d}/c{k:04d}.jsonl"
                os.replace(f"{self.staging}/{name}", f"{self.target}/{name}")
            self.released[k] = time.time()


# --- regional and global ------------------------------------------------------------------------


def key_of(click: dict[str, Any]) -> int:
    return int(click["key"])


def event_time(click: dict[str, Any]) -> Any:
    ts = click["ts"]
    return ts if isinstance(ts, dt.datetime) else dt.datetime.fromisoformat(ts)


def window_row(key: Any, w: Window, value: Any) -> dict[str, Any]:
    return {"key": key, "end": w.end, "count": value}


def windows_job(name: str, args: argparse.Namespace, clicks: str, table: str) -> Pipeline:
    p = Pipeline(name, records_per_epoch=args.records)
    (
        p.source(
            LogSource(clicks),
            parallelism=args.upstream,
            name="clicks",
            event_time=event_time,
            max_out_of_orderness="5 s",
        )
        .key_by(key_of, partitions=args.partitions, name="by-key")
        .window(Tumbling("1 min"), aggregate=count(), emit=window_row, name="minutes")
        .sink(ParquetSink(table), name="out")
    )
    return p


def run_regional(
    spark: Any, mode: str, args: argparse.Namespace, work: str, faults: frozenset[Any]
) -> dict[str, Any]:
    base = f"{work}/{mode}"
    feeder = Feeder(args, f"{base}/staging", f"{base}/clicks")
    overrides: dict[str, Any] = {
        "checkpointing.tolerable-failed-checkpoints": TOLERABLE,
        "checkpointing.interval": "200 ms",
    }
    if mode == "global":
        overrides["checkpointing.region.enabled"] = False
    policy = load_policy(env={}, overrides=overrides).policy
    table = f"{base}/table"
    runtime = SparkRuntime(
        windows_job(mode, args, f"{base}/clicks", table),
        spark,
        root=f"{base}/ckpt",
        policy=policy,
        faults=Faults(units=dict.fromkeys(faults, "fail")),
    )
    stop_at = [float("inf")]

    def progress(event: Any) -> None:
        if not feeder.is_alive() and stop_at[0] == float("inf"):
            stop_at[0] = time.time() + args.drain
        if time.time() >= stop_at[0]:
            runtime.request_stop()

    runtime.progress = progress
    feeder.start()
    summary = runtime.run()
    user = runtime.committers["out"].commit_user
    rows: dict[tuple[int, int], tuple[int, float]] = {}
    for path in glob.glob(f"{table}/_commits/{user}/*/*.json"):
        with open(path) as f:
            record = json.load(f)
        at = os.stat(path).st_mtime
        for file in record["files"]:
            t = pq.read_table(f"{table}/{file}").to_pydict()
            for key, end, n in zip(t["key"], t["end"], t["count"], strict=True):
                assert (key, end) not in rows, f"{mode}: window ({key}, {end}) twice"
                rows[key, end] = (n, at)
    events = summary.checkpoints
    return {
        "mode": mode,
        "rows": rows,
        "released": feeder.released,
        "checkpoints": len(events),
        "regional": sum(1 for e in events if e.kind == "regional"),
        "completed": sum(1 for e in events if e.kind in ("regional", "global")),
    }


# --- Spark Structured Streaming -------------------------------------------------------------------


def run_spark_ss(spark: Any, args: argparse.Namespace, work: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    base = f"{work}/spark-ss"
    feeder = Feeder(args, f"{base}/staging", f"{base}/clicks")
    out = f"{base}/table"
    stream = (
        spark.readStream.schema("key LONG, ts TIMESTAMP, n LONG")
        .option("maxFilesPerTrigger", args.upstream)
        .json(f"{base}/clicks/*/*.jsonl")
        .withWatermark("ts", "5 seconds")
        .groupBy(F.window("ts", "1 minute"), "key")
        .count()
        .selectExpr("key", "unix_millis(window.end) AS end", "count")
    )
    query = (
        stream.writeStream.format("parquet")
        .option("path", out)
        .option("checkpointLocation", f"{base}/ckpt")
        .outputMode("append")
        .start()
    )
    feeder.start()
    feeder.join()
    time.sleep(args.drain)
    query.stop()
    rows: dict[tuple[int, int], tuple[int, float]] = {}
    for path in glob.glob(f"{out}/_spark_metadata/*"):
        if not os.path.basename(path).isdigit():
            continue
        at = os.stat(path).st_mtime
        with open(path) as f:
            entries = [json.loads(line) for line in f.read().splitlines()[1:] if line]
        for entry in entries:
            t = pq.read_table(entry["path"].removeprefix("file:")).to_pydict()
            for key, end, n in zip(t["key"], t["end"], t["count"], strict=True):
                rows[key, end] = (n, at)
    return {
        "mode": "spark-ss",
        "rows": rows,
        "released": feeder.released,
        "checkpoints": 0,
        "regional": 0,
        "completed": 0,
    }


# --- measuring -----------------------------------------------------------------------------------


def measure(run: dict[str, Any]) -> dict[str, Any]:
    """Rows, rows/s and event-to-result latency (commit - release of the closing chunk)."""
    released: dict[int, float] = run["released"]
    start = min(released.values())
    latencies = []
    for (_, end), (_, at) in run["rows"].items():
        closing = (end - BASE_MS) // MINUTE  # the chunk whose clicks first pass `end`
        if closing in released:
            latencies.append(at - released[closing])
    last = max((at for _, at in run["rows"].values()), default=start)
    samples = [(x, 1) for x in latencies] or [(0.0, 1)]
    return {
        "mode": run["mode"],
        "checkpoints": run["checkpoints"],
        "regional": run["regional"],
        "rows": len(run["rows"]),
        "rows_per_s": round(len(run["rows"]) / max(1e-9, last - start), 1),
        "p50_s": round(percentile(samples, 50), 2),
        "p99_s": round(percentile(samples, 99), 2),
    }


COLUMNS = (
    ("mode", "mode", "<9"),
    ("checkpoints", "checkpoints", ">11"),
    ("regional", "regional", ">8"),
    ("rows", "window rows", ">11"),
    ("rows_per_s", "rows/s", ">7"),
    ("p50_s", "p50 s", ">6"),
    ("p99_s", "p99 s", ">6"),
)


def agree(runs: list[dict[str, Any]]) -> None:
    """Every window two contenders both committed has the same count."""
    first = runs[0]["rows"]
    for other in runs[1:]:
        rows = other["rows"]
        for window in first.keys() & rows.keys():
            a, b = first[window][0], rows[window][0]
            if a != b:
                raise AssertionError(
                    f"window (key {window[0]}, end {window[1]}): {runs[0]['mode']} counted {a}, "
                    f"{other['mode']} {b}"
                )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--upstream", type=int, default=16, help="upstream subtasks (splits)")
    ap.add_argument("--partitions", type=int, default=16, help="downstream subtasks")
    ap.add_argument("--records", type=int, default=200, help="clicks per split and minute")
    ap.add_argument("--keys", type=int, default=256)
    ap.add_argument("--chunks", type=int, default=20, help="minutes of event time")
    ap.add_argument("--interval", type=float, default=4.0, help="seconds between chunks")
    ap.add_argument("--drain", type=float, default=20.0, help="seconds after the last chunk")
    ap.add_argument("--p", type=float, default=0.05, help="per unit and checkpoint")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="4 x 4 units, 8 minutes")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON")
    args = ap.parse_args()
    if args.quick:
        args.upstream, args.partitions, args.chunks, args.records = 4, 4, 8, 100
        args.interval, args.drain = 3.0, 12.0
    units = args.upstream + args.partitions
    faults = schedule(args.seed, args.p, 5000, units)  # every checkpoint a run may reach
    work = tempfile.mkdtemp(prefix="regional-bench-windows-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    spark.conf.set("spark.sql.shuffle.partitions", str(args.partitions))
    runs = []
    try:
        for mode in ("regional", "global"):
            runs.append(run_regional(spark, mode, args, work, faults))
            print_table(COLUMNS, [measure(runs[-1])])
        runs.append(run_spark_ss(spark, args, work))
        print_table(COLUMNS, [measure(runs[-1])])
        agree(runs)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    rows = [measure(r) for r in runs]
    print(
        f"\n{args.upstream} upstream x {args.partitions} downstream units, p = {args.p} per unit "
        f"and checkpoint (regional, global), {args.records} clicks per split and minute, "
        f"{args.chunks} minutes released every {args.interval:g} s, {args.keys} keys, master "
        f"{args.master}; latency: commit - release of the chunk that closes the window\n"
    )
    print_table(COLUMNS, rows)
    stem = "windows-quick" if args.quick else "windows"
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
