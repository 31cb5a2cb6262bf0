"""Partial failures on real Spark: regional vs global checkpoints vs Spark Structured Streaming.

One pipeline, one data set, one failure schedule, every contender in the same run (`local[2]`):

    generator (64 splits, `--records` records per split and epoch) -> transform -> Parquet table

* `regional-default`: our runtime, 64 regions, the default policy (`max-consecutive-regional
  = "unlimited"`; a unit over `max-unit-fallbacks = 3` is stuck: isolated, and the job fails
  only once it stays stuck past `max-stuck-time = 15 min`);
* `regional-force-fresh`: `on-unit-fallback-limit = "force-fresh"` (the unit over the limit must
  be fresh in the next checkpoint, which aborts if it fails again: the defaults before issue 26,
  but for the job-level limit);
* `regional-k10`: `max-consecutive-regional = 10` (the default before issue 26), at the highest
  p only;
* `regional-k2`: `max-consecutive-regional = 2` (Flink's default), at the highest p only;
* `global`: our runtime with `[checkpointing.region] enabled = false`;
* `structured-streaming`: the same pipeline as a Structured Streaming query (a Python streaming
  data source, `foreachBatch` writing each batch with overwrite to `batch=<id>/`, idempotent),
  restarted from its checkpoint location as soon as it fails, as an operator would.

Every contender gets `--checkpoints` epochs (checkpoint attempts; micro-batch attempts for
Structured Streaming), and the failure schedule: (epoch, unit) pairs, each drawn with
probability p from one seed. In our runtime the unit's task raises (`Faults` "fail"); in
Structured Streaming the Spark task of partition `unit` raises in micro-batch attempt `epoch`.
`tolerable-failed-checkpoints` is set to 1,000,000 so that no contender's job fails.

Measured from what the run leaves behind: the source logs every read (split, range, time); a
record's commit latency is the time from its *first* read to the moment the commit that made it
visible was written (the commit object's / `_SUCCESS` file's mtime); records re-processed are
reads whose output was discarded (reads minus committed records). The committed tables are
checked for exactly-once (every split's committed records are 0..n-1, each once).

    .venv/bin/python -m benchmarks.bench_partial_failures [--quick]

Writes benchmarks/results/partial_failures.json and partial_failures.png (committed records over
time at the highest p).
"""

from __future__ import annotations

import argparse
import bisect
import collections
import dataclasses
import glob
import itertools
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from benchmarks.report import RESULTS, print_table, write_results
from metadata.events import CheckpointEvent
from regional.dataflow.pipeline import Pipeline
from regional.policy import Policy, load_policy
from regional.runtime.session import spark_session
from regional.runtime.spark import Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink
from regional.sources.base import ReadResult
from regional.sources.generator import GeneratorSource

TOLERABLE = 1_000_000
DEFAULT_TOLERABLE = Policy().checkpointing.tolerable_failed_checkpoints
SCHEMA = pa.schema([("split", pa.int64()), ("n", pa.int64()), ("value", pa.int64())])
OUT_SCHEMA = "split long, n long, score long"
INJECTED = "(injected fault)"  # in every injected failure's message, ours and Spark's


# --- the workload, identical for every contender ----------------------------------------------


def make_record(split: int, n: int) -> dict[str, int]:
    return {"split": split, "n": n, "value": (n * 7919 + split) % 10007}


def make_batch(split: int, start: int, end: int) -> pa.RecordBatch:
    """The records `make_record(split, n)` for n in [start, end), as one Arrow batch."""
    ns = range(start, end)
    return pa.RecordBatch.from_arrays(
        [
            pa.array([split] * len(ns), pa.int64()),
            pa.array(ns, pa.int64()),
            pa.array([(n * 7919 + split) % 10007 for n in ns], pa.int64()),
        ],
        schema=SCHEMA,
    )


