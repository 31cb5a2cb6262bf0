"""regional: regional checkpoints for PySpark pipelines.

Heavy modules (pyspark, pyarrow) are imported lazily so `import regional` and the CLI start fast;
type checkers see the real classes through the `TYPE_CHECKING` imports.

>>> import regional
>>> regional.__version__
'0.1.0'
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from regional.errors import (
    CheckpointAbortedError,
    CommitError,
    GraphError,
    JobFailedError,
    MetadataError,
    PolicyError,
    RegionalError,
    RestoreError,
    SinkError,
    StorageError,
)

if TYPE_CHECKING:
    from regional.dataflow.pipeline import Pipeline
    from regional.graph.job_graph import Edge, JobGraph, Vertex
    from regional.graph.regions import analyse
    from regional.policy import Policy, load_policy
    from regional.runtime.faults import Faults
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime
    from regional.sinks.delta import DeltaSink
    from regional.sinks.iceberg import IcebergSink
    from regional.sinks.kafka import KafkaSink
    from regional.sinks.paimon import PaimonSink
    from regional.sinks.parquet import ParquetSink, read_table
    from regional.sources.files import FileSource
    from regional.sources.generator import GeneratorSource
    from regional.sources.kafka import KafkaSource
    from regional.sources.log import LogSource

#: The release; pyproject.toml reads it from here.
__version__ = "0.1.0"

#: Public names imported on first use (`regional.Pipeline`, `regional.read_table`, ...), so that
#: `import regional` stays light and never imports pyspark.
_LAZY = {
    "Pipeline": "regional.dataflow.pipeline",
    "FileSource": "regional.sources.files",
    "GeneratorSource": "regional.sources.generator",
    "LogSource": "regional.sources.log",
    "KafkaSource": "regional.sources.kafka",
    "ParquetSink": "regional.sinks.parquet",
    "PaimonSink": "regional.sinks.paimon",
    "DeltaSink": "regional.sinks.delta",
    "IcebergSink": "regional.sinks.iceberg",
    "KafkaSink": "regional.sinks.kafka",
    "read_table": "regional.sinks.parquet",
    "SparkRuntime": "regional.runtime.spark",
    "Faults": "regional.runtime.faults",
    "spark_session": "regional.runtime.session",
    "Policy": "regional.policy",
    "load_policy": "regional.policy",
    "JobGraph": "regional.graph.job_graph",
    "Vertex": "regional.graph.job_graph",
    "Edge": "regional.graph.job_graph",
    "analyse": "regional.graph.regions",
}

__all__ = [
    "CheckpointAbortedError",
    "CommitError",
    "DeltaSink",
    "Edge",
    "Faults",
    "FileSource",
    "GeneratorSource",
    "GraphError",
    "IcebergSink",
    "JobFailedError",
    "JobGraph",
    "KafkaSink",
    "KafkaSource",
    "LogSource",
    "MetadataError",
    "PaimonSink",
    "ParquetSink",
    "Pipeline",
    "Policy",
    "PolicyError",
    "RegionalError",
    "RestoreError",
    "SinkError",
    "SparkRuntime",
    "StorageError",
    "Vertex",
    "__version__",
    "analyse",
    "load_policy",
    "read_table",
    "spark_session",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'regional' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
