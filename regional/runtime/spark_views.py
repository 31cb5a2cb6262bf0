"""The inspector views as Spark SQL views, with the units' names as the CLI shows them.

`metadata.spark` turns the inspector views into DataFrames but, below regional in the layers
(DESIGN §3), cannot name a unit: this module gives it `job_inspector`'s `Inspector` (the
newest checkpoint's unit names, `regional.graph.unit_names`, and its sources' last
assignments), so `regional_lag`'s `unit_name` and `records_behind` are the values `regional
inspect ROOT lag --json` prints, not nulls.

    from regional.runtime.spark_views import register_views
    register_views(spark, "s3://bucket/checkpoints", job_id="orders")
    spark.sql("SELECT unit_name, checkpoints_behind FROM regional_lag "
              "WHERE status = 'fallback'").show()
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from metadata import spark as views
from metadata.storage import JobStorage
from regional.runtime.inspection import job_inspector

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["dataframes", "register_views"]


def dataframes(
    spark: SparkSession,
    root: str,
    job_id: str | None = None,
    *,
    num_retained: int | None = None,
    verify_checksums: bool = False,
) -> dict[str, DataFrame]:
    """`metadata.spark.dataframes` of the job under `root`, its units named."""
    inspector = job_inspector(JobStorage.open(root, job_id), num_retained=num_retained)
    return views.dataframes(
        spark, root, job_id, verify_checksums=verify_checksums, inspector=inspector
    )


def register_views(
    spark: SparkSession,
    root: str,
    job_id: str | None = None,
    *,
    prefix: str = "regional_",
    num_retained: int | None = None,
) -> list[str]:
    """`metadata.spark.register_views` of the job under `root`, its units named: the
    temporary views `<prefix><name>` (`metadata.spark.VIEW_NAMES`); returns their names."""
    inspector = job_inspector(JobStorage.open(root, job_id), num_retained=num_retained)
    return views.register_views(spark, root, job_id, prefix=prefix, inspector=inspector)
