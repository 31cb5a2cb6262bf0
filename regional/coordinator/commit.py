"""Exactly-once commits through a coordinator (DESIGN §4 rule 8, Paimon PIP-30).

Sink writers keep their committables in their own subtask state and hand them over with the
unit's ack. Once checkpoint Y's metadata is durable, the `CommitCoordinator` of the sink queues
the committables of Y's *fresh* sink subtasks under commit identifier Y. Commits leave the queue
strictly in order, one at a time: a failed commit is retried and blocks later ones. The queue of
not yet confirmed commits is the coordinator's snapshot, so a restore re-commits them, then the
restored checkpoint's own committables; `perform_commit` skips identifiers up to the latest the
table holds for the job's commit user and refuses a re-commit whose data files are gone.

A table offers the committer side of the sink contract (`regional.sinks.base.TableCommitter`:
the Parquet sink, `InMemoryTableSink`, ...). A commit user's commits are strictly ordered, so a
table answers "what is committed" with one number, `latest_committed`, and need not read its
history.

>>> c = CommitCoordinator("sink", commit_user="job-1")
>>> c.checkpoint_complete(3, (b"f1", b"f2"))
>>> c.next_commit()
Commit(checkpoint_id=3, vertex_id='sink', commit_user='job-1', committables=(b'f1', b'f2'), \
recommit=False, fallback={})
>>> c.commit_succeeded(3); c.next_commit() is None
True
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Mapping

import msgspec

from metadata.format import DECODE_FAILURES
from metadata.layout import name_problem
from metadata.model import SinkRetention, SubtaskState
from regional.coordinator.decisions import Commit
from regional.coordinator.operator_coordinator import RegionalCompletion
from regional.errors import CommitError, MetadataError
from regional.sinks.base import TableCommitter, TableRetention

__all__ = ["CommitCoordinator", "perform_commit", "sink_retention"]


def sink_retention(sinks: Mapping[str, object]) -> tuple[SinkRetention, ...]:
    """The retention of every sink (vertex id -> sink) that reports one (`TableRetention`).
    Best effort: a table that cannot be read now is left out, with a warning in the log."""
    out = []
    for vertex_id, sink in sinks.items():
        if not isinstance(sink, TableRetention):
            continue
        try:
            retention = sink.marker_retention()
        except Exception as exc:
            logging.getLogger(__name__).warning(
                "sink %r: its table's retention is not recorded in checkpoints (%s: %s)",
                vertex_id,
                type(exc).__name__,
                exc,
            )
            continue
        out.append(msgspec.structs.replace(retention, vertex_id=vertex_id))
    return tuple(out)


def perform_commit(commit: Commit, table: TableCommitter) -> bool:
    """Carry out `commit` on `table` idempotently; False if it was already committed.

    Raises `CommitError` when a re-commit after restore names data files that are missing.
    """
    latest = table.latest_committed(commit.commit_user)
    if latest is not None and commit.checkpoint_id <= latest:
        return False
    if commit.recommit and (missing := table.missing_files(commit.committables)):
        raise CommitError(
            f"cannot re-commit checkpoint {commit.checkpoint_id} of sink {commit.vertex_id!r}: "
            f"data file(s) {', '.join(missing[:5])} are missing (were they cleaned?); restore "
            "from a newer checkpoint or restore the files"
        )
    table.commit(
        commit.commit_user, commit.checkpoint_id, commit.committables, fallback=commit.fallback
    )
    return True


class _State(msgspec.Struct, array_like=True):
    commit_user: str
    pending: list[tuple[int, list[bytes]]]
    fallback: dict[int, dict[int, int]] = {}  # checkpoint -> unit -> owner (if any fell back)


class CommitCoordinator:
    """The operator coordinator of sink vertex `vertex_id`: orders and retries its commits."""

    def __init__(self, vertex_id: str, commit_user: str) -> None:
        self._vertex_id = vertex_id
        if (problem := name_problem(commit_user)) is not None:
            raise CommitError(
                f"sink {vertex_id!r}: commit user {commit_user!r} cannot name a directory "
                f"({problem}); it is made of the job id, the run id and the sink's name: name "
                "the sink without slashes"
            )
        self.commit_user = commit_user
        self._queue: deque[Commit] = deque()
        self._in_flight = False

    @property
    def vertex_id(self) -> str:
        return self._vertex_id

    @property
    def pending(self) -> tuple[Commit, ...]:
        """The commits waiting to be committed (or being committed), oldest first."""
        return tuple(self._queue)

    @property
    def queued(self) -> tuple[int, ...]:
        """Identifiers waiting to be committed (or being committed), oldest first."""
        return tuple(c.checkpoint_id for c in self._queue)

    def checkpoint_complete(
        self,
        checkpoint_id: int,
        committables: tuple[bytes, ...],
        *,
        recommit: bool = False,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Queue checkpoint `checkpoint_id`'s committables (its metadata is durable); `fallback`:
        unit -> owner checkpoint of the units that fell back in it."""
        if self._queue and checkpoint_id <= self._queue[-1].checkpoint_id:
            raise CommitError(
                f"sink {self._vertex_id!r}: checkpoint {checkpoint_id} queued after "
                f"{self._queue[-1].checkpoint_id}; commits must be in checkpoint order"
            )
        if committables:
            self._queue.append(
                Commit(
                    checkpoint_id,
                    self._vertex_id,
                    self.commit_user,
                    committables,
                    recommit,
                    dict(fallback or {}),
                )
            )

    def next_commit(self) -> Commit | None:
        """The oldest queued commit if none is in flight (it is then in flight), else None."""
        if self._in_flight or not self._queue:
            return None
        self._in_flight = True
        return self._queue[0]

    def commit_succeeded(self, checkpoint_id: int) -> None:
        self._expect_head(checkpoint_id)
        self._queue.popleft()
        self._in_flight = False

    def commit_failed(self, checkpoint_id: int) -> None:
        """The commit stays at the head of the queue and is handed out again (retry)."""
        self._expect_head(checkpoint_id)
        self._in_flight = False

    def _expect_head(self, checkpoint_id: int) -> None:
        if not self._in_flight or self._queue[0].checkpoint_id != checkpoint_id:
            raise CommitError(
                f"sink {self._vertex_id!r}: no commit of checkpoint {checkpoint_id} is in flight"
            )

    # --- operator coordinator -------------------------------------------------------------

    def snapshot(self, checkpoint_id: int) -> bytes:
        pending = [(c.checkpoint_id, list(c.committables)) for c in self._queue]
        fallback = {c.checkpoint_id: c.fallback for c in self._queue if c.fallback}
        return msgspec.msgpack.encode(_State(self.commit_user, pending, fallback))

    def snapshot_for_fallback(self, checkpoint_id: int, fallback: Mapping[int, int]) -> bytes:
        return self.snapshot(checkpoint_id)

    def check_fallback(self, state: SubtaskState, owner: int) -> str | None:
        return None

    def restore(self, data: bytes) -> None:
        """Reload the commit user and queue the pending commits again, as re-commits.

        `MetadataError` if the snapshot does not decode or its commit user is not a plain name
        (tables join it into paths: a tampered one would commit outside the table)."""
        try:
            state = msgspec.msgpack.decode(data, type=_State)
        except DECODE_FAILURES as exc:
            raise MetadataError(
                f"the checkpointed snapshot of sink {self._vertex_id!r}'s commit coordinator "
                f"does not decode ({exc}); the checkpoint is damaged, restore another one"
            ) from None
        if (problem := name_problem(state.commit_user)) is not None:
            raise MetadataError(
                f"the checkpointed snapshot of sink {self._vertex_id!r}'s commit coordinator "
                f"has commit user {state.commit_user!r} ({problem}); a commit user names a "
                "directory of the table, so the checkpoint was tampered with: restore another "
                "one"
            )
        self.commit_user = state.commit_user
        self._in_flight = False
        self._queue = deque(
            Commit(i, self._vertex_id, state.commit_user, tuple(c), True, state.fallback.get(i, {}))
            for i, c in state.pending
        )

    def notify_complete(self, checkpoint_id: int) -> None:
        return None

    def notify_regional_complete(self, checkpoint_id: int, info: RegionalCompletion) -> None:
        return None

    def notify_aborted(self, checkpoint_id: int, reset: Mapping[int, int]) -> None:
        return None
