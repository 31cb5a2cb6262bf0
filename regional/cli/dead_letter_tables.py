"""Where a job's committed dead letters are, and reading them: one lookup for every surface.

The newest checkpoint records every sink's table (`CheckpointMetadata.sinks`); the dead-letter
sinks are the vertices named `dead-letters` (`regional.dataflow.dead_letters.DEAD_LETTERS`, one
per part of the graph: `dead-letters-<n>`). `regional inspect ROOT dead-letters`, `regional
dead-letters ROOT list|export|replay` and the report (`regional inspect ROOT report`) all find
the committed dead letters here. Parquet and Delta tables are read; another format is named,
with what to read it with.
"""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from metadata.model import CheckpointMetadata
from regional.dataflow.dead_letters import DEAD_LETTER_SCHEMA, DEAD_LETTERS
from regional.errors import UsageError
from regional.runtime.inspection import checkpoint_unit_names

__all__ = [
    "CommittedDeadLetters",
    "DeadLetterTable",
    "DeadLetterTableError",
    "committed_dead_letters",
    "dead_letter_tables",
    "no_dead_letter_sink",
    "operator_exchanges",
    "read_dead_letters",
]


@dataclasses.dataclass(frozen=True)
class DeadLetterTable:
    """A dead-letter table a checkpoint records: the sink vertex writing it, its format
    (`kind`: ``parquet``, ``delta``, ...) and its location."""

    vertex_id: str
    kind: str
    location: str


class DeadLetterTableError(UsageError):
    """A recorded dead-letter table cannot be read here (a format other than Parquet and
    Delta, or Delta without `deltalake`); the message names the table and what to do."""


@dataclasses.dataclass(frozen=True)
class CommittedDeadLetters:
    """The dead-letter tables of a checkpoint (`tables`), the committed rows of those that
    could be read (`rows`, `DEAD_LETTER_SCHEMA`; None when none could) and a line per table
    that could not (`unread`)."""

    tables: tuple[DeadLetterTable, ...]
    rows: pa.Table | None
    unread: tuple[str, ...] = ()


def dead_letter_tables(checkpoint: CheckpointMetadata) -> list[DeadLetterTable]:
    """The dead-letter tables `checkpoint` records, once per location (two dead-letter
    vertices, of two parts of the graph, may share one)."""
    found: dict[tuple[str, str], DeadLetterTable] = {}
    for s in checkpoint.sinks:
        if s.vertex_id == DEAD_LETTERS or s.vertex_id.startswith(f"{DEAD_LETTERS}-"):
            found.setdefault((s.kind, s.location), DeadLetterTable(s.vertex_id, s.kind, s.location))
    return list(found.values())


def no_dead_letter_sink(checkpoint: CheckpointMetadata) -> str:
    """The line every surface shows for a checkpoint that records no dead-letter table."""
    return (
        f"checkpoint {checkpoint.checkpoint_id} records no dead-letter sink: the pipeline runs "
        "without on_error='dead-letter' (or its dead-letter sink records no location)"
    )


def read_dead_letters(table: DeadLetterTable) -> pa.Table:
    """The committed rows (`DEAD_LETTER_SCHEMA`) of a Parquet or Delta dead-letter table;
    `DeadLetterTableError` for another format, or for Delta without `deltalake`."""
    if table.kind == "parquet":
        from regional.sinks.parquet import read_table

        return read_table(table.location)
    if table.kind == "delta":
        try:
            from deltalake import DeltaTable
        except ImportError:
            raise DeadLetterTableError(
                f"the dead-letter sink {table.vertex_id!r} at {table.location} is a Delta "
                "table: install regional-checkpoints[delta] to read it"
            ) from None
        return DeltaTable(table.location).to_pyarrow_table()
    raise DeadLetterTableError(
        f"the dead-letter sink {table.vertex_id!r} at {table.location} is of kind "
        f"{table.kind!r}; regional reads Parquet and Delta dead-letter tables: read this one "
        f"with your {table.kind} reader (columns: {', '.join(DEAD_LETTER_SCHEMA.names)})"
    )


def committed_dead_letters(checkpoint: CheckpointMetadata) -> CommittedDeadLetters:
    """The committed dead letters of every dead-letter table `checkpoint` records, in one
    table; a table that cannot be read is a line in `unread` instead of an error, so the views
    show what they can."""
    tables = dead_letter_tables(checkpoint)
    read, unread = [], []
    for table in tables:
        try:
            read.append(read_dead_letters(table))
        except DeadLetterTableError as exc:
            unread.append(str(exc))
    rows = pa.concat_tables(read, promote_options="default") if read else None
    return CommittedDeadLetters(tuple(tables), rows, tuple(unread))


def operator_exchanges(checkpoint: CheckpointMetadata) -> dict[str, str]:
    """Operator vertex -> the keyed exchange its unit reads, by the exchange's name
    (`regional.graph.unit_names`), so a dead letter's exchange partition is named by it."""
    names = checkpoint_unit_names(checkpoint)
    return {
        s.vertex_id: names.exchanges[s.unit_id]
        for s in checkpoint.subtasks
        if s.unit_id in names.exchanges
    }
