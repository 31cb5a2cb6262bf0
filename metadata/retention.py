"""Retention: which completed checkpoints are kept and which become *subsumed*. One rule, used by
the checkpoint coordinator, the cleaner and the inspector (DESIGN §3; §4 rules 4, 6 and 11).

The rule, in the shape of Flink's `CheckpointSubsumeHelper`:

- The newest `num-retained` completed checkpoints are **retained**; adding one beyond the limit
  drops the oldest from this window.
- **Savepoints** are user-owned: never counted among the newest `num-retained`, never subsumed.
  (Flink counts savepoints in `num-retained` and drops them from its store without discarding
  their files; keeping them out of the window means a savepoint never pushes a checkpoint out.)
- A retained checkpoint keeps alive, **by reference**, the owner checkpoints its fallback state
  points at (`owner_refs`: its `ref_checkpoint_id`s without 0, the initial state, which has no
  files). A checkpoint is **subsumed** (its files may go, and it may be notified as subsumed)
  once it is out of the window and no retained checkpoint or savepoint references it.

Two forms of the same rule: `Retention` takes one completed checkpoint at a time and returns the
ids that became subsumed, in O(its references) with nothing rescanned (the coordinator's hot
path); `retain` feeds a whole history to a `Retention` and returns what is retained and who
references whom (the cleaner and the inspector). Pure: no I/O.

Each checkpoint also records the job's `num-retained` (`CheckpointMetadata.num_retained`), so
that tools reading the checkpoints later keep what the job kept: `recorded_num_retained`.

>>> r = Retention(2)
>>> r.add(1), r.add(2), r.add(3, refs={1})  # 3 re-uses unit state that 1 wrote
((), (), ())
>>> r.add(4)  # 2 leaves the window; 1 left it too, but 3 still references it
(2,)
>>> r.add(5)  # 3 leaves: nothing references 1 any more
(1, 3)
>>> r.retained, r.referenced_by(1)
((4, 5), ())
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from typing import Literal

import msgspec

from metadata.layout import checkpoint_id_of
from metadata.model import CheckpointKind, CheckpointMetadata

__all__ = [
    "DEFAULT_NUM_RETAINED",
    "NumRetained",
    "Retained",
    "Retention",
    "owner_refs",
    "recorded_num_retained",
    "retain",
]

#: The policy default of `checkpointing.num-retained` (Flink keeps 1; see the README's policy
#: keys), used when nothing says what a job kept.
DEFAULT_NUM_RETAINED = 3

#: `ref_checkpoint_id` of a unit that never checkpointed: its initial state, which has no files.
_INITIAL_STATE = 0


def owner_refs(md: CheckpointMetadata) -> frozenset[int]:
    """The checkpoints `md` keeps alive by reference: the owners of its fallback state, without
    0 (the initial state, which no checkpoint wrote), and the older checkpoints whose
    directories hold its state files (a fallback segment a compaction relocated into a newer
    checkpoint's directory than its owner's, `metadata.compaction`).

    >>> from metadata.model import SubtaskState
    >>> md = CheckpointMetadata(checkpoint_id=4, job_id="j", kind="regional",
    ...     trigger_time_ms=0, completion_time_ms=0, subtasks=(SubtaskState("map", 0, 0, 2),
    ...     SubtaskState("map", 1, 1, 0), SubtaskState("map", 2, 2)))
    >>> sorted(owner_refs(md))
    [2]
    """
    refs = md.referenced_checkpoint_ids - {_INITIAL_STATE}
    own = f"chk-{md.checkpoint_id}/"
    homes = {checkpoint_id_of(p) for p in md.handle_paths if not p.startswith(own)}
    return refs | frozenset(h for h in homes if h is not None and h < md.checkpoint_id)


def _check_num_retained(num_retained: int) -> None:
    if num_retained < 1:
        raise ValueError(
            f"num-retained must be at least 1 (got {num_retained}): the latest completed "
            "checkpoint is always retained"
        )


class Retention:
    """The retention rule, fed one completed checkpoint at a time, oldest first.

    `add` returns the ids that became subsumed, ascending. A subsumed id is reported once, when
    its last reason to stay goes (it leaves the window, or the last retained checkpoint that
    references it does); a checkpoint that references an id already subsumed would bring it
    back, which the coordinator never does (only the live latest state is ever re-used).
    Memory is O(retained checkpoints, savepoints and their references).
    """

    __slots__ = (
        "_in_window",
        "_newest",
        "_num_retained",
        "_referrers",
        "_refs_of",
        "_savepoints",
        "_window",
    )

    def __init__(self, num_retained: int) -> None:
        _check_num_retained(num_retained)
        self._num_retained = num_retained
        self._window: deque[int] = deque()  # the newest num_retained checkpoints, oldest first
        self._in_window: set[int] = set()
        self._savepoints: set[int] = set()
        self._refs_of: dict[int, frozenset[int]] = {}  # retained id or savepoint -> its owners
        self._referrers: dict[int, set[int]] = {}  # owner -> retained ids and savepoints using it
        self._newest = -1

    @property
    def num_retained(self) -> int:
        """How many of the newest checkpoints are retained."""
        return self._num_retained

    @property
    def retained(self) -> tuple[int, ...]:
        """The retained checkpoints (savepoints not included), ascending."""
        return tuple(self._window)

    @property
    def savepoints(self) -> tuple[int, ...]:
        """Every savepoint added (user-owned, never subsumed), ascending."""
        return tuple(sorted(self._savepoints))

    def referenced_by(self, checkpoint_id: int) -> tuple[int, ...]:
        """The retained checkpoints and savepoints whose state references `checkpoint_id`,
        ascending."""
        return tuple(sorted(self._referrers.get(checkpoint_id, ())))

    def references(self) -> dict[int, tuple[int, ...]]:
        """Every referenced owner id (ascending) -> `referenced_by(owner)`."""
        return {owner: tuple(sorted(self._referrers[owner])) for owner in sorted(self._referrers)}

    def add(
        self, checkpoint_id: int, refs: Iterable[int] = (), *, savepoint: bool = False
    ) -> tuple[int, ...]:
        """Checkpoint `checkpoint_id` completed, its fallback state written by the checkpoints
        `refs` (0, the initial state, is ignored). Returns the ids that became subsumed.

        Ids must increase (savepoints included); `ValueError` names the two ids otherwise.
        """
        if checkpoint_id <= self._newest:
            raise ValueError(
                f"checkpoint {checkpoint_id} added after checkpoint {self._newest}: retention "
                "takes completed checkpoints in increasing id order"
            )
        self._newest = checkpoint_id
        owners = frozenset(r for r in refs if r != _INITIAL_STATE)
        self._refs_of[checkpoint_id] = owners
        for owner in owners:
            self._referrers.setdefault(owner, set()).add(checkpoint_id)
        if savepoint:
            self._savepoints.add(checkpoint_id)
            return ()
        self._window.append(checkpoint_id)
        self._in_window.add(checkpoint_id)
        subsumed: list[int] = []
        while len(self._window) > self._num_retained:
            old = self._window.popleft()
            self._in_window.discard(old)
            candidates = [old]
            for owner in self._refs_of.pop(old):
                users = self._referrers[owner]
                users.discard(old)
                if not users:
                    del self._referrers[owner]
                    candidates.append(owner)
            subsumed += (c for c in candidates if self._releasable(c))
        return tuple(sorted(subsumed))

    def add_checkpoint(self, md: CheckpointMetadata) -> tuple[int, ...]:
        """`add` for a checkpoint's metadata: its `owner_refs`, a savepoint if its kind says so."""
        return self.add(
            md.checkpoint_id, owner_refs(md), savepoint=md.kind == CheckpointKind.SAVEPOINT
        )

    def _releasable(self, checkpoint_id: int) -> bool:
        return (
            checkpoint_id not in self._in_window
            and checkpoint_id not in self._savepoints
            and checkpoint_id not in self._referrers
        )


