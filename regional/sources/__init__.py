"""Sources: files (Parquet / JSON lines), a partitioned append-only log, a generator."""

from __future__ import annotations

from regional.sources.base import ReadResult, Source
from regional.sources.files import FileSource
from regional.sources.generator import GeneratorSource

__all__ = ["FileSource", "GeneratorSource", "ReadResult", "Source"]
