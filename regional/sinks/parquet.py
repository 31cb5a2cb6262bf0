"""An exactly-once Parquet table sink that every Parquet reader reads correctly (DESIGN §4 rule
8, Paimon PIP-30).

Table directory layout (a local path or any `pyarrow.fs` URI):

```
<table>/part-<job>-<run>-c<checkpoint>-<vertex>-<subtask>-u<unit>-a<attempt>-<random>.parquet
                                          committed data files, published by the commit
<table>/_staging/<job>/<same name>.staged  staged by writers, invisible to readers
<table>/_commits/<commit-user>/<group>/<identifier>.json
                                          one record per commit, written last
```

A writer stages its epoch's rows as one file under `_staging/<job>/`, named by job, driver run,
checkpoint, subtask, unit and attempt, and returns a committable naming it (kept in its subtask
state and handed over with the ack). Readers never see staged files: Spark and pyarrow skip
paths starting with `_` or `.`, and a staged file does not end in `.parquet`, so DuckDB's
``read_parquet('<table>/**/*.parquet')`` (whose `**` does enter `_staging/`) skips it too.

The commit coordinator commits a checkpoint by *publishing* its staged files into the table
directory under their final names (a rename on a local disk; copy + delete on object stores,
`pyarrow.fs.FileSystem.move`), then writing the commit record last. Publishing is idempotent: a
file already published is not published again, so a re-commit after a crash never duplicates.
Between the first publish and the record, a reader of the bare path may see part of that
checkpoint's rows (never a row twice); a restarted driver always completes the commit.
`read_table` reads exactly the files the records list.

Staging, publishing and the commit log are `regional.sinks.staging.StagingArea`'s, which the
keyed exchange's writer shares: commit records grouped by 1,000 identifiers, the latest
identifier kept in memory, commits idempotent per (commit user, identifier) and in identifier
order, and every name read back checked before it is joined into a path.

`read_table(path)` (also `regional.read_table`) reads only committed rows; so do
``spark.read.parquet(path)``, ``pyarrow.dataset.dataset(path, format="parquet")`` and DuckDB's
``read_parquet('<path>/**/*.parquet')``.

>>> import tempfile
>>> import pyarrow as pa
>>> sink = ParquetSink(tempfile.mkdtemp())
>>> from regional.sinks.base import WriteContext
>>> c = sink.write([pa.record_batch({"x": [1, 2]})], WriteContext(job_id="job", run_id="r1",
...     checkpoint_id=1, attempt=0, unit_id=0, vertex_id="out", index=0))
>>> read_table(sink.path).num_rows
0
>>> sink.commit("job-1", 1, c); read_table(sink.path).column("x").to_pylist()
[1, 2]
>>> sink.latest_committed("job-1"), sink.latest_committed("job-2")
(1, None)
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs

from metadata.model import SinkRetention
from regional.errors import CommitError
from regional.sinks.base import WriteContext
from regional.sinks.staging import (
    COMMIT_GROUP,
    StagedSink,
    StagingArea,
    open_location,
    published_in_directory,
)

__all__ = [
    "COMMIT_GROUP",
    "ParquetSink",
    "committed_files",
    "read_committed",
    "read_table",
]

_UNSAFE = re.compile(r"[^A-Za-z0-9_.=-]")


def _committed(path: str) -> tuple[list[str], StagingArea, dict[str, int]]:
    """The table's committed data files (relative), in commit order, its staging area and each
    commit user's latest commit identifier (from the same read of the records). A committed
    file that is gone is a `CommitError` naming the commit and the file."""
    area = StagingArea.at(path, f"table {path}")
    fs, base = area.location()
    records = area.records()
    latest = {r.commit_user: r.identifier for r in records}  # sorted by user, identifier
    listed = [(r, f) for r in records for f in r.files]
    infos = fs.get_file_info([f"{base}/{f}" for _, f in listed]) if listed else []
    lost = [(r, f) for (r, f), i in zip(listed, infos, strict=True) if not i.is_file]
    if lost:
        shown = "; ".join(
            f"commit {r.identifier} of user {r.commit_user!r} lost {f}" for r, f in lost[:3]
        )
        more = f" (and {len(lost) - 3} more)" if len(lost) > 3 else ""
        raise CommitError(
            f"table {path}: {shown}{more}; restore the data files from a backup (the commit "
            "records say which rows the table holds, so without them it cannot be read whole)"
        )
    return [f for _, f in listed], area, latest


def committed_files(path: str) -> list[str]:
    """Full paths (or URIs) of the committed data files of the table at `path`."""
    prefix = path.rstrip("/") if "://" not in path else path.split("?")[0].rstrip("/")
    return [f"{prefix}/{f}" for f in _committed(path)[0]]


def read_table(path: str) -> pa.Table:
    """Every committed row of the Parquet table at `path`, in commit order."""
    return read_committed(path)[0]


def read_committed(
    path: str, *, columns: Sequence[str] | None = None
) -> tuple[pa.Table, dict[str, int]]:
    """The committed rows of the Parquet table at `path` (only `columns` when given, read from
    the files' column chunks alone) and its version: each commit user's latest committed
    identifier, from the same read of the commit records as the rows."""
    committed, area, latest = _committed(path)
    fs, base = area.location()
    if not committed:
        return pa.table({}), latest
    names = None if columns is None else list(columns)
    return pa.concat_tables(
        [pq.read_table(f"{base}/{f}", filesystem=fs, columns=names) for f in committed],
        promote_options="default",
    ), latest


def _stem(c: WriteContext) -> str:
    """The stem of a staged file of `c` (`part-` first: a job id may start with `_` or `.`)."""
    return _UNSAFE.sub(
        "_",
        f"part-{c.job_id}-{c.run_id}-c{c.checkpoint_id}-{c.vertex_id}-{c.index}-"
        f"u{c.unit_id}-a{c.attempt}-{uuid.uuid4().hex[:8]}",
    )


class ParquetSink(StagedSink):
    """A Parquet table at `path`: writers stage files, the commit coordinator publishes them
    (`regional.sinks.base.Sink`).

    `filesystem` overrides the file system `path` implies (then `path` is a path in it)."""

    def __init__(self, path: str, *, filesystem: pafs.FileSystem | None = None) -> None:
        self.path = path
        self._filesystem = filesystem
        self.area = StagingArea(f"table {path}", self._open, published=published_in_directory)

    def _open(self) -> tuple[pafs.FileSystem, str]:
        if self._filesystem is not None:
            return self._filesystem, self.path.rstrip("/")
        return open_location(self.path)

    # --- writer side (in tasks): regional.sinks.base.SinkWriter -----------------------------

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Stage `batches` as one file under `_staging/<job_id>/`; its committable (none if
        there are no rows)."""
        batches = [b for b in batches if b.num_rows]
        if not batches:
            return ()
        table = (
            pa.Table.from_batches(batches)
            if len(batches) == 1
            else pa.concat_tables(
                [pa.Table.from_batches([b]) for b in batches], promote_options="default"
            )
        )
        return (self.area.stage(context.job_id, _stem(context), table),)

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Stage the rows of every part (the units of one task and epoch) as one file under
        `_staging/<job_id>/`, named after the first part; per part, its committables
        (`regional.sinks.base.MergingWriter`)."""
        if not parts:
            return []
        first = parts[0][0]
        return self.area.stage_parts(first.job_id, _stem(first), [b for _, b in parts])

    # --- committer side (on the driver): besides `StagedSink`'s ----------------------------

    def marker_retention(self) -> SinkRetention:
        """Commit records are kept until someone deletes them: no retention to warn about
        (`regional.sinks.base.TableRetention`)."""
        return SinkRetention("", "parquet", self.path)

    def rollback(self, commit_user: str, identifier: int) -> list[int]:
        """Undo `commit_user`'s commits after `identifier`, newest first
        (`regional.sinks.base.TableRollback`)."""
        return self.area.rollback(commit_user, identifier)
