"""The expression stages (`Stream.where`, `select`, `with_columns`, `sql`) as one operator.

`SqlStage` runs a compiled `Predicate` and/or `Projection` (`regional.dataflow.expressions`)
over each chunk's Arrow batch: one vectorised call per chunk, no Python per record. Its input
schema is the stream's (declared at the source); its output schema (`output_schema`) is
computed when the pipeline is built and is what the plan vertex carries.

A row an expression fails on at run time (a CAST that cannot convert, an overflow, a division
by zero) follows the pipeline's ``on_error`` rule: the batch is evaluated again row by row (only
then), each failing row is a dead letter of the stage naming the expression and the reason, and
the other rows go on; without dead letters the unit declines naming the stage and the record.

>>> import pyarrow as pa
>>> schema = pa.schema([("n", pa.int64())])
>>> stage = SqlStage("where", schema, where="n > 1", name="big")
>>> batch = pa.RecordBatch.from_pydict({"n": [1, 2, 3]}, schema=schema)
>>> out, _ = stage.run([("s0", batch)], None, None, None, None)
>>> out[0][1].to_pylist()
[{'n': 2}, {'n': 3}]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import pyarrow as pa
from sqlglot import exp

from regional.dataflow.dead_letters import DeadLetters, set_aside
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.expressions import (
    ARROW_ERRORS,
    ExpressionError,
    Predicate,
    Projection,
    compile_where,
    parse,
    refusal,
    with_columns,
)
from regional.dataflow.failures import raised_on
from regional.dataflow.operators import Chunk, Operator
from regional.dataflow.schema import SchemaMismatch, fit, one_batch
from regional.dataflow.state import OperatorState
from regional.sources.base import Batch

__all__ = ["ExpressionFailed", "SqlStage", "query_parts"]


class ExpressionFailed(ValueError):
    """An expression of a SQL stage failed on a record at run time (names the stage, the
    expression and Arrow's reason)."""


def query_parts(query: str, stage: str) -> tuple[str | None, list[tuple[exp.Expr, str]]]:
    """A row-wise ``SELECT ... FROM input [WHERE ...]`` split into its WHERE text (or None)
    and its select items (each parsed, with its text); `ExpressionError` for anything else,
    naming the construct."""
    node = parse(query, stage)
    if not isinstance(node, exp.Select):
        raise ExpressionError(
            f"stage {stage!r}: sql() takes one SELECT ... FROM input [WHERE ...]; got "
            f"{type(node).__name__.upper()}"
        )
    why = refusal(node)
    if why is not None:
        raise ExpressionError(f"stage {stage!r}: {query!r} is refused: {why}")
    source = node.args.get("from_")
    table = source.this if source is not None else None
    if not (isinstance(table, exp.Table) and table.name == "input" and not table.db):
        found = source.this.sql("spark") if source is not None else "no FROM"
        raise ExpressionError(
            f"stage {stage!r}: sql() reads the stream as the table input (SELECT ... FROM "
            f"input); {query!r} reads {found}"
        )
    where = node.args.get("where")
    items = [(e, e.sql("spark")) for e in node.expressions]
    return (where.this.sql("spark") if where is not None else None), items


class SqlStage(Operator):
    """A `where` condition and/or a projection (`select` items, `with_columns` assignments or
    a `sql` query's) over batches of `input_schema`, compiled when built (errors name the
    stage `name`) and again in each worker that runs it."""

    kind: ClassVar[str] = "sql"
    one_pass = True

    def __init__(
        self,
        kind: str,
        input_schema: pa.Schema,
        *,
        where: str | None = None,
        select: Sequence[str] | None = None,
        assign: dict[str, str] | None = None,
        query: str | None = None,
        name: str = "",
    ) -> None:
        super().__init__(name=name)
        self.kind = kind  # type: ignore[misc]
        self.input_schema = input_schema
        self.where = where
        self.select = tuple(select) if select is not None else None
        self.assign = dict(assign) if assign is not None else None
        self.query = query
        self._program: tuple[Predicate | None, Projection | None] | None = None
        projection = self.program()[1]
        self.output_schema = projection.schema if projection is not None else input_schema

    def program(self) -> tuple[Predicate | None, Projection | None]:
        """The compiled condition and projection (compiled once per process)."""
        if self._program is None:
            self._program = self._compile(self.name or self.kind)
        return self._program

    def _compile(self, stage: str) -> tuple[Predicate | None, Projection | None]:
        schema = self.input_schema
        where, projection = self.where, None
        if self.query is not None:
            where, items = query_parts(self.query, stage)
            projection = Projection.of_nodes(items, schema, stage=stage)
        elif self.select is not None:
            projection = Projection.of_select(self.select, schema, stage=stage)
        elif self.assign is not None:
            projection = with_columns(self.assign, schema, stage=stage)
        predicate = compile_where(where, schema, stage=stage) if where is not None else None
        return predicate, projection

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_program"] = None  # compiled closures stay in their process
        return state

    @property
    def sql_text(self) -> str:
        """What the stage runs, as Spark SQL (for errors and `regional regions`)."""
        if self.query is not None:
            return self.query
        parts = []
        if self.select is not None:
            parts.append(f"SELECT {', '.join(self.select)}")
        if self.assign is not None:
            parts.append("SELECT *, " + ", ".join(f"{v} AS {k}" for k, v in self.assign.items()))
        if self.where is not None:
            parts.append(f"WHERE {self.where}")
        return " ".join(parts)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        """The stage over one batch (Arrow raises on a row an expression fails on)."""
        predicate, projection = self.program()
        if predicate is not None:
            batch = predicate.apply(batch)
        if projection is not None:
            batch = projection.apply(batch)
        return batch

    def _batch(
        self, data: Batch, split: str, base: int, dead_letters: DeadLetters | None
    ) -> pa.RecordBatch:
        """A chunk as a batch of the input schema: Python records (from an operator that
        declared its output's `schema=`, or a join's rows) are fitted to it
        (`regional.dataflow.schema.fit`), and one that does not fit is set aside naming the
        stage and the field (a dead letter, or its unit declines)."""
        if isinstance(data, pa.RecordBatch):
            return data
        batch, misfits = fit(data, self.input_schema)
        for m in misfits:
            error = SchemaMismatch(
                f"stage {self.name!r}: record {base + m.at} of split {split!r} does not fit "
                f"the schema its input declared: {m.error}"
            )
            set_aside(dead_letters, error, self.name, split, base + m.at, m.record)
        return batch

    def run(
        self,
        chunks: Sequence[Chunk],
        origins: Sequence[int] | None,
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        out: list[Chunk] = []
        out_origins: list[int] | None = [] if origins is not None else None
        seen: dict[str, int] = {}
        for n, (split, data) in enumerate(chunks):
            base = seen.get(split, 0)
            seen[split] = base + (data.num_rows if isinstance(data, pa.RecordBatch) else len(data))
            batch = self._batch(data, split, base, dead_letters)
            try:
                result = self.apply(batch)
            except ARROW_ERRORS:
                result = self._row_by_row(batch, split, base, dead_letters)
            except BaseException as exc:
                raised_on(exc, split)
                raise
            if result.num_rows:
                out.append((split, result))
                if out_origins is not None:
                    assert origins is not None
                    out_origins.append(origins[n])
        return out, out_origins

    def _row_by_row(
        self, batch: pa.RecordBatch, split: str, base: int, dead_letters: DeadLetters | None
    ) -> pa.RecordBatch:
        """The stage over `batch` one row at a time (after a vectorised call failed): each
        row an expression fails on is set aside (`dead_letters.set_aside`), the rest go on."""
        kept = []
        for i in range(batch.num_rows):
            row = batch.slice(i, 1)
            try:
                kept.append(self.apply(row))
            except ARROW_ERRORS as exc:
                error = ExpressionFailed(
                    f"stage {self.name!r} ({self.sql_text}) failed on record {base + i} of split "
                    f"{split!r}: {exc}"
                )
                set_aside(dead_letters, error, self.name, split, base + i, row.to_pylist()[0])
        return one_batch(kept, self.output_schema)