def transform(batch: pa.RecordBatch) -> pa.RecordBatch:
    """The work every contender does per record: a derived column."""
    score = pc.add(pc.multiply(batch["value"], 3), batch["split"])
    return pa.RecordBatch.from_arrays(
        [batch["split"], batch["n"], score], names=["split", "n", "score"]
    )


def log_read(log: str, split: int, start: int, end: int) -> None:
    """One line per read (appends of one short line are atomic on a local disk)."""
    if end > start:
        with open(log, "a") as f:
            f.write(f"{split} {start} {end} {time.time():.6f}\n")


class LoggedGenerator:
    """`GeneratorSource` that logs every read (our runtime's source); `inner` replaces the
    default generator of `make_record` (its split ids must be ``g<split>``)."""

    def __init__(self, splits: int, log: str, *, inner: GeneratorSource | None = None) -> None:
        self.inner = inner or GeneratorSource(splits, make_record, schema=SCHEMA)
        self.log = log

    @property
    def bounded(self) -> bool:
        return False

    def discover(self) -> list[str]:
        return self.inner.discover()

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        result = self.inner.read(split_id, position, max_records)
        log_read(self.log, int(split_id[1:]), int(position or b"0"), int(result.position))
        return result


# --- Structured Streaming: the same generator as a Python streaming data source ----------------


class _Ranges(InputPartition):
    """One Spark task's share: records start..end-1 of each of `splits`."""

    def __init__(self, splits: tuple[int, ...], start: int, end: int, log: str) -> None:
        self.splits, self.start, self.end, self.log = splits, start, end, log


