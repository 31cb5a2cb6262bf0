"""Errors raised by the engine. All derive from `RegionalError` (DESIGN §8)."""

from __future__ import annotations

from metadata.errors import MetadataError, RegionalError, StorageError

__all__ = [
    "CheckpointAbortedError",
    "CommitError",
    "GraphError",
    "JobFailedError",
    "MetadataError",
    "PolicyError",
    "RegionalError",
    "RestoreError",
    "SinkError",
    "StorageError",
    "UsageError",
]


class GraphError(RegionalError):
    """A job graph is invalid or cannot be read; the message names the vertex, edge or file."""

    exit_code = 2


class PolicyError(RegionalError):
    """A policy value is invalid; the message names the file, the key path and the bad value."""

    exit_code = 2


class CheckpointAbortedError(RegionalError):
    """A checkpoint was aborted; the message names the checkpoint id and the rule that fired."""


class JobFailedError(RegionalError):
    """The job gave up (e.g. past `tolerable-failed-checkpoints`); names the units at fault."""


class CommitError(RegionalError):
    """A sink commit failed or cannot be made safely (e.g. a committed data file is missing)."""


class UsageError(RegionalError):
    """A command-line option cannot be used (out of range, a checkpoint directory that cannot
    be one); the message names the option, the value and what is allowed. Exit code 2."""

    exit_code = 2


class RestoreError(RegionalError):
    """A checkpoint or savepoint cannot be restored into this job: the path holds none, or its
    state cannot be mapped onto the pipeline. Names the path or vertex and what to do."""

    exit_code = 2


class SinkError(RegionalError):
    """A sink cannot be used as configured (missing optional package, unsupported table, rows
    that do not fit the table); the message names the table and the fix."""

    exit_code = 2
