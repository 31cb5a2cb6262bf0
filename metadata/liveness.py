"""Segment-level liveness of physical state files (DESIGN §4 rule 16, FLIP-306).

A task writes one physical state file per checkpoint holding a segment per stateful subtask of
every unit it ran. The file is **live while any kept (retained or pending) checkpoint references
any of its segments**: a unit that falls back keeps its owner's segment, and with it the whole
file, until the checkpoints referencing it are subsumed. Only the referenced segments are *live
bytes*; the rest of a kept file is space amplification, which `live / physical bytes` shows
(`regional inspect ROOT retention`, the report). `checkpointing.file-merging.min-live-share`
bounds it: a completing checkpoint copies its fallback segments out of a file it references
less than that share of (`metadata.compaction`), so a fallback unit's segment may live in a
newer checkpoint's directory than its owner's (docs: File merging).

`file_liveness(kept)` answers, for the kept checkpoints, every referenced file's physical size,
its live bytes (distinct referenced segments) and the fallback references that keep segments of
it (checkpoint, unit, owner): the cleaner explains a kept file with them.

>>> from metadata.model import CheckpointMetadata, StateHandle, SubtaskState
>>> def seg(offset, unit, ref=None):
...     h = StateHandle("chk-9/u0-a1.state", offset, 10, 40, b"")
...     return SubtaskState("map", unit, unit, ref_checkpoint_id=ref, handles=(h,))
>>> chk12 = CheckpointMetadata(checkpoint_id=12, job_id="j", kind="regional", trigger_time_ms=0,
...     completion_time_ms=0, subtasks=(seg(20, 7, ref=9),))
>>> f = file_liveness([chk12])["chk-9/u0-a1.state"]
>>> (f.size, f.live_bytes, f.live_share), f.fallback_uses
((40, 10, 0.25), (SegmentUse(checkpoint_id=12, unit_id=7, owner=9),))
>>> f.explain()
'segment of unit 7 referenced by chk-12 (fallback owner 9); live 10 of 40 bytes'
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

import msgspec

from metadata.model import CheckpointMetadata

__all__ = ["FileLiveness", "SegmentUse", "file_liveness", "live_totals"]


class SegmentUse(msgspec.Struct, frozen=True, order=True):
    """Kept checkpoint `checkpoint_id` re-uses unit `unit_id`'s segment written by `owner`."""

    checkpoint_id: int
    unit_id: int
    owner: int


class FileLiveness(msgspec.Struct, frozen=True):
    """One referenced physical state file: its size, the bytes of its segments some kept
    checkpoint references, and the fallback references among them (sorted)."""

    path: str
    size: int
    live_bytes: int
    fallback_uses: tuple[SegmentUse, ...] = ()

    @property
    def live_share(self) -> float:
        """Live bytes over physical bytes (1.0 for an empty file)."""
        return self.live_bytes / self.size if self.size else 1.0

    @property
    def merged(self) -> bool:
        """Whether the file holds more than the referencing units' segments: partly live, or
        live for several fallback units (a task's merged file)."""
        return self.live_bytes < self.size or len({u.unit_id for u in self.fallback_uses}) > 1

    def explain(self, limit: int = 3) -> str:
        """Why the file is kept, per fallback unit: ``segment of unit 7 referenced by chk-12
        (fallback owner 9)``, at most `limit` units named, then its live bytes."""
        by_unit: dict[tuple[int, int], list[int]] = defaultdict(list)
        for use in self.fallback_uses:
            by_unit[use.unit_id, use.owner].append(use.checkpoint_id)
        parts = [
            f"segment of unit {unit} referenced by "
            f"{', '.join(f'chk-{c}' for c in sorted(set(ids)))} (fallback owner {owner})"
            for (unit, owner), ids in sorted(by_unit.items())
        ]
        more = len(parts) - limit
        shown = "; ".join(parts[:limit]) + (f"; and {more} more units" if more > 0 else "")
        live = f"live {self.live_bytes} of {self.size} bytes"
        return f"{shown}; {live}" if shown else live


def file_liveness(
    kept: Iterable[CheckpointMetadata], *, fresh_files: bool = True
) -> dict[str, FileLiveness]:
    """Every state file the `kept` checkpoints reference, with its live bytes (see the module
    docstring). A fallback segment of a file whose writer is kept is that writer's own fresh
    segment (fallback state is re-used, never rewritten), so it is counted once.

    Without `fresh_files`, only the files fallback subtasks reference are answered, and only
    those whose writer is not among `kept` are answered right (the cheap question the cleaner
    asks for every plan: a pass over the fallback subtasks only)."""
    fresh: dict[str, int] = {}
    sizes: dict[str, int] = {}
    segments: dict[str, set[tuple[int, int]]] = defaultdict(set)
    uses: dict[str, set[SegmentUse]] = defaultdict(set)
    for md in kept:
        if fresh_files:
            lengths, own_sizes = md.subtask_table.fresh_segment_bytes()
            fresh.update(lengths)
            sizes.update(own_sizes)
        for s in md.subtask_table.fallback_subtasks():
            owner = s.ref_checkpoint_id
            assert owner is not None
            for h in s.handles:
                segments[h.path].add((h.offset, h.length))
                sizes.setdefault(h.path, h.size)
                uses[h.path].add(SegmentUse(md.checkpoint_id, s.unit_id, owner))
    out: dict[str, FileLiveness] = {}
    for path, size in sizes.items():
        live = fresh[path] if path in fresh else sum(n for _, n in segments[path])
        out[path] = FileLiveness(path, size, live, tuple(sorted(uses.get(path, ()))))
    return out


def live_totals(files: Iterable[FileLiveness]) -> tuple[int, int]:
    """(live bytes, physical bytes) over `files`."""
    live = physical = 0
    for f in files:
        live += f.live_bytes
        physical += f.size
    return live, physical