class _GeneratorReader(DataSourceStreamReader):
    """`splits` splits, `records` more records of each per micro-batch, packed into `tasks`
    Spark tasks (as our runtime packs units into one task per core)."""

    def __init__(self, options: dict[str, str]) -> None:
        self.splits = int(options["splits"])
        self.per_batch = int(options["records"])
        self.tasks = int(options["tasks"])
        self.log = options["log"]

    def initialOffset(self) -> dict[str, int]:
        return {"n": 0}

    def latestOffset(self, start: dict[str, int], limit: Any) -> dict[str, int]:
        return {"n": start["n"] + self.per_batch}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> list[_Ranges]:
        return [
            _Ranges(tuple(range(k, self.splits, self.tasks)), start["n"], end["n"], self.log)
            for k in range(self.tasks)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        share = cast(_Ranges, partition)  # one of `partitions`, shipped to this task
        for split in share.splits:
            log_read(share.log, split, share.start, share.end)
            yield make_batch(split, share.start, share.end)


class GeneratorStream(DataSource):
    """`spark.readStream.format("bench_generator")`: split s, records n = start..end-1."""

    @classmethod
    def name(cls) -> str:
        return "bench_generator"

    def schema(self) -> str:
        return "split long, n long, value long"

    def streamReader(self, schema: Any) -> _GeneratorReader:
        return _GeneratorReader(dict(self.options))


class _Finished(Exception):
    """Raised in foreachBatch once the benchmark's attempts are used up (ends the query)."""


def _failing_transform(failing: frozenset[int], attempt: int) -> Any:
    """The transform, raising in the task that processes a split scheduled to fail."""

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        failing_splits = pa.array(sorted(failing), pa.int64())
        for b in batches:  # Spark re-batches: a batch may hold several splits
            hit = pc.filter(b["split"], pc.is_in(b["split"], value_set=failing_splits))
            if len(hit):
                raise RuntimeError(f"split {hit[0]} fails attempt {attempt} {INJECTED}")
            yield transform(b)

    return run


# --- contenders ---------------------------------------------------------------------------------


@dataclasses.dataclass
class Outcome:
    """What a contender did, in the shared vocabulary (an epoch = a checkpoint attempt)."""

    name: str
    p: float
    started: float  # wall clock
    seconds: float
    epochs: list[tuple[bool, frozenset[int]]]  # (completed, units whose output was not kept)
    commits: list[tuple[float, list[str]]]  # (commit time, committed parquet files)
    read_log: str
    restarts: int = 0
    #: Structured Streaming: (start, end) of each micro-batch attempt, seconds since `started`
    attempt_times: list[tuple[float, float]] = dataclasses.field(default_factory=list)
    #: our runtime: checkpoint attempts after which some unit was stuck (`CheckpointEvent.stuck`)
    stuck: int = 0


def schedule(seed: int, p: float, epochs: int, units: int) -> frozenset[tuple[int, int]]:
    rng = random.Random(f"{seed}/{p}")
    return frozenset((e, u) for e in range(1, epochs + 1) for u in range(units) if rng.random() < p)


def run_regional(
    spark: Any,
    name: str,
    overrides: dict[str, Any],
    faults: frozenset[tuple[int, int]],
    args: argparse.Namespace,
    work: str,
    p: float,
) -> Outcome:
    base = f"{work}/{name}-{p}"
    assert not os.path.exists(base), f"{base} exists: every run starts from nothing"
    log = f"{base}.reads"
    table = f"{base}/table"
    pipeline = Pipeline(name, records_per_epoch=args.records)
    src = pipeline.source(LoggedGenerator(args.regions, log), parallelism=args.regions)
    src.map_batches(transform, name="transform").sink(ParquetSink(table), name="out")
    policy = load_policy(
        env={},
        overrides={"checkpointing.tolerable-failed-checkpoints": TOLERABLE, **overrides},
    ).policy
    runtime = SparkRuntime(
        pipeline,
        spark,
        root=f"{base}/ckpt",
        policy=policy,
        faults=Faults(units=dict.fromkeys(faults, "fail")),
    )
    started = time.time()
    summary = runtime.run(max_checkpoints=args.checkpoints)
    seconds = time.time() - started
    epochs = [_regional_epoch(r, args.regions) for r in summary.checkpoints]
    commits_dir = f"{table}/_commits/{runtime.committers['out'].commit_user}"
    commits = []
    # records are grouped by 1,000 ids: _commits/<user>/<group>/<id>.json (regional.sinks.parquet)
    for path in sorted(glob.glob(f"{commits_dir}/*/*.json")):
        with open(path) as f:
            files = [f"{table}/{x}" for x in json.load(f)["files"]]
        commits.append((os.stat(path).st_mtime, files))
    stuck = sum(1 for r in summary.checkpoints if r.stuck)
    return Outcome(name, p, started, seconds, epochs, commits, log, stuck=stuck)


def _regional_epoch(report: CheckpointEvent, units: int) -> tuple[bool, frozenset[int]]:
    for unit, cause in report.causes.items():
        if INJECTED not in cause:
            raise RuntimeError(f"checkpoint {report.checkpoint_id}: unit {unit} fell back: {cause}")
    if report.kind == "aborted":
        return False, frozenset(range(units))
    return True, frozenset(report.fallback_units)


def run_structured_streaming(
    spark: Any,
    name: str,
    faults: frozenset[tuple[int, int]],
    args: argparse.Namespace,
    work: str,
    p: float,
) -> Outcome:
    base = f"{work}/{name}-{p}"
    assert not os.path.exists(base), f"{base} exists: every run starts from nothing"
    log, table, checkpoint = f"{base}.reads", f"{base}/table", f"{base}/checkpoint"
    state = {"attempt": 0, "restarts": 0}
    epochs: list[tuple[bool, frozenset[int]]] = []
    every = frozenset(range(args.regions))
    starts: list[float] = []  # when each attempt started and ended
    ends: list[float] = []
    unexpected: list[Exception] = []  # failures that were not injected end the benchmark

    def each_batch(df: Any, batch_id: int) -> None:
        if state["attempt"] >= args.checkpoints:
            raise _Finished(f"{args.checkpoints} micro-batch attempts done")
        state["attempt"] += 1
        attempt = state["attempt"]
        starts.append(time.time())
        failing = frozenset(u for e, u in faults if e == attempt)
        out = df.mapInArrow(_failing_transform(failing, attempt), OUT_SCHEMA)
        try:
            out.write.mode("overwrite").parquet(f"{table}/batch={batch_id}")
        except Exception as exc:
            epochs.append((False, every))
            ends.append(time.time())
            if INJECTED not in str(exc):
                unexpected.append(exc)
            raise
        epochs.append((True, frozenset()))
        ends.append(time.time())

    stream = (
        spark.readStream.format("bench_generator")
        .option("splits", args.regions)
        .option("records", args.records)
        .option("log", log)
        .option("tasks", spark.sparkContext.defaultParallelism)
        .load()
    )
    started = time.time()
    while state["attempt"] < args.checkpoints:
        query = (
            stream.writeStream.foreachBatch(each_batch)
            .option("checkpointLocation", checkpoint)
            .start()
        )
        attempts_before = state["attempt"]
        try:
            query.awaitTermination()
        except Exception as exc:
            if unexpected or state["attempt"] == attempts_before:
                cause = unexpected[0] if unexpected else exc
                raise RuntimeError(f"{name}: the query failed without an injected fault") from cause
            if state["attempt"] < args.checkpoints:
                state["restarts"] += 1  # the operator restarts the failed query at once
    seconds = time.time() - started
    commits = []
    for entry in sorted(os.listdir(table), key=lambda d: int(d.split("=")[1])):
        success = f"{table}/{entry}/_SUCCESS"
        if os.path.exists(success):
            files = sorted(
                f"{table}/{entry}/{f}"
                for f in os.listdir(f"{table}/{entry}")
                if f.endswith(".parquet")
            )
            commits.append((os.stat(success).st_mtime, files))
    times = [
        (round(a - started, 2), round(b - started, 2)) for a, b in zip(starts, ends, strict=True)
    ]
    return Outcome(
        "structured-streaming", p, started, seconds, epochs, commits, log, state["restarts"], times
    )


# --- measuring ----------------------------------------------------------------------------------


class FirstReads:
    """When each record was first read: per split, disjoint ranges [lo, hi) with their time."""

    def __init__(self, log: str) -> None:
        reads: dict[int, list[tuple[float, int, int]]] = collections.defaultdict(list)
        self.total = 0
        with open(log) as f:
            for line in f:
                fields = line.split()
                start, end = int(fields[1]), int(fields[2])
                reads[int(fields[0])].append((float(fields[3]), start, end))
                self.total += end - start
        self.ranges: dict[int, list[tuple[int, int, float]]] = {}
        for split, rs in reads.items():
            seen, ranges = 0, []
            for t, start, end in sorted(rs):
                if end > max(start, seen):
                    ranges.append((max(start, seen), end, t))
                    seen = end
            self.ranges[split] = ranges

    def latencies(
        self, split: int, lo: int, hi: int, committed_at: float
    ) -> list[tuple[float, int]]:
        """(latency, records) for records lo..hi-1 of `split` committed at `committed_at`."""
        ranges = self.ranges[split]
        i = max(0, bisect.bisect_right(ranges, (lo, float("inf"), 0.0)) - 1)
        out = []
        while i < len(ranges) and ranges[i][0] < hi:
            a, b, t = ranges[i]
            n = min(b, hi) - max(a, lo)
            if n > 0:
                out.append((committed_at - t, n))
            i += 1
        return out


def percentile(samples: list[tuple[float, int]], q: float) -> float:
    """The q-th percentile of values given as (value, how many times), interpolated linearly
    between the two nearest ranks (numpy's default method on the expanded sample)."""
    ordered = sorted(samples)
    cumulative = list(itertools.accumulate(n for _, n in ordered))
    h = (cumulative[-1] - 1) * q / 100
    low = int(h)

    def at(rank: int) -> float:
        return ordered[bisect.bisect_right(cumulative, rank)][0]

    if low + 1 >= cumulative[-1]:
        return at(low)
    return at(low) + (h - low) * (at(low + 1) - at(low))


def measure(o: Outcome) -> dict[str, Any]:
    reads = FirstReads(o.read_log)
    lat, weights = [], []
    committed: dict[int, list[tuple[int, int]]] = collections.defaultdict(list)
    curve = []
    total = 0
    for at, files in o.commits:
        for file in files:
            cols = pq.read_table(file, columns=["split", "n"])
            groups = cols.group_by("split").aggregate([("n", "min"), ("n", "max"), ("n", "count")])
            g = groups.to_pydict()
            for split, lo, top, count in zip(
                g["split"], g["n_min"], g["n_max"], g["n_count"], strict=True
            ):
                assert top + 1 - lo == count, f"{o.name}: {file} holds a gap or a duplicate"
                committed[split].append((lo, top + 1))
                for latency, n in reads.latencies(split, lo, top + 1, at):
                    lat.append(latency)
                    weights.append(n)
            total += cols.num_rows
        curve.append((round(at - o.started, 3), total))
    for split, ranges in committed.items():  # exactly once: 0..n-1, each once
        ranges.sort()
        assert ranges[0][0] == 0 and all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), (
            f"{o.name}: split {split} committed ranges {ranges[:5]}... are not exactly-once"
        )
    latencies = list(zip(lat, weights, strict=True)) or [(0.0, 1)]
    lag: collections.Counter[int] = collections.Counter()
    worst = 0
    for _, behind in o.epochs:
        lag = collections.Counter({u: lag[u] + 1 for u in behind})
        worst = max(worst, max(lag.values(), default=0))
    done = sum(1 for ok, _ in o.epochs if ok)
    aborts_in_a_row, job_fails_at = 0, None  # with tolerable-failed-checkpoints at its default
    for epoch, (ok, _) in enumerate(o.epochs, 1):
        aborts_in_a_row = 0 if ok else aborts_in_a_row + 1
        if aborts_in_a_row > DEFAULT_TOLERABLE and job_fails_at is None:
            job_fails_at = epoch
    gaps = [  # Structured Streaming: from a failed attempt's end to the restarted query's next
        b[0] - a[1]
        for (ok, _), a, b in zip(o.epochs, o.attempt_times, o.attempt_times[1:], strict=False)
        if not ok
    ]
    return {
        "contender": o.name,
        "p": o.p,
        "stuck": o.stuck,
        "epochs": len(o.epochs),
        "completed": done,
        "aborted": len(o.epochs) - done,
        "restarts": o.restarts,
        "seconds": round(o.seconds, 2),
        "records_read": reads.total,
        "records_committed": total,
        "committed_per_s": round(total / o.seconds, 1),
        "p50_latency_s": round(percentile(latencies, 50), 3),
        "p99_latency_s": round(percentile(latencies, 99), 3),
        "records_reprocessed": reads.total - total,
        "max_unit_lag": worst,
        "job_fails_at_default_tolerance": job_fails_at,
        "restart_gap_median_s": round(statistics.median(gaps), 2) if gaps else None,
        "committed_over_time": curve,
    }


