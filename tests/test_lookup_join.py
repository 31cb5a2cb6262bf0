"""The lookup join (`regional.dataflow.lookup`, DESIGN §4 rule 20): records enriched from a
table our Parquet sink committed and from a Delta table, read at their latest committed version
and again once the refresh interval passed; errors that name the table and column."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orders_job
import pyarrow as pa
import pytest

from metadata.storage import JobStorage
from regional.dataflow.lookup import (
    DeltaTable,
    LookupJoin,
    LookupTableError,
    ParquetTable,
    index_rows,
)
from regional.dataflow.pipeline import Pipeline
from regional.errors import GraphError
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _run(p: Pipeline, root: Path) -> None:
    env = TaskEnv(str(root), p.name, p, unit_timeout=30)
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(str(root), p.name)
    )
    assert driver.run().finished


def test_clicks_are_enriched_from_the_committed_rows_of_a_parquet_table(tmp_path: Path) -> None:
    profiles = tmp_path / "profiles"
    writer = Pipeline("profiles")
    writer.source(
        GeneratorSource(1, lambda s, n: {"user": f"u{n}", "tier": ["gold", "silver"][n % 2]},
                        records_per_split=3),
        name="src",
    ).sink(ParquetSink(str(profiles)), name="out")  # fmt: skip
    _run(writer, tmp_path / "ckpt-profiles")
    p = Pipeline("clicks", records_per_epoch=4)
    (
        p.source(
            GeneratorSource(
                2, lambda s, n: {"user": f"u{n % 5}", "n": n, "s": s}, records_per_split=5
            ),
            parallelism=2,
            name="clicks",
        )
        .lookup_join(
            ParquetTable(str(profiles)),
            key="user",
            on="user",
            how="left",
            emit=lambda click, row: {**click, "tier": row and row["tier"]},
            name="tiers",
        )
        .sink(ParquetSink(str(tmp_path / "out")), name="out")
    )
    _run(p, tmp_path / "ckpt")
    rows = sorted(
        (r["s"], r["n"], r["tier"]) for r in read_table(str(tmp_path / "out")).to_pylist()
    )
    tiers = {0: "gold", 1: "silver", 2: "gold"}
    assert rows == sorted((s, n, tiers.get(n % 5)) for s in range(2) for n in range(5))


def test_a_delta_table_is_read_at_its_latest_version(tmp_path: Path) -> None:
    from deltalake import write_deltalake

    path = str(tmp_path / "delta")
    write_deltalake(path, pa.table({"id": [1, 2], "v": ["a", "b"]}))
    write_deltalake(path, pa.table({"id": [1, 2], "v": ["A", "B"]}), mode="overwrite")
    op = LookupJoin(DeltaTable(path), key="id", on=lambda r: r["id"], name="d")
    out, _ = op.run([("s", [{"id": 2}, {"id": 3}])], None, None, None, None)
    assert out == [("s", [{"record": {"id": 2}, "row": {"id": 2, "v": "B"}}])]


class _Versions:
    """A table whose every read gives the next version."""

    def __init__(self) -> None:
        self.reads = 0

    def describe(self) -> str:
        return "versions table"

    def read(self) -> pa.Table:
        self.reads += 1
        return pa.table({"k": [1], "version": [self.reads]})


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
    now[0] += 2
    assert version() == 2
    assert table.reads == 2


def test_errors_name_the_table_and_the_column(tmp_path: Path) -> None:
    with pytest.raises(LookupTableError) as info:
        index_rows(pa.table({"id": [1, 1]}), "id", table="parquet table /t")
    assert str(info.value) == (
        "parquet table /t: key 1 of column 'id' is in more than one row; a lookup table needs "
        "one row per key (deduplicate the table, or look up by a unique column)"
    )
    with pytest.raises(LookupTableError) as info:
        index_rows(pa.table({"id": [1]}), "user", table="parquet table /t")
    assert str(info.value) == (
        "parquet table /t has no column 'user' (its columns: id); give lookup_join(key=...) a "
        "column of the table"
    )
    p = Pipeline("bad")
    src = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=1), name="s")
    with pytest.raises(GraphError) as graph:
        src.lookup_join(ParquetTable("/t"), key="k", on="k", how="outer", name="l")
    assert str(graph.value) == "lookup join 'l': how='outer'; use 'inner' or 'left'"
    with pytest.raises(GraphError) as graph:
        src.lookup_join("/t", key="k", on="k", name="l")
    assert str(graph.value) == (
        "lookup join 'l': table='/t' is not a lookup table; give ParquetTable(path) or "
        "DeltaTable(path) from regional.dataflow.lookup"
    )
