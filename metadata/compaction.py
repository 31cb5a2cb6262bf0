"""Which fallback segments a completing checkpoint copies out of mostly-dead state files
(DESIGN §4 rule 16; docs/file-merging.md, "Space amplification"). Pure: no I/O.

A unit that falls back re-uses its owner's segment, and with it keeps the owner's whole merged
task file alive: up to units-per-task times the bytes it needs, for as long as it stays on
fallback. With `checkpointing.file-merging.min-live-share` = `t` > 0, when checkpoint N is about
to complete and a physical file F of an *older* checkpoint holds segments of N's fallback
subtasks whose distinct bytes are below `t` × F's size (F's live share as N sees it), N copies
those segments into one new file of its own (`metadata.layout.compacted_file_path`) and its
metadata points the fallback handles there. `ref_checkpoint_id` stays the owner: the state is
the same, only relocated. F then goes as soon as no kept checkpoint references it (after
`num-retained` checkpoints), not when the units recover.

`plan_compaction` decides (a `FileCompaction` per file to copy out of); `relocate_states` and
`relocated` rewrite handles once the runtime copied the segments (`regional.runtime.compaction`
does the I/O); `relocated_units` tells the cleaner and the coordinator which checkpoint
directories hold a relocated unit's state (its owner's may hold none of it any more).

Fresh subtasks, `shared/` files and files of the checkpoint itself are never compacted; the
comparison is exact (`live_bytes < t × size` in rationals), so 0 never compacts and 1 compacts
any file with a dead byte.

>>> from metadata.model import CheckpointMetadata, StateHandle, SubtaskState
>>> big = StateHandle("chk-9/u0-a1-r.state", 20, 10, 100, b"c" * 16)
>>> md = CheckpointMetadata(checkpoint_id=12, job_id="j", kind="regional", trigger_time_ms=0,
...     completion_time_ms=0, subtasks=(SubtaskState("map", 7, 7, ref_checkpoint_id=9,
...     handles=(big,)),))
>>> [plan] = plan_compaction(md, 0.5)
>>> plan.path, plan.live_bytes, plan.size, plan.units
('chk-9/u0-a1-r.state', 10, 100, (7,))
>>> plan_compaction(md, 0.05), plan_compaction(md, 0.0)
((), ())
>>> copy = StateHandle("chk-12/compacted-r.state", 0, 10, 10, b"c" * 16)
>>> [s.handles[0].path for s in relocated(md, {big: copy}).subtasks]
['chk-12/compacted-r.state']
>>> [s.ref_checkpoint_id for s in relocated(md, {big: copy}).subtasks]
[9]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from fractions import Fraction

import msgspec

from metadata.layout import checkpoint_id_of
from metadata.model import CheckpointMetadata, StateHandle, SubtaskState

__all__ = [
    "FileCompaction",
    "plan_compaction",
    "relocate_states",
    "relocated",
    "relocated_units",
    "state_dirs",
]


class FileCompaction(msgspec.Struct, frozen=True):
    """One physical state file a completing checkpoint copies live segments out of: its
    `path` and `size`, the `live_bytes` the checkpoint references in it, those distinct
    segments (`handles`, by offset) and the fallback units re-using them."""

    path: str
    size: int
    live_bytes: int
    handles: tuple[StateHandle, ...]
    units: tuple[int, ...]

    @property
    def live_share(self) -> float:
        """Live bytes over physical bytes."""
        return self.live_bytes / self.size if self.size else 1.0


def plan_compaction(md: CheckpointMetadata, min_live_share: float) -> tuple[FileCompaction, ...]:
    """The files of older checkpoints whose fallback segments checkpoint `md` (its metadata as
    it is about to be written) should copy into a file of its own: every state file outside
    `chk-<md.checkpoint_id>/` and `shared/` that `md`'s fallback subtasks reference, whose
    distinct referenced bytes are below `min_live_share` × its size. Sorted by path; empty
    when `min_live_share` is 0 or nothing fell back. A pass over the fallback subtasks only."""
    threshold = Fraction(min_live_share)
    if threshold <= 0:
        return ()
    cid = md.checkpoint_id
    segments: dict[str, dict[tuple[int, int], StateHandle]] = {}
    units: dict[str, set[int]] = {}
    for s in md.subtask_table.fallback_subtasks():
        for h in s.handles:
            if h.shared:
                continue
            home = checkpoint_id_of(h.path)
            if home is None or home >= cid:
                continue  # not a checkpoint's file, or the checkpoint's own
            segments.setdefault(h.path, {}).setdefault((h.offset, h.length), h)
            units.setdefault(h.path, set()).add(s.unit_id)
    out = []
    for path in sorted(segments):
        live = segments[path]
        size = next(iter(live.values())).size
        live_bytes = sum(length for _, length in live)
        if live_bytes < threshold * size:
            handles = tuple(live[k] for k in sorted(live))
            out.append(FileCompaction(path, size, live_bytes, handles, tuple(sorted(units[path]))))
    return tuple(out)


def relocate_states(
    states: Iterable[SubtaskState], moved: Mapping[StateHandle, StateHandle]
) -> tuple[SubtaskState, ...]:
    """`states` with every handle in `moved` replaced by its copy (owners unchanged)."""
    out = []
    for s in states:
        if any(h in moved for h in s.handles):
            s = msgspec.structs.replace(s, handles=tuple(moved.get(h, h) for h in s.handles))
        out.append(s)
    return tuple(out)


def relocated(
    md: CheckpointMetadata, moved: Mapping[StateHandle, StateHandle]
) -> CheckpointMetadata:
    """`md` with its handles in `moved` replaced by their copies (`relocate_states`)."""
    if not moved:
        return md
    return msgspec.structs.replace(md, subtasks=relocate_states(md.subtasks, moved))


def state_dirs(states: Iterable[SubtaskState]) -> frozenset[int]:
    """The checkpoints whose directories (`chk-<id>/`) hold the segments of `states`."""
    dirs = {checkpoint_id_of(h.path) for s in states for h in s.handles if not h.shared}
    dirs.discard(None)
    return frozenset(dirs)  # type: ignore[arg-type]  # None removed


def relocated_units(md: CheckpointMetadata) -> dict[int, tuple[int, frozenset[int]]]:
    """Fallback unit -> (its owner, the checkpoints whose directories hold its segments), for
    the units of `md` with a segment outside their owner's directory (relocated by an earlier
    checkpoint's compaction). A pass over the fallback subtasks only.

    >>> from metadata.model import StateHandle, SubtaskState
    >>> def sub(unit, path):
    ...     h = StateHandle(path, 0, 1, 1, b"")
    ...     return SubtaskState("map", unit, unit, ref_checkpoint_id=3, handles=(h,))
    >>> md = CheckpointMetadata(checkpoint_id=9, job_id="j", kind="regional", trigger_time_ms=0,
    ...     completion_time_ms=0, subtasks=(sub(0, "chk-3/u0-a1.state"),
    ...     sub(1, "chk-5/compacted-r.state")))
    >>> relocated_units(md)
    {1: (3, frozenset({5}))}
    """
    by_unit: dict[int, tuple[int, set[int]]] = {}
    for s in md.subtask_table.fallback_subtasks():
        owner = s.ref_checkpoint_id
        assert owner is not None
        dirs = by_unit.setdefault(s.unit_id, (owner, set()))[1]
        dirs.update(state_dirs((s,)))
    return {
        unit: (owner, frozenset(dirs)) for unit, (owner, dirs) in by_unit.items() if dirs - {owner}
    }
