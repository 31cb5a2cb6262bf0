"""`validate`: check every completed checkpoint of a job against the files in storage.

For each `chk-<id>/_metadata`: the format is supported and the file decodes; every referenced
path stays inside the job root, exists with the recorded size, and every segment matches its
checksum; every fallback subtask refers to an older owner. On a local disk, a `_metadata` or
state file reached through a symbolic link out of the job root is a problem naming the link and
where it points (`metadata.storage.OutsideRootError`); nothing is read through it. One
`Problem` per finding, and the checkpoint a restore would use: the newest one without
problems (the same answer as `JobStorage.find_restorable(verify_checksums=True)`, which a
restore uses with checksums off (sizes only) because reading the state verifies them anyway).

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

import msgspec
import pyarrow as pa

from metadata.errors import MetadataError, StorageError
from metadata.layout import metadata_path
from metadata.model import StateHandle
from metadata.storage import JobStorage, Problem, links_of, reference_problems

__all__ = ["VALIDATE_SCHEMA", "Validation", "validate_job", "validate_table"]

VALIDATE_SCHEMA = pa.schema(
    [
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("path", pa.string(), nullable=False),
        pa.field("problem", pa.string(), nullable=False),
    ]
)


class Validation(msgspec.Struct, frozen=True):
    """Problems found (in checkpoint order) and the checkpoint a restore would use."""

    checked: tuple[int, ...]
    problems: tuple[Problem, ...]
    restore_checkpoint_id: int | None


def validate_job(storage: JobStorage, *, verify_checksums: bool = True) -> Validation:
    """Validate every checkpoint of `storage` (reads each referenced segment once)."""
    files = storage.list_files()
    sizes = {f.path: f.size for f in files}
    links = links_of(files)
    ids = storage.list_checkpoint_ids(files)
    verified: dict[StateHandle, str | None] = {}
    problems: list[Problem] = []
    restore: int | None = None
    for cid in ids:
        try:
            md = storage.read_metadata(cid)
        except (MetadataError, StorageError) as exc:
            problems.append(Problem(cid, metadata_path(cid), str(exc)))
            continue
        found = reference_problems(md, sizes, links)
        if verify_checksums:
            found += storage.verify_segments(md, verified)
        problems += found
        if not found:
            restore = cid
    return Validation(tuple(ids), tuple(problems), restore)


def validate_table(validation: Validation) -> pa.Table:
    """One row per problem. Columns (`VALIDATE_SCHEMA`): `checkpoint_id`, `path` (relative to
    the job root), `problem`."""
    rows = [msgspec.structs.asdict(p) for p in validation.problems]
    return pa.Table.from_pylist(rows, schema=VALIDATE_SCHEMA)
