"""The task protocol between the driver and whatever runs units: work in, typed answers out.

The driver (`regional.runtime.driver.JobDriver`) hands a `TaskDispatcher` one `UnitWork` per
fallback unit and epoch; every unit answers with an `Ack` (its subtask states, in layout order)
or a `Decline` (why it failed). Both are tagged msgspec Structs, so they pickle through Spark,
encode as msgpack or JSON for logs, and can never be mistaken for each other. Nothing here
imports Spark.

>>> from metadata.model import SubtaskState
>>> ack = Ack(3, 0, 1, (SubtaskState("src", 0, 0, attempt=1),), records_in=5)
>>> decline = Decline(3, 1, 1, "ValueError: bad record")
>>> [type(a).__name__ for a in msgspec.msgpack.decode(
...     msgspec.msgpack.encode([ack, decline]), type=list[Answer])]
['Ack', 'Decline']
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import msgspec

from metadata.model import SubtaskState

__all__ = ["Ack", "Answer", "Dispatch", "TaskDispatcher", "UnitWork"]


class UnitWork(msgspec.Struct, frozen=True):
    """One unit's work for one epoch: restore `restore` (the unit's subtask states, in layout
    order), read `new_splits` (`(vertex, index, split)`) from their start, snapshot as
    checkpoint `checkpoint_id` attempt `attempt`."""

    checkpoint_id: int
    attempt: int
    unit_id: int
    restore: tuple[SubtaskState, ...]
    new_splits: tuple[tuple[str, int, str], ...] = ()


class Ack(msgspec.Struct, frozen=True, tag="ack"):
    """Unit `unit` snapshotted checkpoint `checkpoint_id` as attempt `attempt`: `states` are its
    fresh subtask states (uploaded and verified), in layout order. `snapshot_blocked_s` is how
    long the unit was blocked in the synchronous part of its snapshot; `records_dead_lettered`
    how many records its dead-letter sink staged (`on_error="dead-letter"`). The task's seconds
    per phase of the unit: `restore_s` (reading and decoding its operator state), `process_s`
    (sources, operators, staging sink files), `snapshot_s` (encoding the state and writing the
    local file), `upload_s` (uploading it, reading it back, verifying)."""

    checkpoint_id: int
    unit: int
    attempt: int
    states: tuple[SubtaskState, ...]
    records_in: int = 0
    records_out: int = 0
    snapshot_blocked_s: float = 0.0
    records_dead_lettered: int = 0
    restore_s: float = 0.0
    process_s: float = 0.0
    snapshot_s: float = 0.0
    upload_s: float = 0.0


class Decline(msgspec.Struct, frozen=True, tag="decline"):
    """Unit `unit` failed checkpoint `checkpoint_id` in attempt `attempt`: `reason` is one line
    (e.g. the user's exception), `trace` the traceback when there was one."""

    checkpoint_id: int
    unit: int
    attempt: int
    reason: str
    trace: str | None = None


Answer = Ack | Decline


class Dispatch(msgspec.Struct, frozen=True):
    """What a dispatcher got back: the answers that arrived, and `error` when the batch itself
    failed (a lost worker took units with it; units without an answer were lost)."""

    answers: list[Answer]
    error: str | None = None


class TaskDispatcher(Protocol):
    """Runs unit work somewhere (Spark tasks, a simulation) and returns what answered.

    `run` must return by `deadline_ms` (driver clock) with the answers that arrived; units
    still running then are cancelled and are declined by the coordinator as timed out. With
    `isolated`, every unit runs on its own, so a crash loses only that unit (retries).
    """

    def start(self) -> None:
        """Prepare workers before a run (e.g. warm up Python workers); may be a no-op."""
        ...

    def run(
        self, works: Sequence[UnitWork], deadline_ms: int, *, isolated: bool = False
    ) -> Dispatch: ...
