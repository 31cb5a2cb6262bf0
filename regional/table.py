"""`read_table`: the committed rows of a table written by `regional`'s Parquet sink.

Only files listed by a commit record are read, in commit order. Other readers read the bare
table path and see the same rows (staged files of any attempt never show):
``spark.read.parquet(path)``, ``pyarrow.dataset.dataset(path, format="parquet")``, DuckDB's
``read_parquet('<path>/**/*.parquet')``; `committed_files(path)` lists the files for any other.
"""

from __future__ import annotations

from regional.sinks.parquet import committed_files, read_table

__all__ = ["committed_files", "read_table"]
