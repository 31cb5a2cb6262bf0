"""Checkpoint metadata: model, versioned binary format, storage layout, completed-checkpoint
store and inspector views. Imports nothing else of regional (DESIGN §3).

The pure modules (model, format, retention, errors) are imported here; the ones that touch
storage (`pyarrow.fs`) are imported on first use, so the pure core that imports `metadata.*`
never loads a file system. `metadata.spark` (the views as Spark DataFrames) is not exported
here, so that using the metadata layer never starts or needs Spark.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from metadata.errors import MetadataError, RegionalError, StorageError
from metadata.format import FORMAT_VERSION, decode_metadata, encode_metadata
from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    SplitState,
    StateHandle,
    SubtaskState,
    UnitState,
    VertexInfo,
)
from metadata.retention import Retention, retain

if TYPE_CHECKING:
    from metadata.events import CheckpointEvent, read_events
    from metadata.inspect import Inspector
    from metadata.storage import FileEntry, JobStorage, Problem
    from metadata.store import CompletedCheckpointStore, DamagedCheckpoint
    from metadata.validate import Validation, validate_job

#: Public names whose modules touch storage, imported on first use.
_LAZY = {
    "CheckpointEvent": "metadata.events",
    "read_events": "metadata.events",
    "Inspector": "metadata.inspect",
    "FileEntry": "metadata.storage",
    "JobStorage": "metadata.storage",
    "Problem": "metadata.storage",
    "CompletedCheckpointStore": "metadata.store",
    "DamagedCheckpoint": "metadata.store",
    "Validation": "metadata.validate",
    "validate_job": "metadata.validate",
}

__all__ = [
    "FORMAT_VERSION",
    "CheckpointEvent",
    "CheckpointKind",
    "CheckpointMetadata",
    "CompletedCheckpointStore",
    "DamagedCheckpoint",
    "FileEntry",
    "Inspector",
    "JobStorage",
    "MetadataError",
    "Problem",
    "RegionalError",
    "Retention",
    "SplitState",
    "StateHandle",
    "StorageError",
    "SubtaskState",
    "UnitState",
    "Validation",
    "VertexInfo",
    "decode_metadata",
    "encode_metadata",
    "read_events",
    "retain",
    "validate_job",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'metadata' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
