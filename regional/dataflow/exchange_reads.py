"""What the exchange readers of one task read once: the commit records and the directories proven
to stay inside the job root.

Every reader subtask of an exchange learns what was committed from the same commit records
(`metadata.commit_log`), and lists its own partition directory under the same parent. A task
runs many reader units (one per partition: 1,024 of them at 1,024 partitions): read per unit,
the records are listed and read and the partition directory is resolved through every link on
its path once per unit, which cost more than the rows a small epoch moves. Inside `task_reads()`
(a task's epoch, `regional.runtime.task.run_units`) the first reader of an exchange reads its
records and later readers reuse them, and a partition directory is proven confined from its
parent's proof (one `lstat`, `metadata.confine.ConfinedPaths`).

Reusing records read earlier in the task is exact: a reader lists its segments after the
records it uses were read (DESIGN §4 rule 14), so a segment a later commit published has no
record in them and ends the reader's list, as it would have a moment earlier; the reader reads
it in a later epoch. A reader whose cursor is older than the records read so far (a unit that
restored an older checkpoint) reads them again, from its own cursor. Outside `task_reads()` (the
driver: backlogs, rescale) every call reads afresh.

>>> from pyarrow import fs as pafs
>>> with task_reads() as reads:
...     records(pafs.LocalFileSystem(), "/nonexistent/exchange/x", since=3)
[]
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator
from os import DirEntry

from pyarrow import fs as pafs

from metadata.commit_log import IndexedRecord, RecordCache
from metadata.confine import ConfinedPaths, confined_entries

__all__ = ["TaskReads", "confined_listing", "records", "task_reads"]

#: The exchange commit records this process decoded (every reader subtask reads the same).
_DECODED = RecordCache()


class TaskReads:
    """The records and confined directories one task's readers share (`task_reads`)."""

    def __init__(self) -> None:
        #: by exchange directory: the cursor checkpoint read from, and the records since then
        self._records: dict[str, tuple[int, list[IndexedRecord]]] = {}
        #: by job root: the directories proven inside it
        self._confined: dict[tuple[str, str], ConfinedPaths] = {}

    def records(self, fs: pafs.FileSystem, directory: str, since: int) -> list[IndexedRecord]:
        key = f"{type(fs).__name__}:{directory}"
        kept = self._records.get(key)
        if kept is None or since < kept[0]:
            got = _DECODED.records(fs, directory, since=since)
            self._records[key] = (since, got)
            return got
        return [r for r in kept[1] if r.record.identifier >= since]

    def confined(self, root: str, what: str) -> ConfinedPaths:
        paths = self._confined.get((root, what))
        if paths is None:
            paths = self._confined[root, what] = ConfinedPaths(root, what=what)
        return paths


_TASK_READS: contextvars.ContextVar[TaskReads | None] = contextvars.ContextVar(
    "regional_exchange_task_reads", default=None
)


@contextlib.contextmanager
def task_reads() -> Iterator[TaskReads]:
    """Within: exchange readers in this thread share what they read (the module docstring).
    A thread started inside does not (a context variable): the driver's own reads never do."""
    reads = TaskReads()
    token = _TASK_READS.set(reads)
    try:
        yield reads
    finally:
        _TASK_READS.reset(token)


def records(fs: pafs.FileSystem, directory: str, *, since: int) -> list[IndexedRecord]:
    """The commit records of exchange `directory` with identifier >= `since`, by (identifier,
    user): read once per task inside `task_reads()`, decoded once per process
    (`metadata.commit_log.RecordCache`)."""
    reads = _TASK_READS.get()
    if reads is None:
        return _DECODED.records(fs, directory, since=since)
    return reads.records(fs, directory, since)


def confined_listing(
    root: str,
    rel: str,
    keep: Callable[[DirEntry[str]], bool],
    *,
    what: str,
    describe: Callable[[str], str],
) -> list[DirEntry[str]]:
    """`metadata.confine.confined_entries` of local directory `root/rel`; inside
    `task_reads()` the directory is proven confined from its parent (known for the task) and
    one `lstat`, instead of resolving every link on its path."""
    reads = _TASK_READS.get()
    if reads is None:
        return confined_entries(root, rel, keep, what=what, describe=describe)
    reads.confined(root, what).check_directory(rel, describe=describe)
    return confined_entries(root, rel, keep, what=what, describe=describe, checked=True)
