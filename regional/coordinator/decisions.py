"""What goes into the checkpoint coordinator and what comes out (DESIGN §4 rules 2–9).

The coordinator is pure: the runtime calls its methods with the time and the event (an ack, a
decline, a tick, "metadata is durable", "commit done") and carries out the decisions returned,
in order. Every decision is a frozen msgspec Struct, so the runtime can log or ship it as is.

>>> d = AbortCheckpoint(7, Rule.FAILURE_RATIO, "4 of 10 units failed", (1, 2, 3, 4))
>>> d.rule.value
'3c-failure-ratio'
"""

from __future__ import annotations

import enum

import msgspec

from metadata.model import CheckpointKind, CheckpointMetadata, ForcedGlobal

__all__ = [
    "INITIAL_STATE_ID",
    "AbortCheckpoint",
    "Commit",
    "Decision",
    "DiscardAttempt",
    "FailJob",
    "FinishJob",
    "NotifyComplete",
    "NotifyFallback",
    "NotifySubsumed",
    "Rule",
    "TriggerCheckpoint",
    "WriteMetadata",
]

#: `ref_checkpoint_id` of a unit that falls back to its initial (empty) state because it never
#: checkpointed. Checkpoint ids start at 1, so 0 names no checkpoint and no file.
INITIAL_STATE_ID = 0


class Rule(enum.StrEnum):
    """Why a checkpoint was aborted: DESIGN §4 rule 3 (a)–(e), or outside rule 3."""

    REGIONAL_DISABLED = "regional-disabled"
    MUST_BE_FRESH = "3a-must-be-fresh"
    SINGLE_UNIT = "3b-single-unit"
    FAILURE_RATIO = "3c-failure-ratio"
    NO_USABLE_STATE = "3d-no-usable-state"
    COORDINATOR_FALLBACK = "3e-coordinator-fallback"
    METADATA_WRITE = "metadata-write-failed"


class TriggerCheckpoint(msgspec.Struct, frozen=True):
    """Start checkpoint `checkpoint_id`: run every unit with `attempt` and answer by `deadline_ms`.

    `kind` is SAVEPOINT for a savepoint, GLOBAL when every unit must be fresh (`reasons` say
    why), else REGIONAL (units may fall back; `must_be_fresh` lists those that may not).
    `final` marks a checkpoint taken after every bounded source finished (DESIGN rule 5);
    `forced` says, as fields, why every unit must be fresh.
    """

    checkpoint_id: int
    kind: CheckpointKind
    attempt: int
    deadline_ms: int
    must_be_fresh: frozenset[int] = frozenset()
    reasons: tuple[str, ...] = ()
    final: bool = False
    forced: tuple[ForcedGlobal, ...] = ()


class WriteMetadata(msgspec.Struct, frozen=True):
    """Write `metadata` as `chk-<id>/_metadata`, then call `on_metadata_durable` (or
    `on_metadata_failed`). The checkpoint is complete only once its metadata is durable.
    With `savepoint`, first write that (kind SAVEPOINT) as a self-contained copy under
    `savepoints/sp-<id>/`; `metadata` is then the job's own global checkpoint of it."""

    metadata: CheckpointMetadata
    savepoint: CheckpointMetadata | None = None


class AbortCheckpoint(msgspec.Struct, frozen=True):
    """Checkpoint `checkpoint_id` is aborted by `rule`; `failed_units` declined or timed out,
    `causes` says why, per failed unit that answered or timed out (one line each).
    Tell every unit aborted(Y): every unit (cancel those still running) restarts from its
    state in the latest completed checkpoint (`unit_states`); nothing of Y is kept."""

    checkpoint_id: int
    rule: Rule
    message: str
    failed_units: tuple[int, ...] = ()
    causes: dict[int, str] = {}


class DiscardAttempt(msgspec.Struct, frozen=True, gc=False):
    """The state `files` (paths relative to the job root, never shared files) of a unit attempt
    are garbage (an aborted checkpoint, a fenced or late attempt, a malformed ack); so are the
    staged sink files behind `committables` (sink vertex id -> that sink's committables, so each
    sink only ever sees its own). DESIGN rules 8 and 9. An abort returns one per acked unit:
    `gc=False` (it holds only strings and bytes) keeps so many from waking the cyclic GC, and
    those without files may share one empty `committables` (read-only, as every field)."""

    checkpoint_id: int
    unit_id: int
    attempt: int
    files: tuple[str, ...] = ()
    committables: dict[str, tuple[bytes, ...]] = {}

    @property
    def all_committables(self) -> tuple[bytes, ...]:
        """Every sink's committables, in sink order (for single-sink callers and tests)."""
        return tuple(c for v in sorted(self.committables) for c in self.committables[v])


class NotifyComplete(msgspec.Struct, frozen=True):
    """complete(Y) for the units that were fresh in Y (rule 6)."""

    checkpoint_id: int
    units: tuple[int, ...]


class NotifyFallback(msgspec.Struct, frozen=True, gc=False):
    """fallback(Y, owner) for a unit that fell back in Y: drop local leftovers of the Y attempt
    and restart from the owner's state (`INITIAL_STATE_ID`: from no state). `gc=False`: ints
    only, one per fallback unit."""

    checkpoint_id: int
    unit_id: int
    owner_checkpoint_id: int


class NotifySubsumed(msgspec.Struct, frozen=True):
    """subsumed(id): no retained checkpoint holds or references checkpoint `checkpoint_id`."""

    checkpoint_id: int


class Commit(msgspec.Struct, frozen=True):
    """Commit `committables` of sink `vertex_id` to its table as `commit_user` with identifier
    `checkpoint_id` (see `regional.coordinator.commit.perform_commit`), then call `on_commit_done`
    or
    `on_commit_failed`. `recommit` marks a re-commit after restore (check data files exist).
    `fallback` maps each unit that fell back in the checkpoint to the checkpoint owning its state:
    those units' output since that checkpoint is not in this commit (tables may record it)."""

    checkpoint_id: int
    vertex_id: str
    commit_user: str
    committables: tuple[bytes, ...]
    recommit: bool = False
    fallback: dict[int, int] = {}


class FailJob(msgspec.Struct, frozen=True):
    """Give up: more consecutive aborted checkpoints than `tolerable-failed-checkpoints`, or a
    unit stuck longer than `max-stuck-time` (DESIGN §4 rule 5). `units`: the units at fault;
    `message` names them with what they read, the cause and the fix."""

    message: str
    units: tuple[int, ...]


class FinishJob(msgspec.Struct, frozen=True):
    """Every bounded source finished, final global checkpoint `checkpoint_id` completed and all
    output is committed: the job may end (FLIP-147)."""

    checkpoint_id: int


Decision = (
    WriteMetadata
    | AbortCheckpoint
    | DiscardAttempt
    | NotifyComplete
    | NotifyFallback
    | NotifySubsumed
    | Commit
    | FailJob
    | FinishJob
)
