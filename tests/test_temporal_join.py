"""The temporal join as of event time (`regional.dataflow.temporal_join`, DESIGN §4 rule 18): the
pure operator against a brute-force as-of join over random epochs and watermarks; a job in this
process equal to the as-of join minus exactly the dead-lettered late records, row for row under
unit faults on both sides and a driver crash at every crash point; bounded table state."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import orders_job
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.temporal_join import TemporalJoin, TemporalJoinSpec, delete_test, tie_order
from regional.errors import GraphError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def as_of(
    stream: list[dict[str, Any]], changes: list[dict[str, Any]], how: str
) -> Counter[tuple[Any, Any]]:
    """Per stream record: the change of its key with the greatest time at or before its own
    (of equal times the greatest by `tie_order`), None for none or a delete; inner drops
    those."""
    out: Counter[tuple[Any, Any]] = Counter()
    for r in stream:
        candidates = [c for c in changes if c["k"] == r["k"] and c["ts"] <= r["ts"]]
        best = max(candidates, key=lambda c: (c["ts"], tie_order(c)), default=None)
        version = None if best is None or best.get("deleted") else best["id"]
        if version is not None or how == "left":
            out[r["id"], version] += 1
    return out


_rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60), st.booleans()), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    epochs=st.lists(st.tuples(_rows, _rows, st.integers(0, 25)), min_size=1, max_size=6),
    how=st.sampled_from(("inner", "left")),
)
def test_the_operator_emits_the_as_of_join_of_the_records_that_were_not_late(
    epochs: list[Any], how: str
) -> None:
    """Random records and changes (upserts and deletes) cut into random epochs under a
    watermark that grows by random steps, state snapshotted and restored between epochs: the
    rows are the as-of join of what was not late, every one once; no key keeps more than its
    versions at or after the watermark and one before it."""
    op = TemporalJoin(
        TemporalJoinSpec(
            how=how,
            emit=lambda r, v: (r["id"], v and v["id"]),
            is_delete=delete_test("deleted"),
        ),
        (lambda r: r["k"], lambda r: r["k"]),
        (lambda r: r["ts"], lambda r: r["ts"]),
        name="t",
    )
    blob = OperatorState(operator="t").to_bytes()
    watermark, emitted = MIN_WATERMARK, Counter()
    kept_stream: list[dict[str, Any]] = []
    kept_changes: list[dict[str, Any]] = []
    ids = iter(range(10**6))
    for stream, changes, step in [*epochs, ([], [], None)]:
        end = (
            MAX_WATERMARK
            if step is None
            else (0 if watermark == MIN_WATERMARK else watermark) + step
        )
        srows = [{"k": k, "ts": ts, "id": next(ids)} for k, ts, _ in stream]
        crows = [{"k": k, "ts": ts, "id": next(ids), "deleted": d} for k, ts, d in changes]
        kept_stream += [r for r in srows if r["ts"] >= watermark]
        kept_changes += [c for c in crows if c["ts"] >= watermark]
        state = OperatorState.from_bytes(blob, operator="t", source="test")
        time = EpochTime(0, start={KEY_SCOPE: watermark}, end={KEY_SCOPE: end}, key_split="p0")
        out, _ = op.run_inputs([([("a", srows)], [watermark]), ([("b", crows)], [watermark])],
                               state, None, time)  # fmt: skip
        emitted.update(row for _, rows in out for row in rows)
        for slot in state.keyed.get(KEY_SCOPE, {}).values():
            before = [v for v in slot.get("v", ()) if v[0] < end]
            assert len(before) <= 1 and not any(v[2] for v in before)
        blob = state.to_bytes()
        watermark = end
    assert emitted == as_of(kept_stream, kept_changes, how)
    assert KEY_SCOPE not in OperatorState.from_bytes(blob, operator="t", source="t").keyed


# --- a job in this process ----------------------------------------------------------------

SPLITS, PER_SPLIT, PER_EPOCH, USERS = 3, 40, 8, 5


def click(split: int, n: int) -> dict[str, Any]:
    """Click n of split `split`, about one per second, up to 2 s out of order; every 13th is
    8 s behind (late once its split is ahead)."""
    ts = 200_000 + n * 1_000 + split * 250 - (n * 7919 % 3) * 1_000
    if n % 13 == 12:
        ts -= 8_000
    return {"id": f"c{split}-{n}", "k": f"u{(n + split) % USERS}", "ts": ts}


def change(split: int, n: int) -> dict[str, Any]:
    """Profile change n of split `split`: every 3 s a user's tier changes; every 11th change
    deletes the profile; every 17th is 9 s behind (late)."""
    ts = 199_000 + n * 3_000 + split * 1_000 - (n % 2) * 1_000
    if n % 17 == 16:
        ts -= 9_000
    user = f"u{(n * 2 + split) % USERS}"
    return {"id": f"v{split}-{n}", "k": user, "ts": ts, "tier": n % 4, "deleted": n % 11 == 5}


def enriched(record: Any, version: Any) -> dict[str, Any]:
    return {"click": record["id"], "version": version and version["id"]}


def temporal_pipeline(table: str, dead: str, *, how: str = "left", partitions: int = 3) -> Pipeline:
    p = Pipeline(
        "enrich", records_per_epoch=PER_EPOCH, on_error="dead-letter", dead_letter=ParquetSink(dead)
    )
    clicks, changes = (
        p.source(
            GeneratorSource(SPLITS, fn, records_per_split=PER_SPLIT // (1 + (name == "changes"))),
            parallelism=SPLITS,
            name=name,
            event_time="ts",
            max_out_of_orderness="2 s",
        )
        for name, fn in (("clicks", click), ("changes", change))
    )
    clicks.key_by("k").temporal_join(
        changes.key_by("k"),
        how=how,
        emit=enriched,
        is_delete="deleted",
        partitions=partitions,
        on_late="dead-letter",
        name="profiles",
    ).sink(ParquetSink(table), name="out")
    return p


def _driver(tmp_path: Path, faults: Faults | None = None, **kw: Any) -> JobDriver:
    p = temporal_pipeline(str(tmp_path / "table"), str(tmp_path / "dead"), **kw)
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "enrich", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "enrich"),
                     policy=policy, faults=faults)  # fmt: skip


def _rows(tmp_path: Path) -> Counter[tuple[Any, Any]]:
    rows = read_table(str(tmp_path / "table")).to_pylist()
    return Counter((r["click"], r["version"]) for r in rows)


def _late(tmp_path: Path) -> set[str]:
    rows = read_table(str(tmp_path / "dead")).to_pylist()
    assert all(r["error_type"] == "LateRecord" and r["operator"] == "profiles" for r in rows)
    return {json.loads(r["record"])["id"] for r in rows}


def expected(how: str, late: set[str]) -> Counter[tuple[Any, Any]]:
    clicks = [click(s, n) for s in range(SPLITS) for n in range(PER_SPLIT)]
    changes = [change(s, n) for s in range(SPLITS) for n in range(PER_SPLIT // 2)]
    return as_of(
        [c for c in clicks if c["id"] not in late], [c for c in changes if c["id"] not in late], how
    )


@pytest.mark.parametrize("how", ["inner", "left"])
def test_the_join_equals_an_as_of_join_without_exactly_the_dead_lettered_records(
    tmp_path: Path, how: str
) -> None:
    assert _driver(tmp_path, how=how).run().finished
    late = _late(tmp_path)
    assert {i[0] for i in late} == {"c", "v"}  # late records on both sides
    rows = _rows(tmp_path)
    assert rows == expected(how, late)
    assert max(rows.values()) == 1
    assert any(v is None for _, v in rows) == (how == "left")


#: units 0-2 clicks, 3-5 changes, 6-8 the join
UNIT_FAULTS = {(2, 0): "fail", (3, 0): "fail", (3, 4): "fail", (5, 5): "fail", (6, 7): "fail"}


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_faults_on_both_sides_and_a_crash_give_the_fault_free_rows(
    tmp_path: Path, step: str
) -> None:
    assert _driver(tmp_path / "clean").run().finished
    with pytest.raises(DriverCrash):
        _driver(tmp_path, Faults(units=UNIT_FAULTS, crash_at=(6, step))).run()
    summary = _driver(tmp_path).run()
    assert summary.finished and summary.restored_from is not None
    assert _rows(tmp_path) == _rows(tmp_path / "clean")
    assert _late(tmp_path) == _late(tmp_path / "clean")


def test_a_rescaled_join_gives_the_fault_free_rows(tmp_path: Path) -> None:
    """3 join subtasks for three checkpoints, then 4, then 2: versions and waiting records
    move with their key; the rows equal the fault-free run's."""
    assert _driver(tmp_path / "clean").run().finished
    for partitions in (3, 4):
        assert not _driver(tmp_path, partitions=partitions).run(max_checkpoints=3).finished
    summary = _driver(tmp_path, partitions=2).run()
    assert summary.finished and summary.restored_from is not None
    assert _rows(tmp_path) == _rows(tmp_path / "clean")
    assert _late(tmp_path) == _late(tmp_path / "clean")


def test_errors_name_the_join_and_the_fix() -> None:
    p = Pipeline("bad")
    a = p.source(GeneratorSource(1, click, records_per_split=3), name="a", event_time="ts")
    b = p.source(GeneratorSource(1, change, records_per_split=3), name="b", event_time="ts")
    with pytest.raises(GraphError) as info:
        a.key_by("k").temporal_join(b.key_by("k"), how="right", partitions=2, name="t")
    assert str(info.value) == "temporal join 't': how='right'; use one of 'inner', 'left'"
    with pytest.raises(GraphError) as info:
        a.key_by("k").temporal_join(b.key_by("k"), is_delete=3, partitions=2, name="t")
    assert str(info.value) == (
        "temporal join 't': is_delete=3; give a field name that is true for deletes or a "
        "function of a change"
    )
    with pytest.raises(GraphError) as info:
        a.key_by("k").temporal_join(b, partitions=2, name="t")  # type: ignore[arg-type]
    assert str(info.value) == (
        "temporal join 't': join with a keyed changelog stream, e.g. changes.key_by('user'); "
        "got Stream"
    )
