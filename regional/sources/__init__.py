"""Sources: files (Parquet / JSON lines), a partitioned append-only log, a generator, and Kafka
(`KafkaSource`, the extra ``regional-checkpoints[kafka]``; imported on first use, so
`regional.sources` works without confluent-kafka).

Also the source contract, to write a source of your own (`regional.sources.base`): `Source`,
what a read returns (`ReadResult`, its `Batch` of records, a `PoisonRecord` for bad input), and
the capability of a source whose records carry origin watermarks (`TimedSource`)."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from regional.sources.base import Batch, PoisonRecord, ReadResult, Source, TimedSource
from regional.sources.files import FileSource
from regional.sources.generator import GeneratorSource
from regional.sources.log import LogSource

if TYPE_CHECKING:
    from regional.sources.kafka import KafkaSource

__all__ = [
    "Batch",
    "FileSource",
    "GeneratorSource",
    "KafkaSource",
    "LogSource",
    "PoisonRecord",
    "ReadResult",
    "Source",
    "TimedSource",
]


def __getattr__(name: str) -> Any:
    if name == "KafkaSource":
        return importlib.import_module("regional.sources.kafka").KafkaSource
    raise AttributeError(f"module 'regional.sources' has no attribute {name!r}")
