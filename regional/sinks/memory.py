"""`InMemoryTableSink`: the reference sink (`regional.sinks.base.Sink`), kept in memory, for tests
and simulation.

Writers `stage` rows as a data file and get a committable naming it; `commit` makes the files'
rows visible atomically, in identifier order per commit user; `discard` deletes staged files of
failed attempts; `delete_file` stands in for a cleaned data file.

>>> sink = InMemoryTableSink()
>>> c = sink.stage("chk-1/u0-1.data", [("a", 1)])
>>> sink.commit("job", 1, [c]); sink.rows(), sink.latest_committed("job")
([('a', 1)], 1)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from regional.errors import CommitError
from regional.sinks.base import WriteContext

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = ["InMemoryTableSink"]


class InMemoryTableSink:
    """A table in memory: staged data files, and a commit log of (user, identifier, files)."""

    def __init__(self) -> None:
        self.files: dict[str, tuple[Any, ...]] = {}
        self.log: list[tuple[str, int, tuple[str, ...]]] = []
        self.fallback: dict[tuple[str, int], dict[int, int]] = {}  # the commits' fallback units
        self._latest: dict[str, int] = {}
        self.fail_next_commits = 0  # make the next N commits fail (tests)

    def stage(self, path: str, rows: Iterable[Any]) -> bytes:
        """Write a data file of `rows`; its committable is the path."""
        self.files[path] = tuple(rows)
        return path.encode()

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Stage `batches` as one data file named by checkpoint, unit, subtask and attempt
        (`regional.sinks.base.SinkWriter`); none when there are no rows."""
        rows = [row for b in batches for row in b.to_pylist()]
        if not rows:
            return ()
        c = context
        path = f"chk-{c.checkpoint_id}/u{c.unit_id}-{c.vertex_id}-{c.index}-a{c.attempt}.data"
        return (self.stage(path, rows),)

    def sync_staged(self) -> None:
        """Nothing to do: the table lives in memory."""

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete the staged files behind `committables` (already gone is fine)."""
        for c in committables:
            self.files.pop(c.decode(), None)

    def delete_file(self, path: str) -> None:
        del self.files[path]

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        latest = self._latest.get(commit_user, 0)
        if identifier <= latest:
            raise CommitError(
                f"commit {identifier} of user {commit_user!r} is not after its latest commit "
                f"{latest}; commits must be in checkpoint order"
            )
        paths = tuple(c.decode() for c in committables)
        if missing := [p for p in paths if p not in self.files]:
            raise CommitError(f"commit {identifier}: data files missing: {', '.join(missing)}")
        if self.fail_next_commits:
            self.fail_next_commits -= 1
            raise CommitError(f"commit {identifier} of user {commit_user!r} failed (injected)")
        self.log.append((commit_user, identifier, paths))
        self.fallback[commit_user, identifier] = dict(fallback or {})
        self._latest[commit_user] = identifier

    def latest_committed(self, commit_user: str) -> int | None:
        return self._latest.get(commit_user) or None

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        return [c.decode() for c in committables if c.decode() not in self.files]

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo `commit_user`'s commits after `identifier`; returns the identifiers undone."""
        undone = [i for u, i, _ in self.log if u == commit_user and i > identifier]
        self.log = [e for e in self.log if not (e[0] == commit_user and e[1] > identifier)]
        kept = [i for u, i, _ in self.log if u == commit_user]
        self._latest[commit_user] = max(kept, default=0)
        return undone

    def rows(self) -> list[Any]:
        """Every committed row, in commit order."""
        return [row for _, _, paths in self.log for p in paths for row in self.files[p]]
