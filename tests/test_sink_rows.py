"""Sink rows converted once per task (`regional.sinks.rows`): the same batches as converting
each unit's chunks on its own, and a unit whose rows do not convert fails alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from metadata.model import SubtaskState
from regional.coordinator.messages import Ack, Decline, UnitWork
from regional.dataflow.pipeline import Pipeline
from regional.runtime.task import TaskEnv, run_units
from regional.sinks.parquet import ParquetSink
from regional.sinks.rows import batches_of, parts_batches
from regional.sources.generator import GeneratorSource

_value = st.one_of(st.none(), st.integers(-5, 5))
_record = st.fixed_dictionaries({"a": _value, "b": st.sampled_from(["x", "y", None])})
_chunk = st.one_of(
    st.lists(_record, min_size=1, max_size=4),
    st.builds(lambda n: pa.record_batch({"a": pa.array(range(n), pa.int64())}), st.integers(0, 3)),
)


@given(st.lists(st.lists(_chunk, max_size=3), max_size=5))
def test_converting_a_tasks_parts_together_gives_each_parts_own_rows(parts: list[Any]) -> None:
    together = parts_batches(parts, "out")
    assert len(together) == len(parts)
    for part, converted in zip(parts, together, strict=True):
        assert not isinstance(converted, Exception)
        alone = batches_of(part, "out")
        assert [b.to_pylist() for b in converted] == [b.to_pylist() for b in alone]
        assert [b.schema.names for b in converted] == [b.schema.names for b in alone]


def test_chunks_whose_first_records_differ_keep_their_own_columns() -> None:
    parts = parts_batches([[[{"a": 1}]], [[{"b": 2, "a": 3}]]], "out")
    assert [[b.to_pylist() for b in p] for p in parts] == [[[{"a": 1}]], [[{"b": 2, "a": 3}]]]


def test_a_part_that_does_not_convert_is_its_error_and_the_others_convert() -> None:
    good, bad, also_good = parts_batches([[[{"a": 1}]], [[7]], [[{"a": 2}]]], "out")
    assert str(bad) == (
        "sink 'out': its rows do not make an Arrow table (AttributeError: 'int' object has no "
        "attribute 'keys'; first record: 7); give a sink records that are dicts with one type "
        "per field, e.g. map(lambda r: {'n': r['n']})"
    )
    assert good[0].to_pylist() == [{"a": 1}] and also_good[0].to_pylist() == [{"a": 2}]


def _record(split: int, n: int) -> dict[str, int]:
    return {"s": split, "n": n}


def _breaks_on_split_1(r: dict[str, int]) -> Any:
    return r["n"] if r["s"] == 1 else r  # not a record for a table: its unit must fail alone


def test_a_unit_whose_rows_do_not_convert_declines_alone_and_the_others_stage(
    tmp_path: Path,
) -> None:
    p = Pipeline("rows", records_per_epoch=2)
    src = p.source(GeneratorSource(3, _record, records_per_split=4), name="src", parallelism=3)
    src.map(_breaks_on_split_1, name="m").sink(ParquetSink(str(tmp_path / "t")), name="out")
    env = TaskEnv(str(tmp_path / "ckpt"), "rows", p, unit_timeout=30.0, run_id="r1")
    works = [
        UnitWork(
            1,
            1,
            u,
            tuple(SubtaskState(v, u, u, ref_checkpoint_id=0) for v in ("src", "m", "out")),
            (("src", u, f"g{u}"),),
        )
        for u in range(3)
    ]
    answers = run_units(env, works)
    assert [type(a) for a in answers] == [Ack, Decline, Ack]
    decline = answers[1]
    assert isinstance(decline, Decline)
    assert decline.reason.startswith("SinkRowsError: sink 'out': its rows do not make an Arrow")
    staged = [a.states[2].committables for a in answers if isinstance(a, Ack)]
    assert all(len(c) == 1 for c in staged)  # each good unit has its part of the one file
