"""Dead letters: the records a user function failed on, when the pipeline says
`on_error="dead-letter"` (Kafka Streams' KIP-1034, per pipeline).

A failing record does not fail its unit: it becomes one row of the pipeline's dead-letter sink
(`DEAD_LETTER_SCHEMA`) and processing goes on with the next record. The dead-letter sink is a
sink vertex of the job (`dead-letters`, fed by every operator of its chain), so its rows are
staged and committed exactly once with the checkpoint like any sink output, and fall back
with their unit. `map_batches` has no per-record identity: a failing batch is dead-lettered
whole, one row per record of the batch.

>>> dead = DeadLetters(7, {"g3": "5"})
>>> dead.add("parse", "g3", 6, {"n": 6}, ValueError("bad n\\nmore"))
>>> dead.add("parse", "g3", 8, {"n": object()}, KeyError("x"))
>>> rows = dead.batch(("parse",)).to_pylist()
>>> [(r["split_id"], r["split_position"], r["record_index"], r["record"]) for r in rows][0]
('g3', '5', 6, '{"n":6}')
>>> rows[0]["error_type"], rows[0]["error_message"], rows[1]["record"].startswith("{'n': <object")
('ValueError', 'bad n\\nmore', True)
>>> len(dead), dead.batch(("other",)).num_rows
(2, 0)
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import Any

import msgspec
import pyarrow as pa

from regional.dataflow.failures import failure_trace, raised_on

__all__ = [
    "DEAD_LETTERS",
    "DEAD_LETTER_SCHEMA",
    "ON_ERROR",
    "TRACE_CHARS",
    "DeadLetters",
    "set_aside",
]

#: The choices of `Pipeline(on_error=...)`: fail the unit (today's behaviour), or dead-letter.
ON_ERROR = ("fail", "dead-letter")
#: The id of the dead-letter sink vertex (`dead-letters-<n>` for further independent chains).
DEAD_LETTERS = "dead-letters"
#: How much of a dead letter's traceback is kept (its last characters).
TRACE_CHARS = 2048

DEAD_LETTER_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("operator", pa.string(), nullable=False),
        pa.field("split_id", pa.string(), nullable=False),
        pa.field("split_position", pa.string(), nullable=False),
        pa.field("record_index", pa.int64(), nullable=False),
        pa.field("record", pa.string(), nullable=False),
        pa.field("error_type", pa.string(), nullable=False),
        pa.field("error_message", pa.string(), nullable=False),
        pa.field("traceback", pa.string(), nullable=False),
    ]
)

_JSON = msgspec.json.Encoder()


def _record_text(record: Any) -> str:
    """The record as JSON text, or its repr when JSON cannot hold it."""
    try:
        return _JSON.encode(record).decode()
    except (TypeError, ValueError, OverflowError):
        return repr(record)


class DeadLetters:
    """The dead letters of one unit attempt of checkpoint `checkpoint_id`.

    `split_positions` maps each split read in the epoch to the position the epoch started at
    (as text): a dead letter names its split, that position and `record_index`, the record's
    index among the records of that split the operator got in this epoch. Two sources of a
    unit can read splits of one id (the two exchange readers of a join both read
    ``n<N>-p<q>``): `source_positions` has the positions by (source vertex, split), and a
    dead letter that names its `source` takes its position from there."""

    def __init__(
        self,
        checkpoint_id: int,
        split_positions: Mapping[str, str],
        source_positions: Mapping[tuple[str, str], str] | None = None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.split_positions = split_positions
        self.source_positions = {} if source_positions is None else source_positions
        self._rows: list[dict[str, Any]] = []

    def __len__(self) -> int:
        return len(self._rows)

    def add(
        self,
        operator: str,
        split: str,
        index: int,
        record: Any,
        exc: Exception,
        *,
        source: str | None = None,
    ) -> None:
        """Keep `record`, on which `operator` raised `exc` (`source`: the source vertex that
        read it, when the operator knows it)."""
        position = self.source_positions.get((source, split)) if source is not None else None
        if position is None:
            position = self.split_positions.get(split, "")
        self._rows.append(
            {
                "checkpoint_id": self.checkpoint_id,
                "operator": operator,
                "split_id": split,
                "split_position": position,
                "record_index": index,
                "record": _record_text(record),
                "error_type": type(exc).__name__,
                "error_message": str(exc),
                "traceback": failure_trace(exc, TRACE_CHARS),
            }
        )

    def batch(self, operators: Collection[str]) -> pa.RecordBatch:
        """The dead letters of `operators` (the inputs of one dead-letter sink vertex)."""
        return self.batch_of(self.rows(operators))

    def rows(self, operators: Collection[str]) -> list[dict[str, Any]]:
        """The dead letters of `operators` as rows of `DEAD_LETTER_SCHEMA`, in the order kept."""
        return [r for r in self._rows if r["operator"] in operators]

    @staticmethod
    def batch_of(rows: Sequence[Mapping[str, Any]]) -> pa.RecordBatch:
        """`rows` (of `rows`) as a record batch."""
        return pa.RecordBatch.from_pylist(list(rows), schema=DEAD_LETTER_SCHEMA)


def set_aside(
    dead: DeadLetters | None,
    error: Exception,
    operator: str,
    split: str,
    index: int,
    record: Any,
    *,
    source: str | None = None,
) -> None:
    """`record`, which `operator` cannot take (`error`), as its dead letter; without dead
    letters, `error` raised with its split noted (`failures.raised_on`), so that only the unit
    reading that split declines."""
    if dead is None:
        raised_on(error, split)
        raise error
    dead.add(operator, split, index, record, error, source=source)
