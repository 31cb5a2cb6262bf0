"""Extending regional: an exactly-once SQLite sink and a text-lines source, written against the
contracts (`regional.sinks.base`, `regional.sources.base`). The docs page "Extending" shows
this file; `tests/test_extending.py` runs it with faults and a driver crash.

    python examples/sqlite_sink.py      # runs the job on Spark and checks the table

The sink follows DESIGN §4 rule 8 (PIP-30): a writer *stages* its rows (here: in a staging
table, tagged with who wrote them) and returns committables naming them; after the
checkpoint's metadata is durable the driver *commits* them, in one SQLite transaction that also
records (commit user, checkpoint id), so a commit that is retried after a crash finds its
record and is skipped. A staged attempt that is not committed is discarded.
"""

from __future__ import annotations

import os
import sqlite3
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence

import pyarrow as pa

from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import KeyedContext
from regional.errors import CommitError
from regional.sinks.base import WriteContext
from regional.sources.base import ReadResult

__all__ = ["LinesSource", "SQLiteSink", "build_pipeline"]


# --8<-- [start:sink]
class SQLiteSink:
    """Rows into table `table` (columns `columns`) of the SQLite database at `path`,
    exactly-once. Staged rows wait in `_staged_<table>`; commit records live in
    `_commits_<table>` (one row per commit user and checkpoint)."""

    def __init__(self, path: str, table: str, columns: Sequence[str]) -> None:
        self.path, self.table, self.columns = path, table, tuple(columns)
        names = ", ".join(f'"{c}"' for c in self.columns)
        with self._connect() as db:
            db.execute(f'CREATE TABLE IF NOT EXISTS "{table}" ({names})')
            db.execute(f'CREATE TABLE IF NOT EXISTS "_staged_{table}" (tag TEXT, {names})')
            db.execute(
                f'CREATE TABLE IF NOT EXISTS "_commits_{table}" '
                "(commit_user TEXT, checkpoint_id INTEGER, PRIMARY KEY (commit_user, "
                "checkpoint_id))"
            )

    def _connect(self) -> sqlite3.Connection:
        # many Spark tasks stage at once: wait for the write lock instead of failing
        db = sqlite3.connect(self.path, timeout=60)
        db.execute("PRAGMA synchronous=FULL")  # a committed transaction survives power loss
        return db

    # --- the writer, in Spark tasks (regional.sinks.base.SinkWriter) -------------------------

    def write(self, batches: Sequence[pa.RecordBatch], context: WriteContext) -> tuple[bytes, ...]:
        """Stage one epoch's rows of one sink subtask; the committable is their tag, unique
        per (job, driver run, checkpoint, sink subtask, attempt)."""
        rows = [tuple(r[c] for c in self.columns) for b in batches for r in b.to_pylist()]
        if not rows:
            return ()
        c = context
        tag = f"{c.job_id}/{c.run_id}/{c.checkpoint_id}/{c.vertex_id}/{c.index}/a{c.attempt}"
        marks = ", ".join("?" * (len(self.columns) + 1))
        with self._connect() as db:  # one transaction: every row of the tag, or none
            db.execute(f'DELETE FROM "_staged_{self.table}" WHERE tag = ?', (tag,))
            db.executemany(
                f'INSERT INTO "_staged_{self.table}" VALUES ({marks})',
                [(tag, *row) for row in rows],
            )
        return (tag.encode(),)

    def sync_staged(self) -> None:
        """Nothing to do: `write` returns after SQLite committed the staged rows durably."""

    def discard(self, committables: Iterable[bytes]) -> None:
        """Delete what a declined or aborted attempt staged."""
        with self._connect() as db:
            db.executemany(
                f'DELETE FROM "_staged_{self.table}" WHERE tag = ?',
                [(c.decode(),) for c in committables],
            )

    def clean_staged(self, job_id: str, keep: Iterable[bytes]) -> list[str]:
        """At a driver's start (regional.sinks.base.TableStaging): delete the rows job
        `job_id` staged that no committable in `keep` names (attempts a crash left behind)."""
        kept = {c.decode() for c in keep}
        with self._connect() as db:
            tags = [
                t
                for (t,) in db.execute(
                    f'SELECT DISTINCT tag FROM "_staged_{self.table}" '
                    "WHERE substr(tag, 1, length(?1)) = ?1",
                    (f"{job_id}/",),
                )
                if t not in kept
            ]
            db.executemany(
                f'DELETE FROM "_staged_{self.table}" WHERE tag = ?', [(t,) for t in tags]
            )
        return tags

    # --- the committer, on the driver (regional.sinks.base.TableCommitter) -------------------

    def commit(
        self,
        commit_user: str,
        identifier: int,
        committables: Iterable[bytes],
        *,
        fallback: Mapping[int, int] | None = None,
    ) -> None:
        """Move the staged rows of `committables` into the table and record the commit, in
        one transaction; an identifier not after the user's latest is refused."""
        tags = [c.decode() for c in committables]
        with self._connect() as db:
            latest = self._latest(db, commit_user)
            if latest is not None and identifier <= latest:
                raise CommitError(
                    f"SQLite table {self.table!r} in {self.path}: commit {identifier} of "
                    f"{commit_user!r} is not after its latest commit {latest}"
                )
            names = ", ".join(f'"{c}"' for c in self.columns)
            for tag in tags:
                db.execute(
                    f'INSERT INTO "{self.table}" SELECT {names} FROM "_staged_{self.table}" '
                    "WHERE tag = ?",
                    (tag,),
                )
                db.execute(f'DELETE FROM "_staged_{self.table}" WHERE tag = ?', (tag,))
            db.execute(
                f'INSERT INTO "_commits_{self.table}" VALUES (?, ?)', (commit_user, identifier)
            )

    def latest_committed(self, commit_user: str) -> int | None:
        """The highest checkpoint `commit_user` committed (None: nothing yet)."""
        with self._connect() as db:
            return self._latest(db, commit_user)

    def _latest(self, db: sqlite3.Connection, commit_user: str) -> int | None:
        row = db.execute(
            f'SELECT max(checkpoint_id) FROM "_commits_{self.table}" WHERE commit_user = ?',
            (commit_user,),
        ).fetchone()
        return None if row[0] is None else int(row[0])

    def missing_files(self, committables: Iterable[bytes]) -> list[str]:
        """The tags with no staged rows left (a re-commit of them would lose rows)."""
        with self._connect() as db:
            return [
                tag
                for tag in (c.decode() for c in committables)
                if db.execute(
                    f'SELECT 1 FROM "_staged_{self.table}" WHERE tag = ? LIMIT 1', (tag,)
                ).fetchone()
                is None
            ]


