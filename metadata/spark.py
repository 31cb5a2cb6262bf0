"""The inspector views as Spark DataFrames, to query checkpoint history with SQL.

Each view's Arrow table goes through `spark.createDataFrame` (Arrow-based, PySpark 4), so the
DataFrame has the view's columns and types (timestamps as TIMESTAMP, id lists as
ARRAY<BIGINT>). pyspark is imported lazily: the metadata layer never needs Spark otherwise.

    from regional.runtime.spark_views import register_views   # with the units' names
    register_views(spark, "s3://bucket/checkpoints", job_id="orders")
    spark.sql("SELECT checkpoint_id, num_fallback_units FROM regional_checkpoints "
              "WHERE kind = 'regional' ORDER BY checkpoint_id").show()

`metadata` knows neither regional's naming rule nor its split enumerators' snapshots (DESIGN
§3), so the views here come from the `Inspector` the caller gives (`inspector`):
`regional.runtime.spark_views.register_views` passes `job_inspector`'s, whose `lag` has each
unit's `unit_name` and `records_behind`, the rows `regional inspect ROOT lag --json` prints.
Without one, a bare `Inspector` over the job's checkpoints and event log is used, and those two
columns are null.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from metadata.events import events_table, read_events
from metadata.inspect import Inspector
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from metadata.validate import validate_job, validate_table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["VIEW_NAMES", "dataframes", "register_views", "to_dataframe"]

#: The views registered by `register_views` (each as `<prefix><name>`).
VIEW_NAMES = ("checkpoints", "refs", "lag", "summary", "validate", "events")


def to_dataframe(spark: SparkSession, table: pa.Table) -> DataFrame:
    """One Arrow view as a DataFrame with the same column names and types."""
    return spark.createDataFrame(table)


def dataframes(
    spark: SparkSession,
    root: str,
    job_id: str | None = None,
    *,
    num_retained: int | None = None,
    verify_checksums: bool = False,
    inspector: Inspector | None = None,
) -> dict[str, DataFrame]:
    """Every argument-free view of the job under `root` (see `VIEW_NAMES`) as a DataFrame.

    `inspector` gives the inspector views (the caller's, e.g. with unit names; its own
    `num_retained` then applies); without one, a bare `Inspector` over the job's checkpoints
    and event log, whose `num_retained` decides the `retained` column of `checkpoints` (None,
    the default: the value the job recorded in its latest checkpoint, else 3).
    `validate` checks sizes only unless `verify_checksums` (reading every state file);
    `events` is the job's event log (`metadata.events`; files that do not decode are left out).
    """
    storage = JobStorage.open(root, job_id)
    events = read_events(storage)[0] if inspector is None else inspector.events
    if inspector is None:
        store = CompletedCheckpointStore.load(storage)
        inspector = Inspector(store, num_retained=num_retained, events=events)
    tables = dict(inspector.tables())
    tables["validate"] = validate_table(validate_job(storage, verify_checksums=verify_checksums))
    tables["events"] = events_table(events)
    return {name: to_dataframe(spark, tables[name]) for name in VIEW_NAMES}


def register_views(
    spark: SparkSession,
    root: str,
    job_id: str | None = None,
    *,
    prefix: str = "regional_",
    num_retained: int | None = None,
    inspector: Inspector | None = None,
) -> list[str]:
    """Register the views (`dataframes`) as temporary views `<prefix><name>`; returns their
    names."""
    names = []
    views = dataframes(spark, root, job_id, num_retained=num_retained, inspector=inspector)
    for name, df in views.items():
        df.createOrReplaceTempView(prefix + name)
        names.append(prefix + name)
    return names
