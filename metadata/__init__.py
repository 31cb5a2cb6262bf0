"""Checkpoint metadata: model, versioned binary format, storage layout, completed-checkpoint
store and inspector views. Imports nothing else of regional (DESIGN §3).

`metadata.spark` (the views as Spark DataFrames) is not imported here, so that using the
metadata layer never starts or needs Spark.
"""

from metadata.errors import MetadataError, RegionalError, StorageError
from metadata.events import CheckpointEvent, read_events
from metadata.format import FORMAT_VERSION, decode_metadata, encode_metadata
from metadata.inspect import Inspector
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
from metadata.storage import FileEntry, JobStorage, Problem
from metadata.store import CompletedCheckpointStore, DamagedCheckpoint
from metadata.validate import Validation, validate_job

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
