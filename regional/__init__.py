"""regional: regional checkpoints for PySpark pipelines.

Heavy modules (pyspark) are imported lazily so `import regional` and the CLI start fast.
"""

from __future__ import annotations

import importlib
from typing import Any

from regional.errors import (
    CheckpointAbortedError,
    CommitError,
    GraphError,
    JobFailedError,
    MetadataError,
    PolicyError,
    RegionalError,
    SinkError,
    StorageError,
)

__all__ = [
    "CheckpointAbortedError",
    "CommitError",
    "GraphError",
    "JobFailedError",
    "MetadataError",
    "PolicyError",
    "RegionalError",
    "SinkError",
    "StorageError",
]

#: Public names imported on first use (`regional.Pipeline`, `regional.read_table`, ...), so that
#: `import regional` stays light and never imports pyspark.
_LAZY = {
    "Pipeline": "regional.pipeline",
    "FileSource": "regional.sources.files",
    "GeneratorSource": "regional.sources.generator",
    "LogSource": "regional.sources.log",
    "ParquetSink": "regional.sinks.parquet",
    "PaimonSink": "regional.sinks.paimon",
    "read_table": "regional.table",
    "SparkRuntime": "regional.runtime.spark",
    "Faults": "regional.runtime.spark",
    "spark_session": "regional.runtime.session",
}
__all__ += list(_LAZY)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'regional' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
