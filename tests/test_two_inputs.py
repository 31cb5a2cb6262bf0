"""Operators with two inputs they tell apart (the ground joins stand on): `Operator.run_inputs`
gets each input vertex's chunks apart, and `Pipeline._co_partition` puts two keyed streams in
the same partitions (adding the exchanges a side needs), or says why it cannot."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orders_job
import pytest

from metadata.storage import JobStorage
from regional.dataflow.building import Keyed
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.keys import FieldKey
from regional.dataflow.operators import Chunk, Operator, records_of
from regional.dataflow.pipeline import KeyedStream, Pipeline
from regional.dataflow.state import OperatorState
from regional.errors import GraphError
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


class Sides(Operator):
    """Tags every record with the input it came by (0: left, 1: right)."""

    kind = "sides"

    def run_inputs(
        self,
        inputs: Sequence[tuple[Sequence[Chunk], Sequence[int] | None]],
        state: OperatorState | None,
        dead_letters: DeadLetters | None,
        time: EpochTime | None,
    ) -> tuple[list[Chunk], list[int] | None]:
        out: list[Chunk] = []
        for side, (chunks, _) in enumerate(inputs):
            for split, data in chunks:
                out.append((split, [{**r, "side": side} for r in records_of(data)]))
        return out, None


def _pipeline(out: str, *, partitions: int = 3) -> Pipeline:
    p = Pipeline("sides", records_per_epoch=4)
    left = p.source(
        GeneratorSource(2, lambda s, n: {"k": n % 5, "n": n, "s": s}, records_per_split=6),
        name="a",
        parallelism=2,
    )
    right = p.source(
        GeneratorSource(1, lambda s, n: {"k": n % 5, "n": 100 + n, "s": s}, records_per_split=7),
        name="b",
    )
    sides = Keyed(left.vertex_id, FieldKey("k")), Keyed(right.vertex_id, FieldKey("k"))
    ids = p._co_partition(*sides, partitions=partitions, name="j")
    p._add("sides", "j", ids, operator=Sides()).sink(ParquetSink(out), name="out")
    return p


def test_each_input_arrives_apart_and_subtask_q_holds_the_keys_of_partition_q(
    tmp_path: Path,
) -> None:
    out, root = str(tmp_path / "out"), str(tmp_path / "ckpt")
    p = _pipeline(out)
    assert p.vertices["j"].inputs == ("j-left", "j-right")
    assert p.vertices["j"].parallelism == 3
    env = TaskEnv(root, "sides", p, unit_timeout=30)
    JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "sides")).run()
    rows = read_table(out).to_pylist()
    got = sorted((r["side"], r["n"]) for r in rows)
    assert got == sorted(
        [(0, n) for n in range(6) for _ in range(2)] + [(1, 100 + n) for n in range(7)]
    )


def test_a_side_already_partitioned_by_its_key_is_used_as_it_is() -> None:
    p = Pipeline("reuse")
    a = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=3), name="a")
    b = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=3), name="b")
    left = a.key_by("k", partitions=4, name="by-k")
    right = b.key_by("k")._keyed
    assert p._co_partition(left._keyed, right, partitions=None, name="j") == ("by-k", "j-right")
    assert p.vertices["j-right"].parallelism == 4


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (
            lambda a, b: (a.key_by("k", partitions=4), b.key_by("k", partitions=2), None),
            "'j': both sides must be partitioned alike, but the left side is read from an "
            "exchange of 4, the right side is read from an exchange of 2; key both sides with "
            "the same partitions=N (or key a side without partitions and give the join "
            "partitions=N: it adds the exchange)",
        ),
        (
            lambda a, b: (a.key_by("k"), b.key_by("k"), None),
            "'j': neither side is partitioned by its key; give partitions=N, the number of "
            "subtasks the join runs in (each side gets a keyed exchange)",
        ),
        (
            lambda a, b: (a.key_by("k"), a.key_by("k"), 2),
            "'j' joins stream 'a' with itself; key each side from the stream before the "
            "exchange (two exchanges of one stream are allowed)",
        ),
        (
            lambda a, b: (a.key_by("k"), b.key_by("k"), 0),
            "'j': partitions=0; give a whole number of subtasks, at least 1",
        ),
    ],
)
def test_sides_that_cannot_be_partitioned_alike_are_refused_naming_the_fix(
    build: Any, message: str
) -> None:
    p = Pipeline("bad")
    a = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=3), name="a")
    b = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=3), name="b")
    left, right, partitions = build(a, b)
    assert isinstance(left, KeyedStream)
    with pytest.raises(GraphError) as info:
        p._co_partition(left._keyed, right._keyed, partitions=partitions, name="j")
    assert str(info.value) == message
