"""Clickstream windows: per-user, per-minute click counts and per-user sessions from a
clickstream with out-of-order and late records, across a durable keyed exchange, with units
falling back on both sides (docs/event-time.md).

    python examples/clickstream_windows.py             # the demo, about 30 s with Spark's start
    regional run examples/clickstream_windows.py --checkpoint-dir /tmp/cw-ckpt

The demo writes 6 JSON-lines files of 300 clicks (1,800 clicks of 8 users over about 10
minutes, up to 20 s out of order, every 50th click 3 minutes late) and runs

    files (6 subtasks) -> parse -> exchange by user (4) -+-> per-minute counts -> per_minute
                                                         +-> sessions (gap 30 s) -> sessions

Each file's watermark is its largest event time minus 30 s (`max_out_of_orderness`), kept in
the split state; each upstream subtask commits its watermark with its exchange segments, and
the downstream watermark is the minimum over the writers at its cursor. A window emits one final
row once the watermark passes its end; a record behind every window of it is *late*: it goes
to the dead-letter table with the reason. Upstream unit 1 fails checkpoints 3 and 4, downstream
unit 7 checkpoint 5: with the default `hold` policy the rows are those of a fault-free run.

At the end the demo checks both tables with Spark SQL over the input files without the
dead-lettered clicks: ``groupBy(window(ts, '1 minute'), user).count()`` and
``groupBy(session_window(ts, '30 seconds'), user).count()``, and prints IDENTICAL.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
import time
from typing import Any

from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Session, Tumbling, Window, count
from regional.runtime.faults import Faults
from regional.sinks.parquet import ParquetSink
from regional.sources.files import FileSource

FILES, CLICKS_PER_FILE, USERS = 6, 300, 8
UPSTREAM, PARTITIONS = FILES, 4
START = dt.datetime(2026, 11, 26, 9, 0, tzinfo=dt.UTC)


def make_clicks(directory: str, *, files: int = FILES, per_file: int = CLICKS_PER_FILE) -> str:
    """Write `files` JSON-lines files of clicks (deterministic); returns the directory. Click
    n of a file happens about 2 s after click n-1, up to 20 s out of order; every 50th is 3
    minutes late. User u7 stops clicking after the first 2 minutes (a quiet user)."""
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        path = os.path.join(directory, f"clicks-{f:02d}.jsonl")
        if os.path.exists(path):
            continue
        lines = []
        for n in range(per_file):
            ms = f * 333 + n * 2_000 - (n * 7_919 % 11) * 2_000
            if n % 50 == 49:
                ms -= 180_000
            user = f"u{(n * 5 + f) % USERS}"
            if user == "u7" and n > 60:
                user = "u6"
            ts = START + dt.timedelta(milliseconds=ms)
            lines.append(
                json.dumps(
                    {"user": user, "ts": ts.isoformat(), "page": f"p{n % 13}", "f": f, "n": n}
                )
            )
        with open(path + ".tmp", "w") as out:
            out.write("\n".join(lines) + "\n")
        os.replace(path + ".tmp", path)  # files appear complete
    return directory


def event_time(click: dict[str, Any]) -> dt.datetime:
    """The click's time (the JSON reader already made the ISO text a datetime)."""
    ts = click["ts"]
    return ts if isinstance(ts, dt.datetime) else dt.datetime.fromisoformat(ts)


def parse(record: dict[str, Any]) -> dict[str, Any]:
    return {
        "user": str(record["user"]),
        "ts": event_time(record),
        "page": str(record["page"]),
        "f": int(record["f"]),
        "n": int(record["n"]),
    }


def user(click: dict[str, Any]) -> str:
    return str(click["user"])


def minute_row(key: Any, w: Window, value: Any) -> dict[str, Any]:
    return {"user": key, "minute": w.start, "clicks": value}


def session_row(key: Any, w: Window, value: Any) -> dict[str, Any]:
    return {"user": key, "start": w.start, "end": w.end, "clicks": value}


def build_pipeline(clicks_dir: str, out_dir: str) -> Pipeline:
    """Two stages joined by a durable keyed exchange: 6 + 4 fallback units."""
    p = Pipeline(
        "clickstream",
        records_per_epoch=60,
        on_error="dead-letter",
        dead_letter=ParquetSink(os.path.join(out_dir, "late")),
    )
    by_user = (
        p.source(
            FileSource(clicks_dir, format="jsonl"),
            parallelism=UPSTREAM,
            name="files",
            event_time=event_time,
            max_out_of_orderness="30 s",
        )
        .map(parse, name="parse")
        .exchange(user, partitions=PARTITIONS, name="by-user")
    )
    (
        by_user.key_by(user)
        .window(
            Tumbling("1 min"),
            aggregate=count(),
            emit=minute_row,
            on_late="dead-letter",
            name="minutes",
        )
        .sink(ParquetSink(os.path.join(out_dir, "per_minute")), name="per_minute")
    )
    (
        by_user.key_by(user)
        .window(
            Session("30 s"),
            aggregate=count(),
            emit=session_row,
            on_late="dead-letter",
            name="sessions",
        )
        .sink(ParquetSink(os.path.join(out_dir, "sessions")), name="sessions_out")
    )
    return p


