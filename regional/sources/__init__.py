"""Sources: files (Parquet / JSON lines), a partitioned append-only log, a generator."""

from __future__ import annotations

from regional.sources.base import ReadResult, Source
from regional.sources.files import FileSource
from regional.sources.generator import GeneratorSource
from regional.sources.log import LogSource

__all__ = ["FileSource", "GeneratorSource", "LogSource", "ReadResult", "Source"]
