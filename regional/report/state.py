"""How big the state of each stateful operator is (`regional inspect ROOT state`).

The view reads one checkpoint (the CLI passes the newest): per operator that keeps state (a
subtask with a state handle), its subtasks, the checkpoints that own their state (the checkpoint
itself for fresh state, the owner for fallback state), the bytes of state and the number of keys;
with ``verbose``, one row per subtask. Bytes come from the metadata (the handles' lengths). Keys
are counted by the caller from the state segments (`StateCodec.key_count`: one per key and input
split on a forward chain, one per key after a keyed exchange) and given here per subtask; a
subtask without a count (pickled state, a segment that could not be read, or keys not counted at
all) shows none, and so does its operator's total.

>>> from metadata.model import CheckpointKind, CheckpointMetadata, StateHandle, SubtaskState
>>> def h(n): return StateHandle(path="chk-7/u0.state", offset=0, length=n, size=n, checksum=b"")
>>> chk = CheckpointMetadata(7, "job", CheckpointKind.REGIONAL, 0, 0, subtasks=[
...     SubtaskState("totals", 0, 0, handles=(h(100),)),
...     SubtaskState("totals", 1, 1, ref_checkpoint_id=5, handles=(h(40),)),
...     SubtaskState("parse", 0, 0)])
>>> state_view(chk, {("totals", 0): 3, ("totals", 1): 2}).to_pylist()
[{'operator': 'totals', 'subtasks': 2, 'owner_checkpoints': [5, 7], 'state_bytes': 140, 'keys': 5}]
>>> [r["keys"] for r in state_view(chk, {("totals", 0): 3}, verbose=True).to_pylist()]
[3, None]
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import pyarrow as pa

from metadata.model import CheckpointMetadata, SubtaskState

__all__ = ["STATE_SCHEMA", "STATE_SUBTASKS_SCHEMA", "state_view", "stateful_subtasks"]

STATE_SCHEMA = pa.schema(
    [
        ("operator", pa.string()),
        ("subtasks", pa.int64()),
        ("owner_checkpoints", pa.list_(pa.int64())),
        ("state_bytes", pa.int64()),
        ("keys", pa.int64()),
    ]
)
STATE_SUBTASKS_SCHEMA = pa.schema(
    [
        ("operator", pa.string()),
        ("subtask_index", pa.int64()),
        ("unit_id", pa.int64()),
        ("owner_checkpoint_id", pa.int64()),
        ("state_bytes", pa.int64()),
        ("keys", pa.int64()),
    ]
)


class _Row(NamedTuple):
    """One stateful subtask, as `STATE_SUBTASKS_SCHEMA` lists it."""

    operator: str
    subtask_index: int
    unit_id: int
    owner_checkpoint_id: int
    state_bytes: int
    keys: int | None


def stateful_subtasks(checkpoint: CheckpointMetadata) -> list[SubtaskState]:
    """The subtasks of `checkpoint` that hold state (a handle), operators in the order the
    checkpoint lists its vertices (the graph's), subtasks by index."""
    order = {v.vertex_id: i for i, v in enumerate(checkpoint.vertices)}
    held = [s for s in checkpoint.subtasks if s.handles]
    return sorted(held, key=lambda s: (order.get(s.vertex_id, len(order)), s.vertex_id, s.index))


def state_view(
    checkpoint: CheckpointMetadata,
    keys: Mapping[tuple[str, int], int | None] | None = None,
    *,
    verbose: bool = False,
) -> pa.Table:
    """One row per stateful operator of `checkpoint` (`STATE_SCHEMA`), or per stateful subtask
    with `verbose` (`STATE_SUBTASKS_SCHEMA`); `keys` maps (operator, subtask index) to the
    subtask's key count (None or missing: not counted)."""
    counts = keys or {}
    rows = [
        _Row(
            s.vertex_id,
            s.index,
            s.unit_id,
            checkpoint.checkpoint_id if s.ref_checkpoint_id is None else s.ref_checkpoint_id,
            sum(h.length for h in s.handles),
            counts.get((s.vertex_id, s.index)),
        )
        for s in stateful_subtasks(checkpoint)
    ]
    if verbose:
        return pa.Table.from_pylist([r._asdict() for r in rows], schema=STATE_SUBTASKS_SCHEMA)
    operators: dict[str, list[_Row]] = {}
    for r in rows:
        operators.setdefault(r.operator, []).append(r)
    out = []
    for operator, members in operators.items():
        known = [r.keys for r in members if r.keys is not None]
        out.append(
            {
                "operator": operator,
                "subtasks": len(members),
                "owner_checkpoints": sorted({r.owner_checkpoint_id for r in members}),
                "state_bytes": sum(r.state_bytes for r in members),
                "keys": sum(known) if len(known) == len(members) else None,
            }
        )
    return pa.Table.from_pylist(out, schema=STATE_SCHEMA)
