"""Incremental cleaning: the deletions the full retention plan would make, planned from what
the driver wrote and completed, without listing the job root or re-reading any `_metadata`.

The full plan (`cleaner.plan.plan_retention`) lists the whole job root and decodes every
checkpoint's metadata: fine for `regional clean` and once at start-up, too slow after every
checkpoint of a job with a thousand units. `IncrementalPlanner` starts from the state a full
plan left (`after_scan`) and is then told what the driver writes: each completed
checkpoint's metadata (`completed`) and each event file (`event_written`). It keeps the
retention window (`metadata.retention`'s rule), a reference count per state file over the
kept checkpoints, and the files it knows per checkpoint directory, so each step costs
O(the files that change), whatever the job's age.

A step deletes only what the full plan, run on the same storage, would delete, with the same
reason, detail and phase (`cleaner.plan.garbage_verdict` and `expired_event_verdict` are
shared), in the same order (`deletion_order`):

- the `_metadata` of a checkpoint that left the window (phase 0), then its files no kept
  checkpoint references (phase 1): `subsumed`. Because fallback state points at its owner,
  the owner's referenced files stay, and go (as `orphan`, the full plan's word for a file of a
  checkpoint whose metadata is gone) when the last kept checkpoint referencing them leaves;
- event files older than the newest `num_retained_events` (phase 2): `expired-event`;
- committed segments of a keyed exchange (`exchange/<reader>/n<N>/p<q>/...`) that the driver
  said it published (`segments_published`) or the full scan kept, once every kept checkpoint's
  reader has read them (phase 2): `consumed` (`cleaner.plan.exchange_verdict`). While some
  checkpoint's cursors cannot be read, every segment stays until the next full scan.

It never plans anything else: files it did not see written (stale attempts, leftovers of a
crash, staged files of failed attempts) wait for the next full scan; directories the full
plan kept whole (damaged, not owned under a `no-claim` restore base, holding a symbolic link,
pending, unknown `_metadata`) and every other path outside `chk-<id>/` and `events/`
(savepoints, shared files, the lease, an exchange's staged segments and commit records) are
never touched. A crash loses
only the planner's memory: what it would have deleted is garbage the next full scan finds.

>>> from metadata.model import CheckpointMetadata, StateHandle, SubtaskState
>>> def md(cid, ref=None):
...     owner = ref or cid
...     h = StateHandle(path=f"chk-{owner}/u0-a0.state", offset=0, length=4, size=4, checksum=b"")
...     return CheckpointMetadata(checkpoint_id=cid, job_id="j", kind="regional" if ref else
...         "global", trigger_time_ms=0, completion_time_ms=0,
...         subtasks=(SubtaskState("map", 0, 0, ref, handles=(h,)),))
>>> planner = IncrementalPlanner(num_retained=1)
>>> planner.completed(md(1)).deletions
()
>>> [(d.path, d.reason.value) for d in planner.completed(md(2, ref=1)).deletions]
[('chk-1/_metadata', 'subsumed')]
>>> [(d.path, d.reason.value, d.detail) for d in planner.completed(md(3)).deletions]
[('chk-2/_metadata', 'subsumed', 'metadata of dropped checkpoint 2'), ('chk-1/u0-a0.state', \
'orphan', 'checkpoint 1 has no _metadata: left by a crash')]
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence

import msgspec

from cleaner.model import (
    Action,
    FileDecision,
    Reason,
    RestoreBase,
    RetentionInputError,
    RetentionPlan,
    deletion_order,
)
from cleaner.plan import (
    BLIND_DETAIL,
    MARK_SUPERSEDED_DETAIL,
    exchange_verdict,
    expired_event_verdict,
    file_kind,
    garbage_verdict,
    reader_views,
)
from metadata.exchange import ExchangeFile, ReaderView, SegmentName, segment_of
from metadata.layout import (
    DEFAULT_RETAINED_EVENTS,
    EVENTS_DIR,
    checkpoint_id_of,
    event_checkpoint_id,
    metadata_path,
    path_problem,
)
from metadata.model import CheckpointKind, CheckpointMetadata
from metadata.watermarks import WatermarkMark, mark_kept_by, mark_path_of

__all__ = ["CleaningStep", "IncrementalPlanner", "merge_steps"]

#: Checkpoints a full plan keeps whole for a reason other than retention: never touched here.
_KEPT_WHOLE = frozenset(
    {
        Reason.PENDING,
        Reason.DAMAGED,
        Reason.NOT_OWNED,
        Reason.LINK,
        Reason.OUTSIDE_ROOT,
        Reason.UNKNOWN,
    }
)


class CleaningStep(msgspec.Struct, frozen=True):
    """The deletions one change made due, in deletion order (`cleaner.run.execute` carries
    them out like a full plan's), and the checkpoints whose `_metadata` they delete."""

    deletions: tuple[FileDecision, ...] = ()
    dropped_ids: tuple[int, ...] = ()


def _own_file(cid: int, path: str) -> bool:
    """`path` is a file directly under `chk-<cid>/` with a safe name (never anything else)."""
    head, sep, name = path.partition("/")
    return sep == "/" and head == f"chk-{cid}" and "/" not in name and path_problem(path) is None


class IncrementalPlanner:
    """What the driver wrote and what is still kept, updated one change at a time; plans the
    deletions each change makes due (see the module docstring). Pure: no I/O, no clock.

    `num_retained` as the policy's; `restore_base`: with a `no-claim` base `B`, nothing under
    `chk-<k>/` with `k <= B` is deleted; `num_retained_events` newest event files are kept.
    """

    def __init__(
        self,
        *,
        num_retained: int,
        restore_base: RestoreBase | None = None,
        num_retained_events: int = DEFAULT_RETAINED_EVENTS,
    ) -> None:
        if num_retained < 1:
            raise RetentionInputError(
                f"num-retained must be at least 1 (got {num_retained}): the latest completed "
                "checkpoint is always kept; fix [checkpointing] num-retained"
            )
        if num_retained_events < 0:
            raise RetentionInputError(
                f"the number of event files to keep cannot be negative (got {num_retained_events})"
            )
        self.num_retained = num_retained
        self.num_retained_events = num_retained_events
        self._no_claim_upto = (
            restore_base.checkpoint_id
            if restore_base is not None and restore_base.mode == "no-claim"
            else None
        )
        self._window: deque[int] = deque()  # newest num_retained completed (not savepoints)
        self._refs: dict[int, frozenset[str]] = {}  # kept checkpoint -> paths it references
        self._users: dict[str, int] = {}  # path -> how many kept checkpoints reference it
        self._metadata: dict[int, int] = {}  # checkpoint whose _metadata is there -> its size
        self._files: dict[int, dict[str, int]] = {}  # checkpoint -> its other files -> size
        self._whole: set[int] = set()  # checkpoints kept whole: never touched
        self._events: list[tuple[str, int]] = []  # event files, in name (checkpoint) order
        self._newest = -1
        self._kept_md: dict[int, CheckpointMetadata] = {}  # kept checkpoint -> its metadata
        self._segments: dict[str, ExchangeFile] = {}  # exchange segments not deleted yet
        self._marks: dict[str, tuple[str, WatermarkMark]] = {}  # watermark marks, by path
        self._exchange_blind = False  # some checkpoint's cursors unknown: keep every segment

    @classmethod
    def after_scan(
        cls,
        plan: RetentionPlan,
        completed: Iterable[CheckpointMetadata],
        *,
        restore_base: RestoreBase | None = None,
        num_retained_events: int = DEFAULT_RETAINED_EVENTS,
    ) -> IncrementalPlanner:
        """The planner for the job root as it is once the full `plan` is carried out:
        `completed` is the metadata that plan was given. Checkpoints the plan keeps whole for
        any reason but retention are never touched afterwards."""
        self = cls(
            num_retained=plan.num_retained,
            restore_base=restore_base,
            num_retained_events=num_retained_events,
        )
        dropped = set(plan.dropped_ids)
        self._whole = {c.checkpoint_id for c in plan.checkpoints if c.reason in _KEPT_WHOLE}
        present = sorted(
            (md for md in completed if md.checkpoint_id not in dropped),
            key=lambda md: md.checkpoint_id,
        )
        window: deque[int] = deque(maxlen=plan.num_retained)
        window.extend(md.checkpoint_id for md in present if md.kind != CheckpointKind.SAVEPOINT)
        for md in present:
            cid = md.checkpoint_id
            self._newest = max(self._newest, cid)
            self._keep(cid, md)
            if cid in window:
                self._window.append(cid)
            elif md.kind != CheckpointKind.SAVEPOINT:
                self._whole.add(cid)  # kept beyond the window (e.g. the restorable one)
        for f in plan.files:
            if f.action is Action.DELETE:
                continue
            owner = f.checkpoint_id
            if owner is not None and owner not in self._whole and _own_file(owner, f.path):
                if f.path == metadata_path(owner):
                    if owner in self._refs:
                        self._metadata[owner] = f.size
                else:
                    self._files.setdefault(owner, {})[f.path] = f.size
            elif f.reason is Reason.EVENT_LOG:
                self._events.append((f.path, f.size))
        self._events.sort()
        # exchange segments the full plan kept: known; all of them stay while some checkpoint's
        # cursors could not be read (until the next full scan)
        self._exchange_blind = any(
            f.reason is Reason.BACKLOG and f.detail == BLIND_DETAIL for f in plan.files
        ) or any(c.reason is Reason.DAMAGED for c in plan.checkpoints)
        self.segments_published(
            f.path for f in plan.files if f.action is Action.KEEP and f.reason is Reason.BACKLOG
        )
        return self

    # --- changes ----------------------------------------------------------------------------

    def completed(self, md: CheckpointMetadata, metadata_size: int = 0) -> CleaningStep:
        """Checkpoint `md` completed (its `_metadata` of `metadata_size` bytes is durable):
        the deletions that makes due. Ids must increase (`RetentionInputError` otherwise)."""
        cid = md.checkpoint_id
        if cid <= self._newest:
            raise RetentionInputError(
                f"checkpoint {cid} completed after checkpoint {self._newest}: the incremental "
                "plan takes completed checkpoints in increasing id order; re-plan with a full "
                "scan (`regional clean`)"
            )
        self._newest = cid
        self._metadata[cid] = metadata_size
        own = self._files.setdefault(cid, {})
        for s in md.subtasks:
            for h in s.handles:
                if _own_file(cid, h.path):
                    own[h.path] = h.size
        self._keep(cid, md)
        if md.kind == CheckpointKind.SAVEPOINT:
            return CleaningStep()
        self._window.append(cid)
        dropped: list[int] = []
        while len(self._window) > self.num_retained:
            old = self._window.popleft()
            if not self._not_owned(old) and old not in self._whole:
                dropped.append(old)  # else: kept anyway, with its references
        if not dropped:
            return CleaningStep()
        released: set[str] = set()
        for old in dropped:
            self._kept_md.pop(old, None)
            for path in self._refs.pop(old):
                left = self._users[path] - 1
                if left:
                    self._users[path] = left
                else:
                    del self._users[path]
                    released.add(path)
        deletions: list[FileDecision] = []
        for old in dropped:
            if old in self._metadata:
                deletions.append(self._delete(old, metadata_path(old), self._metadata[old]))
            released.update(p for p in self._files.get(old, {}) if p not in self._users)
        for path in released:
            owner = checkpoint_id_of(path)
            if owner is None or owner in self._refs or owner in self._whole:
                continue  # a file of a kept checkpoint, or of one never touched
            size = self._files.get(owner, {}).get(path)
            if size is not None and not self._not_owned(owner):
                deletions.append(self._delete(owner, path, size))
        # storage changes only now: the verdicts above saw it as the full plan would
        for d in deletions:
            assert d.checkpoint_id is not None
            if d.path == metadata_path(d.checkpoint_id):
                del self._metadata[d.checkpoint_id]
            else:
                files = self._files[d.checkpoint_id]
                del files[d.path]
                if not files:
                    del self._files[d.checkpoint_id]
        deletions += self._consumed()
        deletions.sort(key=deletion_order)
        return CleaningStep(tuple(deletions), tuple(dropped))

    def segments_published(self, paths: Iterable[str]) -> CleaningStep:
        """A commit published keyed-exchange segments (`metadata.exchange`, paths relative to
        the job root): they are deleted, as `consumed`, once every kept checkpoint's reader has
        read them. Nothing is due now (the checkpoint of the commit reads none of them)."""
        for path in paths:
            if (file := segment_of(path)) is not None:
                self._segments[path] = file
            elif (marked := mark_path_of(path)) is not None:
                self._marks[path] = marked
        return CleaningStep()

    def _consumed(self) -> list[FileDecision]:
        """The known exchange segments and watermark marks no kept checkpoint needs any more
        (rule 2a)."""
        if not (self._segments or self._marks) or self._exchange_blind:
            return []
        kept = [self._kept_md[c] for c in sorted(self._kept_md)]
        views: dict[str, list[ReaderView] | str] = {}
        out = []
        for path, file in list(self._segments.items()):
            if file.reader not in views:
                views[file.reader] = reader_views(kept, file.reader)
            reason, detail, phase, _ = exchange_verdict(file, views[file.reader])
            if phase is not None:
                out.append(FileDecision(path, 0, Action.DELETE, reason, detail, None, (), phase))
                del self._segments[path]
        if self._marks:
            out += self._superseded_marks(kept, views)
        return out

    def _superseded_marks(
        self, kept: list[CheckpointMetadata], views: dict[str, list[ReaderView] | str]
    ) -> list[FileDecision]:
        """The known watermark marks a later mark of their writer superseded for every kept
        checkpoint's reader (`metadata.watermarks.mark_kept_by`)."""
        segments: dict[tuple[str, int, int], list[SegmentName]] = {}
        for file in self._segments.values():
            segments.setdefault((file.reader, file.layout, file.partition), []).append(file.segment)
        marks: dict[str, list[WatermarkMark]] = {}
        for reader, mark in self._marks.values():
            marks.setdefault(reader, []).append(mark)
        out = []
        for path, (reader, mark) in list(self._marks.items()):
            if reader not in views:
                views[reader] = reader_views(kept, reader)
            reader_view_list = views[reader]
            if isinstance(reader_view_list, str):
                continue

            def listed(n: int, q: int, r: str = reader) -> list[SegmentName]:
                return segments.get((r, n, q), [])

            if not mark_kept_by(mark, reader_view_list, listed, marks[reader]):
                out.append(
                    FileDecision(
                        path, 0, Action.DELETE, Reason.CONSUMED, MARK_SUPERSEDED_DETAIL, None, (), 2
                    )
                )
                del self._marks[path]
        return out

    def event_written(self, path: str, size: int = 0) -> CleaningStep:
        """The driver wrote event file `path` (`metadata.layout.event_path`): the events now
        older than the newest `num_retained_events` are due."""
        if not path.startswith(EVENTS_DIR + "/") or event_checkpoint_id(path) is None:
            return CleaningStep()  # not the event log's: never ours to delete
        bisect.insort(self._events, (path, size))
        over = len(self._events) - self.num_retained_events
        if over <= 0:
            return CleaningStep()
        expired, self._events = self._events[:over], self._events[over:]
        reason, detail, phase = expired_event_verdict(self.num_retained_events)
        return CleaningStep(
            tuple(
                FileDecision(p, n, Action.DELETE, reason, detail, None, (), phase)
                for p, n in expired
            )
        )

    # --- what it holds ----------------------------------------------------------------------

    @property
    def retained(self) -> tuple[int, ...]:
        """The newest `num_retained` completed checkpoints (savepoints not counted)."""
        return tuple(self._window)

    def known_files(self) -> dict[str, int]:
        """Every file the planner would still delete when its time comes, with its size (for
        tests and diagnostics)."""
        known = {metadata_path(c): n for c, n in self._metadata.items()}
        for files in self._files.values():
            known.update(files)
        known.update(self._events)
        return known

    # --- internals --------------------------------------------------------------------------

    def _keep(self, cid: int, md: CheckpointMetadata) -> None:
        paths = md.handle_paths  # from the columns: no subtask built
        self._refs[cid] = paths
        self._kept_md[cid] = md  # its exchange readers' cursors keep segments
        for path in paths:
            self._users[path] = self._users.get(path, 0) + 1

    def _not_owned(self, cid: int) -> bool:
        return self._no_claim_upto is not None and cid <= self._no_claim_upto

    def _delete(self, cid: int, path: str, size: int) -> FileDecision:
        kind = file_kind(path.rpartition("/")[2])
        reason, detail, phase = garbage_verdict(
            cid, kind, has_metadata=cid in self._metadata, newest_completed=self._newest
        )
        return FileDecision(path, size, Action.DELETE, reason, detail, cid, (), phase)


def merge_steps(steps: Sequence[CleaningStep]) -> CleaningStep:
    """Several steps as one, in deletion order (what the driver hands its worker per epoch)."""
    deletions = sorted((d for s in steps for d in s.deletions), key=deletion_order)
    return CleaningStep(tuple(deletions), tuple(c for s in steps for c in s.dropped_ids))
