"""`JobStorage`: the files of one job under a checkpoint root, over `pyarrow.fs` (DESIGN §5).

About 850 lines, on purpose: every read, write, listing and delete of a job root goes through
this one adapter, so its guarantees (atomic metadata, no escape from the root, fsync, errors that
name the file) are checked in one place; the layout is `metadata.layout`, the format
`metadata.format`.

The root is a local path or any `pyarrow.fs` URI (`file://`, `s3://...?endpoint_override=..`,
`hdfs://`, `gs://`); the job's files live under `<root>/<job-id>/`. Every path this class takes
or returns is relative to that job root and passes `metadata.layout.check_relative`, so a
tampered metadata file cannot make it read or delete anything outside.

`_metadata` is written as one atomic object: on a local file system a temporary file, fsync,
a no-clobber link (or rename) and a directory fsync; on object stores one write of a new
object, never a rename (pyarrow's S3 stream writes all bytes as one multipart upload that
becomes visible only when it is completed at close). A `_metadata` that appears at all is
therefore complete on local disks and on S3; on any other store a partial object would still be
caught by the format's length and checksum and skipped as damaged. On S3 with conditional
writes (`metadata.exclusive`) a new `_metadata` or event file is one `PutObject` with
`If-None-Match: *`: atomic, and the store itself refuses to overwrite. Elsewhere object stores
offer no "create if absent" through pyarrow, so the refusal to overwrite is a check before the
write there (one coordinator writes a given checkpoint id). "Latest" is found by listing and
validating (`find_latest_restorable`), never through a mutable pointer.

No LIST on the steady-state path (one per checkpoint would not scale to a checkpoint a second):
pyarrow's `get_file_info` on an S3 key that does not exist sends a HEAD and then a LIST (is it
a "directory"?), so on S3 `file_size`/`exists` ask with one HEAD (`open_input_file`) instead,
and writes never create "directory" objects (pyarrow's S3 streams do not probe parents).

>>> import tempfile
>>> from metadata.model import CheckpointMetadata
>>> storage = JobStorage(tempfile.mkdtemp(), "job-1")
>>> handles = storage.write_segments("chk-1/u0-a0.state", [b"abc", b"defg"])
>>> [(h.offset, h.length, h.size) for h in handles]
[(0, 3, 7), (3, 4, 7)]
>>> storage.read_segment(handles[1])
b'defg'
>>> storage.write_metadata(CheckpointMetadata(checkpoint_id=1, job_id="job-1", kind="global",
...     trigger_time_ms=0, completion_time_ms=5))
>>> storage.list_checkpoint_ids(), [f.path for f in storage.list_files()]
([1], ['chk-1/_metadata', 'chk-1/u0-a0.state'])
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import posixpath
import uuid
from collections.abc import Mapping, Sequence

import msgspec
from pyarrow import fs as pafs

from metadata.bounded_read import byte_size, read_bounded
from metadata.confine import check_confined
from metadata.errors import MetadataError, OutsideRootError, StorageError
from metadata.exclusive import create_exclusive, s3_delete_object, s3_put_if_absent
from metadata.format import (
    MAX_METADATA_FILE_BYTES,
    decode_metadata,
    encode_metadata,
    segment_checksum,
)
from metadata.layout import (
    EVENTS_DIR,
    LEASE_DIR,
    SAVEPOINTS_DIR,
    SHARED_DIR,
    check_relative,
    checkpoint_dir,
    checkpoint_id_of,
    metadata_path,
)
from metadata.model import CheckpointMetadata, StateHandle

__all__ = [
    "FileEntry",
    "JobSelectionError",
    "JobStorage",
    "OutsideRootError",
    "Problem",
    "RestoreSearch",
    "links_of",
    "reference_problems",
    "resolve_root",
]

log = logging.getLogger(__name__)

#: The top-level directories of a job root besides `chk-<id>/` (`metadata.layout`).
_LAYOUT_DIRS = frozenset({EVENTS_DIR, LEASE_DIR, SAVEPOINTS_DIR, SHARED_DIR})

#: errnos of `os.link` on file systems without hard links: fall back to a rename.
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV})


class JobSelectionError(StorageError):
    """The checkpoint root or the job in it cannot be chosen (missing root, unknown job, several
    jobs and none named). Bad usage: exit code 2."""

    exit_code = 2


class FileEntry(msgspec.Struct, frozen=True):
    """A file under the job root: `path` relative to it, `size` in bytes, `mtime_ms` (epoch
    milliseconds, None where the file system does not report it).

    `link` is set for a symbolic link the listing did not follow (local file systems only):
    the real path it points to. `outside_root` says that path is outside the job root (else
    it is a link to a directory inside it, not followed so no file is listed twice). Such an
    entry is not a file of the job: it is never read nor deleted."""

    path: str
    size: int
    mtime_ms: int | None = None
    link: str | None = None
    outside_root: bool = False

    @property
    def link_problem(self) -> str | None:
        """Why this entry is not used (a link), as `Problem.problem` words; None for a file."""
        if self.link is None:
            return None
        if self.outside_root:
            return (
                f"a symbolic link to {self.link}, outside the job root; regional never "
                "follows it: remove the link"
            )
        return (
            f"a symbolic link to {self.link} in the job root, not followed (only links to "
            "files are)"
        )


class Problem(msgspec.Struct, frozen=True):
    """One thing wrong with a checkpoint: `path` (relative to the job root) and what is wrong."""

    checkpoint_id: int
    path: str
    problem: str


class RestoreSearch(msgspec.Struct, frozen=True):
    """The outcome of looking for a restorable checkpoint: the newest usable one (or None) and
    the newer ones skipped, each with its problems."""

    metadata: CheckpointMetadata | None
    skipped: tuple[Problem, ...] = ()


def resolve_root(
    root: str, filesystem: pafs.FileSystem | None = None
) -> tuple[pafs.FileSystem, str]:
    """The file system and its path for a checkpoint root (a local path or a URI)."""
    if filesystem is not None:
        return filesystem, root.rstrip("/") or "/"
    if "://" in root:
        try:
            filesystem, path = pafs.FileSystem.from_uri(root)
        except (ValueError, OSError) as exc:
            raise JobSelectionError(
                f"checkpoint root {_redact(root)!r} is not a usable file system URI ({exc}); "
                "use a local path or file://, s3://, hdfs://, gs://"
            ) from None
        return filesystem, path.rstrip("/") or "/"
    return pafs.LocalFileSystem(), os.path.abspath(root)


def _redact(uri: str) -> str:
    """A URI without credentials or query, for messages."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    rest = rest.split("?", 1)[0]
    if "@" in rest.split("/", 1)[0]:
        rest = rest.split("@", 1)[1]
    return f"{scheme}://{rest}"