# --- main ---------------------------------------------------------------------------------------

CONTENDERS: dict[str, dict[str, Any]] = {
    "regional-default": {},
    "regional-force-fresh": {"checkpointing.region.on-unit-fallback-limit": "force-fresh"},
    "regional-k10": {"checkpointing.region.max-consecutive-regional": 10},
    "regional-k2": {"checkpointing.region.max-consecutive-regional": 2},
    "global": {"checkpointing.region.enabled": False},
}
#: Contenders run at the highest p only (they differ from the default only when forced global
#: checkpoints meet failures).
HIGHEST_P_ONLY = ("regional-k10", "regional-k2")
COLUMNS = (
    ("contender", "contender", "<21"),
    ("p", "p", "<5"),
    ("completed", "done", ">4"),
    ("aborted", "abort", ">5"),
    ("restarts", "restarts", ">8"),
    ("seconds", "seconds", ">7"),
    ("records_committed", "committed", ">9"),
    ("committed_per_s", "committed/s", ">11"),
    ("p50_latency_s", "p50 s", ">6"),
    ("p99_latency_s", "p99 s", ">6"),
    ("records_reprocessed", "re-processed", ">12"),
    ("max_unit_lag", "max lag", ">7"),
    ("stuck", "stuck", ">5"),
)


