"""Checkpoint metadata: model, versioned binary format, storage layout, completed-checkpoint
store and inspector views. Imports nothing else of regional (DESIGN §3)."""

from metadata.errors import MetadataError, RegionalError, StorageError

__all__ = ["MetadataError", "RegionalError", "StorageError"]