class Retained(msgspec.Struct, frozen=True):
    """What the retention rule keeps of a history of completed checkpoints (see `retain`).

    `retained`: the newest `num_retained` checkpoints, ascending (savepoints not included).
    `savepoints`: every savepoint, ascending. `referenced_by`: owner id -> the retained
    checkpoints and savepoints that reference it, ascending. `subsumed`: every id the rule
    released on the way, ascending (its files may go).
    """

    num_retained: int
    retained: tuple[int, ...]
    savepoints: tuple[int, ...]
    referenced_by: dict[int, tuple[int, ...]]
    subsumed: tuple[int, ...]

    @property
    def kept(self) -> frozenset[int]:
        """Retained checkpoints and savepoints: the checkpoints kept whole."""
        return frozenset(self.retained) | frozenset(self.savepoints)


def retain(checkpoints: Iterable[CheckpointMetadata], num_retained: int) -> Retained:
    """The retention rule over a history of completed checkpoints (any order; each id once).

    >>> from metadata.model import SubtaskState
    >>> def md(cid, kind="global", ref=None):
    ...     return CheckpointMetadata(checkpoint_id=cid, job_id="j", kind=kind,
    ...         trigger_time_ms=0, completion_time_ms=0, subtasks=(SubtaskState("m", 0, 0, ref),))
    >>> history = [md(1), md(2, "savepoint"), md(3, "regional", ref=1), md(4, "regional", ref=1)]
    >>> r = retain(history, 1)
    >>> r.retained, r.savepoints, r.referenced_by, r.subsumed
    ((4,), (2,), {1: (4,)}, (3,))
    """
    rule = Retention(num_retained)
    subsumed: set[int] = set()
    for md in sorted(checkpoints, key=lambda c: c.checkpoint_id):
        subsumed.update(rule.add_checkpoint(md))
    return Retained(
        num_retained=num_retained,
        retained=rule.retained,
        savepoints=rule.savepoints,
        referenced_by=rule.references(),
        subsumed=tuple(sorted(subsumed)),
    )


