"""The retention planner: which checkpoints and files to keep, which to delete, and why.

Pure (no I/O, no clock): it takes what storage holds and returns a `RetentionPlan` that an
executor (`cleaner.run`) carries out and an inspector view (`cleaner.views`) renders. About 650
lines, on purpose: the rules below, their explanations and the one pass that applies them to
every listed file read best together; the decisions themselves are `cleaner.model`. DESIGN §4
rule 11, `flink_regional.md` §2.6, §4 and §10 items 22–25.

Rules, in the order they apply to a file (the first that matches decides):

1. A file referenced by a state handle of a *kept* checkpoint (the newest `num_retained`
   completed ones and savepoints, as `metadata.retention` decides for the coordinator and the
   inspector too, and a restore base the job does not own) is kept, naming every
   kept checkpoint that references it. Because fallback state points at its **owner** (rule 4),
   this keeps the few referenced *files* of an intermediate checkpoint, not the whole checkpoint.
   A physical file holding several segments (a task's merged file, DESIGN §4 rule 16) stays
   while any kept segment remains, and a merged file kept only for fallback units says which:
   ``segment of unit 7 referenced by chk-12 (fallback owner 9); live 10 of 40 bytes``
   (`metadata.liveness`); `shared/` files are reference-counted the same way.
2. A file named by a pending checkpoint, or under its directory, is kept.
2a. A committed segment of a keyed exchange (`exchange/<reader>/n<N>/p<q>/...`,
   `metadata.exchange`) is kept while some kept checkpoint's reader has not read it
   (`exchange-backlog`, naming those checkpoints) and deleted once every one has (`consumed`);
   all of them are kept while a checkpoint's metadata is damaged or none is kept. Its staged
   segments and commit records are the exchange writer's (`exchange`, kept). A watermark mark
   (`exchange/<reader>/_watermarks/...`, `metadata.watermarks`) is kept while a kept
   checkpoint's reader may still compute its watermark from it, and deleted (`consumed`) once
   a later mark of the same writer superseded it for every one.
3. `savepoints/...` is user-owned: always kept. Unreferenced `shared/` files are orphans. The
   event log (`events/<id>-<ms>.json`, `metadata.events`) keeps its newest
   `num_retained_events` files; older ones are deleted as `expired-event`. `_lease/` records
   are the driver's (`lease`, kept; a driver replaces a stale one). Any other path
   outside `chk-<id>/` is kept and reported as `unknown` (delete it by hand).
4. Everything under a checkpoint with damaged metadata is kept for inspection (never deleted
   automatically, DESIGN §8). A symbolic link the listing did not follow (local disks: a link
   out of the job root, `outside-root`, or to a directory inside it, `symlink`) is never deleted
   and nothing under it is listed; a checkpoint directory holding one is kept whole, with the
   same reason (it was tampered with: inspect it, remove the link by hand).
5. With a `no-claim` restore base `B`, everything under `chk-<k>/` with `k <= B` is kept: the
   job does not own it (Flink's `highestNotClaimedCheckpointID`).
6. A directory without `_metadata` newer than every completed checkpoint is kept when the
   caller cannot see the live set (`live_unknown`, the CLI); a `_metadata` the caller did not
   read (a checkpoint that completed after the scan) keeps its directory.
7. In a kept checkpoint's own directory, an unreferenced unit-attempt state file
   (`u<unit>-a<attempt>[-<run>].state`, or a `compacted-<run>.state` copy) is a
   `stale-attempt` and deleted; other files are kept (they
   may be named by sink committables, which are opaque to the cleaner).
8. Files of a dropped completed checkpoint are deleted (`subsumed`); state files of a
   directory without `_metadata` are deleted as `aborted` (its id is newer than every
   completed checkpoint) or `orphan` (left by a crash or an interrupted clean); other files
   there are `staged` files of a failed attempt.

Deletion order (crash safety): first the `_metadata` of every dropped checkpoint, oldest first,
so that no reader ever sees a "completed" checkpoint with missing files; then the remaining
files of checkpoint directories, oldest first; then orphaned `shared/` files and expired
events. A crash at any point leaves only unreferenced files behind, which the next plan deletes
as orphans.

`subsumed_ids` holds only checkpoints that no kept checkpoint references and whose last files
this plan deletes: dropped completed checkpoints, and orphaned directories (e.g. an owner whose
metadata an earlier plan deleted while its files were still referenced, now released). They
are safe to notify as subsumed, one id at a time; never notify "everything up to the largest
id" (rule 6, §10 item 25). `referenced_ids` are checkpoints whose metadata goes while some of
their files stay for newer checkpoints: never notify them.

>>> from metadata.model import CheckpointMetadata, StateHandle, SubtaskState, UnitState
>>> def handle(path):
...     return (StateHandle(path=path, offset=0, length=10, size=10, checksum=b""),)
>>> c1 = CheckpointMetadata(checkpoint_id=1, job_id="j", kind="global", trigger_time_ms=0,
...     completion_time_ms=0, subtasks=(
...         SubtaskState("map", 0, 0, handles=handle("chk-1/u0-a0.state")),
...         SubtaskState("map", 1, 1, handles=handle("chk-1/u1-a0.state"))))
>>> c2 = CheckpointMetadata(checkpoint_id=2, job_id="j", kind="regional", trigger_time_ms=0,
...     completion_time_ms=0, units=(UnitState(1, ref_checkpoint_id=1),), subtasks=(
...         SubtaskState("map", 0, 0, handles=handle("chk-2/u0-a0.state")),
...         SubtaskState("map", 1, 1, ref_checkpoint_id=1, handles=handle("chk-1/u1-a0.state"))))
>>> files = [ListedFile(p, 10) for p in ("chk-1/_metadata", "chk-1/u0-a0.state",
...     "chk-1/u1-a0.state", "chk-2/_metadata", "chk-2/u0-a0.state")]
>>> plan = plan_retention([c1, c2], files, num_retained=1)
>>> [(d.path, d.reason.value) for d in plan.deletions]
[('chk-1/_metadata', 'subsumed'), ('chk-1/u0-a0.state', 'subsumed')]
>>> plan.checkpoint(1).detail
'metadata deleted; 1 file (10 bytes) kept for checkpoint 2 (units 1)'
>>> plan.subsumed_ids, plan.saved_bytes
((), 20)
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from operator import attrgetter

from cleaner.model import (
    Action,
    CheckpointDecision,
    FileDecision,
    ListedFile,
    MissingFile,
    PendingFiles,
    Reason,
    RefusedPath,
    RestoreBase,
    RetentionInputError,
    RetentionPlan,
    StoredFile,
)
from metadata.compaction import relocated_units
from metadata.errors import MetadataError, StorageError
from metadata.exchange import (
    EXCHANGE_DIR,
    ExchangeFile,
    ReaderView,
    SegmentName,
    kept_by,
    reader_view,
    segment_of,
)
from metadata.layout import (
    DEFAULT_RETAINED_EVENTS,
    EVENTS_DIR,
    LEASE_DIR,
    METADATA_NAME,
    SAVEPOINTS_DIR,
    SHARED_DIR,
    check_relative,
    event_checkpoint_id,
)
from metadata.liveness import FileLiveness, file_liveness, live_totals
from metadata.model import CheckpointMetadata
from metadata.retention import retain
from metadata.watermarks import WatermarkMark, mark_kept_by, mark_path_of

__all__ = [
    "Action",
    "CheckpointDecision",
    "FileDecision",
    "ListedFile",
    "MissingFile",
    "PendingFiles",
    "Reason",
    "RefusedPath",
    "RestoreBase",
    "RetentionInputError",
    "RetentionPlan",
    "StoredFile",
    "exchange_verdict",
    "expired_event_verdict",
    "file_kind",
    "garbage_verdict",
    "plan_retention",
    "reader_views",
]

#: A unit attempt's state file, or a checkpoint's compacted copy of fallback segments
#: (`metadata.layout.compacted_file_path`).
_STATE_FILE = re.compile(r"^(?:u\d+-a\d+(?:-[A-Za-z0-9_.]+)?|compacted-[A-Za-z0-9_.]+)\.state$")
# A path that is certainly normal and inside the root (no segment starts with "."; no "/",
# "\\" or ":" anywhere else); anything else goes through `check_relative`.
_SAFE_PATH = re.compile(r"[A-Za-z0-9_][\w.=+-]*(?:/[A-Za-z0-9_][\w.=+-]*)*", re.ASCII)


_NOT_KEPT: tuple[int, ...] = (-1,)  # identity sentinel: never a value of `kept_by`
_MAYBE_LIVE = "no _metadata, newer than every completed checkpoint: may be in progress"


def _checkpoint_id_of(path: str) -> int | None:
    """`metadata.layout.checkpoint_id_of`, without a regex (it runs once per listed file)."""
    if not path.startswith("chk-"):
        return None
    slash = path.find("/")
    digits = path[4:slash] if slash > 0 else path[4:]
    return int(digits) if digits.isascii() and digits.isdigit() else None


def _link_text(f: StoredFile) -> str:
    """`chk-2 -> /outside (outside the job root)`: a link entry of the listing, for details."""
    where = "outside the job root" if f.outside_root else "inside the job root, not followed"
    return f"a symbolic link {f.path} -> {f.link} ({where})"


def _ids(ids: Iterable[int]) -> str:
    return ", ".join(str(i) for i in sorted(ids))


def _referenced_detail(users: tuple[int, ...], own: int | None) -> str:
    """Why a referenced file is kept: its own kept checkpoint, and/or the ones re-using it."""
    others = [u for u in users if u != own]
    if own is None:
        return f"referenced by checkpoint {_ids(others)}"
    if not others:
        return f"file of kept checkpoint {own}"
    return f"file of kept checkpoint {own}, also referenced by {_ids(others)}"


def _relocated(live: FileLiveness, cid: int | None) -> bool:
    """Whether `live` is a compaction's copy: segments used under an owner other than the
    checkpoint whose directory holds the file (`metadata.compaction`)."""
    return any(use.owner != cid for use in live.fallback_uses)


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


class _References:
    """Which normalised paths each checkpoint references, and per checkpoint directory holding
    its fallback state (the owner's, or a newer one's after a compaction) the units using it."""

    def __init__(self, completed: Sequence[CheckpointMetadata], listed: set[str]) -> None:
        self.paths: dict[int, set[str]] = {}
        self.owner_units: dict[int, dict[int, set[int]]] = {}
        self.refused: list[RefusedPath] = []
        # Paths known to be normal and inside the root: the listing's own paths (they name real
        # files under it), and every path checked once already.
        safe = set(listed)  # a copy: it grows
        for md in completed:
            cid = md.checkpoint_id
            raw = set(md.handle_paths)  # from the columns: no subtask built
            odd = [p for p in raw - safe if _SAFE_PATH.fullmatch(p) is None]
            safe |= raw.difference(odd)
            if odd:
                raw.difference_update(odd)
                for path in odd:
                    try:
                        raw.add(check_relative(path))
                    except StorageError as exc:
                        self.refused.append(RefusedPath(cid, path, str(exc)))
            self.paths[cid] = raw
            units: dict[int, set[int]] = defaultdict(set)
            if md.units:  # per-unit owners, as the coordinator records them
                for u in md.units:
                    if u.ref_checkpoint_id is not None:
                        units[u.ref_checkpoint_id].add(u.unit_id)
            else:  # metadata without unit records: derive from the subtasks
                for ref, unit in {
                    (s.ref_checkpoint_id, s.unit_id)
                    for s in md.subtasks
                    if s.ref_checkpoint_id is not None
                }:
                    units[ref].add(unit)
            # a unit whose state a compaction relocated is kept by the directories holding it
            for unit, (owner, dirs) in relocated_units(md).items():
                units[owner].discard(unit)
                for home in dirs:
                    units[home].add(unit)
            self.owner_units[cid] = {ref: us for ref, us in units.items() if us}


def _flink_closure(start: Iterable[int], refs: _References) -> set[int]:
    """Retained ids plus every id reachable through references (FLINK's protected set)."""
    seen = set(start)
    todo = list(seen)
    while todo:
        cid = todo.pop()
        for ref in refs.owner_units.get(cid, {}):
            if ref not in seen:
                seen.add(ref)
                todo.append(ref)
    return seen


def file_kind(name: str) -> str:
    """The kind of a file in a checkpoint directory, by its name: `metadata`, `state` (a unit
    attempt's `u<unit>-a<attempt>[-<run>].state`, or the checkpoint's
    `compacted-<run>.state`) or `other` (e.g. a staged sink file)."""
    if name == METADATA_NAME:
        return "metadata"
    return "state" if _STATE_FILE.match(name) is not None else "other"


def garbage_verdict(
    cid: int, kind: str, *, has_metadata: bool, newest_completed: int
) -> tuple[Reason, str, int]:
    """(reason, detail, deletion phase) of a file of `kind` (`file_kind`) under `chk-<cid>/`
    that no kept checkpoint references and no other rule keeps. `has_metadata`: checkpoint
    `cid` completed and its metadata was given (a dropped checkpoint); `newest_completed`: the
    newest completed checkpoint id. Shared by the full and the incremental plan."""
    if has_metadata:
        if kind == "metadata":
            return Reason.SUBSUMED, f"metadata of dropped checkpoint {cid}", 0
        return Reason.SUBSUMED, f"file of dropped checkpoint {cid}", 1
    if kind == "other":
        return Reason.STAGED, f"staged file of a failed attempt of checkpoint {cid}", 1
    if cid > newest_completed:
        return Reason.ABORTED, f"checkpoint {cid} never completed", 1
    return Reason.ORPHAN, f"checkpoint {cid} has no _metadata: left by a crash", 1


def expired_event_verdict(num_retained_events: int) -> tuple[Reason, str, int]:
    """(reason, detail, deletion phase) of an event file older than the newest
    `num_retained_events`. Shared by the full and the incremental plan."""
    detail = f"event older than the newest {num_retained_events} events"
    return Reason.EXPIRED_EVENT, detail, 2


#: Why every exchange segment is kept when some checkpoint's cursors cannot be read.
BLIND_DETAIL = "no kept checkpoint with readable metadata says which segments were read"
#: Why an exchange segment is deleted.
CONSUMED_DETAIL = "exchange segment every kept checkpoint's reader has read"
#: Why an exchange's watermark mark is deleted.
MARK_SUPERSEDED_DETAIL = (
    "watermark mark superseded by a later one of its writer for every kept checkpoint's reader"
)


def reader_views(kept: Iterable[CheckpointMetadata], reader: str) -> list[ReaderView] | str:
    """The kept checkpoints' views of exchange `reader` (`metadata.exchange.reader_view`), or
    why they cannot be read (a position that is not a cursor: every segment is then kept)."""
    try:
        return [reader_view(md, reader) for md in kept]
    except MetadataError as exc:
        return f"kept: {exc}"


def exchange_verdict(
    file: ExchangeFile, views: list[ReaderView] | str
) -> tuple[Reason, str, int | None, tuple[int, ...]]:
    """(reason, detail, deletion phase or None to keep, kept_by) of committed exchange segment
    `file` given the kept checkpoints' `reader_views` (rule 2a; the full and the incremental
    plan share it)."""
    if isinstance(views, str):
        return Reason.BACKLOG, views, None, ()
    keepers = tuple(kept_by(file, views))
    if keepers:
        detail = f"exchange segment not yet read by kept checkpoint(s) {_ids(keepers)}"
        return Reason.BACKLOG, detail, None, keepers
    return Reason.CONSUMED, CONSUMED_DETAIL, 2, ()


def plan_retention(
    completed: Sequence[CheckpointMetadata],
    files: Iterable[StoredFile],
    *,
    num_retained: int,
    pending: Sequence[PendingFiles] = (),
    damaged: Iterable[int] = (),
    restore_base: RestoreBase | None = None,
    live_unknown: bool = False,
    num_retained_events: int = DEFAULT_RETAINED_EVENTS,
    liveness_totals: bool = False,
) -> RetentionPlan:
    """Decide, for every checkpoint and every listed file, keep or delete, with the reason.

    `completed` are the checkpoints whose metadata decoded; `damaged` the ids whose metadata
    did not (never deleted); `pending` the checkpoints in progress; `files` the listing of the
    job root (paths relative to it). With `live_unknown` (a caller that cannot see the
    coordinator, like the CLI), a directory without `_metadata` newer than every completed
    checkpoint is kept as possibly in progress instead of deleted as aborted. The newest
    `num_retained_events` event files are kept. With `liveness_totals` the plan also sums
    the kept state files' live and physical bytes (`RetentionPlan.live_bytes`: a pass over
    every kept checkpoint's handles, so only views ask for it). Raises `RetentionInputError`
    if `num_retained` < 1 or `num_retained_events` < 0.
    """
    if num_retained < 1:
        raise RetentionInputError(
            f"num-retained must be at least 1 (got {num_retained}): the latest completed "
            "checkpoint is always kept; fix [checkpointing] num-retained or --num-retained"
        )
    if num_retained_events < 0:
        raise RetentionInputError(
            f"the number of event files to keep cannot be negative (got {num_retained_events})"
        )
    by_id = {md.checkpoint_id: md for md in completed}
    damaged_ids = set(damaged) - by_id.keys()
    pending_ids = {p.checkpoint_id for p in pending}
    pending_files: set[str] = set()
    for p in pending:
        for path in p.files:
            try:
                pending_files.add(check_relative(path))
            except StorageError:
                continue  # a pending checkpoint cannot protect a file outside the root
    no_claim_upto = (
        restore_base.checkpoint_id
        if restore_base is not None and restore_base.mode == "no-claim"
        else None
    )

    def not_owned(cid: int | None) -> bool:
        return cid is not None and no_claim_upto is not None and cid <= no_claim_upto

    checkpoints = sorted(
        (md for md in completed if md.checkpoint_id not in pending_ids),
        key=lambda md: md.checkpoint_id,
    )
    rule = retain(checkpoints, num_retained)
    savepoint_ids = set(rule.savepoints)
    retained = set(rule.retained)
    listed = sorted(files, key=attrgetter("path"))
    linked: dict[int, tuple[Reason, str]] = {}  # checkpoint -> why it is kept whole
    for f in listed:
        if f.link is not None and (cid := _checkpoint_id_of(f.path)) is not None:
            reason = Reason.OUTSIDE_ROOT if f.outside_root else Reason.LINK
            if linked.get(cid, (Reason.LINK,))[0] is Reason.LINK:  # outside-root wins
                linked[cid] = (reason, _link_text(f))
    # a restore falls back to the newest checkpoint whose files are all there: never delete it
    # because newer ones are damaged (a missing or truncated state file)
    sizes = {f.path: f.size for f in listed}
    restorable = next(
        (
            md.checkpoint_id
            for md in reversed(checkpoints)
            if all(sizes.get(h.path) == h.size for st in md.subtasks for h in st.handles)
        ),
        None,
    )
    if restorable is not None:
        retained.add(restorable)
    kept_ids = (
        retained
        | savepoint_ids
        | {md.checkpoint_id for md in checkpoints if not_owned(md.checkpoint_id)}
    )
    newest_completed = max(by_id, default=-1)

    listed_paths = {f.path for f in listed}
    events = [
        f.path
        for f in listed
        if f.path.startswith(EVENTS_DIR + "/") and event_checkpoint_id(f.path) is not None
    ]  # in name order: checkpoint order
    expired_events = set(events[: max(0, len(events) - num_retained_events)])
    refs = _References(checkpoints, listed_paths)
    kept_by: dict[str, tuple[int, ...]] = {}  # path -> kept ids referencing it, ascending
    own_only: dict[int, tuple[int, ...]] = {}  # kept id -> the one tuple `(id,)` kept_by shares
    for cid in sorted(kept_ids):
        paths = refs.paths[cid]
        again = [p for p in paths if p in kept_by]  # referenced by an older kept one too
        one = own_only[cid] = (cid,)  # shared by every path only this checkpoint references
        kept_by.update(dict.fromkeys(paths.difference(again), one))
        for path in again:
            kept_by[path] += one

    kept_mds = [by_id[cid] for cid in sorted(kept_ids) if cid in by_id]
    if not liveness_totals:  # only files kept for fallback units of owners that are not kept
        kept_mds = [
            md
            for md in kept_mds
            if not kept_ids.issuperset(refs.owner_units.get(md.checkpoint_id, ()))
        ]
    liveness = file_liveness(kept_mds, fresh_files=liveness_totals)
    live_bytes = physical_bytes = 0
    if liveness_totals:
        live_bytes, physical_bytes = live_totals(
            f for f in liveness.values() if sizes.get(f.path) == f.size
        )
    rules = _Rules(
        liveness=liveness,
        own_only=own_only,
        listed_paths=listed_paths,
        kept_by=kept_by,
        kept_ids=kept_ids,
        by_id=by_id,
        pending_ids=pending_ids,
        pending_files=pending_files,
        damaged_ids=damaged_ids,
        not_owned=not_owned,
        newest_completed=newest_completed,
        live_unknown=live_unknown,
        retained=retained,
        savepoint_ids=savepoint_ids,
        num_retained=num_retained,
        no_claim_upto=no_claim_upto,
        expired_events=expired_events,
        num_retained_events=num_retained_events,
        linked=linked,
    )
    decisions = rules.decide_all(listed)
    referrers: dict[int, dict[int, set[int]]] = defaultdict(dict)  # owner -> referrer -> units
    for cid in kept_ids:
        for owner, units in refs.owner_units[cid].items():
            referrers[owner][cid] = units
    all_ids = sorted(rules.dir_ids | by_id.keys() | damaged_ids | pending_ids)
    cps: list[CheckpointDecision] = []
    for cid in all_ids:
        md = by_id.get(cid)
        users = referrers.get(cid, {})
        action, reason, detail = rules.checkpoint_verdict(cid, users)
        cps.append(
            CheckpointDecision(
                checkpoint_id=cid,
                kind=str(md.kind) if md is not None else None,
                action=action,
                reason=reason,
                detail=detail,
                referenced_by=tuple(sorted(users)),
                units=tuple(sorted(set().union(*users.values()))),
                kept_bytes=rules.kept_bytes.get(cid, 0),
                deleted_bytes=rules.deleted_bytes.get(cid, 0),
            )
        )

    subsumed = tuple(
        c.checkpoint_id
        for c in cps
        if c.action is Action.DELETE and (c.checkpoint_id in by_id or c.reason is Reason.ORPHAN)
    )
    referenced = tuple(c.checkpoint_id for c in cps if c.action is Action.KEEP_FILES)

    missing = tuple(
        MissingFile(path, kept_by[path]) for path in sorted(kept_by.keys() - listed_paths)
    )
    kept_total, deleted_total = rules.kept_total, rules.deleted_total
    flink = _flink_closure(retained, refs) | kept_ids
    extra = sum(rules.deleted_bytes.get(cid, 0) for cid in flink)
    return RetentionPlan(
        num_retained=num_retained,
        checkpoints=tuple(cps),
        files=tuple(decisions),
        retained_ids=tuple(sorted(retained)),
        subsumed_ids=subsumed,
        referenced_ids=referenced,
        refused=tuple(sorted(refs.refused, key=lambda r: (r.checkpoint_id, r.path))),
        missing=missing,
        kept_bytes=kept_total,
        deleted_bytes=deleted_total,
        whole_checkpoint_bytes=kept_total + extra,
        live_bytes=live_bytes,
        physical_bytes=physical_bytes,
    )


class _Rules:
    """The module's rules for files (applied in order; the first that matches decides) and
    for checkpoints.

    Decisions for unreferenced files depend only on (directory, kind of name), so they are
    computed once per pair; `decide_all` also sums bytes per checkpoint directory (this is the
    planner's hot loop: one pass, no per-file string formatting)."""

    def __init__(
        self,
        *,
        liveness: dict[str, FileLiveness],
        own_only: dict[int, tuple[int, ...]],
        listed_paths: set[str],
        kept_by: dict[str, tuple[int, ...]],
        kept_ids: set[int],
        by_id: dict[int, CheckpointMetadata],
        pending_ids: set[int],
        pending_files: set[str],
        damaged_ids: set[int],
        not_owned: Callable[[int | None], bool],
        newest_completed: int,
        live_unknown: bool,
        retained: set[int],
        savepoint_ids: set[int],
        num_retained: int,
        no_claim_upto: int | None,
        expired_events: set[str],
        num_retained_events: int,
        linked: dict[int, tuple[Reason, str]],
    ) -> None:
        self.liveness = liveness
        self.linked = linked
        self.kept_by = kept_by
        self.expired_events = expired_events
        self.num_retained_events = num_retained_events
        self.kept_ids = kept_ids
        self.by_id = by_id
        self.pending_ids = pending_ids
        self.pending_files = pending_files
        self.damaged_ids = damaged_ids
        self.not_owned = not_owned
        self.newest_completed = newest_completed
        self.live_unknown = live_unknown
        self.retained = retained
        self.savepoint_ids = savepoint_ids
        self.num_retained = num_retained
        self.no_claim_upto = no_claim_upto
        self.has_metadata: set[int] = set()
        self.listed_paths = listed_paths
        self.own_only = own_only
        self.dir_ids: set[int] = set()
        self.kept_bytes: dict[int, int] = defaultdict(int)
        self.deleted_bytes: dict[int, int] = defaultdict(int)
        self.kept_files: dict[int, int] = defaultdict(int)
        self.exchange_views: dict[str, list[ReaderView] | str] = {}  # reader -> `reader_views`
        self.exchange_listings: dict[
            str, tuple[dict[tuple[int, int], list[SegmentName]], list[WatermarkMark]]
        ] = {}
        self.kept_total = 0
        self.deleted_total = 0

    def decide_all(self, listed: Sequence[StoredFile]) -> list[FileDecision]:
        """Decide every listed file. `listed` must be sorted by path, so that the files of one
        top-level directory are contiguous (the per-directory sums rely on it)."""
        verdicts: dict[tuple[str, str], tuple[Reason, str, int | None, tuple[int, ...]]] = {}
        details: dict[tuple[tuple[int, ...], int | None], str] = {}
        out: list[FileDecision] = []
        append = out.append
        kept_by_get = self.kept_by.get
        pending_files = self.pending_files
        cur_top: str | None = None
        cid: int | None = None
        own_only = _NOT_KEPT
        own_detail = ""
        kept = deleted = n_kept = 0
        for f in listed:
            path, size = f.path, f.size
            top, _, name = path.partition("/")
            if top != cur_top:
                self._flush(cid, kept, deleted, n_kept)
                kept = deleted = n_kept = 0
                cur_top, cid = top, _checkpoint_id_of(top)
                # the (cid,) `kept_by` shares
                own_only = _NOT_KEPT if cid is None else self.own_only.get(cid, _NOT_KEPT)
                own_detail = f"file of kept checkpoint {cid}"
            if f.link is not None:  # a link the listing did not follow: never deleted
                why = f"{_link_text(f)}: never followed nor deleted; remove it by hand"
                link_reason = Reason.OUTSIDE_ROOT if f.outside_root else Reason.LINK
                append(FileDecision(path, size, Action.KEEP, link_reason, why, cid))
                kept += size
                n_kept += 1
                continue
            users = kept_by_get(path)
            if users is own_only:  # the common case: a file only its own checkpoint uses
                append(
                    FileDecision(path, size, Action.KEEP, Reason.RETAINED, own_detail, cid, users)
                )
                kept += size
                n_kept += 1
                continue
            if users:
                own = cid if cid in users else None
                live = self.liveness.get(path) if own is None else None
                if live is not None and (live.merged or _relocated(live, cid)):
                    # which segments keep a merged file (or a compaction's copy of them)
                    detail = live.explain()
                else:
                    known = details.get((users, own))
                    detail = known or details.setdefault(
                        (users, own), _referenced_detail(users, own)
                    )
                reason = Reason.REFERENCED if own is None else Reason.RETAINED
                append(FileDecision(path, size, Action.KEEP, reason, detail, cid, users))
                kept += size
                n_kept += 1
                continue
            if path in pending_files:
                detail = "named by a checkpoint in progress"
                append(FileDecision(path, size, Action.KEEP, Reason.PENDING, detail, cid))
                kept += size
                n_kept += 1
                continue
            if top == EXCHANGE_DIR:
                reason, detail, phase, keepers = self._exchange_rule(path)
                action = Action.KEEP if phase is None else Action.DELETE
                append(FileDecision(path, size, action, reason, detail, cid, keepers, phase))
                if phase is None:
                    kept += size
                    n_kept += 1
                else:
                    deleted += size
                continue
            if top == EVENTS_DIR and path in self.expired_events:
                kind = "expired-event"
            elif top == EVENTS_DIR and event_checkpoint_id(path) is not None:
                kind = "event"
            else:
                kind = file_kind(name)
            verdict = verdicts.get((top, kind))
            if verdict is None:
                verdict = verdicts[top, kind] = self._rule(top, cid, kind)
            reason, detail, phase, keepers = verdict
            if phase is None:
                append(FileDecision(path, size, Action.KEEP, reason, detail, cid, keepers))
                kept += size
                n_kept += 1
            else:
                append(FileDecision(path, size, Action.DELETE, reason, detail, cid, keepers, phase))
                deleted += size
        self._flush(cid, kept, deleted, n_kept)
        return out

    def _flush(self, cid: int | None, kept: int, deleted: int, n_kept: int) -> None:
        """Add one directory's sums to the totals (per checkpoint if it is `chk-<id>/`)."""
        self.kept_total += kept
        self.deleted_total += deleted
        if cid is not None:
            self.dir_ids.add(cid)
            self.kept_bytes[cid] += kept
            self.deleted_bytes[cid] += deleted
            self.kept_files[cid] += n_kept
            if f"chk-{cid}/{METADATA_NAME}" in self.listed_paths:
                self.has_metadata.add(cid)

    def _exchange_rule(self, path: str) -> tuple[Reason, str, int | None, tuple[int, ...]]:
        """A file of a keyed exchange (rule 2a, `exchange_verdict`); the kept checkpoints'
        reader views are built once per reader."""
        if (marked := mark_path_of(path)) is not None:
            return self._mark_rule(*marked)
        file = segment_of(path)
        if file is None:
            detail = "staged segment or commit record of an exchange: its writer cleans it"
            return Reason.EXCHANGE, detail, None, ()
        if self.damaged_ids or not self.kept_ids & self.by_id.keys():
            return Reason.BACKLOG, BLIND_DETAIL, None, ()
        views = self.exchange_views.get(file.reader)
        if views is None:
            kept = [self.by_id[k] for k in sorted(self.kept_ids) if k in self.by_id]
            views = self.exchange_views[file.reader] = reader_views(kept, file.reader)
        return exchange_verdict(file, views)

    def _mark_rule(
        self, reader: str, mark: WatermarkMark
    ) -> tuple[Reason, str, int | None, tuple[int, ...]]:
        """A watermark mark of exchange `reader` (rule 2a): kept while a kept checkpoint's
        reader may compute its watermark from it (`metadata.watermarks.mark_kept_by`),
        deleted once a later mark of its writer superseded it for every one."""
        if self.damaged_ids or not self.kept_ids & self.by_id.keys():
            return Reason.BACKLOG, BLIND_DETAIL, None, ()
        views = self.exchange_views.get(reader)
        if views is None:
            kept = [self.by_id[k] for k in sorted(self.kept_ids) if k in self.by_id]
            views = self.exchange_views[reader] = reader_views(kept, reader)
        if isinstance(views, str):
            return Reason.BACKLOG, views, None, ()
        listing = self._exchange_listing(reader)
        keepers = tuple(
            mark_kept_by(mark, views, lambda n, q: listing[0].get((n, q), ()), listing[1])
        )
        if keepers:
            detail = f"watermark mark kept checkpoint(s) {_ids(keepers)} may still need"
            return Reason.BACKLOG, detail, None, keepers
        return Reason.CONSUMED, MARK_SUPERSEDED_DETAIL, 2, ()

    def _exchange_listing(
        self, reader: str
    ) -> tuple[dict[tuple[int, int], list[SegmentName]], list[WatermarkMark]]:
        """The committed segments (by layout and partition) and marks of exchange `reader`
        among the listed files, once per reader."""
        cached = self.exchange_listings.get(reader)
        if cached is None:
            segments: dict[tuple[int, int], list[SegmentName]] = defaultdict(list)
            marks: list[WatermarkMark] = []
            prefix = f"{EXCHANGE_DIR}/{reader}/"
            for path in self.listed_paths:
                if not path.startswith(prefix):
                    continue
                if (file := segment_of(path)) is not None:
                    segments[file.layout, file.partition].append(file.segment)
                elif (marked := mark_path_of(path)) is not None:
                    marks.append(marked[1])
            cached = self.exchange_listings[reader] = (dict(segments), marks)
        return cached

    def _rule(
        self, top: str, cid: int | None, kind: str
    ) -> tuple[Reason, str, int | None, tuple[int, ...]]:
        """(reason, detail, deletion phase or None to keep, kept_by) for an unreferenced file
        of `kind` (metadata, state, other) in top-level directory `top`."""
        if cid is None:
            if top == SAVEPOINTS_DIR:
                return Reason.SAVEPOINT, "savepoint: user-owned, never deleted", None, ()
            if top == LEASE_DIR:
                detail = "the driver's lease of the job root: its driver deletes it"
                return Reason.LEASE, detail, None, ()
            if top == SHARED_DIR:
                return Reason.ORPHAN, "shared file referenced by no kept checkpoint", 2, ()
            if kind == "expired-event":
                return (*expired_event_verdict(self.num_retained_events), ())
            if kind == "event":
                detail = f"event log: within the newest {self.num_retained_events} events"
                return Reason.EVENT_LOG, detail, None, ()
            return Reason.UNKNOWN, "not a checkpoint, shared or savepoint file; kept", None, ()
        if cid in self.pending_ids:
            return Reason.PENDING, f"checkpoint {cid} is in progress", None, ()
        if cid in self.linked:
            reason, text = self.linked[cid]
            return reason, f"checkpoint {cid} holds {text}; kept whole", None, ()
        if cid in self.damaged_ids:
            return Reason.DAMAGED, f"checkpoint {cid} has damaged metadata; kept", None, ()
        if self.not_owned(cid):
            return Reason.NOT_OWNED, "written by or before a no-claim restore base", None, ()
        if self.live_unknown and cid > self.newest_completed and cid not in self.by_id:
            return Reason.PENDING, _MAYBE_LIVE, None, ()
        if cid not in self.by_id and f"chk-{cid}/{METADATA_NAME}" in self.listed_paths:
            detail = f"checkpoint {cid} has _metadata the planner was not given; kept"
            return Reason.UNKNOWN, detail, None, ()
        if cid in self.kept_ids:
            if kind == "metadata":
                return Reason.RETAINED, f"metadata of kept checkpoint {cid}", None, (cid,)
            if kind == "state":
                detail = f"unit attempt file that checkpoint {cid}'s metadata does not reference"
                return Reason.STALE_ATTEMPT, detail, 1, ()
            detail = f"in kept checkpoint {cid}, not a state handle (may be named by committables)"
            return Reason.UNKNOWN, detail, None, (cid,)
        reason, detail, phase = garbage_verdict(
            cid, kind, has_metadata=cid in self.by_id, newest_completed=self.newest_completed
        )
        return reason, detail, phase, ()

    def checkpoint_verdict(
        self, cid: int, users: dict[int, set[int]]
    ) -> tuple[Action, Reason, str]:
        """Keep, keep only referenced files, or delete checkpoint `cid`, and why; `users` maps
        the kept checkpoints that re-use its files to their fallback units."""
        md = self.by_id.get(cid)
        newest = f"({self.num_retained} newest)"
        if cid in self.pending_ids:
            return Action.KEEP, Reason.PENDING, "checkpoint in progress"
        if cid in self.linked:
            reason, text = self.linked[cid]
            detail = f"holds {text}; nothing under it is deleted: inspect it, remove the link"
            return Action.KEEP, reason, detail
        if cid in self.damaged_ids:
            detail = (
                "metadata does not decode; kept for inspection, see "
                "`regional inspect ROOT validate`, delete by hand if unneeded"
            )
            return Action.KEEP, Reason.DAMAGED, detail
        if self.not_owned(cid):
            detail = (
                f"written by or before restore base {self.no_claim_upto}, restored in "
                "no-claim mode: owned by the user, never deleted"
            )
            return Action.KEEP, Reason.NOT_OWNED, detail
        if md is None and self.live_unknown and cid > self.newest_completed:
            return Action.KEEP, Reason.PENDING, _MAYBE_LIVE
        if md is None and cid in self.has_metadata:
            detail = "has _metadata the planner was not given (completed after the scan?)"
            return Action.KEEP, Reason.UNKNOWN, detail
        if cid in self.savepoint_ids:
            return Action.KEEP, Reason.SAVEPOINT, "savepoint: user-owned"
        if cid in self.retained:
            return Action.KEEP, Reason.RETAINED, f"within num-retained {newest}"
        n = self.kept_files.get(cid, 0)
        if n:
            per_ref = "; ".join(
                f"checkpoint {r} (units {_ids(u)})" for r, u in sorted(users.items())
            )
            head = "metadata deleted; " if md is not None else ""
            detail = (
                f"{head}{_plural(n, 'file')} ({self.kept_bytes[cid]} bytes) kept for "
                f"{per_ref or 'pending checkpoints'}"
            )
            return Action.KEEP_FILES, Reason.REFERENCED, detail
        if md is not None:
            detail = f"outside num-retained {newest}, referenced by no kept checkpoint"
            return Action.DELETE, Reason.SUBSUMED, detail
        if cid > self.newest_completed:
            return (
                Action.DELETE,
                Reason.ABORTED,
                "no _metadata and not in progress: never completed",
            )
        detail = "no _metadata and not in progress: left by a crash or an interrupted clean"
        return Action.DELETE, Reason.ORPHAN, detail
