"""Event-time jobs for the window and timer tests: clicks of a few users from generator splits,
out of order within a bound, with a few records far behind (late); windows per user on a
forward chain (state per split) or after a durable exchange (state per user), and an
independent model of what they must emit (per split, epoch by epoch)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from metadata.watermarks import MIN_WATERMARK
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Session, Sliding, Tumbling, Window, count
from regional.sinks.parquet import ParquetSink, read_table
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
) -> Pipeline:
    """clicks (`parallelism` subtasks) -> [exchange by user] -> window `kind` -> Parquet."""
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
    keyed = stream.key_by(user, partitions=partitions, name="by-user" if partitions else None)
    keyed.window(ASSIGNERS[kind], aggregate=count(), emit=emit, on_late=on_late, name="win").sink(
        ParquetSink(table), name="out"
    )
    return p


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
        if out and ts < out[-1][1]:
            start, end, n = out[-1]
            out[-1] = (start, max(end, ts + gap), n + 1)
        else:
            out.append((ts, ts + gap, 1))
    return out
