"""The lookup join (`regional.dataflow.lookup`, DESIGN §4 rule 20): records enriched from a
table our Parquet, Delta and Iceberg sinks committed, read at its latest committed version and
again once the refresh interval passed (driven by an injected clock); errors that name the
table, its version and the column."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orders_job
import pyarrow as pa
import pytest

from metadata.storage import JobStorage
from regional.dataflow.lookup import (
    DeltaTable,
    IcebergTable,
    LookupJoin,
    LookupTableError,
    ParquetTable,
    TableRead,
    index_rows,
)
from regional.dataflow.pipeline import Pipeline
from regional.errors import GraphError
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.base import Sink
from regional.sinks.delta import DeltaSink
from regional.sinks.iceberg import IcebergSink
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

PROFILES = pa.schema([("user", pa.string()), ("tier", pa.string())])
TIERS = ("gold", "silver", "bronze")


def _driver(p: Pipeline, root: Path) -> JobDriver:
    env = TaskEnv(str(root), p.name, p, unit_timeout=30)
    return JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(str(root), p.name))


def write_profiles(sink: Sink, root: Path, users: range, *, job: str = "profiles") -> None:
    """Run a job that writes profile u<n> (tier by n) for each n of `users` to `sink`."""
    writer = Pipeline(job)
    writer.source(
        GeneratorSource(1, lambda s, n: {"user": f"u{users[n]}", "tier": TIERS[users[n] % 3]},
                        records_per_split=len(users)),
        name="src",
    ).sink(sink, name="out")  # fmt: skip
    assert _driver(writer, root / f"ckpt-{job}").run().finished


def click(split: int, n: int) -> dict[str, Any]:
    return {"user": f"u{n % 6}", "n": n, "s": split}


def clicks_pipeline(table: Any, out: Path, **lookup: Any) -> Pipeline:
    """Two splits of 20 clicks (users u0..u5), 4 a split an epoch, enriched with the tier."""
    p = Pipeline("clicks", records_per_epoch=4)
    (
        p.source(GeneratorSource(2, click, records_per_split=20), parallelism=2, name="clicks")
        .lookup_join(
            table,
            key="user",
            on="user",
            how="left",
            emit=lambda c, row: {**c, "tier": row and row["tier"]},
            name="tiers",
            **lookup,
        )
        .sink(ParquetSink(str(out)), name="out")
    )
    return p


def _tiers(out: Path) -> list[tuple[int, int, str | None]]:
    return sorted((r["s"], r["n"], r["tier"]) for r in read_table(str(out)).to_pylist())


SINKS = {
    "parquet": (lambda root: ParquetSink(str(root / "t")),
                lambda root: ParquetTable(str(root / "t"))),
    "delta": (lambda root: DeltaSink(str(root / "t"), schema=PROFILES),
              lambda root: DeltaTable(str(root / "t"))),
    "iceberg": (lambda root: IcebergSink(str(root / "w"), "db.profiles", schema=PROFILES),
                lambda root: IcebergTable(str(root / "w"), "db.profiles")),
}  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(SINKS))
def test_clicks_are_enriched_from_a_table_our_sink_committed(tmp_path: Path, fmt: str) -> None:
    sink, table = SINKS[fmt]
    write_profiles(sink(tmp_path), tmp_path, range(4))
    p = clicks_pipeline(table(tmp_path), tmp_path / "out")
    assert _driver(p, tmp_path / "ckpt").run().finished
    want = [(s, n, TIERS[n % 6 % 3] if n % 6 < 4 else None) for s in range(2) for n in range(20)]
    assert _tiers(tmp_path / "out") == want


@pytest.mark.spark
def test_on_spark_each_python_worker_reads_the_iceberg_table(spark: Any, tmp_path: Path) -> None:
    """The table reader goes to the executors with the pipeline; each Python worker opens the
    catalog itself and reads the current snapshot."""
    from regional.runtime.spark import SparkRuntime

    warehouse = str(tmp_path / "w")
    write_profiles(IcebergSink(warehouse, "db.profiles", schema=PROFILES), tmp_path, range(4))
    p = clicks_pipeline(IcebergTable(warehouse, "db.profiles"), tmp_path / "out")
    assert SparkRuntime(p, spark, root=str(tmp_path / "ckpt")).run().finished
    want = [(s, n, TIERS[n % 6 % 3] if n % 6 < 4 else None) for s in range(2) for n in range(20)]
    assert _tiers(tmp_path / "out") == want


def test_a_new_version_between_epochs_is_met_once_the_refresh_interval_passed(
    tmp_path: Path,
) -> None:
    """Epochs 1-2 read users u0..u3; then another job commits u4 and u5. Epoch 3, within the
    refresh interval of the first read, still meets the cached version; epochs 4-5, after it,
    the new one."""
    table = tmp_path / "profiles"
    write_profiles(ParquetSink(str(table)), tmp_path, range(4))
    now = [0.0]
    p = clicks_pipeline(ParquetTable(str(table)), tmp_path / "out", refresh="1 min",
                        clock=lambda: now[0])  # fmt: skip
    assert not _driver(p, tmp_path / "ckpt").run(max_checkpoints=2).finished
    write_profiles(ParquetSink(str(table)), tmp_path, range(4, 6), job="more-profiles")
    now[0] = 59.0
    assert not _driver(p, tmp_path / "ckpt").run(max_checkpoints=1).finished
    now[0] = 60.0
    assert _driver(p, tmp_path / "ckpt").run().finished

    def tier(n: int) -> str | None:
        new = n >= 12  # epochs 4 and 5 hold records 12..19 of each split
        return TIERS[n % 6 % 3] if n % 6 < 4 or new else None

    assert _tiers(tmp_path / "out") == [(s, n, tier(n)) for s in range(2) for n in range(20)]


class _Versions:
    """A table whose every read gives the next version."""

    def __init__(self) -> None:
        self.reads = 0

    def describe(self) -> str:
        return "versions table"

    def read(self, columns: Sequence[str] | None) -> TableRead:
        self.reads += 1
        return TableRead(pa.table({"k": [1], "version": [self.reads]}), f"version {self.reads}")


def test_the_table_is_read_again_once_the_refresh_interval_passed() -> None:
    table, now = _Versions(), [1000.0]
    op = LookupJoin(table, key="k", on=lambda r: r["k"], refresh_s=60, now=lambda: now[0],
                    emit=lambda r, row: row["version"], name="v")  # fmt: skip

    def version() -> Any:
        out, _ = op.run([("s", [{"k": 1}])], None, None, None, None)
        return out[0][1][0]

    assert version() == 1
    now[0] += 59
    assert version() == 1  # within the interval: the cached version, no read
    assert op.version == "version 1"
    now[0] += 2
    assert version() == 2
    assert (table.reads, op.version) == (2, "version 2")


def test_only_the_key_and_the_asked_columns_are_read(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "delta")
    write_deltalake(path, pa.table({"id": [1, 2], "v": ["a", "b"], "w": [0.5, 1.5]}))
    write_deltalake(path, pa.table({"id": [1, 2], "v": ["A", "B"], "w": [0.5, 1.5]}),
                    mode="overwrite")  # fmt: skip
    op = LookupJoin(DeltaTable(path), key="id", on=lambda r: r["id"], columns=["v"], name="d")
    out, _ = op.run([("s", [{"id": 2}, {"id": 3}])], None, None, None, None)
    assert out == [("s", [{"record": {"id": 2}, "row": {"id": 2, "v": "B"}}])]
    assert op.version == "version 1"


def test_a_row_with_a_null_key_matches_nothing() -> None:
    rows = pa.table({"k": [None, 1], "v": ["nobody", "one"]})
    assert index_rows(rows, "k", table="t") == {1: {"k": 1, "v": "one"}}


def _error(table: Any, columns: Sequence[str] | None = None) -> str:
    with pytest.raises(LookupTableError) as info:
        LookupJoin(table, key="user", on=lambda r: r, columns=columns, name="l").index()
    return str(info.value)


def test_a_missing_table_or_column_is_named_with_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert _error(ParquetTable(str(missing))) == (
        f"parquet table {missing} has no commit (nothing under {missing}/_commits): check the "
        "path, or run the job whose ParquetSink writes it first"
    )
    assert _error(DeltaTable(str(missing))).startswith(
        f'delta table {missing} does not exist (Local path "{missing}" does not exist'
    )
    assert _error(IcebergTable(str(missing), "db.t")) == (
        f"iceberg table db.t (warehouse file://{missing}): there is no catalog "
        f"{missing}/catalog.db; check the warehouse, or run the job whose IcebergSink writes "
        "the table first"
    )
    write_profiles(IcebergSink(str(tmp_path / "w"), "db.profiles", schema=PROFILES), tmp_path,
                   range(2))  # fmt: skip
    assert _error(IcebergTable(str(tmp_path / "w"), "db.other")) == (
        f"iceberg table db.other (warehouse file://{tmp_path}/w) is not in its catalog; check "
        "the table name, or create it (IcebergSink(..., schema=...) does)"
    )
    assert _error(IcebergTable(str(tmp_path / "w"), "db.profiles"), ["age"]).startswith(
        f"iceberg table db.profiles (warehouse file://{tmp_path}/w) (snapshot "
    )
    assert _error(IcebergTable(str(tmp_path / "w"), "db.profiles"), ["age"]).endswith(
        ") has no column 'age' (its columns: user, tier); give lookup_join key= and columns= "
        "columns of the table"
    )
    write_profiles(ParquetSink(str(tmp_path / "p")), tmp_path, range(2), job="parquet")
    assert _error(ParquetTable(str(tmp_path / "p")), ["age"]) == (
        f"parquet table {tmp_path}/p has no column 'age' (its columns: user, tier); give "
        "lookup_join key= and columns= columns of the table"
    )


def test_a_key_in_several_rows_names_the_table_version_key_and_count(tmp_path: Path) -> None:
    table = tmp_path / "profiles"
    write_profiles(ParquetSink(str(table)), tmp_path, range(3))
    write_profiles(ParquetSink(str(table)), tmp_path, range(1, 3), job="again")
    message = _error(ParquetTable(str(table)))
    assert message.startswith(f"parquet table {table} (commit 1 of again-")
    assert message.endswith(
        "): key 'u1' of column 'user' is in 2 rows; a lookup table needs one row per key "
        "(deduplicate the table, or look up by a unique column)"
    )
    with pytest.raises(LookupTableError) as info:
        index_rows(pa.table({"id": [1]}), "user", table="parquet table /t")
    assert str(info.value) == (
        "parquet table /t has no column 'user' (its columns: id); give lookup_join key= and "
        "columns= columns of the table"
    )


def test_bad_arguments_name_the_join() -> None:
    p = Pipeline("bad")
    src = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=1), name="s")
    cases = [
        (dict(table=ParquetTable("/t"), how="outer"),
         "lookup join 'l': how='outer'; use 'inner' or 'left'"),
        (dict(table="/t"),
         "lookup join 'l': table='/t' is not a lookup table; give ParquetTable(path), "
         "DeltaTable(path) or IcebergTable(warehouse, table) from regional.dataflow.lookup"),
        (dict(table=ParquetTable("/t"), columns="tier"),
         "lookup join 'l': columns='tier'; give a list of the table's column names"),
        (dict(table=ParquetTable("/t"), refresh="soon"),
         "lookup join 'l': refresh='soon'; give a duration of more than 0 to 365 days: \"500 ms\", "
         "\"5 s\", \"1 min\", \"30 d\", a datetime.timedelta or a number of seconds"),
    ]  # fmt: skip
    for kw, message in cases:
        with pytest.raises(GraphError) as info:
            src.lookup_join(key="k", on="k", name="l", **kw)
        assert str(info.value) == message
