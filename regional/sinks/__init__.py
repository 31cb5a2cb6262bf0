"""Sinks committed exactly-once through the commit coordinator: `ParquetSink` (a Parquet table)
and `PaimonSink` (an Apache Paimon append table; needs the extra ``regional[paimon]``, imported
on first use so that `regional.sinks` works without it)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from regional.sinks.parquet import ParquetSink, committed_files, read_table

if TYPE_CHECKING:
    from regional.sinks.paimon import PaimonSink

__all__ = ["PaimonSink", "ParquetSink", "committed_files", "read_table"]


def __getattr__(name: str) -> Any:
    if name == "PaimonSink":
        return importlib.import_module("regional.sinks.paimon").PaimonSink
    raise AttributeError(f"module 'regional.sinks' has no attribute {name!r}")
