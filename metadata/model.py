"""The checkpoint metadata model: what one completed checkpoint records (DESIGN §5).

Every struct is a frozen `msgspec.Struct`, encoded as a msgpack array (`array_like`) to keep the
metadata small. The per-subtask and per-unit structs are `gc=False`: they hold only immutable
values, so they can never be part of a reference cycle, and a job of 100,000 units keeps
hundreds of thousands of them alive that the garbage collector then never walks.

The format is additive: new fields go at the **end** of a struct, with a default, so that files
written by an older version still decode (see `metadata.format`).

Paths in `StateHandle` are relative to the job root (`<root>/<job-id>/`), never absolute.
Integers carry their ranges (`Count`, `Int64`, `EpochMs`) as msgspec constraints, checked when
a file is decoded (not when a struct is built in code): a value no writer produces (a timestamp
past year 9999, an id beyond 64 bits) makes the file damaged instead of crashing a view later.

Owner references: a subtask whose state was re-used from an earlier checkpoint (a *fallback*
subtask) carries `ref_checkpoint_id` = the checkpoint that physically wrote that state, and its
handles point at that owner's files. Fresh subtasks carry `None`.

>>> h = StateHandle(path="chk-3/u0-1.state", offset=0, length=10, size=10, checksum=b"x" * 16)
>>> s = SubtaskState(vertex_id="map", index=0, unit_id=0, handles=(h,))
>>> s.is_fallback
False
>>> SubtaskState(vertex_id="map", index=0, unit_id=0, ref_checkpoint_id=2).is_fallback
True
"""

from __future__ import annotations

import enum
from typing import Annotated

import msgspec

__all__ = [
    "CheckpointKind",
    "CheckpointMetadata",
    "Count",
    "EpochMs",
    "ForcedGlobal",
    "Int64",
    "SinkRetention",
    "SplitState",
    "StateHandle",
    "SubtaskState",
    "UnitState",
    "VertexInfo",
]


#: An integer a 64-bit signed column (Arrow `int64`, the inspector's views) can hold: a decoded
#: file with a bigger one is damaged, not a checkpoint (msgspec checks it while decoding).
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
#: A count, size, offset or id: not negative, and fits `Int64`.
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: Epoch milliseconds up to the end of year 9999 (what `datetime` and the views can show);
#: a later timestamp is no real one.
EpochMs = Annotated[int, msgspec.Meta(ge=0, le=253_402_300_799_999)]


class CheckpointKind(enum.StrEnum):
    """`global`: every unit fresh. `regional`: some units fell back. `savepoint`: global,
    self-contained, user-owned."""

    GLOBAL = "global"
    REGIONAL = "regional"
    SAVEPOINT = "savepoint"


class ForcedGlobal(enum.StrEnum):
    """Why every unit had to be fresh in a checkpoint (DESIGN §4 rules 1, 5, 12): recorded in
    `CheckpointMetadata.forced_global`, so tools never parse reason texts."""

    SAVEPOINT = "savepoint"  # a savepoint, or the job's own copy of one
    FINAL = "final"  # every bounded source finished
    UNTIL_SUCCESS = "until-success"  # after a no-claim, rescaled or savepoint restore
    CONSECUTIVE_REGIONAL = "max-consecutive-regional"  # the job-level limit (tier 1)
    NO_UNIT_FALLBACKS = "max-unit-fallbacks-0"  # units may never fall back
    REGIONAL_DISABLED = "regional-disabled"  # configuration: not a staleness limit
    SINGLE_UNIT = "single-unit"  # one fallback unit: nothing can fall back on its own


class SinkRetention(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True):
    """How long a sink's table keeps what the sink's deduplication relies on (its commit marker:
    Delta's `txn`, Iceberg's and Paimon's snapshots), as the driver saw it when the checkpoint was
    taken (format 1.4): the sink's vertex, kind and location, the table setting that bounds it
    and that bound in milliseconds (None: kept until someone deletes it).

    >>> SinkRetention("out", "delta", "/t", "delta.setTransactionRetentionDuration", 86_400_000)
    SinkRetention(vertex_id='out', kind='delta', location='/t', \
setting='delta.setTransactionRetentionDuration', retention_ms=86400000)
    """

    vertex_id: str
    kind: str
    location: str
    setting: str = ""
    retention_ms: Count | None = None


