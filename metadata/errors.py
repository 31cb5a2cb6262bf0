"""The exception hierarchy shared by every package of regional.

`RegionalError` is rooted here, not in `regional`, because `metadata` imports nothing of ours
(DESIGN §3); `regional.RegionalError` is the same class re-exported. Every error carries an
`exit_code` so the CLI can map failures without knowing each class: 2 for bad input or bad usage,
1 for an operation that failed.
"""

from __future__ import annotations

__all__ = ["MetadataError", "OutsideRootError", "RegionalError", "StorageError"]


class RegionalError(Exception):
    """Root of every error regional raises on purpose. Messages name the thing and the fix."""

    exit_code: int = 1


class MetadataError(RegionalError):
    """A checkpoint metadata file cannot be used: truncated, corrupt, or of an unknown version.

    The message always names the file.
    """

    exit_code = 1


class StorageError(RegionalError):
    """Checkpoint storage refused an operation: a path outside the job root, a missing or
    damaged state file, an unreachable file system."""

    exit_code = 1


class OutsideRootError(StorageError):
    """A path under the job root resolves outside it through a symbolic link (local file
    systems): regional never reads, writes or deletes through it. The message names the link
    and where it points."""
