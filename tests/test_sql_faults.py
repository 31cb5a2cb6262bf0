"""A job written in the schema/SQL style keeps exactly-once through faults (issue 44).

Orders with a declared schema -> ``where`` -> ``select`` with an expression -> a keyed
exchange by column -> a tumbling ``sum_of`` by column -> Parquet, records that do not fit the
schema dead-lettered. Fault-free, its committed windows equal the same query run as a batch by
DuckDB over the same records; through unit faults in a first run that stops early, a second run
at another partition count that crashes at any driver step, and a third that resumes, its
windows and dead letters equal the fault-free run's (read back with DuckDB, not our reader).
The same style on Spark, against Spark SQL, is `tests/test_runtime_quickstart.py`."""

from __future__ import annotations

import datetime as dt
import glob
import json
import os
from pathlib import Path
from typing import Any

import duckdb
import orders_job
import pyarrow as pa
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Tumbling, sum_of
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

SPLITS, PER_SPLIT = 3, 40
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
ORDERS = pa.schema(
    [
        ("id", pa.string()),
        ("user", pa.string()),
        ("country", pa.string()),
        ("amount", pa.int64()),
        ("ts", pa.timestamp("us", tz="UTC")),
    ]
)


def order(split: int, n: int) -> dict[str, Any]:
    """In event-time order per split, 1 s apart; every 13th amount is text (a misfit)."""
    return {
        "id": f"o{split}-{n}",
        "user": f"u{(n * 7 + split) % 5}",
        "country": ("DE", "FR", "US")[(n + split) % 3],
        "amount": "lots" if n % 13 == 6 else (n * 11 + split) % 40 - 5,
        "ts": EPOCH + dt.timedelta(seconds=n, milliseconds=split * 100),
    }


def _driver(directory: Path, partitions: int, faults: Faults | None = None) -> JobDriver:
    out = directory / "out"
    p = Pipeline(
        "sql-orders",
        records_per_epoch=7,
        on_error="dead-letter",
        dead_letter=ParquetSink(str(out / "dead")),
    )
    orders = p.source(
        GeneratorSource(SPLITS, order, records_per_split=PER_SPLIT),
        parallelism=SPLITS,
        name="orders",
        schema=ORDERS,
        event_time="ts",
    )
    paid = orders.where("amount > 0 AND country IN ('DE', 'FR')", name="paid").select(
        "user", "amount * 2 AS doubled", "ts", name="doubled"
    )
    paid.key_by("user", partitions=partitions, name="by-user").window(
        Tumbling("10 s"), aggregate=sum_of("doubled"), name="per-user"
    ).sink(ParquetSink(str(out / "windows")), name="table")
    root = str(directory / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.7}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "sql-orders", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, "sql-orders"),
        policy=policy,
        faults=faults,
    )


def committed(directory: Path) -> dict[str, list[tuple[Any, ...]]]:
    """The committed windows (user, start, end, sum) and dead letters (operator, id, and the
    error after where it was read), read with DuckDB."""
    queries = {
        "windows": "SELECT user, window_start, window_end, sum_doubled FROM t",
        "dead": "SELECT operator, record, error_message FROM t",
    }
    out: dict[str, list[tuple[Any, ...]]] = {}
    for table, query in queries.items():
        files = glob.glob(os.path.join(directory, "out", table, "*.parquet"))
        con = duckdb.connect()
        con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r})")
        rows = con.execute(query).fetchall() if files else []
        if table == "dead":
            rows = [
                (op, json.loads(record)["id"], error.split(": ", 1)[1])
                for op, record, error in rows
            ]
        out[table] = sorted(rows)
    return out


def batch_query() -> list[tuple[Any, ...]]:
    """The same query over every record that fits the schema, as one DuckDB batch."""
    fitting = [
        r
        for s in range(SPLITS)
        for n in range(PER_SPLIT)
        if isinstance((r := order(s, n))["amount"], int)
    ]
    t = pa.Table.from_pylist(fitting, schema=ORDERS)  # noqa: F841 - read by DuckDB
    return sorted(
        duckdb.sql(
            "SELECT user, time_bucket(INTERVAL 10 SECONDS, ts) AS s, "
            "time_bucket(INTERVAL 10 SECONDS, ts) + INTERVAL 10 SECONDS AS e, sum(amount * 2) "
            "FROM t WHERE amount > 0 AND country IN ('DE', 'FR') GROUP BY ALL"
        ).fetchall()
    )


@pytest.fixture(scope="module")
def fault_free(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[tuple[Any, ...]]]:
    directory = tmp_path_factory.mktemp("sql-fault-free")
    assert _driver(directory, 2).run().finished
    return committed(directory)


def test_the_fault_free_windows_are_the_batch_querys_and_misfits_are_dead_letters(
    fault_free: dict[str, list[tuple[Any, ...]]],
) -> None:
    assert fault_free["windows"] == batch_query()
    misfits = sorted(f"o{s}-{n}" for s in range(SPLITS) for n in range(PER_SPLIT) if n % 13 == 6)
    assert [i for _, i, _ in fault_free["dead"]] == misfits
    assert {(op, error) for op, _, error in fault_free["dead"]} == {
        (
            "orders",
            "field 'amount': expected int64, found string ('lots'); fix the record, or declare "
            "the field's type as it comes (or nullable) in schema=...",
        )
    }


@settings(max_examples=6, deadline=None)
@example(first=2, second=3, stop_after=3, failing={(2, 0), (3, 1)}, crash="after-metadata")
@given(
    first=st.integers(1, 3),
    second=st.integers(1, 4),
    stop_after=st.integers(2, 4),
    failing=st.sets(st.tuples(st.integers(1, 5), st.integers(0, 5)), max_size=5),
    crash=st.none() | st.sampled_from(CRASH_STEPS),
)
def test_unit_faults_a_rescale_and_a_driver_crash_commit_the_fault_free_rows(
    tmp_path_factory: pytest.TempPathFactory,
    fault_free: dict[str, list[tuple[Any, ...]]],
    first: int,
    second: int,
    stop_after: int,
    failing: set[tuple[int, int]],
    crash: str | None,
) -> None:
    """Units on both sides of the exchange fail in random checkpoints of a first run that
    stops early; a second run at another partition count crashes at a step of its second
    checkpoint; a third resumes to the end: the windows and dead letters of the fault-free
    run, each once."""
    directory = tmp_path_factory.mktemp("sql-faults")
    faults = Faults(units={(c, u): "fail" for c, u in failing if c <= stop_after})
    _driver(directory, first, faults).run(max_checkpoints=stop_after)
    if crash is not None:
        with pytest.raises(DriverCrash):
            _driver(directory, second, Faults(crash_at=(stop_after + 2, crash))).run()
    assert _driver(directory, second).run().finished
    assert committed(directory) == fault_free