class StateHandle(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """One segment of a state file.

    `path` is relative to the job root. Several handles may name the same physical file at
    different offsets (one file per unit attempt, one segment per subtask); `size` is the size of
    the whole physical file, `length` the size of this segment. `checksum` is the BLAKE2b-128
    digest of the segment's bytes. `shared` marks files under `shared/` that several checkpoints
    may reference (incremental state).
    """

    path: str
    offset: Count
    length: Count
    size: Count
    checksum: bytes
    shared: bool = False


class SplitState(msgspec.Struct, frozen=True, array_like=True, gc=False):
    """A source split owned by a subtask and its position (opaque to the metadata layer)."""

    split_id: str
    position: bytes


class SubtaskState(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """The state of one subtask `(vertex_id, index)` in a checkpoint.

    `ref_checkpoint_id` is `None` when the state is fresh, else the owner checkpoint's id.
    `attempt` is the attempt number of the region task that wrote the state (DESIGN §4 rule 9).
    `committables` are sink committables kept in writer state (PIP-30), opaque bytes.
    """

    vertex_id: str
    index: Count
    unit_id: Count
    ref_checkpoint_id: Int64 | None = None
    handles: tuple[StateHandle, ...] = ()
    split_states: tuple[SplitState, ...] = ()
    committables: tuple[bytes, ...] = ()
    attempt: Count = 0

    @property
    def is_fallback(self) -> bool:
        """True when this state was re-used from an earlier (owner) checkpoint."""
        return self.ref_checkpoint_id is not None

    @property
    def state_bytes(self) -> int:
        """Bytes of state this subtask holds (sum of its segment lengths)."""
        return sum(h.length for h in self.handles)


class UnitState(msgspec.Struct, frozen=True, array_like=True, omit_defaults=True, gc=False):
    """Per fallback unit: fresh (`ref_checkpoint_id` None) or fallback to its owner checkpoint,
    and why it fell back (`reason`, e.g. ``"declined: ValueError: bad record"``, ``"timeout"``)."""

    unit_id: Count
    ref_checkpoint_id: Int64 | None = None
    reason: str | None = None


class VertexInfo(msgspec.Struct, frozen=True, array_like=True):
    """Parallelism and max parallelism of a vertex when the checkpoint was taken."""

    vertex_id: str
    parallelism: Count
    max_parallelism: Count


class CheckpointMetadata(msgspec.Struct, frozen=True, omit_defaults=True):
    """Everything one completed checkpoint records; written last, as `chk-<id>/_metadata`.

    Times are Unix epoch milliseconds (wall clock of the driver). `reasons` explain the kind
    (why regional, why forced global). `coordinators` maps an operator (vertex) id to its
    operator-coordinator snapshot. `num_retained` is the job's `num-retained` when the
    checkpoint was taken, so that `regional clean` and `regional inspect` keep what the job
    kept (None in metadata written before it was recorded, format 1.0). `forced_global` says
    why every unit had to be fresh (format 1.2; empty before, and when nothing forced it).
    `consecutive_regional` counts the regional checkpoints in a row ending with this one (0 for a
    global one), so a restore keeps the job-level limit's count (format 1.3; None before).
    `sinks` records each sink's table retention (format 1.4; empty before, and for sinks that
    report none), so `validate` can warn without the pipeline.
    """

    checkpoint_id: Int64
    job_id: str
    kind: CheckpointKind
    trigger_time_ms: EpochMs
    completion_time_ms: EpochMs
    policy_fingerprint: str = ""
    graph_fingerprint: str = ""
    reasons: tuple[str, ...] = ()
    vertices: tuple[VertexInfo, ...] = ()
    units: tuple[UnitState, ...] = ()
    coordinators: dict[str, bytes] = {}
    subtasks: tuple[SubtaskState, ...] = ()
    num_retained: Int64 | None = None
    forced_global: tuple[ForcedGlobal, ...] = ()
    consecutive_regional: Count | None = None
    sinks: tuple[SinkRetention, ...] = ()

    @property
    def fallback_units(self) -> tuple[UnitState, ...]:
        """The units whose state was re-used from an earlier checkpoint."""
        return tuple(u for u in self.units if u.ref_checkpoint_id is not None)

    @property
    def referenced_checkpoint_ids(self) -> frozenset[int]:
        """Ids of the owner checkpoints this checkpoint's fallback state points at."""
        return frozenset(
            s.ref_checkpoint_id for s in self.subtasks if s.ref_checkpoint_id is not None
        )

    @property
    def oldest_ref_checkpoint_id(self) -> int | None:
        """The smallest owner id referenced (Flink's `oldest_ref_checkpoint_id`), or None."""
        refs = self.referenced_checkpoint_ids
        return min(refs) if refs else None

    @property
    def state_bytes(self) -> int:
        """Bytes of state referenced by this checkpoint (fresh and fallback)."""
        return sum(s.state_bytes for s in self.subtasks)
