"""Sinks committed exactly-once through the commit coordinator: `ParquetSink` (a Parquet table),
`PaimonSink` (an Apache Paimon append table; the extra ``regional-checkpoints[paimon]``),
`DeltaSink` (a Delta Lake table; ``regional-checkpoints[delta]``), `IcebergSink` (an Apache
Iceberg table; ``regional-checkpoints[iceberg]``) and `KafkaSink` (a Kafka topic, exactly-once
for ``read_committed`` consumers; ``regional-checkpoints[kafka]``). The optional ones are
imported on first use, so that `regional.sinks` works without their packages.

Also the sink contract, to write a sink of your own (`regional.sinks.base`): `Sink` (both sides),
`SinkWriter` and `MergingWriter` (in tasks, with a `WriteContext`), `TableCommitter` (on the
driver) and the optional capabilities `TableRollback`, `TableRollbackUsers`, `TableStaging`,
`TableRetention`, `WatermarkSink` and `ReadInsideSink`; and the template a table format's sink
is written on, `TableSink`, with its versioned committables (`TableCommittable`,
`COMMITTABLE_VERSION`; `regional.sinks.table`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from regional.sinks.base import (
    MergingWriter,
    ReadInsideSink,
    Sink,
    SinkWriter,
    TableCommitter,
    TableRetention,
    TableRollback,
    TableRollbackUsers,
    TableStaging,
    WatermarkSink,
    WriteContext,
)
from regional.sinks.parquet import ParquetSink, committed_files, read_table
from regional.sinks.table import COMMITTABLE_VERSION, TableCommittable, TableSink

if TYPE_CHECKING:
    from regional.sinks.delta import DeltaSink
    from regional.sinks.iceberg import IcebergSink
    from regional.sinks.kafka import KafkaSink
    from regional.sinks.paimon import PaimonSink

_LAZY = {
    "PaimonSink": "regional.sinks.paimon",
    "DeltaSink": "regional.sinks.delta",
    "IcebergSink": "regional.sinks.iceberg",
    "KafkaSink": "regional.sinks.kafka",
}

__all__ = [
    "COMMITTABLE_VERSION",
    "DeltaSink",
    "IcebergSink",
    "KafkaSink",
    "MergingWriter",
    "PaimonSink",
    "ParquetSink",
    "ReadInsideSink",
    "Sink",
    "SinkWriter",
    "TableCommittable",
    "TableCommitter",
    "TableRetention",
    "TableRollback",
    "TableRollbackUsers",
    "TableSink",
    "TableStaging",
    "WatermarkSink",
    "WriteContext",
    "committed_files",
    "read_table",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'regional.sinks' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