def reference_problems(
    md: CheckpointMetadata, sizes: Mapping[str, int], links: Mapping[str, FileEntry] | None = None
) -> list[Problem]:
    """What keeps `md` from being restored, given the job root's files (`path -> size`) and
    the symbolic links its listing did not follow (`path -> entry`, `links_of`).

    Pure: checks every handle's path stays inside the job root (also through links), exists
    and has the recorded size, and that every fallback subtask refers to an older owner.
    """
    problems: list[Problem] = []
    seen: set[str] = set()
    cid = md.checkpoint_id
    for s in md.subtasks:
        if s.ref_checkpoint_id is not None and s.ref_checkpoint_id >= cid:
            problems.append(
                Problem(
                    cid,
                    metadata_path(cid),
                    f"subtask {s.vertex_id}[{s.index}] refers to checkpoint "
                    f"{s.ref_checkpoint_id}, which is not older than {cid}",
                )
            )
        for h in s.handles:
            if h.path in seen:
                continue
            seen.add(h.path)
            try:
                path = check_relative(h.path)
            except StorageError as exc:
                problems.append(Problem(cid, h.path, f"refused: {exc}"))
                continue
            if links and (link := _link_on(path, links)) is not None:
                through = "" if link.path == path else f"it is under {link.path}, "
                problems.append(Problem(cid, path, f"refused: {through}{link.link_problem}"))
                continue
            size = sizes.get(path)
            if size is None:
                problems.append(Problem(cid, path, "missing"))
            elif size != h.size:
                problems.append(Problem(cid, path, f"size is {size} bytes, recorded {h.size}"))
    return problems


def links_of(files: Sequence[FileEntry]) -> dict[str, FileEntry]:
    """The entries of a listing that are symbolic links not followed, by path."""
    return {f.path: f for f in files if f.link is not None}


