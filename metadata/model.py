"""The checkpoint metadata model: what one completed checkpoint records (DESIGN §5).

Every struct is a frozen `msgspec.Struct`, encoded as a msgpack array (`array_like`) to keep the
metadata small. The per-subtask and per-unit structs are `gc=False`: they hold only immutable
values, so they can never be part of a reference cycle, and a job of 100,000 units keeps
hundreds of thousands of them alive that the garbage collector then never walks.

The format is additive: new fields go at the **end** of a struct, with a default, so that files
written by an older version still decode (see `metadata.format`). The per-subtask structs and
the table of them (`SubtaskTable`, stored as columns since format 1.5) live in
`metadata.subtasks` and are re-exported here; the integer ranges in `metadata.ranges`.

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
from collections.abc import Sequence

import msgspec

from metadata.ranges import Count, EpochMs, Int64
from metadata.subtasks import SplitState, StateHandle, SubtaskState, SubtaskTable

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
    "SubtaskTable",
    "UnitState",
    "VertexInfo",
]


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

    `subtasks` is always a `SubtaskTable` (any sequence given is wrapped in one): a decoded
    table builds its `SubtaskState`s on first access, and the whole-table questions below
    (`handle_paths`, `referenced_checkpoint_ids`, `state_bytes`, `subtasks_of`) read its
    columns without building them.
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
    subtasks: Sequence[SubtaskState] = ()
    num_retained: Int64 | None = None
    forced_global: tuple[ForcedGlobal, ...] = ()
    consecutive_regional: Count | None = None
    sinks: tuple[SinkRetention, ...] = ()

    def __post_init__(self) -> None:
        if type(self.subtasks) is not SubtaskTable:
            msgspec.structs.force_setattr(self, "subtasks", SubtaskTable(self.subtasks))

    @property
    def subtask_table(self) -> SubtaskTable:
        """`subtasks`, typed as the `SubtaskTable` it always is."""
        table = self.subtasks
        assert isinstance(table, SubtaskTable)
        return table

    @property
    def handle_paths(self) -> frozenset[str]:
        """The state file paths this checkpoint's handles name (fresh and fallback)."""
        return self.subtask_table.handle_paths()

    def subtasks_of(self, vertex_id: str) -> tuple[SubtaskState, ...]:
        """The subtasks of vertex `vertex_id`, in table order."""
        return self.subtask_table.of_vertex(vertex_id)

    @property
    def fallback_units(self) -> tuple[UnitState, ...]:
        """The units whose state was re-used from an earlier checkpoint."""
        return tuple(u for u in self.units if u.ref_checkpoint_id is not None)

    @property
    def referenced_checkpoint_ids(self) -> frozenset[int]:
        """Ids of the owner checkpoints this checkpoint's fallback state points at."""
        return self.subtask_table.referenced_checkpoint_ids()

    @property
    def oldest_ref_checkpoint_id(self) -> int | None:
        """The smallest owner id referenced (Flink's `oldest_ref_checkpoint_id`), or None."""
        refs = self.referenced_checkpoint_ids
        return min(refs) if refs else None

    @property
    def state_bytes(self) -> int:
        """Bytes of state referenced by this checkpoint (fresh and fallback)."""
        return self.subtask_table.state_bytes()
