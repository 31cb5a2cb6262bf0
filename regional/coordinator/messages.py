"""The task protocol between the driver and whatever runs units: work in, typed answers out.

The driver (`regional.runtime.driver.JobDriver`) hands a `TaskDispatcher` one `UnitWork` per
fallback unit and epoch; every unit answers with an `Ack` (its subtask states, in layout order)
or a `Decline` (why it failed). Both are tagged msgspec Structs, so they pickle through Spark,
encode as msgpack or JSON for logs, and can never be mistaken for each other. Where many acks
are made together (a Spark task's partition of units), `AckBatch.of` packs them with their
shape, which the checkpoint coordinator checks against the layout in one comparison
(`Dispatch.batches`). Nothing here imports Spark.

>>> from metadata.model import SubtaskState
>>> ack = Ack(3, 0, 1, (SubtaskState("src", 0, 0, attempt=1),), records_in=5)
>>> decline = Decline(3, 1, 1, "ValueError: bad record")
>>> [type(a).__name__ for a in msgspec.msgpack.decode(
...     msgspec.msgpack.encode([ack, decline]), type=list[Answer])]
['Ack', 'Decline']
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

import msgspec

from metadata.model import SubtaskState

__all__ = [
    "Ack",
    "AckBatch",
    "Answer",
    "UnitWork",
    "ack_shape",
    "answers_of",
    "packed",
    "well_formed_shape",
]


class UnitWork(msgspec.Struct, frozen=True):
    """One unit's work for one epoch: restore `restore` (the unit's subtask states, in layout
    order), read `new_splits` (`(vertex, index, split)`) from their start, snapshot as
    checkpoint `checkpoint_id` attempt `attempt`. `ended`: the sources whose input has ended
    (every split read; their watermark is +inf: event-time windows and timers flush)."""

    checkpoint_id: int
    attempt: int
    unit_id: int
    restore: tuple[SubtaskState, ...]
    new_splits: tuple[tuple[str, int, str], ...] = ()
    ended: tuple[str, ...] = ()


class Ack(msgspec.Struct, frozen=True, tag="ack"):
    """Unit `unit` snapshotted checkpoint `checkpoint_id` as attempt `attempt`: `states` are its
    fresh subtask states (uploaded and verified), in layout order. `snapshot_blocked_s` is how
    long the unit was blocked in the synchronous part of its snapshot; `records_dead_lettered`
    how many records its dead-letter sink staged (`on_error="dead-letter"`). The task's seconds
    per phase of the unit: `restore_s` (reading and decoding its operator state), `process_s`
    (sources, operators, staging sink files), `snapshot_s` (encoding the state and writing the
    local file), `upload_s` (uploading it, reading it back, verifying). With event time:
    `records_late`, the records its window operators judged late, and `watermark`, the unit's
    watermark (ms) after the epoch (DESIGN §4 rule 15). `state_hits` and `state_misses`: how
    many of its operator subtasks with state restored it kept hot in the worker, and how many
    decoded its bytes instead (DESIGN §6; both 0 with hot state off)."""

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
    records_late: int = 0  # records its window operators found late (event time)
    watermark: int | None = None  # its subtask watermark after the epoch (event time)
    state_hits: int = 0  # operator subtasks restored from hot state (DESIGN §6)
    state_misses: int = 0  # operator subtasks restored by decoding their bytes
    records_exchanged: int = 0  # of records_in, those read from a keyed exchange
    #: per operator vertex: (records in, records out, records judged late) in the epoch
    operators: dict[str, tuple[int, int, int]] = {}
    dead_letter_types: dict[str, int] = {}  # its dead letters by error type
    #: per source vertex and split it read: records between its position and the split's end
    behind: dict[str, dict[str, int]] = {}
    #: of those splits, when the oldest unread record was appended (ms), where the source says
    unread_since: dict[str, dict[str, int]] = {}


class Decline(msgspec.Struct, frozen=True, tag="decline"):
    """Unit `unit` failed checkpoint `checkpoint_id` in attempt `attempt`: `reason` is one line
    (e.g. the user's exception), `trace` the traceback when there was one."""

    checkpoint_id: int
    unit: int
    attempt: int
    reason: str
    trace: str | None = None


Answer = Ack | Decline

_encode = msgspec.msgpack.Encoder().encode
_states_of = attrgetter("states")
_handles_of = attrgetter("handles")
_committables_of = attrgetter("committables")
_state_shape = attrgetter("vertex_id", "index", "unit_id", "attempt", "ref_checkpoint_id")


def ack_shape(ack: Ack) -> bytes:
    """What the checkpoint coordinator checks of `ack`, as msgpack: `[unit, attempt, states]`,
    `states` one `[vertex_id, index, unit_id, attempt, ref_checkpoint_id]` per subtask state
    (nil when `states` is not a tuple).

    >>> ack_shape(Ack(3, 0, 1, (SubtaskState("src", 0, 0, attempt=1),)))
    b'\\x93\\x00\\x01\\x91\\x95\\xa3src\\x00\\x00\\x01\\xc0'
    """
    states = ack.states
    return _encode(
        (ack.unit, ack.attempt, list(map(_state_shape, states)) if type(states) is tuple else None)
    )


def well_formed_shape(unit: int, attempt: int, subtasks: Sequence[tuple[str, int]]) -> bytes:
    """The `ack_shape` of a well-formed ack of `unit`'s attempt `attempt` whose subtasks are
    `subtasks` (vertex id, index), in layout order: fresh states, each of that unit and attempt.

    >>> state = SubtaskState("src", 0, 0, attempt=1)
    >>> well_formed_shape(0, 1, [("src", 0)]) == ack_shape(Ack(3, 0, 1, (state,)))
    True
    """
    return _encode((unit, attempt, [(v, i, unit, attempt, None) for v, i in subtasks]))


class AckBatch(msgspec.Struct, frozen=True, tag="ack-batch"):
    """Acks of checkpoint `checkpoint_id`, made by `AckBatch.of` where they were made (a Spark
    task's partition of units, the simulated dispatcher): `shape` is their `ack_shape`s joined,
    so the checkpoint coordinator checks the whole batch against its layout by comparing bytes
    instead of reading every subtask state (an ack whose shape differs is checked on its own).
    Build it with `of` only: the coordinator trusts `shape` and `files` to describe `acks`."""

    checkpoint_id: int
    acks: tuple[Ack, ...]
    shape: bytes
    files: bool  # whether a state of `acks` holds a state file or committables

    @classmethod
    def of(cls, acks: Sequence[Ack]) -> AckBatch:
        """The batch of `acks` (at least one, all of one checkpoint; `ValueError` otherwise).

        >>> b = AckBatch.of([Ack(3, 0, 1, ()), Ack(3, 1, 1, ())])
        >>> b.checkpoint_id, b.shape == ack_shape(b.acks[0]) + ack_shape(b.acks[1])
        (3, True)
        """
        batch = tuple(acks)
        if not batch:
            raise ValueError("an ack batch holds at least one ack")
        cid = batch[0].checkpoint_id
        if {type(a) for a in batch} != {Ack} or {a.checkpoint_id for a in batch} != {cid}:
            raise ValueError("an ack batch holds acks (type Ack) of one checkpoint only")
        states = list(chain.from_iterable(map(_states_of, batch)))
        files = any(map(_handles_of, states)) or any(map(_committables_of, states))
        return cls(cid, batch, b"".join(map(ack_shape, batch)), files)


def packed(answers: Sequence[Answer]) -> list[Answer | AckBatch]:
    """`answers` as a task that ran several units returns them: the acks of each checkpoint
    packed into one `AckBatch` (in their order), then the other answers.

    >>> [type(a).__name__ for a in packed([Ack(3, 0, 1, ()), Decline(3, 1, 1, "x"),
    ...     Ack(3, 2, 1, ())])]
    ['AckBatch', 'Decline']
    """
    acks: dict[int, list[Ack]] = {}
    rest: list[Answer | AckBatch] = []
    for a in answers:
        if type(a) is Ack:
            acks.setdefault(a.checkpoint_id, []).append(a)
        else:
            rest.append(a)
    return [*map(AckBatch.of, acks.values()), *rest]


def answers_of(items: Sequence[Answer | AckBatch]) -> list[Answer]:
    """`items` with every batch replaced by its acks, in order."""
    out: list[Answer] = []
    for item in items:
        if type(item) is AckBatch:
            out += item.acks
        else:
            out.append(item)  # type: ignore[arg-type]  # Ack or Decline
    return out