def plot(rows: list[dict[str, Any]], p: float, regions: int, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for r in rows:
        if r["p"] != p:
            continue
        xs = [0.0] + [x for x, _ in r["committed_over_time"]] + [r["seconds"]]
        ys = [0] + [y for _, y in r["committed_over_time"]] + [r["records_committed"]]
        label = f"{r['contender']}: {r['records_committed']:,} in {r['seconds']:.0f} s"
        ax.step(xs, ys, where="post", label=label)
    ax.set_xlabel("seconds since the run started")
    ax.set_ylabel("records committed (visible in the sink)")
    ax.set_title(f"{regions} regions, per-region failure probability p = {p} per checkpoint")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--regions", type=int, default=64)
    ap.add_argument("--records", type=int, default=500, help="records per split and epoch")
    ap.add_argument("--checkpoints", type=int, default=50)
    ap.add_argument("--p", type=float, nargs="+", default=[0.0, 0.01, 0.05])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--master", default="local[2]")
    ap.add_argument("--quick", action="store_true", help="16 regions, 10 checkpoints, p=0.05")
    ap.add_argument("--out", default=RESULTS, help="directory for the JSON and PNG")
    ap.add_argument("--replot", action="store_true", help="only redraw the PNG from the JSON")
    args = ap.parse_args()
    stem = "partial_failures-quick" if args.quick else "partial_failures"
    if args.replot:
        with open(f"{args.out}/{stem}.json") as f:
            saved = json.load(f)
        config = saved["config"]
        plot(saved["rows"], max(config["p"]), config["regions"], f"{args.out}/{stem}.png")
        return
    if args.quick:
        args.regions, args.checkpoints, args.records, args.p = 16, 10, 100, [0.05]
    work = tempfile.mkdtemp(prefix="regional-bench-failures-")
    spark = spark_session(args.master, log_file=f"{work}/spark.log")
    spark.dataSource.register(GeneratorStream)
    rows = []
    try:
        # warm both paths up (Python workers, Catalyst, the data source planner), unmeasured
        warm = argparse.Namespace(**{**vars(args), "checkpoints": 10})
        run_regional(spark, "warm-up", {}, frozenset(), warm, work, 0.0)
        run_structured_streaming(spark, "warm-up-sss", frozenset(), warm, work, 0.0)
        for p in args.p:
            faults = schedule(args.seed, p, args.checkpoints, args.regions)
            for name, overrides in CONTENDERS.items():
                if name in HIGHEST_P_ONLY and p != max(args.p):
                    continue
                outcome = run_regional(spark, name, overrides, faults, args, work, p)
                rows.append(measure(outcome))
                print_table(COLUMNS, rows[-1:])
            rows.append(measure(run_structured_streaming(spark, "sss", faults, args, work, p)))
            print_table(COLUMNS, rows[-1:])
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"\n{args.regions} regions, {args.records} records per region and epoch, "
        f"{args.checkpoints} epochs, master {args.master}, seed {args.seed}\n"
    )
    print_table(COLUMNS, rows)
    write_results(
        f"{args.out}/{stem}.json",
        master=args.master,
        config={k: v for k, v in vars(args).items() if k not in ("out", "replot")},
        rows=rows,
    )
    plot(rows, max(args.p), args.regions, f"{args.out}/{stem}.png")
    print(f"\nwrote {args.out}/{stem}.json and {stem}.png")


if __name__ == "__main__":
    main()
