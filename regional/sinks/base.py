"""The one sink contract (DESIGN §4 rule 8): what a sink offers its writers in tasks and its
committer on the driver.

A **writer** (`SinkWriter`) runs in a task: `write` stages one epoch's batches of one sink
subtask and returns the committables naming what it staged (kept in the subtask's state and
handed to the commit coordinator with the unit's ack); `sync_staged` makes what it staged
durable once per task, before any ack naming it leaves; `discard` deletes what a declined or
aborted attempt staged. Everything a writer needs to know about the call is one `WriteContext`.

A **committer** (`TableCommitter`) runs on the driver: it commits a checkpoint's committables
atomically and idempotently under (commit user, identifier). Optional capabilities are their own
protocols, checked with `isinstance`: `TableRollback` (undo commits after an identifier),
`TableRollbackUsers` (undo several commit users' commits at once, for a table that rolls back
as a whole), `TableStaging` (clean staged files a crash orphaned), `TableRetention` (how long
the table keeps what its deduplication relies on).

Several sink vertices may write one table (the dead-letter sink of every part of the graph,
one sink object given to two `Stream.sink` calls, two sink objects on one location): each
vertex commits under its own commit user, and the driver cleans and rolls back per table
(`regional.runtime.restore`), so what one vertex staged or committed is never taken for
another's leftovers.

A writer that is also a `MergingWriter` stages one file per task and epoch for all the units
the task ran (`regional.sinks.merging`), instead of one per unit.

`Sink` is both sides in one object, which is what `Stream.sink` takes: `ParquetSink`,
`DeltaSink`, `IcebergSink`, `PaimonSink` and the keyed exchange's writer implement it.

>>> import tempfile
>>> import pyarrow as pa
>>> from regional.sinks.parquet import ParquetSink
>>> sink = ParquetSink(tempfile.mkdtemp())
>>> isinstance(sink, Sink)
True
>>> context = WriteContext(job_id="job", run_id="r1", checkpoint_id=1, attempt=0, unit_id=0,
...     vertex_id="out", index=0)
>>> committables = sink.write([pa.record_batch({"x": [1, 2]})], context)
>>> sink.commit("job-1", 1, committables); sink.latest_committed("job-1")
1
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import msgspec

from metadata.model import SinkRetention

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "MergingWriter",
    "ReadInsideSink",
    "Sink",
    "SinkWriter",
    "TableCommitter",
    "TableRetention",
    "TableRollback",
    "TableRollbackUsers",
    "TableStaging",
    "WatermarkSink",
    "WriteContext",
]


class WriteContext(msgspec.Struct, frozen=True, kw_only=True):
    """Who writes: sink subtask `index` of vertex `vertex_id`, in unit `unit_id`, staging for
    checkpoint `checkpoint_id` as attempt `attempt`, in job `job_id` and driver run `run_id`.
    Names of staged files are made from these, so two attempts never collide. `watermarks`:
    with event time, the subtask's watermark (ms) before and after the epoch (the keyed
    exchange commits them, DESIGN §4 rule 15; other sinks ignore them)."""

    job_id: str
    run_id: str
    checkpoint_id: int
    attempt: int
    unit_id: int
    vertex_id: str
    index: int
    watermarks: tuple[int, int] | None = None


@runtime_checkable
class SinkWriter(Protocol):
    """The task side of a sink."""

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Stage `batches` (one epoch of one sink subtask); the committables naming what was
        staged (none when there are no rows)."""
        ...

    def sync_staged(self) -> None:
        """Make everything this writer staged durable (called once per task, before the acks
        naming it leave); a no-op for sinks whose `write` is durable on return."""
        ...

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete what `committables` staged (a declined or aborted attempt); already gone is
        fine, and committables of other sinks' formats are skipped."""
        ...


@runtime_checkable
class MergingWriter(Protocol):
    """A writer that stages the rows of many units of one task in **one** data file per epoch
    (DESIGN §4 rule 16; `regional.sinks.merging`). A task hands it every unit's batches at
    once, after its last unit; each unit's committables name its part of the file, and the
    committer commits the file whole, or rewritten without the rows of units that are not in
    the commit (declared fallen back after staging)."""

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Stage the rows of every part (one sink subtask of one unit each, all of one task
        and epoch) as one file; per part, in order, its committables (none without rows)."""
        ...


@runtime_checkable
class WatermarkSink(Protocol):
    """A writer that commits its subtask's watermark with its rows, for a reader downstream (the
    keyed exchange's writer, DESIGN §4 rule 15): the task hands it the watermarks before and
    after the epoch (`WriteContext.watermarks`), the one before being what its restored
    committables commit (`committed_watermark`; None: none yet). Its rows stay inside the job
    (they are not counted as output)."""

    def committed_watermark(self, committables: Iterable[bytes]) -> int | None: ...


@runtime_checkable
class ReadInsideSink(Protocol):
    """A writer whose committed files the job itself reads and then no longer needs (the keyed
    exchange's writer): `published_paths` names, relative to the job root, the files a commit
    of `committables` published, so the cleaner deletes them once every reader is past them."""

    def published_paths(self, committables: Iterable[bytes]) -> list[str]: ...


@runtime_checkable
class TableCommitter(Protocol):
    """A table that commits committables atomically under (commit user, identifier).

    `commit` must be atomic and must refuse an identifier not greater than the user's latest;
    `fallback` (unit -> owner checkpoint of the units that fell back) is for the table's commit
    record. `latest_committed` is the highest identifier the user committed (None: nothing);
    every lower one is committed too, so it decides idempotency without reading the table's
    history. `missing_files` names the data files behind `committables` that no longer exist.
    """

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None: ...

    def latest_committed(self, commit_user: str) -> int | None: ...

    def missing_files(self, committables: Iterable[bytes]) -> list[str]: ...


@runtime_checkable
class Sink(SinkWriter, TableCommitter, Protocol):
    """A sink: its writers stage in tasks, its committer commits on the driver."""


@runtime_checkable
class TableRollback(Protocol):
    """A table that can undo a commit user's commits after an identifier (a restore from a
    checkpoint older than the table's latest commit, when newer checkpoints are damaged)."""

    def rollback(self, commit_user: str, identifier: int) -> list[int]: ...


@runtime_checkable
class TableRollbackUsers(Protocol):
    """A table that rolls back as a whole (to an earlier snapshot), so one commit user's
    commits cannot be undone while another user of the job committed after them:
    `rollback_users` undoes the commits after `identifier` of every user in `commit_users`
    (the job's sink vertices) in one step, and returns the identifiers undone per user."""

    def rollback_users(
        self, commit_users: Collection[str], identifier: int
    ) -> dict[str, list[int]]: ...


@runtime_checkable
class TableStaging(Protocol):
    """A table whose writers stage files a crash can orphan: `clean_staged` deletes job
    `job_id`'s staged files that no committable in `keep` names, and returns them. The driver
    calls it when it starts, before any task runs, with every committable of the job its
    restored checkpoint still names (a pending re-commit's files are among them), of every
    sink vertex: a table keeps those naming its files and skips the others."""

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]: ...


@runtime_checkable
class TableRetention(Protocol):
    """A table that says how long it keeps what its deduplication relies on (a commit marker,
    snapshots): recorded in every checkpoint (`CheckpointMetadata.sinks`, the vertex id left
    empty here) so `regional inspect ROOT validate` can warn without the pipeline."""

    def marker_retention(self) -> SinkRetention: ...
