"""A pending checkpoint: who has answered, with what, and until when (DESIGN §4 rules 2 and 9).

Answers are per unit attempt. Every unit starts with attempt 1 at the trigger; `retry` starts a
new attempt (fencing the old one) with its own deadline. Acks and declines are O(1); finding the
units past their deadline is O(1) until the earliest deadline passes, then a scan in C
(`itertools`), not a Python loop over every unit.

>>> p = PendingCheckpoint(5, trigger_ms=0, num_units=3, deadline_ms=100)
>>> p.decline(1, "boom"); p.outstanding
2
>>> p.expired(99), p.expired(100)
([], [0, 2])
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import compress, filterfalse
from operator import not_

from metadata.model import CheckpointKind, ForcedGlobal, SubtaskState

__all__ = ["PendingCheckpoint"]


class PendingCheckpoint:
    """Checkpoint `checkpoint_id` while its units run. Plain attributes, mutated by the
    checkpoint coordinator only."""

    __slots__ = (
        "_deadline",
        "_earliest",
        "checkpoint_id",
        "declined",
        "files",
        "final",
        "forced",
        "kind",
        "must_be_fresh",
        "must_be_fresh_all",
        "outstanding",
        "reasons",
        "regional_allowed",
        "retries",
        "states",
        "tier1",
        "trigger_ms",
        "unit_ids",
    )

    def __init__(
        self,
        checkpoint_id: int,
        *,
        trigger_ms: int,
        num_units: int,
        deadline_ms: int,
        kind: CheckpointKind = CheckpointKind.REGIONAL,
        must_be_fresh_all: bool = False,
        must_be_fresh: frozenset[int] = frozenset(),
        regional_allowed: bool = True,
        tier1: bool = False,
        final: bool = False,
        reasons: tuple[str, ...] = (),
        forced: tuple[ForcedGlobal, ...] = (),
        unit_ids: Sequence[int] | None = None,
    ) -> None:
        self.checkpoint_id = checkpoint_id
        self.trigger_ms = trigger_ms
        self.kind = kind
        self.must_be_fresh_all = must_be_fresh_all
        self.must_be_fresh = must_be_fresh
        self.regional_allowed = regional_allowed
        self.tier1 = tier1
        self.final = final
        self.reasons = reasons
        self.forced = forced
        #: per unit: the acked subtask states, or None (not answered or declined)
        self.states: list[tuple[SubtaskState, ...] | None] = [None] * num_units
        #: unit -> cause, for declined units
        self.declined: dict[int, str] = {}
        self.outstanding = num_units
        #: 0..num_units-1 (a caller's shared tuple: scans then allocate no int per unit)
        self.unit_ids: Sequence[int] = range(num_units) if unit_ids is None else unit_ids
        #: whether an acked state holds a state file or committables: False (none does), True,
        #: or None (not known: acks taken one by one are not looked at here)
        self.files: bool | None = False
        self._deadline = deadline_ms
        #: unit -> (attempt, deadline) for retried units; every other unit runs attempt 1
        self.retries: dict[int, tuple[int, int]] = {}
        self._earliest = deadline_ms

    @property
    def deadline_ms(self) -> int:
        """The checkpoint's own deadline; no retried attempt runs past it."""
        return self._deadline

    def attempt_of(self, unit_id: int) -> int:
        """The current (unfenced) attempt of `unit_id`."""
        retry = self.retries.get(unit_id)
        return 1 if retry is None else retry[0]

    def answered(self, unit_id: int) -> bool:
        return self.states[unit_id] is not None or unit_id in self.declined

    def ack(self, unit_id: int, states: tuple[SubtaskState, ...]) -> None:
        self.states[unit_id] = states
        self.outstanding -= 1
        if self.files is False:
            self.files = None

    def decline(self, unit_id: int, cause: str) -> None:
        self.declined[unit_id] = cause
        self.outstanding -= 1

    def retry(self, unit_id: int, deadline_ms: int) -> int:
        """Fence the unit's current attempt and start the next one; returns its number."""
        attempt = self.attempt_of(unit_id) + 1
        self.retries[unit_id] = (attempt, deadline_ms)
        self._earliest = min(self._deadline, *(d for _, d in self.retries.values()))
        return attempt

    def expired(self, now_ms: int) -> list[int]:
        """Units that have not answered and whose deadline is at or before `now_ms`."""
        if now_ms < self._earliest:
            return []
        if self._deadline <= now_ms and not self.retries:
            return self.unanswered()
        out = []
        for unit_id in self.unanswered():
            retry = self.retries.get(unit_id)
            if (self._deadline if retry is None else retry[1]) <= now_ms:
                out.append(unit_id)
        return out

    def unanswered(self) -> list[int]:
        """Units that neither acked nor declined, ascending (acked states are never empty)."""
        if self.outstanding == 0:
            return []
        silent = compress(self.unit_ids, map(not_, self.states))
        return list(filterfalse(self.declined.__contains__, silent))
