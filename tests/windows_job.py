"""Event-time jobs for the window and timer tests: clicks of a few users from generator splits,
out of order within a bound, with a few records far behind (late); windows per user on a
forward chain (state per split) or after a durable exchange (state per user), and an
independent model of what they must emit (per split, epoch by epoch)."""

from __future__ import annotations

import json
import os
from collections import Counter
from typing import Any

from metadata.watermarks import MIN_WATERMARK
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import (
    Aggregate,
    Session,
    Sliding,
    Tumbling,
    Window,
    combine,
    count,
    count_distinct,
    max_of,
    mean_of,
    sum_of,
)
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.files import FileSource
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT, PER_EPOCH, USERS = 4, 120, 15, 5
BOUND_MS = 4_000


def click(split: int, n: int) -> dict[str, Any]:
    """Click n of split `split`: about one per second, up to 3 s out of order, every 23rd
    click 40 s behind (late), users u0..u4; user u4 stops clicking after 40 s (quiet)."""
    ts = 1_000_000 + split * 700 + n * 1_000 - (n * 7919 % 4) * 1_000
    if n % 23 == 22:
        ts -= 40_000
    user = f"u{(n * 3 + split) % USERS}"
    if user == "u4" and n > 40:
        user = "u3"
    return {"user": user, "ts": ts, "split": split, "n": n}


#: the clicks `check` (before the exchange) raises on: three per split, none of them late
POISON_N = (13, 53, 93)


def check(r: dict[str, Any]) -> dict[str, Any]:
    """An upstream map that fails on the clicks numbered `POISON_N` (dead-lettered)."""
    if r["n"] in POISON_N:
        raise ValueError(f"click {r['n']} of split {r['split']} is poison")
    return r


def user(r: dict[str, Any]) -> str:
    return str(r["user"])


def ts_of(r: dict[str, Any]) -> int:
    return int(r["ts"])


def emit(key: Any, w: Window, value: Any) -> dict[str, Any]:
    return {"user": key, "start": w.start, "end": w.end, "value": value}


ASSIGNERS: dict[str, Any] = {
    "tumbling": Tumbling("10 s"),
    "sliding": Sliding("10 s", "5 s"),
    "session": Session("2 s"),
}


def pipeline(
    kind: str,
    table: str,
    *,
    partitions: int | None = None,
    parallelism: int = 2,
    on_late: str = "drop",
    dead_letter: Any = None,
    checked: bool = False,
) -> Pipeline:
    """clicks (`parallelism` subtasks) -> [`check` when `checked`] -> [exchange by user] ->
    window `kind` -> Parquet."""
    p = Pipeline(
        "clicks",
        records_per_epoch=PER_EPOCH,
        on_error="dead-letter" if dead_letter is not None else "fail",
        dead_letter=dead_letter,
    )
    src = GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT)
    stream = p.source(
        src,
        parallelism=parallelism,
        name="clicks",
        event_time=ts_of,
        max_out_of_orderness=BOUND_MS / 1000,
    )
    if checked:
        stream = stream.map(check, name="check")
    keyed = stream.key_by(user, partitions=partitions, name="by-user" if partitions else None)
    keyed.window(ASSIGNERS[kind], aggregate=count(), emit=emit, on_late=on_late, name="win").sink(
        ParquetSink(table), name="out"
    )
    return p


