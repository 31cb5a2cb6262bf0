"""`read_table`: the committed rows of a table written by `regional`'s Parquet sink.

Only files listed by a commit are read, so staged files of failed attempts never show. From
Spark: ``spark.read.parquet(*regional.table.committed_files(path))``.
"""

from __future__ import annotations

from regional.sinks.parquet import committed_files, read_table

__all__ = ["committed_files", "read_table"]