class NumRetained(msgspec.Struct, frozen=True):
    """A `num-retained` value and where it came from, as tools show it:
    ``num-retained 10 (recorded in checkpoint 42)``.

    `source`: ``recorded`` (in `checkpoint_id`'s metadata), ``default`` (nothing said
    otherwise), ``policy`` (a policy file) or ``option`` (given explicitly). `detail` says
    where in words.
    """

    value: int
    source: Literal["recorded", "default", "policy", "option"]
    detail: str
    checkpoint_id: int | None = None

    def __str__(self) -> str:
        return f"num-retained {self.value} ({self.detail})"


def recorded_num_retained(newest_first: Iterable[CheckpointMetadata]) -> NumRetained:
    """The `num-retained` recorded by the newest checkpoint that records one, else the default.

    `newest_first` is consumed only up to that checkpoint, so a lazy iterable reading metadata
    newest first reads just what it needs.

    >>> def md(cid, n=None):
    ...     return CheckpointMetadata(checkpoint_id=cid, job_id="j", kind="global",
    ...         trigger_time_ms=0, completion_time_ms=0, num_retained=n)
    >>> str(recorded_num_retained([md(42, 10), md(41, 5)]))
    'num-retained 10 (recorded in checkpoint 42)'
    >>> str(recorded_num_retained([md(7)]))
    'num-retained 3 (default: no checkpoint records one)'
    """
    for md in newest_first:
        if md.num_retained is not None:
            return NumRetained(
                md.num_retained,
                "recorded",
                f"recorded in checkpoint {md.checkpoint_id}",
                md.checkpoint_id,
            )
    return NumRetained(DEFAULT_NUM_RETAINED, "default", "default: no checkpoint records one")
