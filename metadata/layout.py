"""The storage layout of a job root (DESIGN §5), as pure functions over relative paths.

```
<root>/<job-id>/
  chk-<id>/_metadata               written last, one object; its presence = completed
  chk-<id>/u<unit>-a<attempt>-<run>.state  snapshot files of the units fresh in <id>
  chk-<id>/compacted-<run>.state   fallback units' segments copied out of older files
  shared/                          files shared across checkpoints
  savepoints/sp-<id>/...           self-contained savepoints
  events/<id>-<trigger ms>.json    the event log: one JSON line per checkpoint outcome
  _lease/g<generation>[-r<n>].json the driver's lease of the job root (`metadata.lease`)
```

Every path stored in metadata is relative to the job root. `path_problem` (and `check_relative`,
which raises) refuses anything that could resolve outside it (`..`, absolute paths, URIs,
backslashes, NUL, empty components), because such paths can come from a tampered metadata
file; `name_problem` does the same for a single name (a commit user, a split id) that becomes
one path component. Every name read from storage that is joined into a path passes one of them.

>>> state_file_path(7, 3, 1, "4f1c2a")
'chk-7/u3-a1-4f1c2a.state'
>>> compacted_file_path(9, "4f1c2a")
'chk-9/compacted-4f1c2a.state'
>>> checkpoint_id_of("chk-7/_metadata")
7
>>> event_path(7, 1795383295552)
'events/000000000007-1795383295552.json'
>>> event_checkpoint_id("events/000000000007-1795383295552.json")
7
>>> check_relative("chk-7/../../etc/passwd")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.errors.StorageError: path 'chk-7/../../etc/passwd' resolves outside the job root ...
"""

from __future__ import annotations

import functools
import re

from metadata.errors import StorageError

__all__ = [
    "DEFAULT_RETAINED_EVENTS",
    "EVENTS_DIR",
    "JOB_ID_FORM",
    "LEASE_DIR",
    "MAX_JOB_ID_LENGTH",
    "METADATA_NAME",
    "SAVEPOINTS_DIR",
    "SHARED_DIR",
    "check_relative",
    "checkpoint_dir",
    "checkpoint_id_of",
    "compacted_file_path",
    "event_checkpoint_id",
    "event_path",
    "job_id_problem",
    "metadata_path",
    "name_problem",
    "path_problem",
    "savepoint_dir",
    "state_file_path",
]

METADATA_NAME = "_metadata"
SHARED_DIR = "shared"
SAVEPOINTS_DIR = "savepoints"
EVENTS_DIR = "events"
LEASE_DIR = "_lease"
#: Newest event-log files kept by the runtime and `regional clean` (older: `expired-event`).
DEFAULT_RETAINED_EVENTS = 1000

#: The longest job id of a new job (100 characters). The id names the job's directory and is
#: part of longer names: a sink's staged files (``part-<job>-<run>-c<id>-<vertex>-...``), commit
#: users (``<job>-<run>-<vertex>``), Paimon data files; each must stay within the 255 bytes a
#: name may have on common file systems.
MAX_JOB_ID_LENGTH = 100

#: What a job id may be, as messages say it: a directory name and a part of object-store keys,
#: so no separators, no spaces or shell characters.
JOB_ID_FORM = (
    f"letters, digits, '.', '_' and '-', at most {MAX_JOB_ID_LENGTH} characters (not '.' or "
    "'..' alone)"
)

_JOB_ID_CHARACTER = re.compile(r"[A-Za-z0-9._-]")
_CHK = re.compile(r"^chk-(\d+)(?:/|$)")
_EVENT = re.compile(r"^events/(\d{12})-(\d+)\.json$")
_DRIVE = re.compile(r"^[A-Za-z]:")


def checkpoint_dir(checkpoint_id: int) -> str:
    """`chk-<id>`, relative to the job root."""
    return f"chk-{checkpoint_id}"


def metadata_path(checkpoint_id: int) -> str:
    """`chk-<id>/_metadata`, relative to the job root."""
    return f"chk-{checkpoint_id}/{METADATA_NAME}"


def state_file_path(
    checkpoint_id: int, unit_id: int, attempt: int, run_id: str | None = None
) -> str:
    """The snapshot file of one unit attempt of driver run `run_id`:
    `chk-<id>/u<unit>-a<attempt>-<run>.state` (`chk-<id>/u<unit>-a<attempt>.state` without a
    run, as written before runs were named). The run id keeps two drivers that both believe
    they own the job root from ever writing the same file."""
    run = f"-{run_id}" if run_id else ""
    return f"chk-{checkpoint_id}/u{unit_id}-a{attempt}{run}.state"