def canonical(value: Any) -> str:
    """`value` as text where equal floats are equal bit for bit (-0.0 is not 0.0, nan is nan)
    and a dict's order does not count (state is a mapping; its order is not kept)."""
    if isinstance(value, dict):
        items = sorted((repr(k), canonical(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(canonical(v) for v in value) + "]"
    return repr(value)


def rows(table: str) -> list[tuple[Any, ...]]:
    """The committed window rows, sorted (a multiset: one row per emitted window)."""
    t = read_table(table)
    if t.num_rows == 0:
        return []
    return sorted(
        zip(*(t.column(c).to_pylist() for c in ("user", "start", "end", "value")), strict=True)
    )


def forward_model(kind: str) -> tuple[list[tuple[Any, ...]], int]:
    """What the forward-chain job must emit, computed independently: per split, epoch by epoch
    (PER_EPOCH records), a record is late when all its windows closed at the split's
    watermark before the epoch (sessions: when it is behind that watermark); one row per
    (split, user, window). Returns (sorted rows, late records)."""
    assigner = ASSIGNERS[kind]
    out: list[tuple[Any, ...]] = []
    late = 0
    for split in range(SPLITS):
        records = [click(split, n) for n in range(PER_SPLIT)]
        per: Counter[tuple[Any, ...]] = Counter()
        kept: list[dict[str, Any]] = []
        top = None
        for i in range(0, PER_SPLIT, PER_EPOCH):
            chunk = records[i : i + PER_EPOCH]
            origin = MIN_WATERMARK if top is None else top - BOUND_MS
            for r in chunk:
                if kind == "session":
                    if r["ts"] < origin:
                        late += 1
                    else:
                        kept.append(r)
                    continue
                open_ = [w for w in assigner.assign(r["ts"]) if w.end > origin]
                late += not open_
                for w in open_:
                    per[(r["user"], w.start, w.end)] += 1
            top = max([r["ts"] for r in chunk] + ([top] if top is not None else []))
        out += [(*k, n) for k, n in per.items()]
        for u in sorted({r["user"] for r in kept}):
            for start, end, n in batch_sessions([r["ts"] for r in kept if r["user"] == u]):
                out.append((u, start, end, n))
    return sorted(out), late


def batch_sessions(stamps: list[int], gap: int = 2_000) -> list[tuple[int, int, int]]:
    """Sessions of sorted-by-time event times: (start, end = last + gap, records)."""
    out: list[tuple[int, int, int]] = []
    for ts in sorted(stamps):
        if out and ts <= out[-1][1]:  # touching sessions merge
            start, end, n = out[-1]
            out[-1] = (start, max(end, ts + gap), n + 1)
        else:
            out.append((ts, ts + gap, 1))
    return out


# --- the same clicks as JSON-lines files, for the Spark tests ------------------------------


def write_clicks(directory: str) -> str:
    """One file per split (`clicks-<s>.jsonl`), each click with an `amount` to sum."""
    os.makedirs(directory, exist_ok=True)
    for s in range(SPLITS):
        with open(os.path.join(directory, f"clicks-{s}.jsonl"), "w") as out:
            for n in range(PER_SPLIT):
                out.write(json.dumps({**click(s, n), "amount": (s * 31 + n * 17) % 50}) + "\n")
    return directory


def count_and_sum() -> Aggregate:
    """[clicks, amount] per window."""
    return Aggregate(
        lambda: [0, 0],
        lambda acc, r: [acc[0] + 1, acc[1] + r["amount"]],
        lambda a, b: [a[0] + b[0], a[1] + b[1]],
        lambda acc: acc,
    )


def emit_totals(key: Any, w: Window, value: Any) -> dict[str, Any]:
    return {"user": key, "start": w.start, "end": w.end, "clicks": value[0], "amount": value[1]}


def file_pipeline(
    kind: str, clicks: str, table: str, dead: str, *, checked: bool = False
) -> Pipeline:
    """clicks files (one subtask per file) -> [`check` when `checked`] -> exchange by user
    (3) -> window `kind` -> Parquet; late records (and `check`'s poison clicks) dead-lettered
    (`dead`: one sink for both sides of the exchange)."""
    p = Pipeline(
        "clicks",
        records_per_epoch=PER_EPOCH,
        on_error="dead-letter",
        dead_letter=ParquetSink(dead),
    )
    stream = p.source(
        FileSource(clicks, format="jsonl"),
        parallelism=SPLITS,
        name="clicks",
        event_time=ts_of,
        max_out_of_orderness=BOUND_MS / 1000,
    )
    if checked:
        stream = stream.map(check, name="check")
    (
        stream.key_by(user, partitions=3, name="by-user")
        .window(
            ASSIGNERS[kind],
            aggregate=count_and_sum(),
            emit=emit_totals,
            on_late="dead-letter",
            name="win",
        )
        .sink(ParquetSink(table), name="out")
    )
    return p


def totals(table: str) -> list[tuple[Any, ...]]:
    """The committed (user, start, end, clicks, amount) rows, sorted."""
    t = read_table(table)
    columns = ("user", "start", "end", "clicks", "amount")
    return sorted(zip(*(t.column(c).to_pylist() for c in columns), strict=True))


def late_records(dead: str) -> list[tuple[int, int]]:
    """(split, n) of every click dead-lettered as late, sorted."""
    t = read_table(dead)
    if t.num_rows == 0:
        return []
    out = []
    for r in t.to_pylist():
        assert r["error_type"] == "LateRecord", r
        record = json.loads(r["record"])
        out.append((int(record["split"]), int(record["n"])))
    return sorted(out)


def dead_letters(dead: str) -> list[tuple[str, str, int, int]]:
    """(operator, error type, split, n) of every dead-lettered click, sorted."""
    rows = read_table(dead).to_pylist()
    out = []
    for r in rows:
        record = json.loads(r["record"])
        out.append((r["operator"], r["error_type"], int(record["split"]), int(record["n"])))
    return sorted(out)


def expected_dead_letters(late: list[tuple[int, int]]) -> list[tuple[str, str, int, int]]:
    """What `dead_letters` holds for a checked job whose window judged `late` late."""
    poison = [("check", "ValueError", s, n) for s in range(SPLITS) for n in POISON_N]
    return sorted(poison + [("win", "LateRecord", s, n) for s, n in late])


# --- a sessionizer with timers --------------------------------------------------------

GAP = 5_000


def sessionize(ctx: Any, click: dict[str, Any]) -> list[dict[str, Any]]:
    """A session per user: a click more than `GAP` after the last one ends the old session;
    a timer at last + GAP closes the session of a user who went quiet."""
    last, clicks = ctx.value_state("last"), ctx.value_state("clicks", 0)
    out = []
    if last.value() is not None:
        ctx.timers.delete(last.value() + GAP)
        if click["ts"] > last.value() + GAP:
            out.append({"user": ctx.key, "clicks": clicks.value(), "end": last.value() + GAP})
            clicks.update(0)
    last.update(max(click["ts"], last.value() or click["ts"]))
    clicks.update(clicks.value() + 1)
    ctx.timers.at_event_time(last.value() + GAP)
    return out


def close_session(ctx: Any, ts: int) -> list[dict[str, Any]]:
    row = {"user": ctx.key, "clicks": ctx.value_state("clicks", 0).value(), "end": ts}
    ctx.value_state("last").clear()
    ctx.value_state("clicks").clear()
    return [row]


def quiet_clicks(split: int, n: int) -> dict[str, Any]:
    """In time order; user q<split> clicks only 10 times, then is quiet for good; user
    a<split> clicks every second, with a 9 s pause every 40 clicks."""
    if n < 10:
        return {"user": f"q{split}", "ts": n * 1_000}
    return {"user": f"a{split}", "ts": n * 1_000 + (n // 40) * 9_000}


def sessionizer(table: str, partitions: int | None = None) -> Pipeline:
    p = Pipeline("sessions", records_per_epoch=10)
    (
        p.source(
            GeneratorSource(2, quiet_clicks, records_per_split=200),
            parallelism=2,
            event_time=lambda r: r["ts"],
        )
        .key_by(user, partitions=partitions, name="by-user" if partitions else None)
        .process(sessionize, on_timer=close_session, name="sessionize")
        .sink(ParquetSink(table), name="out")
    )
    return p


def expected_sessions() -> list[tuple[str, int, int]]:
    """(user, clicks, last click + GAP) of every session of the sessionizer's input."""
    want = []
    for s in range(2):
        stamps = [quiet_clicks(s, n) for n in range(200)]
        for u in sorted({c["user"] for c in stamps}):
            times = [c["ts"] for c in stamps if c["user"] == u]
            want += [(u, n, end) for _, end, n in batch_sessions(times, GAP)]
    return sorted(want)


# --- every event-time operator after one exchange, for the rescale tests ------------------

#: The window operators of `all_operators` (their dead letters name them) and the timer one.
WINDOW_OPERATORS = tuple(ASSIGNERS)
TIMERS = "timers"


def on_time_sessionize(ctx: Any, click: dict[str, Any]) -> list[dict[str, Any]]:
    """`sessionize` over the on-time clicks only (a `process` has no late-data rule: what it
    makes of a click behind its timers would depend on when the click is read)."""
    return [] if click["n"] % 23 == 22 else sessionize(ctx, click)


def all_operators(
    directory: str, partitions: int, *, source: Any = None, per_epoch: int = PER_EPOCH
) -> Pipeline:
    """clicks (`SPLITS` subtasks; `source`, by default the generator's) -> exchange by user
    (`partitions`) -> tumbling, sliding and session windows and a sessionizer with event-time
    timers, each into its own Parquet table under `directory` (`<operator>/`); late records
    dead-lettered (`dead/`)."""
    p = Pipeline(
        "clicks",
        records_per_epoch=per_epoch,
        on_error="dead-letter",
        dead_letter=ParquetSink(os.path.join(directory, "dead")),
    )
    keyed = p.source(
        source or GeneratorSource(SPLITS, click, records_per_split=PER_SPLIT),
        parallelism=SPLITS,
        name="clicks",
        event_time=ts_of,
        max_out_of_orderness=BOUND_MS / 1000,
    ).key_by(user, partitions=partitions, name="by-user")
    for kind in WINDOW_OPERATORS:
        keyed.window(
            ASSIGNERS[kind], aggregate=count(), emit=emit, on_late="dead-letter", name=kind
        ).sink(ParquetSink(os.path.join(directory, kind)), name=f"out-{kind}")
    keyed.process(on_time_sessionize, on_timer=close_session, name=TIMERS).sink(
        ParquetSink(os.path.join(directory, TIMERS)), name=f"out-{TIMERS}"
    )
    return p


# --- the built-in aggregates over Arrow columns, for the columnar-path job tests -----------


def priced_click(split: int, n: int) -> dict[str, Any]:
    """`click` with an `amount`: quarters (sums of them are exact floats in any order, so a
    fault that reorders the records cannot change them), None every 19th."""
    return {**click(split, n), "amount": None if n % 19 == 7 else (split * 31 + n * 17) % 50 / 4}


#: window operator -> (assigner, built-in aggregate) of `builtin_aggregates`
BUILTINS: dict[str, tuple[Any, Aggregate]] = {
    "tumbling-sum": (Tumbling("10 s"), sum_of("amount")),
    "sliding-mean": (Sliding("10 s", "5 s"), mean_of("amount")),
    "tumbling-max": (Tumbling("10 s"), max_of("amount")),
    "sliding-count": (Sliding("10 s", "5 s"), count()),
    # several aggregates in one window (a list): folded part by part over columns
    "tumbling-several": (
        Tumbling("10 s"),
        combine([count(), sum_of("amount"), max_of("amount").alias("top")], "tumbling-several"),
    ),
    # an HLL sketch per window and key (record by record): its state survives snapshots,
    # fallbacks and the rescale, and its estimate depends on the set of values only
    "tumbling-approx-distinct": (Tumbling("10 s"), count_distinct("ts", exact=False, lg_k=7)),
}
RUNNING = "running-sum"


def user_total(key: Any, value: Any) -> dict[str, Any]:
    return {"user": key, "value": value}


def builtin_aggregates(directory: str, partitions: int, *, columnar: bool) -> Pipeline:
    """priced clicks (`SPLITS` subtasks, event time the field ``ts``) -> exchange by the field
    ``user`` (`partitions`) -> the `BUILTINS` windows and a running sum of ``amount``, each
    into its own Parquet table under `directory`; late records dead-lettered (`dead/`). With
    ``columnar=False`` the same aggregates as plain `Aggregate`s: record by record."""

    def plain(agg: Aggregate) -> Aggregate:
        return agg if columnar else Aggregate(*agg[:4])

    p = Pipeline(
        "priced",
        records_per_epoch=PER_EPOCH,
        on_error="dead-letter",
        dead_letter=ParquetSink(os.path.join(directory, "dead")),
    )
    keyed = p.source(
        GeneratorSource(SPLITS, priced_click, records_per_split=PER_SPLIT),
        parallelism=SPLITS,
        name="clicks",
        event_time="ts",
        max_out_of_orderness=BOUND_MS / 1000,
    ).key_by("user", partitions=partitions, name="by-user")
    for name, (assigner, agg) in BUILTINS.items():
        keyed.window(
            assigner, aggregate=plain(agg), emit=emit, on_late="dead-letter", name=name
        ).sink(ParquetSink(os.path.join(directory, name)), name=f"out-{name}")
    keyed.aggregate(plain(sum_of("amount")), emit=user_total, name=RUNNING).sink(
        ParquetSink(os.path.join(directory, RUNNING)), name=f"out-{RUNNING}"
    )
    return p
