"""regional: regional checkpoints for PySpark pipelines.

Heavy modules (pyspark) are imported lazily so `import regional` and the CLI start fast.
"""

from __future__ import annotations

from regional.errors import (
    CheckpointAbortedError,
    CommitError,
    GraphError,
    JobFailedError,
    MetadataError,
    PolicyError,
    RegionalError,
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
    "StorageError",
]