def _within_limit(data: bytes | None, source: str) -> bytes:
    """The bytes `read_bounded` read of metadata file `source`; `MetadataError` (damaged, so
    skipped like a corrupt one) when there were more than `MAX_METADATA_FILE_BYTES`."""
    if data is None:
        raise MetadataError(
            f"{source} is larger than {byte_size(MAX_METADATA_FILE_BYTES)}, more than any "
            "checkpoint's metadata; the file was replaced or damaged"
        )
    return data


def _link_on(path: str, links: Mapping[str, FileEntry]) -> FileEntry | None:
    """The link at `path` or at one of its parent directories, if any."""
    end = len(path)
    while end > 0:
        link = links.get(path[:end])
        if link is not None:
            return link
        end = path.rfind("/", 0, end)
    return None


class JobStorage:
    """The files of job `job_id` under checkpoint root `root` (see the module docstring).

    On a local file system nothing is read, written or deleted through a symbolic link that
    leads out of the job root (`OutsideRootError`), and listings never descend into one (they
    report it, `FileEntry.link`); object stores have no links, so that costs them nothing.
    """

    def __init__(
        self, root: str, job_id: str, *, filesystem: pafs.FileSystem | None = None
    ) -> None:
        if not job_id or "/" in job_id or "\\" in job_id or job_id in (".", ".."):
            raise JobSelectionError(
                f"job id {job_id!r} cannot be a directory name under the checkpoint root; "
                "use a name without slashes"
            )
        self.root = root
        self.job_id = job_id
        self.filesystem, base = resolve_root(root, filesystem)
        self.job_path = f"{base.rstrip('/')}/{job_id}"
        self._local = isinstance(self.filesystem, pafs.LocalFileSystem)
        #: Use S3 conditional writes for `create_new` where the store has them (False: the
        #: claim protocol of `metadata.exclusive`, for stores known not to have them).
        self.conditional_writes = True

    def __repr__(self) -> str:
        return f"JobStorage({self.describe('')!r})"

    # -- naming ------------------------------------------------------------------------------

    def describe(self, relpath: str) -> str:
        """A human-readable location of `relpath` (no credentials), for messages."""
        full = f"{self.job_path}/{relpath}" if relpath else self.job_path
        return full if self._local else f"{self.filesystem.type_name}://{full.lstrip('/')}"

    def _full(self, relpath: str) -> str:
        """The full path of `relpath`; on a local disk, refused if it leads out of the root
        (`metadata.confine.check_confined`, the rule tables and exchanges use too)."""
        rel = check_relative(relpath)
        full = f"{self.job_path}/{rel}"
        if self._local:
            check_confined(self.job_path, rel, describe=self.describe)
        return full

    # -- jobs and listings -------------------------------------------------------------------

    @staticmethod
    def list_jobs(root: str, *, filesystem: pafs.FileSystem | None = None) -> list[str]:
        """Names of the job directories under `root`, sorted; raises if `root` does not exist."""
        filesystem, base = resolve_root(root, filesystem)
        try:
            infos = filesystem.get_file_info(pafs.FileSelector(base, recursive=False))
        except FileNotFoundError:
            raise JobSelectionError(
                f"checkpoint root {_redact(root)!r} does not exist; check the path"
            ) from None
        except NotADirectoryError:
            raise JobSelectionError(
                f"checkpoint root {_redact(root)!r} is a file, not a directory; check the path"
            ) from None
        except OSError as exc:  # unreachable or refused: the operation failed (exit 1)
            raise StorageError(
                f"checkpoint root {_redact(root)!r} cannot be listed: {exc}"
            ) from None
        dirs = (i for i in infos if i.type == pafs.FileType.Directory)
        return sorted(posixpath.basename(i.path) for i in dirs)

    @classmethod
    def open(
        cls, root: str, job_id: str | None = None, *, filesystem: pafs.FileSystem | None = None
    ) -> JobStorage:
        """The storage of `job_id`, or of the only job under `root` when `job_id` is None."""
        jobs = cls.list_jobs(root, filesystem=filesystem)
        if job_id is None:
            if len(jobs) == 1:
                return cls(root, jobs[0], filesystem=filesystem)
            if not jobs:
                raise JobSelectionError(f"checkpoint root {_redact(root)!r} holds no job")
            raise JobSelectionError(
                f"checkpoint root {_redact(root)!r} holds {len(jobs)} jobs "
                f"({', '.join(jobs)}); choose one with --job"
            )
        if job_id not in jobs:
            raise JobSelectionError(
                f"job {job_id!r} not found under {_redact(root)!r}; jobs there: "
                f"{', '.join(jobs) or 'none'}"
            )
        return cls(root, job_id, filesystem=filesystem)

    def check_job_root(self) -> None:
        """Refuse (`JobSelectionError`, exit 2) a job directory that holds entries but none of
        the layout's (`chk-<id>`, `events`, `_lease`, `shared`, `savepoints`): it is some other
        directory, e.g. `regional inspect /etc --job apt`. An empty one is a job not started."""
        try:
            infos = self.filesystem.get_file_info(
                pafs.FileSelector(self.job_path, recursive=False, allow_not_found=True)
            )
        except OSError as exc:
            raise StorageError(f"cannot list {self.describe('')}: {exc}") from None
        names = [posixpath.basename(i.path) for i in infos]
        if names and not any(n in _LAYOUT_DIRS or checkpoint_id_of(n) is not None for n in names):
            raise JobSelectionError(
                f"{self.describe('')} is not a regional job root: it holds none of chk-<id>/, "
                f"{', '.join(f'{d}/' for d in sorted(_LAYOUT_DIRS))}; check ROOT and --job"
            )

    def list_files(self) -> list[FileEntry]:
        """Every file under the job root, recursively, sorted by path (none if it is missing).

        On a local disk, symbolic links are not followed out of the root nor into directories:
        they are listed as entries with `link` set (`FileEntry`)."""
        if self._local:
            return self._list_local()
        selector = pafs.FileSelector(self.job_path, recursive=True, allow_not_found=True)
        cut = len(self.job_path) + 1
        entries = []
        for info in self.filesystem.get_file_info(selector):
            if info.type != pafs.FileType.File:
                continue
            mtime = info.mtime_ns
            entries.append(
                FileEntry(info.path[cut:], info.size, None if mtime is None else mtime // 1_000_000)
            )
        return sorted(entries, key=lambda e: e.path)

    def _list_local(self) -> list[FileEntry]:
        """`list_files` on a local disk, with `os.scandir`: links are reported, not followed
        (a link to a file inside the root is listed as that file)."""
        root = os.path.realpath(self.job_path)
        entries: list[FileEntry] = []
        todo = [""]
        while todo:
            rel = todo.pop()
            try:
                listing = os.scandir(f"{self.job_path}/{rel}" if rel else self.job_path)
            except (FileNotFoundError, NotADirectoryError):
                continue  # no job root yet, or removed since its parent was listed
            except OSError as exc:
                raise StorageError(f"cannot list {self.describe(rel)}: {exc}") from None
            with listing:
                for e in listing:
                    path = f"{rel}/{e.name}" if rel else e.name
                    try:
                        if e.is_symlink():
                            target = os.path.realpath(e.path)
                            inside = target == root or target.startswith(root + os.sep)
                            if inside and e.is_file():
                                st = e.stat()
                                entries.append(FileEntry(path, st.st_size, st.st_mtime_ns // 10**6))
                            else:
                                entries.append(FileEntry(path, 0, None, target, not inside))
                        elif e.is_dir(follow_symlinks=False):
                            todo.append(path)
                        elif e.is_file(follow_symlinks=False):
                            st = e.stat(follow_symlinks=False)
                            entries.append(FileEntry(path, st.st_size, st.st_mtime_ns // 10**6))
                    except FileNotFoundError:
                        continue  # deleted while listing
        return sorted(entries, key=lambda e: e.path)

    def list_dir(self, reldir: str) -> list[str]:
        """Paths (relative to the job root, sorted) of the files directly in `reldir`; none if
        it is missing. For small directories read often (the lease), not the whole root."""
        rel = check_relative(reldir)
        if self._local:  # entries may vanish while listed (temporary files): skip them
            try:
                with os.scandir(self._full(rel)) as listing:
                    names = []
                    for e in listing:
                        with contextlib.suppress(FileNotFoundError):
                            if e.is_file(follow_symlinks=False):
                                names.append(f"{rel}/{e.name}")
            except (FileNotFoundError, NotADirectoryError):
                return []
            except OSError as exc:
                raise StorageError(f"cannot list {self.describe(rel)}: {exc}") from None
            return sorted(names)
        selector = pafs.FileSelector(self._full(rel), recursive=False, allow_not_found=True)
        cut = len(self.job_path) + 1
        try:
            infos = self.filesystem.get_file_info(selector)
        except OSError as exc:
            raise StorageError(f"cannot list {self.describe(rel)}: {exc}") from None
        return sorted(i.path[cut:] for i in infos if i.type == pafs.FileType.File)

    def read_file(self, relpath: str, *, limit: int | None = None) -> bytes | None:
        """The bytes of the file at `relpath`, or None if there is none. With `limit`, a file
        larger than `limit` bytes is a `StorageError` (after reading `limit + 1` of them)."""
        try:
            with self.filesystem.open_input_stream(self._full(relpath)) as f:
                if limit is None:
                    return bytes(f.read())
                data = read_bounded(f, limit)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {self.describe(relpath)}: {exc}") from None
        if data is None:
            raise StorageError(
                f"{self.describe(relpath)} is larger than {byte_size(limit)}, more than such a "
                "file holds; it was replaced or damaged"
            )
        return data

    def list_checkpoint_ids(self, files: Sequence[FileEntry] | None = None) -> list[int]:
        """Ids of the checkpoints that have `chk-<id>/_metadata`, ascending."""
        files = self.list_files() if files is None else files
        ids = {
            cid
            for f in files
            if (cid := checkpoint_id_of(f.path)) is not None and f.path == metadata_path(cid)
        }
        return sorted(ids)

    # -- metadata ----------------------------------------------------------------------------

    def read_metadata(self, checkpoint_id: int) -> CheckpointMetadata:
        """Read and decode `chk-<id>/_metadata`; `MetadataError` naming the file if unusable."""
        rel = metadata_path(checkpoint_id)
        source = self.describe(rel)
        try:
            with self.filesystem.open_input_stream(self._full(rel)) as f:
                data = read_bounded(f, MAX_METADATA_FILE_BYTES)
        except FileNotFoundError:
            raise MetadataError(
                f"{source} does not exist: checkpoint {checkpoint_id} never completed or was "
                "cleaned"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot read {source}: {exc}") from None
        md = decode_metadata(_within_limit(data, source), source=source)
        if md.checkpoint_id != checkpoint_id:
            raise MetadataError(
                f"{source} holds checkpoint {md.checkpoint_id}, not {checkpoint_id}; the file "
                "was moved or tampered with"
            )
        return md

    def read_metadata_at(self, relpath: str) -> CheckpointMetadata:
        """Read and decode the metadata file at `relpath` (e.g. a savepoint's `_metadata`)."""
        source = self.describe(relpath)
        try:
            with self.filesystem.open_input_stream(self._full(relpath)) as f:
                data = read_bounded(f, MAX_METADATA_FILE_BYTES)
        except FileNotFoundError:
            raise MetadataError(f"{source} does not exist") from None
        except OSError as exc:
            raise StorageError(f"cannot read {source}: {exc}") from None
        return decode_metadata(_within_limit(data, source), source=source)

    def write_metadata(self, md: CheckpointMetadata, *, at: str | None = None) -> None:
        """Write `chk-<id>/_metadata` (or the file at `at`) atomically; refuses to overwrite an
        existing one.

        Call it only after every state file `md` references is durable (DESIGN §4 rule 10).
        """
        rel = at or metadata_path(md.checkpoint_id)
        data = encode_metadata(md)
        exists = (
            f"{self.describe(rel)} already exists; checkpoint {md.checkpoint_id} completed "
            "before, so its id must not be reused"
        )
        try:
            self._put_new(rel, data, exists=exists)
        except OSError as exc:
            raise StorageError(
                f"cannot write {self.describe(rel)}: {exc}; checkpoint {md.checkpoint_id} is "
                "not complete"
            ) from None

    def write_new_file(self, relpath: str, data: bytes) -> None:
        """Write `data` as a new file at `relpath`, appearing whole or not at all, like
        `_metadata` (see the module docstring); `StorageError` if it exists or the write fails.
        For small records that readers may list at any time (the event log)."""
        rel = check_relative(relpath)
        exists = f"{self.describe(rel)} already exists; it is never rewritten"
        try:
            self._put_new(rel, data, exists=exists)
        except OSError as exc:
            raise StorageError(f"cannot write {self.describe(rel)}: {exc}") from None

    def replace_file(self, relpath: str, data: bytes) -> None:
        """Write `data` at `relpath`, replacing any file there; it appears whole or not at all
        (a temporary file renamed over it on a local disk, one object elsewhere). For the
        lease's skip records (`metadata.lease`), which must exist whatever was there."""
        rel = check_relative(relpath)
        try:
            if self._local:
                final = self._full(rel)
                os.makedirs(os.path.dirname(final), exist_ok=True)
                tmp = f"{final}.tmp-{uuid.uuid4().hex}"
                try:
                    with open(tmp, "xb") as f:
                        f.write(data)
                        f.flush()
                        os.fsync(f.fileno())
                    os.replace(tmp, final)
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                _fsync_path(final)
            else:
                with self.filesystem.open_output_stream(self._full(rel)) as out:
                    out.write(data)
        except OSError as exc:
            raise StorageError(f"cannot write {self.describe(rel)}: {exc}") from None

    def create_new(self, relpath: str, data: bytes) -> bool:
        """Create the file at `relpath` holding `data` unless one exists: True if this call
        created it, False if it existed or another writer created it first. Atomic on every
        store (`metadata.exclusive`): of writers racing for one name, exactly one gets True.
        `StorageError` if the store fails."""
        rel = check_relative(relpath)
        full = self._full(rel)
        try:
            return create_exclusive(
                self.filesystem, full, data, conditional=self.conditional_writes
            )
        except OSError as exc:
            raise StorageError(f"cannot write {self.describe(rel)}: {exc}") from None

    def _put_new(self, rel: str, data: bytes, *, exists: str) -> None:
        """Write `data` as a new object at `rel`, appearing whole; `StorageError(exists)` if one
        is there. On S3 with conditional writes: one `PutObject` with `If-None-Match: *` (no
        HEAD, no LIST; the store refuses atomically). Otherwise a check (one HEAD on S3), then
        `_put_whole`; on a local disk the no-clobber link refuses too."""
        if not self._local and self.conditional_writes and self.filesystem.type_name == "s3":
            created = s3_put_if_absent(self.filesystem, self._full(rel), data)
            if created is not None:
                if not created:
                    raise StorageError(exists)
                return
        if self.exists(rel):
            raise StorageError(exists)
        self._put_whole(rel, data)

    def _put_whole(self, rel: str, data: bytes) -> None:
        """One object that appears whole or not at all: temp file + fsync + link on a local
        disk, a single PUT on object stores (never a rename there)."""
        if self._local:
            self._write_local_atomic(rel, data)
        else:
            with self.filesystem.open_output_stream(self._full(rel)) as out:
                out.write(data)

    def _write_local_atomic(self, rel: str, data: bytes) -> None:
        final = self._full(rel)
        directory = os.path.dirname(final)
        os.makedirs(directory, exist_ok=True)
        tmp = f"{final}.tmp-{uuid.uuid4().hex}"
        try:
            with open(tmp, "xb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, final)  # atomic and never replaces an existing file
            except FileExistsError:
                raise StorageError(
                    f"{final} already exists; a checkpoint id must not be reused"
                ) from None
            except OSError as exc:
                if exc.errno not in _NO_HARD_LINKS:
                    raise
                if os.path.exists(final):
                    raise StorageError(
                        f"{final} already exists; a checkpoint id must not be reused"
                    ) from None
                os.replace(tmp, final)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        dir_fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    # -- state files -------------------------------------------------------------------------

    def write_state_file(self, relpath: str, data: bytes) -> StateHandle:
        """Write one state file holding one segment; returns its handle (size and checksum)."""
        return self.write_segments(relpath, [data])[0]

    def write_segments(self, relpath: str, segments: Sequence[bytes]) -> list[StateHandle]:
        """Write `segments` back to back as one file; one handle per segment, in order.

        The size is checked after the write, and a local file is fsynced (with its directory),
        so a handle is only returned for a durable file.
        """
        rel = check_relative(relpath)
        total = sum(len(s) for s in segments)
        handles = []
        offset = 0
        try:
            if self._local:
                os.makedirs(os.path.dirname(self._full(rel)), exist_ok=True)
            with self.filesystem.open_output_stream(self._full(rel)) as out:
                for seg in segments:
                    out.write(seg)
                    handles.append(
                        StateHandle(
                            path=rel,
                            offset=offset,
                            length=len(seg),
                            size=total,
                            checksum=segment_checksum(seg),
                            shared=rel.startswith("shared/"),
                        )
                    )
                    offset += len(seg)
            if self._local:
                _fsync_path(self._full(rel))
        except OSError as exc:
            raise StorageError(f"cannot write state file {self.describe(rel)}: {exc}") from None
        written = self.file_size(rel)
        if written != total:
            raise StorageError(
                f"state file {self.describe(rel)} has {written} bytes after writing {total}; "
                "the upload did not complete"
            )
        return handles

    def read_segment(
        self,
        handle: StateHandle,
        *,
        checkpoint_id: int | None = None,
        whole_files: dict[str, bytes] | None = None,
    ) -> bytes:
        """The bytes of one segment, verified against the handle's size, length and checksum.

        `checkpoint_id` (the checkpoint whose metadata holds the handle) is named in errors.
        With `whole_files` (path -> bytes, filled here), the whole physical file is read once
        and later segments of it are sliced from memory: one read per merged file (DESIGN §4
        rule 16) instead of one per segment.
        """
        of = "" if checkpoint_id is None else f" of checkpoint {checkpoint_id}"
        try:
            rel = check_relative(handle.path)
        except StorageError as exc:
            raise StorageError(f"refusing a state handle{of}: {exc}") from None
        where = self.describe(rel) + of
        cached = None if whole_files is None else whole_files.get(rel)
        try:
            if cached is not None:
                size, data = len(cached), cached[handle.offset : handle.offset + handle.length]
                if size != handle.size:
                    raise StorageError(
                        f"state file {where} has {size} bytes, the metadata records "
                        f"{handle.size}; it was damaged or replaced"
                    )
            else:
                with self.filesystem.open_input_file(self._full(rel)) as f:
                    size = f.size()
                    if size != handle.size:
                        raise StorageError(
                            f"state file {where} has {size} bytes, the metadata records "
                            f"{handle.size}; it was damaged or replaced"
                        )
                    if whole_files is not None:
                        whole = whole_files[rel] = bytes(f.read_at(size, 0))
                        data = whole[handle.offset : handle.offset + handle.length]
                    else:
                        data = f.read_at(handle.length, handle.offset)
        except FileNotFoundError:
            raise StorageError(f"state file {where} is missing") from None
        except OSError as exc:
            raise StorageError(f"cannot read state file {where}: {exc}") from None
        if len(data) != handle.length:
            raise StorageError(
                f"state file {where}: segment at {handle.offset} has {len(data)} bytes, "
                f"expected {handle.length}"
            )
        if segment_checksum(data) != handle.checksum:
            raise StorageError(
                f"state file {where}: segment at {handle.offset}+{handle.length} fails its "
                "checksum; the file is corrupt"
            )
        return bytes(data)

    def exists(self, relpath: str) -> bool:
        """Whether a file exists at `relpath`."""
        return self.file_size(relpath) is not None

    def file_size(self, relpath: str) -> int | None:
        """The size of the file at `relpath`, or None if there is none.

        On S3 one HEAD: `open_input_file` (which only HEADs until read), not `get_file_info`,
        which follows a 404 with a LIST to tell a missing key from a "directory" (a key no
        file of ours ever is)."""
        full = self._full(relpath)
        try:
            if not self._local and self.filesystem.type_name == "s3":
                try:
                    with self.filesystem.open_input_file(full) as f:
                        return int(f.size())
                except FileNotFoundError:
                    return None
            info = self.filesystem.get_file_info(full)
        except OSError as exc:
            raise StorageError(f"cannot look up {self.describe(relpath)}: {exc}") from None
        return info.size if info.type == pafs.FileType.File else None

    def delete_file(self, relpath: str) -> bool:
        """Delete one file; False if it was already gone. Paths outside the root are refused.

        On a local file system an emptied `chk-<id>/` directory is removed too
        (`rmdir` only removes an empty directory, so a concurrent writer cannot lose a file);
        object stores have no directories to remove, and on S3 none is made either
        (`metadata.exclusive.s3_delete_object`: pyarrow would PUT a `chk-<id>/` object).
        """
        rel = check_relative(relpath)
        full = self._full(rel)
        try:
            if self.filesystem.type_name == "s3":  # a HEAD, then one DeleteObject
                if self.file_size(rel) is None:
                    return False
                if s3_delete_object(self.filesystem, full):
                    return True
            self.filesystem.delete_file(full)
        except FileNotFoundError:
            return False
        except OSError as exc:
            raise StorageError(f"cannot delete {self.describe(relpath)}: {exc}") from None
        cid = checkpoint_id_of(rel)
        parent = posixpath.dirname(rel)
        if self._local and cid is not None and parent == checkpoint_dir(cid):
            with contextlib.suppress(OSError):  # not empty (or already gone): keep it
                os.rmdir(os.path.dirname(full))
        return True

    # -- restore -----------------------------------------------------------------------------

    def verify_segments(
        self, md: CheckpointMetadata, verified: dict[StateHandle, str | None] | None = None
    ) -> list[Problem]:
        """Read every segment `md` references and check its length and checksum.

        `verified` caches outcomes across checkpoints (fallback handles repeat). Paths that are
        refused, missing or of the wrong size are left to `reference_problems`.
        """
        cache: dict[StateHandle, str | None] = {} if verified is None else verified
        problems = []
        for s in md.subtasks:
            for h in s.handles:
                if h not in cache:
                    cache[h] = self._segment_problem(h)
                problem = cache[h]
                if problem is not None:
                    problems.append(Problem(md.checkpoint_id, h.path, problem))
        return problems

    def _segment_problem(self, handle: StateHandle) -> str | None:
        try:
            check_relative(handle.path)
        except StorageError:
            return None  # refused: reported by reference_problems
        try:
            if self.file_size(handle.path) != handle.size:
                return None  # missing or resized: reported by reference_problems
            self.read_segment(handle)
        except OutsideRootError:
            return None  # through a link out of the root: reported by reference_problems
        except StorageError as exc:
            return str(exc)
        return None

    def find_restorable(self, *, verify_checksums: bool = False) -> RestoreSearch:
        """The newest checkpoint that decodes and whose referenced files all exist with their
        recorded sizes (and, with `verify_checksums`, whose segments match their checksums),
        and the newer ones skipped with their problems."""
        files = self.list_files()
        sizes = {f.path: f.size for f in files}
        links = links_of(files)
        skipped: list[Problem] = []
        for cid in reversed(self.list_checkpoint_ids(files)):
            try:
                md = self.read_metadata(cid)
            except (MetadataError, StorageError) as exc:
                skipped.append(Problem(cid, metadata_path(cid), str(exc)))
                continue
            problems = reference_problems(md, sizes, links)
            if verify_checksums and not problems:
                problems = self.verify_segments(md)
            if not problems:
                return RestoreSearch(md, tuple(skipped))
            skipped.extend(problems)
        return RestoreSearch(None, tuple(skipped))

    def find_latest_restorable(
        self, *, warn: bool = True, verify_checksums: bool = False
    ) -> CheckpointMetadata | None:
        """The newest restorable checkpoint (see `find_restorable`), or None.

        Skipping a newer checkpoint is loud: one `logging.warning` per problem when `warn`.
        """
        search = self.find_restorable(verify_checksums=verify_checksums)
        if warn:
            chosen = search.metadata.checkpoint_id if search.metadata else None
            for p in search.skipped:
                log.warning(
                    "checkpoint %d of job %s is not restorable (%s: %s); using %s instead",
                    p.checkpoint_id,
                    self.job_id,
                    p.path,
                    p.problem,
                    "no checkpoint" if chosen is None else f"checkpoint {chosen}",
                )
        return search.metadata


def _fsync_path(path: str) -> None:
    """Make a local file and its directory entry durable (an ack must not outlive a crash)."""
    for target, flags in ((path, os.O_RDONLY), (os.path.dirname(path), os.O_RDONLY)):
        fd = os.open(target, flags)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
