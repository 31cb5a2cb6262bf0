"""A source whose records are fitted to a declared schema (`Pipeline.source(src, schema=...)`).

`FittedSource` wraps the user's source: every batch it reads comes out as an Arrow batch of
exactly the schema (`regional.dataflow.schema.fit`), and a record that does not fit is a poison
record of the read (`regional.sources.base.PoisonRecord`), so the epoch treats it as it treats
a record the source cannot decode: a dead letter of the source vertex with
``on_error="dead-letter"``, else the unit declines naming the source, the split and the field.
Positions, splits and boundedness are the wrapped source's own.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from regional.dataflow.schema import SchemaMismatch, fit, schema_of
from regional.errors import GraphError
from regional.sources.base import Batch, PoisonRecord, ReadResult, Source, num_records

__all__ = ["FittedSource", "RowsFitter", "fitted"]


class FittedSource:
    """`source`, its records fitted to `schema` (`name`: the source vertex, for errors)."""

    def __init__(self, source: Source, schema: pa.Schema, *, name: str) -> None:
        self.source = source
        self.schema = schema
        self.name = name

    @property
    def output_schema(self) -> pa.Schema:
        """The schema of every batch read (the plan vertex's `schema`)."""
        return self.schema

    @property
    def bounded(self) -> bool:
        return self.source.bounded

    def discover(self) -> list[str]:
        return self.source.discover()

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        result = self.source.read(split_id, position, max_records)
        poison = list(getattr(result, "poison", ()))
        undecoded = {p.ordinal for p in poison}
        ordinal = 0  # the index of the next decoded record among all records of the read
        batches: list[Batch] = []
        for data in result.batches:
            count = num_records(data)
            ordinals: list[int] = []
            while len(ordinals) < count:
                if ordinal not in undecoded:
                    ordinals.append(ordinal)
                ordinal += 1
            batch, misfits = fit(data, self.schema)
            if batch.num_rows:
                batches.append(batch)
            poison += [self._poison(split_id, ordinals[m.at], m.record, m.error) for m in misfits]
        poison.sort(key=lambda p: p.ordinal)
        return ReadResult(  # the consumer lag as the source said it (a plain 3-tuple: none)
            batches,
            result.position,
            result.finished,
            tuple(poison),
            getattr(result, "behind", None),
            getattr(result, "unread_since", None),
        )

    def _poison(
        self, split_id: str, ordinal: int, record: Any, error: SchemaMismatch
    ) -> PoisonRecord:
        raised = SchemaMismatch(
            f"source {self.name!r}, split {split_id!r}, record {ordinal} of the read: {error}; "
            "fix the record, or declare the field's type as it comes (or nullable) in schema=..."
        )
        return PoisonRecord(ordinal, record, raised)

    def __getattr__(self, name: str) -> Any:
        """Anything else is the wrapped source's (`endless_splits`, a source's own extras)."""
        source = self.__dict__.get("source")
        if source is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(source, name)

    def __repr__(self) -> str:
        return f"FittedSource({self.source!r}, {self.schema.names})"


def fitted(source: Source, declared: Any, name: str) -> FittedSource:
    """`source` read through `FittedSource` with the schema `declared` stands for
    (`regional.dataflow.schema.schema_of`; ``"infer"``: the schema of a Parquet source's first
    file); `GraphError` naming the source when `declared` is no schema."""
    if isinstance(declared, str) and declared == "infer":
        infer = getattr(source, "file_schema", None)
        declared = infer() if callable(infer) else None
        if declared is None:
            raise GraphError(
                f"source {name!r}: schema='infer' takes the schema of the first file of a "
                "FileSource(format='parquet') that has one; declare it instead: schema=<a "
                "pyarrow.Schema, msgspec Struct or dataclass>"
            )
    try:
        schema = schema_of(declared)
    except TypeError as exc:
        raise GraphError(f"source {name!r}: {exc}") from None
    fitting = getattr(source, "fitting", None)
    if callable(fitting):  # it decodes rows itself (FileSource): the schema judges them there
        source = fitting(RowsFitter(schema))
    return FittedSource(source, schema, name=name)


class RowsFitter:
    """`fit` of decoded rows to `schema`, in the shape a source's `fitting` hook takes
    (`regional.sources.files.RowsFit`): the rows that fit, and (index, why) of the others."""

    def __init__(self, schema: pa.Schema) -> None:
        self.schema = schema

    def __call__(
        self, rows: list[dict[str, Any]]
    ) -> tuple[pa.RecordBatch, list[tuple[int, Exception]]]:
        batch, misfits = fit(rows, self.schema)
        return batch, [(m.at, m.error) for m in misfits]
