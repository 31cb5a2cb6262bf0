"""`validate`: check every completed checkpoint of a job against the files in storage.

For each `chk-<id>/_metadata`: the format is supported and the file decodes; every referenced
path stays inside the job root, exists with the recorded size, and every segment matches its
checksum; every fallback subtask refers to an older owner. On a local disk, a `_metadata` or
state file reached through a symbolic link out of the job root is a problem naming the link and
where it points (`metadata.storage.OutsideRootError`); nothing is read through it. One
`Problem` per finding, and the checkpoint a restore would use: the newest one without
problems (the same answer as `JobStorage.find_restorable(verify_checksums=True)`, which a
restore uses with checksums off (sizes only) because reading the state verifies them anyway).

Warnings are not problems (nothing is broken yet): `retention_warnings` compares each sink's
table retention recorded in the newest checkpoint (`CheckpointMetadata.sinks`) with the age of
the oldest retained one. A table that may drop the sink's commit marker sooner would let a
restore of that checkpoint commit its output again.

>>> import tempfile
>>> from metadata.model import CheckpointMetadata, SubtaskState
>>> from metadata.storage import JobStorage
>>> storage = JobStorage(tempfile.mkdtemp(), "j")
>>> h = storage.write_state_file("chk-1/u0-a0.state", b"state")
>>> storage.write_metadata(CheckpointMetadata(checkpoint_id=1, job_id="j", kind="global",
...     trigger_time_ms=0, completion_time_ms=1,
...     subtasks=(SubtaskState("map", 0, 0, handles=(h,)),)))
>>> report = validate_job(storage)
>>> report.restore_checkpoint_id, report.problems
(1, ())
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence

import msgspec
import pyarrow as pa

from metadata.commit_log import FileCheck, read_records
from metadata.errors import MetadataError, StorageError
from metadata.exchange import EXCHANGE_DIR, kept_by, reader_view, segment_of
from metadata.format import segment_checksum
from metadata.layout import metadata_path
from metadata.model import CheckpointMetadata, StateHandle
from metadata.storage import JobStorage, Problem, links_of, reference_problems

__all__ = [
    "VALIDATE_SCHEMA",
    "Validation",
    "exchange_problems",
    "retention_warnings",
    "validate_job",
    "validate_table",
]

VALIDATE_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("problem", pa.string(), nullable=False),
    ]
)


class Validation(msgspec.Struct, frozen=True):
    """Problems found (in checkpoint order), the checkpoint a restore would use, and warnings
    (`retention_warnings`)."""

    checked: tuple[int, ...]
    problems: tuple[Problem, ...]
    restore_checkpoint_id: int | None
    warnings: tuple[str, ...] = ()


def _duration(ms: int) -> str:
    """`ms` for people: `90 s`, `2.0 h`, `3.5 d`."""
    if ms < 120_000:
        return f"{ms / 1000:g} s"
    if ms < 172_800_000:
        return f"{ms / 3_600_000:.1f} h"
    return f"{ms / 86_400_000:.1f} d"


def retention_warnings(decoded: Sequence[CheckpointMetadata], now_ms: int) -> list[str]:
    """One warning per sink (as recorded by the newest of `decoded`, the job's retained
    checkpoints) whose table may drop the sink's commit marker before the oldest of them is
    too old to restore: its retention is shorter than that checkpoint's age at `now_ms`.

    >>> from metadata.model import SinkRetention
    >>> day = 86_400_000
    >>> def md(cid, done, sinks=()):
    ...     return CheckpointMetadata(checkpoint_id=cid, job_id="j", kind="global",
    ...         trigger_time_ms=done, completion_time_ms=done, sinks=sinks)
    >>> sink = SinkRetention("out", "delta", "/t", "delta.setTransactionRetentionDuration", day)
    >>> retention_warnings([md(3, 0), md(4, day, (sink,))], now_ms=day // 2 * 5)
    ... # doctest: +NORMALIZE_WHITESPACE
    ["sink 'out' (delta table /t): delta.setTransactionRetentionDuration is 24.0 h, but the
    oldest retained checkpoint 3 completed 2.5 d ago; after the table drops the job's commit
    marker, restoring it would commit its output again. Make
    delta.setTransactionRetentionDuration longer than the job may stay stopped, or restore a
    newer checkpoint"]
    >>> retention_warnings([md(3, 2 * day), md(4, 2 * day, (sink,))], now_ms=day // 2 * 5)
    []
    """
    if not decoded:
        return []
    oldest = min(decoded, key=lambda m: m.checkpoint_id)
    newest = max(decoded, key=lambda m: m.checkpoint_id)
    age = now_ms - oldest.completion_time_ms
    out = []
    for sink in newest.sinks:
        if sink.retention_ms is None or sink.retention_ms >= age:
            continue
        setting = sink.setting or "its retention"
        out.append(
            f"sink {sink.vertex_id!r} ({sink.kind} table {sink.location}): {setting} is "
            f"{_duration(sink.retention_ms)}, but the oldest retained checkpoint "
            f"{oldest.checkpoint_id} completed {_duration(age)} ago; after the table drops the "
            "job's commit marker, restoring it would commit its output again. Make "
            f"{setting} longer than the job may stay stopped, or restore a newer checkpoint"
        )
    return out


def validate_job(
    storage: JobStorage, *, verify_checksums: bool = True, now_ms: int | None = None
) -> Validation:
    """Validate every checkpoint of `storage` (reads each referenced segment once); warnings
    are judged at `now_ms` (default: now)."""
    files = storage.list_files()
    sizes = {f.path: f.size for f in files}
    links = links_of(files)
    ids = storage.list_checkpoint_ids(files)
    verified: dict[StateHandle, str | None] = {}
    problems: list[Problem] = []
    restore: int | None = None
    decoded: list[CheckpointMetadata] = []
    for cid in ids:
        try:
            decoded.append(storage.read_metadata(cid))
        except (MetadataError, StorageError) as exc:
            problems.append(Problem(cid, metadata_path(cid), str(exc)))
    exchange = exchange_problems(storage, decoded, sizes, verify_checksums=verify_checksums)
    for md in decoded:
        found = reference_problems(md, sizes, links)
        if verify_checksums:
            found += storage.verify_segments(md, verified)
        found += [p for p in exchange if p.checkpoint_id == md.checkpoint_id]
        problems += found
        if not found:
            restore = md.checkpoint_id
    problems.sort(key=lambda p: p.checkpoint_id)
    now = now_ms if now_ms is not None else int(time.time() * 1000)
    warnings = tuple(retention_warnings(decoded, now))
    return Validation(tuple(ids), tuple(problems), restore, warnings)


def exchange_problems(
    storage: JobStorage,
    decoded: Sequence[CheckpointMetadata],
    sizes: Mapping[str, int],
    *,
    verify_checksums: bool = True,
) -> list[Problem]:
    """The keyed exchanges' committed segments that a kept checkpoint still needs
    (`metadata.exchange.kept_by`) but that are missing, of another size than their commit
    record says, or (with `verify_checksums`) fail its checksum: one `Problem` per checkpoint
    whose restore would read the segment. A commit record that cannot be read is a problem of
    every checkpoint."""
    readers = sorted(
        {
            parts[1]
            for path in sizes
            if (parts := path.split("/"))[0] == EXCHANGE_DIR and len(parts) > 3
        }
    )
    problems: list[Problem] = []
    for reader in readers:
        directory = f"{storage.job_path}/{EXCHANGE_DIR}/{reader}"
        try:
            records = read_records(storage.filesystem, directory)
        except (MetadataError, StorageError, OSError) as exc:
            problems += [
                Problem(md.checkpoint_id, f"{EXCHANGE_DIR}/{reader}/_commits", str(exc))
                for md in decoded
            ]
            continue
        views = [reader_view(md, reader) for md in decoded]
        for record in records:
            for file, check in record.expected().items():
                path = f"{EXCHANGE_DIR}/{reader}/{file}"
                segment = segment_of(path)
                needed = kept_by(segment, views) if segment is not None else []
                if not needed:
                    continue  # every kept checkpoint's reader is past it (it may be cleaned)
                problem = _segment_problem(storage, path, check, sizes, verify_checksums)
                if problem is not None:
                    problems += [Problem(cid, path, problem) for cid in needed]
    return problems


def _segment_problem(
    storage: JobStorage,
    path: str,
    check: FileCheck,
    sizes: Mapping[str, int],
    verify_checksums: bool,
) -> str | None:
    size = sizes.get(path)
    committed = f"committed with checkpoint {check.identifier}"
    if size is None:
        return f"exchange segment {committed} is missing: a restore would lose its records"
    if check.size is not None and size != check.size:
        return (
            f"exchange segment {committed} has {size} bytes, its commit record says "
            f"{check.size}: truncated or replaced"
        )
    if verify_checksums and check.checksum is not None:
        data = storage.read_file(path) or b""
        if segment_checksum(data).hex() != check.checksum:
            return f"exchange segment {committed} fails the checksum of its commit record"
    return None


def validate_table(validation: Validation) -> pa.Table:
    """One row per problem. Columns (`VALIDATE_SCHEMA`): `checkpoint_id`, `path` (relative to
    the job root), `problem`."""
    rows = [msgspec.structs.asdict(p) for p in validation.problems]
    return pa.Table.from_pylist(rows, schema=VALIDATE_SCHEMA)