#: Units 0-5 read the files and write the exchange; units 6-9 read it and run both windows.
FAULTS = Faults(units={(3, 1): "fail", (4, 1): "fail", (5, 7): "fail"})

_WORK = os.path.join(tempfile.gettempdir(), "regional-clickstream")


if __name__ == "regional_pipeline":  # loaded by `regional run`
    _root = os.environ.get("REGIONAL_CHECKPOINT_DIR", os.path.join(_WORK, "ckpt"))
    pipeline = build_pipeline(
        make_clicks(os.path.join(_WORK, "clicks")), _root.rstrip("/") + "-out"
    )
    faults = FAULTS


def check_windows(spark: Any, clicks_dir: str, out_dir: str) -> list[str]:
    """What differs between the committed tables and Spark SQL over the input without the
    clicks each window operator dead-lettered as late, one line per table at fault (empty:
    identical). Times compare as ms since the epoch (`unix_millis`)."""
    spark.read.json(clicks_dir).selectExpr(
        "user", "to_timestamp(ts) AS ts", "f", "n"
    ).createOrReplaceTempView("clicks")
    late_path = os.path.join(out_dir, "late")
    if os.path.exists(late_path):
        spark.read.parquet(late_path).selectExpr(
            "operator",
            "CAST(get_json_object(record, '$.f') AS BIGINT) AS f",
            "CAST(get_json_object(record, '$.n') AS BIGINT) AS n",
        ).createOrReplaceTempView("late")
    else:
        spark.createDataFrame([], "operator STRING, f BIGINT, n BIGINT").createOrReplaceTempView(
            "late"
        )
    checks = [
        (
            "per_minute",
            "minutes",
            "window(ts, '1 minute')",
            "unix_millis(window.start)",
        ),
        (
            "sessions",
            "sessions",
            "session_window(ts, '30 seconds')",
            "unix_millis(session_window.start), unix_millis(session_window.end)",
        ),
    ]
    problems = []
    for table, operator, window, columns in checks:
        want = {
            tuple(r)
            for r in spark.sql(
                f"""
                SELECT user, {columns}, count(*) AS clicks
                FROM clicks LEFT ANTI JOIN (SELECT f, n FROM late WHERE operator = '{operator}')
                USING (f, n)
                GROUP BY {window}, user
                """
            ).collect()
        }
        got = {tuple(r) for r in spark.read.parquet(os.path.join(out_dir, table)).collect()}
        if want != got:
            problems.append(
                f"{table}: {len(want - got)} row(s) of Spark SQL missing, {len(got - want)} extra"
            )
    return problems


def show(event: Any) -> None:
    """One line per checkpoint outcome."""
    fb = ",".join(map(str, event.fallback_units)) or "-"
    print(
        f"  checkpoint {event.checkpoint_id:>2}  {event.kind:<8}  fallback {fb:<3}  "
        f"records read {event.records_in:>4}  late {event.records_dead_lettered:>2}",
        flush=True,
    )


def main() -> int:
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="regional-clickstream-")
    clicks = make_clicks(os.path.join(work, "clicks"))
    print(f"clicks: {FILES} files x {CLICKS_PER_FILE} clicks of {USERS} users in {clicks}")
    print("starting Spark (local[*]; its log goes to clickstream-spark.log) ...", flush=True)
    spark = spark_session(log_file=os.path.join(work, "clickstream-spark.log"))
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    out = os.path.join(work, "out")
    p = build_pipeline(clicks, out)
    plan = p.regions()
    print(
        f"\n{plan.num_units} fallback units: 0-{UPSTREAM - 1} files -> parse -> exchange writer, "
        f"{UPSTREAM}-{plan.num_units - 1} exchange reader -> minutes + sessions"
    )
    print("faults: unit 1 at checkpoints 3 and 4, unit 7 at checkpoint 5")
    runtime = SparkRuntime(p, spark, root=os.path.join(work, "ckpt"), faults=FAULTS, progress=show)
    result = runtime.run()
    print(
        f"  -> {result.count('regional')} regional, {result.count('global')} global, "
        f"{result.count('aborted')} aborted checkpoints in {result.seconds:.1f} s"
    )
    problems = check_windows(spark, clicks, out)
    late: dict[str, int] = dict(
        spark.read.parquet(os.path.join(out, "late")).groupBy("operator").count().collect()
    )
    print(
        f"\nper-minute counts and sessions vs Spark SQL window / session_window over the "
        f"input without the late clicks ({late.get('minutes', 0)} for the minutes, "
        f"{late.get('sessions', 0)} for the sessions) -> "
        + ("IDENTICAL" if not problems else "DIFFERENT")
    )
    for line in problems:
        print(f"  {line}")
    print(f"total {time.monotonic() - started:.1f} s; files in {work}")
    spark.stop()
    return 0 if not problems and result.finished else 1


if __name__ == "__main__":
    sys.exit(main())
