"""Operator coordinators (DESIGN §4 rules 7 and 8): the protocol, the split enumerator, the
commit coordinator with its `TableCommitter` protocol, and an in-memory reference sink."""

from __future__ import annotations

from regional.operators.commit import (
    CommitCoordinator,
    TableCommitter,
    TableRetention,
    TableRollback,
    TableStaging,
    perform_commit,
    sink_retention,
)
from regional.operators.memory_sink import InMemoryTableSink
from regional.operators.protocol import FallbackUnsupportedError, OperatorCoordinator
from regional.operators.split_enumerator import SplitEnumerator

__all__ = [
    "CommitCoordinator",
    "FallbackUnsupportedError",
    "InMemoryTableSink",
    "OperatorCoordinator",
    "SplitEnumerator",
    "TableCommitter",
    "TableRetention",
    "TableRollback",
    "TableStaging",
    "perform_commit",
    "sink_retention",
]
