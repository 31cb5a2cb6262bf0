"""The columnar keyed API (`key_by(...).apply_in_arrow(fn)`): one call per key and epoch with
the key's records as an Arrow table and its state; exact committed output through unit faults
and a driver crash after an exchange, equal to a direct computation."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import orders_job
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from metadata.storage import JobStorage
from regional.dataflow.keys import FieldKey
from regional.dataflow.operators import ApplyInArrow
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import OperatorState
from regional.errors import GraphError
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def running_total(ctx: Any, table: pa.Table) -> pa.Table:
    """Per key: the running total of `v` after this epoch's records, and how many calls."""
    total = ctx.value_state("total", 0)
    total.update(total.value() + pc.sum(table["v"]).as_py())
    calls = ctx.value_state("calls", 0)
    calls.update(calls.value() + 1)
    return pa.table({"k": [ctx.key], "total": [total.value()], "rows": [table.num_rows]})


def test_one_call_per_key_with_its_rows_in_arrival_order_and_state_across_epochs() -> None:
    op = ApplyInArrow(running_total, FieldKey("k"), name="sums")
    state = OperatorState()
    batch = pa.record_batch({"k": ["a", "b", "a"], "v": [1, 10, 2]})
    out, origins = op.run([("s", batch), ("s", [{"k": "b", "v": 20}])], None, state, None, None)
    assert origins is None
    assert [r for _, b in out for r in b.to_pylist()] == [
        {"k": "a", "total": 3, "rows": 2},
        {"k": "b", "total": 30, "rows": 2},
    ]
    restored = OperatorState.from_bytes(op.snapshot(state, ["s"]) or b"")
    again, _ = op.run([("s", [{"k": "a", "v": 5}])], None, restored, None, None)
    assert [r for _, b in again for r in b.to_pylist()] == [{"k": "a", "total": 8, "rows": 1}]
    # a key function instead of a field: the same groups (every record turned into Python)
    by_fn = ApplyInArrow(running_total, lambda r: r["k"], name="sums")
    out, _ = by_fn.run([("s", batch)], None, OperatorState(), None, None)
    assert [r["total"] for _, b in out for r in b.to_pylist()] == [3, 10]


def test_a_failing_key_is_dead_lettered_whole_and_a_wrong_result_names_the_operator() -> None:
    from regional.dataflow.dead_letters import DeadLetters

    def picky(ctx: Any, table: pa.Table) -> list[dict[str, Any]]:
        if ctx.key == "bad":
            raise ValueError("no")
        return [{"k": ctx.key}]

    dead = DeadLetters(3, {"s": "0"})
    batch = pa.record_batch({"k": ["ok", "bad", "bad"], "v": [1, 2, 3]})
    op = ApplyInArrow(picky, FieldKey("k"), name="picky")
    out, _ = op.run([("s", batch)], None, OperatorState(), dead, None)
    assert out == [("s", [{"k": "ok"}])]
    rows = dead.batch(("picky",)).to_pylist()
    assert [(r["record_index"], r["error_type"]) for r in rows] == [
        (1, "ValueError"),
        (2, "ValueError"),
    ]
    wrong = ApplyInArrow(lambda ctx, t: "rows", FieldKey("k"), name="wrong")
    with pytest.raises(TypeError, match="operator 'wrong': the apply_in_arrow function returned"):
        wrong.run([("s", batch)], None, OperatorState(), dead, None)


def test_key_by_a_field_name_keys_the_exchange_and_the_state_alike() -> None:
    p = Pipeline("fields")
    src = p.source(GeneratorSource(2, lambda s, n: {"k": n % 3, "v": n}), parallelism=2)
    keyed = src.key_by("k", partitions=2, name="x").apply_in_arrow(running_total, name="sums")
    assert p.vertices["sums"].operator.scope == "key"  # type: ignore[union-attr]
    assert keyed.vertex_id == "sums"
    with pytest.raises(GraphError, match="neither a field name nor callable"):
        src.key_by(3)  # type: ignore[arg-type]


def running_rows(ctx: Any, table: pa.Table) -> pa.Table:
    """Per record: the key's running total of `v` up to it (vectorised: a cumulative sum plus
    the total kept in state)."""
    total = ctx.value_state("total", 0)
    running = pc.add(pc.cumulative_sum(table["v"]), total.value())
    total.update(running[-1].as_py())
    return pa.table({"k": table["k"], "v": table["v"], "total": running})


def _job(table: str) -> Pipeline:
    """2 sources x 40 records -> exchange by field k (3 partitions) -> running totals."""
    p = Pipeline("totals", records_per_epoch=10)
    src = p.source(
        GeneratorSource(2, lambda s, n: {"k": f"k{(n * 7 + s) % 5}", "v": n},
                        records_per_split=40),
        parallelism=2,
        name="src",
    )  # fmt: skip
    totals = src.key_by("k", partitions=3, name="by-k").apply_in_arrow(running_rows)
    totals.sink(ParquetSink(table), name="out")
    return p


def _driver(root: Path, p: Pipeline, faults: Faults | None = None, **kw: Any) -> JobDriver:
    faults = faults or Faults()
    env = TaskEnv(str(root), "totals", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(str(root), "totals"),
        faults=faults, **kw,
    )  # fmt: skip


def test_exact_through_unit_faults_and_a_driver_crash(tmp_path: Path) -> None:
    clean = str(tmp_path / "clean")
    assert _driver(tmp_path / "ckpt-clean", _job(clean)).run().finished
    expected = read_table(clean).to_pylist()
    direct = []  # per key, records in exchange order: (k, v, running total)
    for s in (0, 1):
        for n in range(40):
            direct.append((f"k{(n * 7 + s) % 5}", n))
    finals: dict[str, int] = {}
    for k, v in direct:
        finals[k] = finals.get(k, 0) + v
    assert len(expected) == 80
    assert {r["k"]: r["total"] for r in sorted(expected, key=lambda r: r["total"])} == finals

    table = str(tmp_path / "faulty")
    faults = Faults(units={(3, 2): "fail", (4, 0): "fail"}, crash_at=(5, "after-metadata"))
    events: list[Any] = []
    with pytest.raises(DriverCrash):
        _driver(tmp_path / "ckpt", _job(table), faults, progress=events.append).run()
    assert [e.kind for e in events].count("regional") >= 2  # both sides fell back
    assert _driver(tmp_path / "ckpt", _job(table)).run().finished
    got = read_table(table).to_pylist()
    # every record exactly once, and every key's final total exact; which running total a
    # record shows depends on how the two upstream units' records interleave, which a
    # fallback changes (DESIGN §4 rule 15: exact for commutative, associative results)
    pairs = lambda rows: Counter((r["k"], r["v"]) for r in rows)  # noqa: E731
    assert pairs(got) == pairs(expected) == Counter(direct)
    assert {r["k"]: r["total"] for r in sorted(got, key=lambda r: r["total"])} == finals
