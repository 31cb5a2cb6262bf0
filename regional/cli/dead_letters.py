"""`regional dead-letters ROOT list|export|replay`: dead letters you can act on.

* ``list``: the committed dead-letter rows of the job (`--operator`, `--reason`,
  `--checkpoint`, `--limit`; `--json`), one per record, each with its **id**;
* ``export --format jsonl|parquet -o FILE``: the same rows to a file; in JSON lines the record
  is decoded back to JSON where it was JSON, so it can be fixed with any editor or `jq`;
* ``replay FILE --into SOURCE``: re-inject fixed records (JSON lines of ``{"id", "record"}``,
  what `export` writes with the records fixed) into source vertex SOURCE of the running job, or
  of its next run, exactly once: the batch goes whole into the source's replay inbox under the
  job root and the source reads it as one more split, checkpointed like any other
  (`regional.sources.replay`, DESIGN §4 rule 25). A batch id or a dead-letter id the job's
  inboxes hold already is refused, so a record is replayed once.

A dead letter's id (`dead_letter_id`) is a digest of what names it uniquely: the operator that
set it aside, its split, the position the epoch started reading that split at and its index
there. It is the same in every listing and export of the job. The committed rows are found as
`regional inspect ROOT dead-letters` finds them: the newest checkpoint records every
dead-letter sink's location (`regional.cli.dead_letter_tables`: one lookup for both commands and
the report; Parquet and Delta are read).
"""

from __future__ import annotations

import argparse
import getpass
import hashlib
import json
import posixpath
import socket
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
from pyarrow import fs as pafs

from metadata.errors import StorageError
from metadata.model import CheckpointMetadata
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from regional.cli.dead_letter_tables import (
    dead_letter_tables,
    no_dead_letter_sink,
    read_dead_letters,
)
from regional.coordinator.split_enumerator import last_assigned
from regional.report.dead_letters import REASONS, reason_of
from regional.sources.replay import (
    MAX_BATCH_BYTES,
    REPLAY_DIR,
    BatchManifest,
    ReplayError,
    batch_file_name,
    decode_batch,
    encode_batch,
    parse_fixed_records,
)

__all__ = [
    "DEAD_LETTER_ROWS_SCHEMA",
    "dead_letter_id",
    "dead_letter_rows",
    "register",
]