# --8<-- [end:sink]
# --8<-- [start:source]
class LinesSource:
    """The lines of every `*.txt` file in `directory`, one split per file; a record is
    ``{"file": name, "line": text}``. The position is the byte offset of the next line, so a
    read from a position is deterministic (regional.sources.base.Source)."""

    bounded = True

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def discover(self) -> list[str]:
        """Every `*.txt` file (called on the driver each epoch: new files are new splits)."""
        return sorted(f for f in os.listdir(self.directory) if f.endswith(".txt"))

    def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
        """Up to `max_records` lines of file `split_id` from byte offset `position`."""
        offset = int(position or b"0")
        records: list[dict[str, str]] = []
        with open(os.path.join(self.directory, split_id), "rb") as f:
            f.seek(offset)
            while len(records) < max_records and (line := f.readline()):
                offset += len(line)
                records.append({"file": split_id, "line": line.decode().rstrip("\n")})
            finished = not f.read(1)
        return ReadResult([records], str(offset).encode(), finished)


# --8<-- [end:source]
# --8<-- [start:pipeline]
def count_words(ctx: KeyedContext, record: dict[str, str]) -> Iterator[dict[str, object]]:
    """A running count per word of each file (keyed state, checkpointed with the unit)."""
    for word in record["line"].split():
        n = ctx.value_state(word, 0)
        n.update(n.value() + 1)
        yield {"word": word, "n": n.value()}


def build_pipeline(data_dir: str, database: str) -> Pipeline:
    """Lines of 4 files -> words with their running count per file -> SQLite."""
    p = Pipeline("words", records_per_epoch=20)
    lines = p.source(LinesSource(data_dir), parallelism=4, name="lines")
    counted = lines.key_by(lambda r: r["file"]).process(count_words, name="count")
    counted.sink(SQLiteSink(database, "words", ["word", "n"]), name="words")
    return p


# --8<-- [end:pipeline]
def write_lines(directory: str, *, files: int = 4, lines: int = 30) -> None:
    """`files` small text files (deterministic)."""
    os.makedirs(directory, exist_ok=True)
    for f in range(files):
        with open(os.path.join(directory, f"part-{f}.txt"), "w") as out:
            out.writelines(f"w{(f * 7 + n) % 5} w{n % 3}\n" for n in range(lines))


def main() -> int:
    from regional.runtime.faults import Faults
    from regional.runtime.session import spark_session
    from regional.runtime.spark import SparkRuntime

    work = tempfile.mkdtemp(prefix="regional-sqlite-")
    write_lines(os.path.join(work, "data"))
    database = os.path.join(work, "words.db")
    pipeline = build_pipeline(os.path.join(work, "data"), database)
    faults = Faults(units={(2, 1): "fail", (3, 1): "fail"})  # unit 1 falls back twice
    spark = spark_session()
    summary = SparkRuntime(pipeline, spark, root=os.path.join(work, "ckpt"), faults=faults).run()
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT count(*), max(n) FROM words").fetchone()
    print(f"{summary.count('regional')} regional checkpoints; committed rows: {rows[0]}")
    return 0 if rows[0] == 4 * 30 * 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
