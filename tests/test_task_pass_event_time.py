"""A task's pass under event time (`regional.dataflow.walker`): each unit keeps its own
watermarks (by split and for its subtask), its late count and its exchange writer's marks; the
operators that need them (windows, timers) run once per unit inside the pass, the others once
over every unit's records; every unit's epoch equals the one it has alone."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from unit_chain import UnitChain

from metadata.model import SubtaskState
from regional.dataflow.operators import records_of
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.unit_epoch import UnitEpoch
from regional.dataflow.walker import TaskUnit, run_task_epoch
from regional.dataflow.windows import Tumbling, count
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

NOW_MS = 1_700_000_000_000


def _record(split: int, n: int) -> dict[str, int]:
    # event times go up by 1 s per record with some disorder, and differ per split
    return {"s": split, "n": n, "ts": (n * 1000 + (n % 3) * 1500 + split * 700)}


def _timer_count(ctx: Any, r: dict[str, int]) -> Iterator[dict[str, int]]:
    c = ctx.value_state("c", 0)
    c.update(c.value() + 1)
    ctx.timers.at_event_time(r["ts"] + 2000)
    yield {"s": r["s"], "n": r["n"], "c": c.value(), "fired": 0}


def _fired(ctx: Any, ts: int) -> list[dict[str, int]]:
    return [{"s": -1, "n": ts, "c": ctx.value_state("c", 0).value(), "fired": 1}]


def _pipeline(parallelism: int, splits: int, per_split: int, per_epoch: int) -> Pipeline:
    p = Pipeline(
        "timed-pass",
        records_per_epoch=per_epoch,
        on_error="dead-letter",
        dead_letter=ParquetSink("/unused/dead"),
    )
    src = p.source(
        GeneratorSource(splits, _record, records_per_split=per_split),
        parallelism=parallelism,
        name="src",
        event_time="ts",
        max_out_of_orderness="1 s",
    )
    kept = src.map(lambda r: {**r, "k": r["n"] % 3}, name="keyed").filter(
        lambda r: r["n"] % 5 != 4, name="kept"
    )
    kept.key_by(lambda r: r["k"]).window(
        Tumbling("4 s"), aggregate=count(), on_late="dead-letter", name="w"
    ).sink(ParquetSink("/unused/windows"), name="windows")
    kept.key_by(lambda r: r["k"]).process(_timer_count, on_timer=_fired, name="timers").sink(
        ParquetSink("/unused/timers"), name="fired"
    )
    return p


def _seen(epoch: UnitEpoch) -> tuple[Any, ...]:
    rows = {v: [r for b in bs for r in records_of(b)] for v, bs in epoch.sink_batches.items()}
    for dead in [v for v in rows if v.startswith("dead")]:  # the trace differs by frames only
        rows[dead] = [{k: r[k] for k in r if k != "trace"} for r in rows[dead]]
    return (
        epoch.split_states,
        epoch.snapshots,
        rows,
        epoch.records_in,
        epoch.records_out,
        epoch.dead_lettered,
        epoch.late,
        epoch.watermark,
        epoch.sink_watermarks,
    )


@settings(max_examples=25, deadline=None)
@given(
    parallelism=st.integers(2, 3),
    owners=st.lists(st.integers(0, 2), min_size=1, max_size=5),
    per_split=st.integers(0, 12),
    per_epoch=st.integers(1, 6),
    epochs=st.integers(1, 4),
)
def test_a_timed_pass_gives_every_unit_the_epoch_it_has_alone(
    parallelism: int, owners: list[int], per_split: int, per_epoch: int, epochs: int
) -> None:
    p = _pipeline(parallelism, len(owners), per_split, per_epoch)
    chain = UnitChain(p, parallelism, owners)
    for checkpoint in range(1, epochs + 1):
        units = chain.units(checkpoint)
        alone = [chain.alone(p, unit, checkpoint, NOW_MS) for unit in units]
        together = run_task_epoch(p, units, checkpoint_id=checkpoint, now_ms=NOW_MS)
        assert together is not None
        assert [_seen(t) for t in together] == [_seen(a) for a in alone]
        for epoch in together:  # the user functions ran (no record is a dead letter)
            assert epoch.dead_lettered == 0 or epoch.late > 0
        for u, epoch in enumerate(together):
            chain.keep(u, epoch)


def test_the_timed_pass_runs_windows_and_timers_per_unit_and_they_fire() -> None:
    from regional.dataflow.plan import compile_plan

    p = _pipeline(2, 2, 12, 12)
    shape = compile_plan(p).shape(p.vertices)
    assert sorted(v.id for v in shape.order if not v.merges) == ["timers", "w"]
    units = [
        TaskUnit(
            {v: SubtaskState(v, u, u) for v in p.vertices},
            (("src", u, f"g{u}"),),
            (),
            lambda s: (b"", "none"),
        )
        for u in range(2)
    ]
    together = run_task_epoch(p, units, checkpoint_id=1, now_ms=NOW_MS)
    assert together is not None
    for epoch in together:
        rows = {v: [r for b in bs for r in records_of(b)] for v, bs in epoch.sink_batches.items()}
        assert rows["windows"] and any(r["fired"] for r in rows["fired"])
        assert epoch.watermark is not None and epoch.watermark > 0
