"""The table-sink template (DESIGN §4 rules 8 and 16): what every table format's sink does the
same way, so that a format (`DeltaSink`, `IcebergSink`, `PaimonSink`) keeps only what is its
own: where its data files are, how it commits them atomically under (commit user, identifier)
and how it reads back what a commit user committed.

A `TableSink` is a `regional.sinks.base.Sink`, a `MergingWriter` and a `TableRetention`. For
every format it does

* **staging** (`write`, `write_merged`): the records are fitted to the table's columns and
  written as one data file per sink subtask and epoch, or, with merging, one per task and epoch
  whose committables each name one unit's rows of it (`regional.sinks.merging.FilePart`);
* **committables**: one typed Struct per format (`TableCommittable`), versioned, decoded once
  per call (`decode`); one written by a newer regional is refused, naming the sink and the
  version, with "upgrade regional" (`check_version`);
* **discard**: a declined attempt's data files are deleted, a merged file once every part of it
  is (`regional.sinks.merging.DiscardedParts`); committables of other sinks and other tables
  are skipped (`own`);
* **the frame of a commit** (`commit`): identifiers in order, every data file present
  (`missing_files`), and the **cut-out**: a merged file of which the commit holds only some
  parts (a unit declared fallen back after staging) is rewritten with just their rows under a
  name the kept rows decide (`kept_stem`: a retried commit writes the same file), committed,
  and the merged file deleted afterwards;
* **retention** (`marker_retention`): how long the table keeps what its deduplication relies on.

The format supplies the hooks: its committable Struct (`committable`), its table's identity and
columns (`_other_table`, `_schema`), where a committable's data files are and how they
are found, written and deleted (`_paths`, `_path`, `_exist`, `_stage`, `_delete`), and the
commit itself (`_publish`: its own backstops, the cut-out's rewrite, the atomic commit), with
`latest_committed` and `read`. Committables stay `bytes` in the contract: checkpoints store them
as the writer encoded them. (The shape follows quix-streams' `BatchingSink` template and Flink's
sink2 `SinkWriter`/`Committer` with versioned committable serializers.)

>>> class Example(msgspec.Struct, frozen=True, array_like=True):  # a format's committable
...     file: str
...     rows: int
...     first_row: int = 0
...     file_rows: int = -1
...     version: int = COMMITTABLE_VERSION
>>> committable = Example("f.parquet", rows=2, first_row=4, file_rows=9)
>>> part_of(committable), committable.version
(FilePart(first_row=4, rows=2, file_rows=9), 1)
>>> check_version(msgspec.structs.replace(committable, version=7), "table t")
Traceback (most recent call last):
...
regional.errors.CommitError: table t: a committable was written by a newer regional \
(committable version 7; this one reads versions up to 1); upgrade regional to commit it
"""

from __future__ import annotations

import importlib
import json
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import msgspec
import pyarrow as pa

from metadata.format import DECODE_FAILURES
from metadata.model import SinkRetention
from regional.errors import CommitError, SinkError
from regional.sinks.base import WriteContext
from regional.sinks.merging import DiscardedParts, FilePart, commit_plan, kept_stem, merged_table

__all__ = [
    "COMMITTABLE_VERSION",
    "Planned",
    "TableCommittable",
    "TableSink",
    "check_version",
    "fallback_json",
    "part_of",
    "require",
]

#: The committable version this regional writes and the newest it reads. Committables written
#: before committables had a version decode as version 1.
COMMITTABLE_VERSION = 1

Ranges = tuple[tuple[int, int], ...]


class TableCommittable(Protocol):
    """What the template reads of a format's committable: a frozen, array-like msgspec Struct
    whose format's own fields come first, then `first_row` and `file_rows` (its part of a
    merged file: `rows` from `first_row` of the file's `file_rows`; -1 for a whole file), then
    `version` (absent, so 1, in committables written before it existed). The array layout is
    the compatibility contract: a later version keeps every field before `version` in its place
    and adds its own after it, so every version decodes far enough to read its version."""

    @property
    def rows(self) -> int: ...

    @property
    def first_row(self) -> int: ...

    @property
    def file_rows(self) -> int: ...

    @property
    def version(self) -> int: ...


C = TypeVar("C", bound=TableCommittable)


def part_of(committable: TableCommittable) -> FilePart | None:
    """The committable's part of a merged file, or None when it names a whole file."""
    c = committable
    return None if c.file_rows < 0 else FilePart(c.first_row, c.rows, c.file_rows)


def check_version(committable: C, describe: str) -> C:
    """`committable`, unless a newer regional wrote it: then a `CommitError` naming the sink
    (`describe`) and the version (nothing is committed or deleted with it)."""
    if committable.version > COMMITTABLE_VERSION:
        raise CommitError(
            f"{describe}: a committable was written by a newer regional (committable version "
            f"{committable.version}; this one reads versions up to {COMMITTABLE_VERSION}); "
            "upgrade regional to commit it"
        )
    return committable


