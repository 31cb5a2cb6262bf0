"""Rows keep every field (issue 41 item 5): a chunk's columns are the union of its records'
fields, never the first record's alone, through a plain `map` into a sink, `map_batches` and
`apply_in_arrow`; a field of two types Arrow cannot share is a dead letter naming the field
and both types (or, with `on_error="fail"`, a decline naming them); an `apply_in_arrow`
function returning another type for one key is widened when no value changes (int32 and
int64) and otherwise dead-letters that key's rows. Committed rows are read back with DuckDB
over the table's committed files. The driver runs the real task code in this process."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from orders_job import InProcessDispatcher

from metadata.model import SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.pipeline import Pipeline, Stream
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink, committed_files
from regional.sources.generator import GeneratorSource


def _record(split: int, n: int) -> dict[str, int]:
    return {"split": split, "n": n, "parity": n % 2}


def _shaped(r: dict[str, int]) -> dict[str, Any]:
    """Odd records gain a field the first record of every chunk (n even) lacks."""
    out: dict[str, Any] = {"split": r["split"], "n": r["n"], "parity": r["parity"]}
    if r["n"] % 2:
        out["odd"] = f"odd-{r['n']}"
    return out


def _whole(ctx: Any, table: pa.Table) -> pa.Table:
    return table


def _pipeline(tmp_path: Path, then: Any, *, on_error: str = "dead-letter") -> Pipeline:
    """2 splits of 6 records, each read whole in the first epoch by its own unit (the two
    units share a task's pass), into `then(stream)` and a Parquet sink."""
    dead = ParquetSink(str(tmp_path / "dead")) if on_error == "dead-letter" else None
    p = Pipeline("rows", records_per_epoch=6, on_error=on_error, dead_letter=dead)
    src = p.source(GeneratorSource(2, _record, records_per_split=6), parallelism=2, name="src")
    then(src).sink(ParquetSink(str(tmp_path / "out")), name="out")
    return p


def _run(tmp_path: Path, p: Pipeline) -> None:
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s"}}
    policy = load_policy(env={}, overrides=overrides).policy
    env = TaskEnv(root, "rows", p, unit_timeout=30)
    summary = JobDriver(
        p, InProcessDispatcher(env), storage=JobStorage(root, "rows"), policy=policy
    ).run()
    assert summary.finished


def _rows(path: Path, query: str = "SELECT * FROM t ORDER BY split, n") -> list[tuple[Any, ...]]:
    files = committed_files(str(path))
    if not files:
        return []
    con = duckdb.connect()
    con.execute(f"CREATE VIEW t AS SELECT * FROM read_parquet({files!r}, union_by_name=true)")
    return con.execute(query).fetchall()


def _dead(tmp_path: Path) -> list[tuple[Any, ...]]:
    return _rows(
        tmp_path / "dead",
        "SELECT operator, split_id, record_index, record, error_type, error_message FROM t "
        "ORDER BY split_id, record_index",
    )


def _declines(tmp_path: Path, p: Pipeline) -> list[str | None]:
    """Per unit (split g0, g1) run in one task for checkpoint 1: the reason it declines, or
    None for an ack."""
    env = TaskEnv(str(tmp_path / "ckpt"), "rows", p, unit_timeout=30.0, run_id="r1")
    works = [
        UnitWork(
            1,
            1,
            u,
            tuple(SubtaskState(v, u, u, ref_checkpoint_id=0) for v in p.vertices),
            (("src", u, f"g{u}"),),
        )
        for u in range(2)
    ]
    answers = run_units(env, works)
    assert all(isinstance(a, Ack | Decline) for a in answers)
    return [a.reason if isinstance(a, Decline) else None for a in answers]


THROUGH = {
    "map": lambda s: s.map(_shaped, name="m"),
    "map_batches": lambda s: s.map(_shaped, name="m").map_batches(lambda b: b, name="mb"),
    "apply_in_arrow": lambda s: (
        s.map(_shaped, name="m").key_by("parity").apply_in_arrow(_whole, name="a")
    ),
}


@pytest.mark.parametrize("kind", sorted(THROUGH))
def test_a_field_the_first_record_lacks_is_committed_for_the_records_that_have_it(
    tmp_path: Path, kind: str
) -> None:
    _run(tmp_path, _pipeline(tmp_path, THROUGH[kind]))
    assert _rows(tmp_path / "out", "SELECT split, n, odd FROM t ORDER BY split, n") == [
        (s, n, f"odd-{n}" if n % 2 else None) for s in range(2) for n in range(6)
    ]
    assert _dead(tmp_path) == []


def _typed(r: dict[str, int]) -> dict[str, Any]:
    """`v` is an int, but a str in record 4 of split 1."""
    v: Any = "four" if (r["split"], r["n"]) == (1, 4) else r["n"] * 10
    return {"split": r["split"], "n": r["n"], "v": v}


FIELD_OF_TWO_TYPES = (
    "field 'v' is string (a Python str) in this record but int64 in the other records of its "
    "chunk; Arrow holds one type per column: give the field one type in every record"
)


def test_a_field_of_two_types_is_a_dead_letter_naming_the_field_and_both_types(
    tmp_path: Path,
) -> None:
    _run(tmp_path, _pipeline(tmp_path, lambda s: s.map(_typed, name="m")))
    assert _rows(tmp_path / "out", "SELECT split, n, v FROM t ORDER BY split, n") == [
        (s, n, n * 10) for s in range(2) for n in range(6) if (s, n) != (1, 4)
    ]
    assert _dead(tmp_path) == [
        (
            "m",
            "g1",
            4,
            '{"split":1,"n":4,"v":"four"}',
            "SinkRowsError",
            f"sink 'out': {FIELD_OF_TWO_TYPES}",
        )
    ]


def test_a_field_of_two_types_into_map_batches_is_that_operators_dead_letter(
    tmp_path: Path,
) -> None:
    def then(s: Stream) -> Stream:
        return s.map(_typed, name="m").map_batches(lambda b: b, name="mb")

    _run(tmp_path, _pipeline(tmp_path, then))
    assert _rows(tmp_path / "out", "SELECT split, n, v FROM t ORDER BY split, n") == [
        (s, n, n * 10) for s in range(2) for n in range(6) if (s, n) != (1, 4)
    ]
    assert [(op, error) for op, _, _, _, _, error in _dead(tmp_path)] == [
        ("mb", f"operator 'mb': {FIELD_OF_TWO_TYPES}")
    ]


def test_with_on_error_fail_a_field_of_two_types_declines_naming_sink_field_and_types(
    tmp_path: Path,
) -> None:
    p = _pipeline(tmp_path, lambda s: s.map(_typed, name="m"), on_error="fail")
    assert _declines(tmp_path, p) == [None, f"SinkRowsError: sink 'out': {FIELD_OF_TWO_TYPES}"]


def _drift(types: tuple[pa.DataType, pa.DataType]) -> Any:
    """An apply_in_arrow function whose column `v` is of the first type for even `n` and of
    the second for odd."""

    def fn(ctx: Any, table: pa.Table) -> pa.Table:
        kind = types[ctx.key]
        n = table.column("n").to_pylist()
        v = [str(x) for x in n] if pa.types.is_string(kind) else n
        return pa.table({"split": table.column("split"), "n": n, "v": pa.array(v, kind)})

    return fn


def test_apply_in_arrow_columns_of_two_int_widths_are_widened_to_the_wider(
    tmp_path: Path,
) -> None:
    def then(s: Stream) -> Stream:
        return s.key_by("parity").apply_in_arrow(_drift((pa.int64(), pa.int32())), name="a")

    _run(tmp_path, _pipeline(tmp_path, then))
    assert _rows(tmp_path / "out", "SELECT split, n, v FROM t ORDER BY split, n") == [
        (s, n, n) for s in range(2) for n in range(6)
    ]
    files = committed_files(str(tmp_path / "out"))
    assert {pq.read_schema(f).field("v").type for f in files} == {pa.int64()}
    assert _dead(tmp_path) == []


DRIFT = (
    "column 'v' is string in these rows of 'a' but int64 in the rows before them, and Arrow "
    "has no type that holds both unchanged; give the column one type (e.g. cast it in the "
    "function that makes it)"
)


def test_apply_in_arrow_returning_another_type_for_one_key_dead_letters_its_rows(
    tmp_path: Path,
) -> None:
    def then(s: Stream) -> Stream:
        return s.key_by("parity").apply_in_arrow(_drift((pa.int64(), pa.string())), name="a")

    _run(tmp_path, _pipeline(tmp_path, then))
    assert _rows(tmp_path / "out", "SELECT split, n, v FROM t ORDER BY split, n") == [
        (s, n, n) for s in range(2) for n in range(0, 6, 2)
    ]
    assert _dead(tmp_path) == [
        # the 4th to 6th rows `a` made of the split (the even key's 3 came first)
        (
            "a",
            f"g{s}",
            3 + i,
            f'{{"split":{s},"n":{n},"v":"{n}"}}',
            "SinkRowsError",
            f"sink 'out': {DRIFT}",
        )
        for s in range(2)
        for i, n in enumerate(range(1, 6, 2))
    ]
    p = _pipeline(tmp_path / "fail", then, on_error="fail")
    assert _declines(tmp_path / "fail", p) == [f"SinkRowsError: sink 'out': {DRIFT}"] * 2


def _both_faults(r: dict[str, int]) -> dict[str, Any]:
    """Record 1 of each split gives `x` a str among ints, record 3 has no `parity` key."""
    out: dict[str, Any] = {"split": r["split"], "n": r["n"], "x": "one" if r["n"] == 1 else r["n"]}
    if r["n"] != 3:
        out["parity"] = r["parity"]
    return out


def test_apply_in_arrow_names_each_bad_record_when_a_chunk_has_a_bad_key_and_a_bad_type(
    tmp_path: Path,
) -> None:
    """A record without the key field and a record whose field has another type, in one
    chunk: each is a dead letter naming its own place in the split's epoch (the key is judged
    on the records as given, then the rest are converted: one leaving must not shift the
    other's index), and the others commit."""
    p = _pipeline(
        tmp_path,
        lambda s: s.map(_both_faults, name="m").key_by("parity").apply_in_arrow(_whole, name="a"),
    )
    _run(tmp_path, p)
    dead = [(op, split, i, kind) for op, split, i, _, kind, _ in _dead(tmp_path)]
    assert dead == [
        ("a", f"g{s}", i, kind)
        for s in range(2)
        for i, kind in ((1, "SinkRowsError"), (3, "UserFunctionError"))
    ]
    records = [json.loads(r) for _, _, _, r, _, _ in _dead(tmp_path)]
    assert [(r["split"], r["n"]) for r in records] == [(s, n) for s in range(2) for n in (1, 3)]
    assert _rows(tmp_path / "out", "SELECT split, n, x FROM t ORDER BY split, n") == [
        (s, n, n) for s in range(2) for n in (0, 2, 4, 5)
    ]


def _mixed_kinds(r: dict[str, int]) -> dict[str, Any]:
    """Split 0's values are ints and naive datetimes, split 1's floats and aware ones: each
    unit's rows alone convert to other types than the other's."""
    s, n = r["split"], r["n"]
    when = dt.datetime(2026, 1, 1, 0, n)
    return {
        "split": s,
        "n": n,
        "v": n if s == 0 else n + 0.5,
        "at": when if s == 0 else when.replace(tzinfo=dt.UTC),
    }


@pytest.mark.parametrize("on_error", ["dead-letter", "fail"])
def test_ints_and_floats_of_two_units_in_one_file_all_commit(tmp_path: Path, on_error: str) -> None:
    """Two units in one task give one sink ints and floats, naive and aware datetimes: one
    conversion of all their records takes them together (float64; the first's zone), so the
    units' own conversions must be widened alike, never refused (they were dead-lettered, or
    every unit of the task declined, when converted per unit)."""
    _run(tmp_path, _pipeline(tmp_path, lambda s: s.map(_mixed_kinds, name="m"), on_error=on_error))
    got = _rows(tmp_path / "out", 'SELECT split, n, v, epoch("at") FROM t ORDER BY split, n')
    assert got == [
        (
            s,
            n,
            float(n) if s == 0 else n + 0.5,
            dt.datetime(2026, 1, 1, 0, n, tzinfo=dt.UTC).timestamp(),
        )
        for s in range(2)
        for n in range(6)
    ]
    if on_error == "dead-letter":
        assert _dead(tmp_path) == []


def _reordered(r: dict[str, int]) -> dict[str, Any]:
    """Split 0 writes its fields in another order than split 1, and only None in `note`."""
    s, n = r["split"], r["n"]
    if s == 0:
        return {"note": None, "n": n, "split": s, "parity": r["parity"]}
    return {"split": s, "parity": r["parity"], "n": n, "note": f"n{n}"}


def _through(ctx: Any, r: dict[str, Any]) -> list[dict[str, Any]]:
    return [r]


def test_writers_of_one_task_whose_columns_differ_in_order_and_nullness_share_a_segment(
    tmp_path: Path,
) -> None:
    """Two writer units of one task convert their own records (dead letters on): their
    columns come in another order and one is null-typed; the exchange's merged segment takes
    both (every unit of the task declined when they were concatenated as they were)."""
    _run(
        tmp_path,
        _pipeline(
            tmp_path,
            lambda s: (
                s.map(_reordered, name="m")
                .key_by("parity", partitions=2)
                .process(_through, name="p")
            ),
        ),
    )
    got = _rows(tmp_path / "out", "SELECT split, n, parity, note FROM t ORDER BY split, n")
    assert got == [(s, n, n % 2, None if s == 0 else f"n{n}") for s in range(2) for n in range(6)]
    assert _dead(tmp_path) == []