def compacted_file_path(checkpoint_id: int, run_id: str) -> str:
    """The file checkpoint `checkpoint_id` copies its fallback units' live segments into when
    their owner's merged file is mostly dead (`metadata.compaction`):
    `chk-<id>/compacted-<run>.state`. One per checkpoint and driver run; the run id keeps two
    drivers that both believe they own the job root from writing the same file."""
    return f"chk-{checkpoint_id}/compacted-{run_id}.state"


def savepoint_dir(savepoint_id: int) -> str:
    """`savepoints/sp-<id>`, relative to the job root."""
    return f"{SAVEPOINTS_DIR}/sp-{savepoint_id}"


def event_path(checkpoint_id: int, trigger_time_ms: int) -> str:
    """The event of one checkpoint attempt: `events/<id, 12 digits>-<trigger ms>.json`.

    Zero-padded ids list in checkpoint order; the trigger time keeps the name new even when a
    restarted driver reuses the id of an aborted checkpoint (object stores have no append, so
    every event is its own object and none is ever rewritten)."""
    return f"{EVENTS_DIR}/{checkpoint_id:012d}-{trigger_time_ms}.json"


def event_checkpoint_id(path: str) -> int | None:
    """The checkpoint id of an event file's path (as `event_path` names it), else None."""
    m = _EVENT.match(path)
    return int(m.group(1)) if m else None


def checkpoint_id_of(path: str) -> int | None:
    """The checkpoint id of a path under `chk-<id>/`, else None."""
    m = _CHK.match(path)
    return int(m.group(1)) if m else None


def name_problem(name: str) -> str | None:
    """Why `name` is not a safe single path component (a commit user, a file name), or None.

    Safe: not empty, not `.` or `..`, no `/`, backslash or NUL. Names read from storage are
    joined into paths, so a tampered one must not be able to leave its directory.

    >>> name_problem("job-1-4f1c2a-sink"), name_problem("..")
    (None, "'..' is not allowed")
    """
    if not name:
        return "it is empty"
    if name in (".", ".."):
        return f"{name!r} is not allowed"
    if "/" in name or "\\" in name or "\x00" in name:
        return "it contains a slash, backslash or NUL byte"
    return None


def job_id_problem(job_id: str) -> str | None:
    """Why `job_id` cannot name a new job (`JOB_ID_FORM`), or None. Checked before a run starts;
    reading an existing job root only needs `name_problem`.

    >>> job_id_problem("clicks-2") is None
    True
    >>> job_id_problem("x" * 101), job_id_problem("a b"), job_id_problem("..")
    ('it is 101 characters long', "it contains ' '", "'..' alone is not allowed")
    """
    if not job_id:
        return "it is empty"
    if len(job_id) > MAX_JOB_ID_LENGTH:
        return f"it is {len(job_id)} characters long"
    if job_id in (".", ".."):
        return f"{job_id!r} alone is not allowed"
    bad = next((c for c in job_id if not _JOB_ID_CHARACTER.fullmatch(c)), None)
    return None if bad is None else f"it contains {bad!r}"


@functools.lru_cache(maxsize=8192)  # pure; the same state files are checked for every unit
def path_problem(path: str) -> str | None:
    """Why `path` is not a safe path relative to its root, or None: not absolute, not a URI,
    no drive letter, and every `/`-separated component a safe name (`name_problem`).

    >>> path_problem("chk-7/u0-a1.state") is None
    True
    >>> path_problem("chk-7/../../etc/passwd"), path_problem("/etc/passwd")
    ("'..' is not allowed", 'it is absolute or a URI')
    """
    if not path:
        return "it is empty"
    if "://" in path or path.startswith(("/", "\\")) or _DRIVE.match(path):
        return "it is absolute or a URI"
    for part in path.split("/"):
        problem = name_problem(part)
        if problem is not None:
            return problem if part else "it has an empty component"
    return None


def check_relative(path: str) -> str:
    """Return `path` if it stays inside the job root (`path_problem`), else raise
    `StorageError` naming it."""
    problem = path_problem(path)
    if problem is None:
        return path
    if problem.startswith("it is absolute"):
        where = "is absolute or a URI"
    elif ".." in path.split("/"):
        where = "resolves outside the job root ('..' is not allowed)"
    else:
        where = f"is not a safe relative path ({problem})"
    raise StorageError(
        f"path {path!r} {where}; metadata paths must be relative to the job root, so the "
        "metadata that holds it was tampered with or written by a broken tool"
    )