def fallback_json(fallback: Mapping[int, int] | None) -> str:
    """The units that fell back (unit -> owner checkpoint) as a commit records them: a compact
    JSON object, by unit."""
    return json.dumps(
        {str(u): o for u, o in sorted((fallback or {}).items())}, separators=(",", ":")
    )


def require(package: str, sink: str, extra: str) -> Any:
    """The optional `package` a format's sink needs (imported on first use), or a `SinkError`
    saying which extra installs it."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        raise SinkError(
            f"the {sink} sink needs the {package.split('.')[0]} package ({exc}): "
            f"pip install 'regional-checkpoints[{extra}]'"
        ) from exc


@dataclass(frozen=True)
class Planned(Generic[C]):
    """One staged data file a commit commits: `item` is its committable (the first part of a
    merged file), `keep` the ranges of its rows the commit keeps (None: the whole file) and
    `kept` the name of the cut-out holding them (None: whole, or named by the format's own
    writer). `sources` are the data files `item` names (full paths), `gone` those of them not
    there, and `kept_here` whether the cut-out is there instead (a retry after the commit
    deleted its merged file)."""

    item: C
    keep: Ranges | None
    kept: str | None
    sources: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    kept_here: bool = False

    @property
    def missing(self) -> list[str]:
        """The data files this commit needs that are neither there nor replaced by the cut-out."""
        return [] if self.kept_here else self.gone


class TableSink(Generic[C]):
    """The template of a table format's sink (see the module's docstring for what it does and
    which hooks a format supplies)."""

    #: The format's committable Struct.
    committable: type[C]
    #: The format's name in the retention recorded in checkpoints (`marker_retention`).
    kind: str
    #: The attributes shipped to tasks: the configuration, never table objects or caches.
    shipped: tuple[str, ...]

    def __init__(self) -> None:
        self._forget()

    def __getstate__(self) -> dict[str, Any]:
        """Ship only the configuration (`shipped`) to tasks."""
        return {name: getattr(self, name) for name in self.shipped}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """A writer unpickled in a task: its configuration, nothing read or discarded yet."""
        self.__dict__.update(state)
        self._forget()

    def _forget(self) -> None:
        """Start without table objects and caches (a new sink, or one unpickled in a task)."""
        self._discarded = DiscardedParts()  # parts of merged files discarded so far

    # --- hooks of the format ------------------------------------------------------------------

    @property
    def describe(self) -> str:
        """The table in errors (``Delta table /data/t``, ``Iceberg table 'db.t'``)."""
        raise NotImplementedError

    def _other_table(self, committable: C) -> str | None:
        """The table `committable` was written for (as it records it) when that is not this
        one; None when it is."""
        raise NotImplementedError

    def _schema(self) -> pa.Schema:
        """The table's columns as Arrow (records are fitted to them)."""
        raise NotImplementedError

    def _stage(self, rows: pa.Table, context: WriteContext) -> list[C]:
        """Write `rows` (fitted) as data named after `context`; the committables of what was
        written, whole (one data file, or, for a format that writes several, one per commit
        message), at `COMMITTABLE_VERSION`."""
        raise NotImplementedError

    def _name(self, committable: C) -> str:
        """The data file `committable` names, as its committables name it (for errors)."""
        raise NotImplementedError

    def _key(self, committable: C) -> str:
        """What identifies the staged data `committable` names (all parts of a merged file
        share it)."""
        return self._name(committable)

    def _path(self, name: str) -> str:
        """The full path of data file `name` (as committables name files); a name that would
        leave the table is a `CommitError`."""
        raise NotImplementedError

    def _paths(self, committable: C) -> list[str]:
        """The full paths of the data files `committable` names."""
        return [self._path(self._name(committable))]

    def _kept_name(self, committable: C, keep: Ranges) -> str | None:
        """The name of the cut-out of `committable`'s merged file keeping `keep`: next to it,
        ``<stem>-k<kept ranges>.parquet`` (None: the format names it when it writes it)."""
        name = self._name(committable)
        stem = kept_stem(posixpath.basename(name).removesuffix(".parquet"), keep)
        return posixpath.join(posixpath.dirname(name), f"{stem}.parquet")

    def _checked(self, committable: C) -> C:
        """`committable`, or a `CommitError` if what it names has no place in the table."""
        return committable

    def _exist(self, paths: Sequence[str]) -> list[bool]:
        """For each full path, whether a file is there."""
        raise NotImplementedError

    def _delete(self, paths: Sequence[str]) -> None:
        """Delete the files at `paths` (already gone is fine)."""
        raise NotImplementedError

    def _merges(self) -> bool:
        """Whether `write_merged` writes the units of a task as one data file (else each unit
        on its own, as `write` does)."""
        return True

    def _latest_before_commit(self, commit_user: str) -> int | None:
        """The latest identifier of `commit_user`, as the commit that follows checks it."""
        return self.latest_committed(commit_user)

    def _publish(
        self,
        commit_user: str,
        identifier: int,
        plan: Sequence[Planned[C]],
        latest: int | None,
        fallback: str,
    ) -> None:
        """Commit `plan` (every data file present, see `Planned`) atomically as `commit_user`'s
        `identifier` (`latest`: its latest before; `fallback`: `fallback_json`), writing the
        cut-outs first. The merged files cut out are deleted afterwards by the template."""
        raise NotImplementedError

    @property
    def location(self) -> str:
        """Where the table is, as recorded with its retention."""
        raise NotImplementedError

    def _retention(self) -> tuple[str, int | None]:
        """The table property bounding how long its commit markers live, and its value (ms;
        None when not set: kept forever, or until someone deletes them)."""
        raise NotImplementedError

    def latest_committed(self, commit_user: str) -> int | None:
        """The highest identifier `commit_user` committed, or None
        (`regional.sinks.base.TableCommitter`)."""
        raise NotImplementedError

    # --- committables -------------------------------------------------------------------------

    def decode(self, committables: Iterable[bytes]) -> list[C]:
        """Every committable decoded, of this table and a version this regional reads; a
        `CommitError` naming the sink otherwise (they come from checkpoint state)."""
        out = []
        for raw in committables:
            try:
                c = msgspec.msgpack.decode(raw, type=self.committable)
            except DECODE_FAILURES as exc:
                raise CommitError(
                    f"{self.describe}: a committable does not decode as a {self.kind} "
                    f"committable ({exc}); was the sink of this vertex changed since the "
                    "checkpoint was taken?"
                ) from None
            if (table := self._other_table(c)) is not None:
                raise CommitError(
                    f"{self.describe}: a committable was written for another table ({table}); "
                    "was the sink's table changed since the checkpoint was taken? Restore with "
                    "the original table"
                )
            out.append(self._checked(check_version(c, self.describe)))
        return out

    def own(self, committables: Iterable[bytes]) -> list[C]:
        """The committables of this table, decoded; those of other sinks and tables are
        skipped (a defence: the runtime hands a sink only its own)."""
        out = []
        for raw in committables:
            try:
                c = msgspec.msgpack.decode(raw, type=self.committable)
            except DECODE_FAILURES:
                continue
            if self._other_table(c) is None:
                out.append(self._checked(check_version(c, self.describe)))
        return out

    # --- writer side (in tasks): regional.sinks.base.SinkWriter, MergingWriter ----------------

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Write `batches` as one data file of the table, named after `context`; its
        committables (none if there are no rows). Nothing is visible until the driver commits."""
        rows = [b for b in batches if b.num_rows]
        if not rows:
            return ()
        return tuple(msgspec.msgpack.encode(c) for c in self._stage(self._fit(rows), context))

    def write_merged(
        self, parts: Sequence[tuple[WriteContext, Sequence[pa.RecordBatch]]]
    ) -> list[tuple[bytes, ...]]:
        """Write the rows of every part (the units of one task and epoch) as one data file,
        named after the first part; per part, its committable naming its rows of the file
        (none for a part without rows; `regional.sinks.base.MergingWriter`). The commit
        commits the file whole, or a cut-out of it without the rows of parts it does not hold."""
        if not parts:
            return []
        if not self._merges():
            return [self.write(batches, context) for context, batches in parts]
        fitted = [  # without schema metadata: merged_table compares the parts' schemas
            self._fit(rows).replace_schema_metadata(None).to_batches()
            if (rows := [b for b in batches if b.num_rows])
            else []
            for _, batches in parts
        ]
        table, places = merged_table(fitted)
        if table is None:
            return [() for _ in parts]
        staged = self._stage(table, parts[0][0])
        if len(staged) != 1 or staged[0].rows != table.num_rows:
            self._delete([p for c in staged for p in self._paths(c)])
            raise SinkError(
                f"{self.describe}: the merged rows of {len(parts)} units ({table.num_rows} "
                f"rows) were written as {len(staged)} commit messages, not as one; only "
                "unpartitioned tables are supported"
            )
        whole: Any = staged[0]
        return [
            ()
            if p is None
            else (
                msgspec.msgpack.encode(
                    msgspec.structs.replace(
                        whole, rows=p.rows, first_row=p.first_row, file_rows=p.file_rows
                    )
                ),
            )
            for p in places
        ]

    def _fit(self, batches: Sequence[pa.RecordBatch]) -> pa.Table:
        """`batches` as one table of the table's columns, in its order and types."""
        schema = self._schema()
        names = schema.names
        out = []
        for batch in batches:
            missing = [n for n in names if n not in batch.schema.names]
            extra = [n for n in batch.schema.names if n not in names]
            if missing or extra:
                raise SinkError(
                    f"records for {self.describe} do not fit its columns {names}: missing "
                    f"{missing or 'none'}, unknown {extra or 'none'}; map the records to the "
                    "table's columns before the sink"
                )
            try:
                out.append(pa.Table.from_batches([batch]).select(names).cast(schema))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as exc:
                raise SinkError(
                    f"records for {self.describe} do not convert to its schema ({schema}): {exc}"
                ) from exc
        return pa.concat_tables(out)

    def sync_staged(self) -> None:
        """Nothing to do here (`regional.sinks.base.SinkWriter.sync_staged`): a format's
        writer makes each data file durable as it writes it, or says in its docstring why it
        cannot."""

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete the data files of a declined or aborted attempt (already gone is fine). A
        merged file is deleted once all of its parts were discarded through this sink object
        (the other units' rows in it may still commit). Committables of other sinks and tables
        are skipped; one naming a file out of the table is refused, and nothing is deleted."""
        gone = []
        for c in self.own(committables):
            if (part := part_of(c)) is not None and not self._discarded.add(self._key(c), part):
                continue
            gone += self._paths(c)
        self._delete(gone)

    def rows_of(self, committables: Iterable[bytes]) -> int:
        """How many rows `committables` hold (for progress displays)."""
        return sum(c.rows for c in self.own(committables))

    # --- committer side (on the driver): regional.sinks.base.TableCommitter -------------------

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Commit the data behind `committables` atomically as `commit_user`'s `identifier`,
        recording `fallback` (unit -> owner checkpoint of the units that fell back). Refused
        (`CommitError`, nothing committed) when `identifier` is not after the user's latest or
        a data file is missing. A merged file of which the commit holds only some parts is cut
        out first and deleted after the commit."""
        latest = self._latest_before_commit(commit_user)
        if latest is not None and identifier <= latest:
            raise CommitError(
                f"{self.describe}: commit {identifier} of user {commit_user!r} is not after its "
                f"latest commit {latest}; commits must be in checkpoint order"
            )
        plan = self._located(self._plan(self.decode(committables)))
        if missing := [p for planned in plan for p in planned.missing]:
            raise CommitError(
                f"{self.describe}: cannot commit checkpoint {identifier}: data file(s) "
                f"{', '.join(missing[:5])} are missing (were they deleted?); nothing was "
                "committed; restore from a newer checkpoint or restore the files"
            )
        self._publish(commit_user, identifier, plan, latest, fallback_json(fallback))
        self._delete([p for x in plan if x.keep is not None and not x.gone for p in x.sources])

    def _plan(self, items: Sequence[C]) -> list[Planned[C]]:
        """The staged data files a commit of `items` commits, in order: each whole file, and
        each merged file once (at its first part's place), whole when the commit holds every
        part of it, else cut out (`regional.sinks.merging.commit_plan`)."""
        return [
            Planned(c, keep, None if keep is None else self._kept_name(c, keep))
            for c, keep in commit_plan(
                items,
                part=part_of,
                file=self._key,
                describe=lambda c: f"{self.describe}: {self._name(c)}",
            )
        ]

    def _located(self, plan: Sequence[Planned[C]]) -> list[Planned[C]]:
        """`plan` with where its data files are: the files each item names, those gone, and,
        only where a cut-out's merged file is gone, whether the cut-out is there."""
        sources = [self._paths(x.item) for x in plan]
        paths = list(dict.fromkeys(p for s in sources for p in s))
        here = dict(zip(paths, self._exist(paths), strict=True))
        located = [
            Planned(x.item, x.keep, x.kept, s, [p for p in s if not here[p]])
            for x, s in zip(plan, sources, strict=True)
        ]
        cut = [x for x in located if x.gone and x.kept is not None]
        found = self._exist([self._path(x.kept) for x in cut if x.kept is not None])
        replaced = {id(x) for x, f in zip(cut, found, strict=True) if f}
        return [
            Planned(x.item, x.keep, x.kept, x.sources, x.gone, True) if id(x) in replaced else x
            for x in located
        ]

    def data_files(self, committables: Iterable[bytes]) -> list[str]:
        """Full paths of the data files behind `committables` (a merged file once)."""
        return list(dict.fromkeys(p for c in self.decode(committables) for p in self._paths(c)))

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The data files behind `committables` that are gone (a merged file partly committed
        counts as there while its cut-out is)."""
        plan = self._located(self._plan(self.decode(committables)))
        return [p for x in plan for p in x.missing]

    def marker_retention(self) -> SinkRetention:
        """How long the table keeps what its deduplication relies on
        (`regional.sinks.base.TableRetention`)."""
        key, ms = self._retention()
        return SinkRetention("", self.kind, self.location, key, ms)