#: The rows `list --json` and `export` give: a dead letter as stored, with its id and reason.
DEAD_LETTER_ROWS_SCHEMA = pa.schema(
    [
        pa.field("id", pa.string(), nullable=False),
        pa.field("checkpoint_id", pa.int64(), nullable=False),
        pa.field("operator", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("error_type", pa.string(), nullable=False),
        pa.field("split_id", pa.string(), nullable=False),
        pa.field("split_position", pa.string(), nullable=False),
        pa.field("record_index", pa.int64(), nullable=False),
        pa.field("record", pa.string(), nullable=False),
        pa.field("error", pa.string(), nullable=False),
        pa.field("replayed", pa.string()),
    ]
)
_CUT = 80


def dead_letter_id(operator: str, split: str, position: str, index: int) -> str:
    """The id of a dead letter: 16 hex digits of a digest of its operator, split, the position
    its epoch started that split at, and its index there (together unique in a job: an epoch's
    dead letters are committed once, with its checkpoint).

    >>> dead_letter_id("parse", "orders-0.jsonl", "20", 3)
    '87e8dbd4c3246096'
    """
    text = "\0".join((operator, split, position, str(index)))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `dead-letters` with `list`, `export` and `replay`."""
    parser = subparsers.add_parser(
        "dead-letters",
        help="list, export and replay the committed dead letters of a job",
        description="List, export and replay the dead letters a job committed (records set "
        "aside with on_error='dead-letter'). ROOT is the checkpoint root.",
    )
    parser.add_argument("root", metavar="ROOT", help="checkpoint root")
    parser.add_argument("--job", help="job id (needed when ROOT holds several)")
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list", help="the dead letters as a table, one row per record, with their ids"
    )
    _filters(listing)
    listing.add_argument("--json", action="store_true", help="a JSON array, one object per row")
    export = actions.add_parser(
        "export", help="write the dead letters to a JSON-lines or Parquet file"
    )
    _filters(export)
    export.add_argument("--format", choices=("jsonl", "parquet"), default="jsonl")
    export.add_argument("-o", "--output", metavar="FILE", required=True, help="file to write")
    replay = actions.add_parser(
        "replay",
        help="re-inject fixed records into a source of the running or the next run, once",
        description='Re-inject the fixed records of FILE (JSON lines, each {"id": <the dead '
        'letter\'s id>, "record": <the fixed record>}) into source vertex SOURCE of the '
        "running job or its next run, exactly once.",
    )
    replay.add_argument("file", metavar="FILE", help="the fixed records (JSON lines)")
    replay.add_argument(
        "--into", metavar="SOURCE", required=True, help="the source vertex to read them"
    )
    replay.add_argument(
        "--batch", metavar="ID", help="the batch id (default: from the dead-letter ids)"
    )
    parser.set_defaults(handler=dead_letters_command)


def _filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--operator", help="only the dead letters of this operator")
    parser.add_argument("--reason", choices=REASONS, help="only the dead letters of this reason")
    parser.add_argument(
        "--checkpoint", type=int, metavar="ID", help="only those committed in checkpoint ID"
    )
    parser.add_argument("--limit", type=_limit, metavar="N", help="at most N rows")


def _limit(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = 0
    if not 1 <= n <= 10_000_000:
        raise argparse.ArgumentTypeError(f"{text!r}: give a number from 1 to 10000000")
    return n


def dead_letters_command(args: argparse.Namespace) -> int:
    """Open the job under `args.root` and run the action."""
    from regional.cli.render import say

    storage = JobStorage.open(args.root, args.job)
    storage.check_job_root()
    newest = _newest(storage)
    if args.action == "replay":
        return _replay(storage, newest, args)
    if newest is None:
        say(f"job {storage.describe('')} has no completed checkpoint: no dead letter committed")
    elif not dead_letter_tables(newest):
        say(no_dead_letter_sink(newest))
    every = dead_letter_rows(storage, newest)
    rows = _filtered(every, args)
    if args.action == "list":
        return _list(rows, len(every), args)
    return _export(rows, args)


def _newest(storage: JobStorage) -> CheckpointMetadata | None:
    """The newest completed checkpoint (a warning on stderr per damaged one skipped)."""
    store = CompletedCheckpointStore.load(storage)
    for d in store.damaged:
        print(f"warning: checkpoint {d.checkpoint_id} skipped: {d.error}", file=sys.stderr)
    return store.latest()


def dead_letter_rows(
    storage: JobStorage, newest: CheckpointMetadata | None
) -> list[dict[str, Any]]:
    """Every dead letter committed up to checkpoint `newest` as a row of
    `DEAD_LETTER_ROWS_SCHEMA`, in checkpoint, operator, split and index order, with the
    replay batch that replayed it."""
    if newest is None:
        return []
    replayed = {i: m.batch for m in _manifests(storage) for i in m.ids}
    out = []
    for table in dead_letter_tables(newest):
        for r in read_dead_letters(table).to_pylist():
            key = dead_letter_id(
                r["operator"], r["split_id"], r["split_position"], r["record_index"]
            )
            out.append(
                {
                    "id": key,
                    "checkpoint_id": r["checkpoint_id"],
                    "operator": r["operator"],
                    "reason": reason_of(r["error_type"]),
                    "error_type": r["error_type"],
                    "split_id": r["split_id"],
                    "split_position": r["split_position"],
                    "record_index": r["record_index"],
                    "record": r["record"],
                    "error": r["error_message"],
                    "replayed": replayed.get(key),
                }
            )
    out.sort(key=lambda r: (r["checkpoint_id"], r["operator"], r["split_id"], r["record_index"]))
    return out


def _filtered(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    kept = [
        r
        for r in rows
        if (args.operator is None or r["operator"] == args.operator)
        and (args.reason is None or r["reason"] == args.reason)
        and (args.checkpoint is None or r["checkpoint_id"] == args.checkpoint)
    ]
    return kept if args.limit is None else kept[: args.limit]


def _cut(text: str) -> str:
    line = (text.splitlines() or [""])[0]
    return line if len(line) <= _CUT and "\n" not in text else line[: _CUT - 3] + "..."


def _list(rows: list[dict[str, Any]], total: int, args: argparse.Namespace) -> int:
    from regional.cli.render import print_table, say

    if args.json:
        print_table(pa.Table.from_pylist(rows, schema=DEAD_LETTER_ROWS_SCHEMA), as_json=True)
        return 0
    shown = [
        {
            "id": r["id"],
            "checkpoint": r["checkpoint_id"],
            "operator": r["operator"],
            "reason": r["reason"],
            "position": f"{r['split_id']} {r['split_position'] or '(start)'} #{r['record_index']}",
            "record": _cut(r["record"]),
            "error": _cut(r["error"]),
            "replayed": r["replayed"],
        }
        for r in rows
    ]
    print_table(pa.Table.from_pylist(shown) if shown else _EMPTY_LIST, as_json=False)
    shown_of = f"{len(rows)} of {total}" if len(rows) != total else f"{total}"
    say(
        f"{shown_of} dead letter(s); export them with `regional dead-letters ROOT export -o "
        "FILE`, fix the records and replay them with `regional dead-letters ROOT replay FILE "
        "--into SOURCE`"
    )
    return 0


_EMPTY_LIST = pa.table(
    {
        n: pa.array([], pa.int64() if n == "checkpoint" else pa.string())
        for n in ("id", "checkpoint", "operator", "reason", "position", "record", "error")
    }
    | {"replayed": pa.array([], pa.string())}
)


def _decoded(record: str) -> Any:
    """The stored record text as JSON where it is JSON, else the text (a repr) as it is."""
    try:
        return json.loads(record)
    except ValueError:
        return record


def _export(rows: list[dict[str, Any]], args: argparse.Namespace) -> int:
    from regional.cli.render import say

    out = Path(args.output)
    if args.format == "parquet":
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows, schema=DEAD_LETTER_ROWS_SCHEMA), out)
    else:
        with out.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({**r, "record": _decoded(r["record"])}) + "\n")
    say(f"{len(rows)} dead letter(s) written to {out}")
    return 0


def _manifests(storage: JobStorage, source: str | None = None) -> list[BatchManifest]:
    """The manifests of the replay batches in the job's inboxes (of `source` only, if given)."""
    base = f"{storage.job_path}/{REPLAY_DIR}"
    try:
        infos = storage.filesystem.get_file_info(pafs.FileSelector(base, recursive=True))
    except FileNotFoundError:
        return []
    found = []
    for info in sorted(infos, key=lambda i: i.path):
        rel = info.path[len(base) + 1 :] if info.path.startswith(base) else info.path
        if info.type != pafs.FileType.File or not rel.endswith(".jsonl"):
            continue
        if source is not None and not rel.startswith(f"{source}/"):
            continue
        data = storage.read_file(f"{REPLAY_DIR}/{rel}", limit=MAX_BATCH_BYTES)
        if data is not None:
            found.append(decode_batch(data, where=storage.describe(f"{REPLAY_DIR}/{rel}"))[0])
    return found


def _next_batch_file(storage: JobStorage, source: str) -> str:
    """The name of `source`'s next batch file: the inbox holds 1..k, numbered without a gap
    (a running job finds batch k + 1 by asking for it; a gap would hide every later one)."""
    base = f"{storage.job_path}/{REPLAY_DIR}/{source}"
    try:
        infos = storage.filesystem.get_file_info(pafs.FileSelector(base))
    except FileNotFoundError:
        infos = []
    names = {posixpath.basename(i.path) for i in infos if i.type == pafs.FileType.File}
    have = len([n for n in names if n.endswith(".jsonl")])
    missing = [batch_file_name(k) for k in range(1, have + 1) if batch_file_name(k) not in names]
    if missing:
        raise ReplayError(
            f"the replay inbox {storage.describe(f'{REPLAY_DIR}/{source}')} lacks "
            f"{missing[0]}: its batch files are numbered from 1 without a gap, and a running "
            "job finds each by the number after the last; put the file back (a batch read to "
            "its end is never read again)"
        )
    return batch_file_name(have + 1)


def _source_vertices(newest: CheckpointMetadata | None) -> list[str]:
    """The source vertices the newest checkpoint has a split enumerator for."""
    if newest is None:
        return []
    return sorted(v for v, data in newest.coordinators.items() if last_assigned(data) is not None)


def _replay(
    storage: JobStorage, newest: CheckpointMetadata | None, args: argparse.Namespace
) -> int:
    from regional.cli.render import say

    root = storage.describe("")
    path = Path(args.file)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ReplayError(f"cannot read the fixed records {path}: {exc}") from None
    records = parse_fixed_records(text, file=str(path))
    sources = _source_vertices(newest)
    if args.into not in sources:
        raise ReplayError(
            f"job {root} has no source vertex {args.into!r} (its sources: "
            f"{', '.join(sources) or 'none recorded yet: run the job once'}); give --into one "
            "of them"
        )
    known = {r["id"] for r in dead_letter_rows(storage, newest)}
    lines = _line_numbers(text)
    for r in records:
        if r.id not in known:
            raise ReplayError(
                f"{path} line {lines[r.id]}: job {root} has no committed dead letter {r.id}; "
                "take the ids from `regional dead-letters ROOT export`"
            )
    ids = tuple(r.id for r in records)
    batch = args.batch or "b-" + hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:12]
    done = _manifests(storage)
    for m in done:
        if m.batch == batch:
            raise ReplayError(
                f"replay batch {batch} was replayed into {m.source!r} of job {root} already "
                f"(by {m.by}, {_when(m.at_ms)}); a batch is replayed once"
            )
        again = [i for i in ids if i in set(m.ids)]
        if again:
            raise ReplayError(
                f"{path} line {lines[again[0]]}: dead letter {again[0]} was replayed already, "
                f"in batch {m.batch} into {m.source!r} of job {root} (by {m.by}, "
                f"{_when(m.at_ms)}); a record is replayed once: remove its line"
            )
    manifest = BatchManifest(
        batch=batch,
        source=args.into,
        by=f"{getpass.getuser()}@{socket.gethostname()}",
        at_ms=int(time.time() * 1000),
        ids=ids,
        from_file=str(path),
    )
    # the inbox's next number: a running job finds it by asking for that name (rule 25); a
    # replay written at the same moment takes the number first, and this one is refused
    rel = f"{REPLAY_DIR}/{args.into}/{_next_batch_file(storage, args.into)}"
    try:
        storage.write_new_file(rel, encode_batch(manifest, records))
    except StorageError as exc:
        raise ReplayError(
            f"replay batch {batch} into {args.into!r}: {exc}; if another replay into it was "
            "written at the same moment, run the command again"
        ) from None
    say(
        f"replay batch {batch}: {len(records)} record(s) into source {args.into!r} of job "
        f"{root} ({storage.describe(rel)}); the running job reads them in its next epoch, "
        "else its next run does"
    )
    return 0


def _line_numbers(text: str) -> dict[str, int]:
    """The line of each id in a fixed-records file (checked already)."""
    out: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            out.setdefault(json.loads(line)["id"], n)
    return out


def _when(ms: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ms / 1000))
