"""Windows and timers run in this process (`tests/windows_job.py`, no Spark): forward-chain
windows equal an independent model, through unit faults and a driver crash they commit the
fault-free rows row for row, late records are dead-lettered with the reason, window state
rescales with its splits, a sessionizer's timers close quiet users' sessions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orders_job
import pytest
import windows_job as job

from metadata.storage import JobStorage
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.windows import Tumbling, count
from regional.errors import GraphError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource


def _driver(tmp_path: Path, p: Pipeline, faults: Faults | None = None, **kw: Any) -> JobDriver:
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "clicks", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, "clicks"),
        policy=policy,
        faults=faults,
        **kw,
    )


@pytest.mark.parametrize("kind", ["tumbling", "sliding", "session"])
def test_forward_chain_windows_emit_exactly_the_model_rows(tmp_path: Path, kind: str) -> None:
    table = str(tmp_path / "table")
    summary = _driver(tmp_path, job.pipeline(kind, table)).run()
    assert summary.finished
    want, late = job.forward_model(kind)
    assert late > 0  # the data has late records, and they are left out
    assert job.rows(table) == want


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_unit_faults_and_a_driver_crash_commit_the_fault_free_window_rows(
    tmp_path: Path, step: str
) -> None:
    table = str(tmp_path / "table")
    faults = Faults(units={(2, 0): "fail", (3, 1): "fail", (4, 0): "fail"}, crash_at=(5, step))
    first = _driver(tmp_path, job.pipeline("sliding", table), faults)
    with pytest.raises(DriverCrash):
        first.run()
    summary = _driver(tmp_path, job.pipeline("sliding", table)).run()
    assert summary.finished and summary.restored_from is not None
    assert job.rows(table) == job.forward_model("sliding")[0]


def test_late_records_are_dead_lettered_with_the_reason(tmp_path: Path) -> None:
    table, dead = str(tmp_path / "table"), str(tmp_path / "dead")
    p = job.pipeline("tumbling", table, on_late="dead-letter", dead_letter=ParquetSink(dead))
    assert _driver(tmp_path, p).run().finished
    letters = read_table(dead).to_pylist()
    _, late = job.forward_model("tumbling")
    assert len(letters) == late
    first = min(letters, key=lambda r: (r["split_id"], r["record_index"]))
    assert first["operator"] == "win" and first["error_type"] == "LateRecord"
    assert "is behind the watermark" in first["error_message"]
    assert "every window of the record had closed" in first["error_message"]
    assert job.rows(table) == job.forward_model("tumbling")[0]


def test_window_state_moves_with_its_split_on_a_rescale(tmp_path: Path) -> None:
    table = str(tmp_path / "table")
    first = _driver(tmp_path, job.pipeline("tumbling", table, parallelism=2))
    first.run(max_checkpoints=3)
    assert not first.finished
    summary = _driver(tmp_path, job.pipeline("tumbling", table, parallelism=4)).run()
    assert summary.finished and summary.restored_from == 3
    assert job.rows(table) == job.forward_model("tumbling")[0]


def test_a_sessionizer_closes_every_quiet_users_session_by_its_timer(tmp_path: Path) -> None:
    table = str(tmp_path / "table")
    driver = _driver(tmp_path, job.sessionizer(table))
    driver.run(max_checkpoints=4)  # the input is far from read: quiet users' timers fired
    early = {r["user"]: r for r in read_table(table).to_pylist()}
    assert {u: (r["clicks"], r["end"]) for u, r in early.items() if u[0] == "q"} == {
        "q0": (10, 9_000 + job.GAP),
        "q1": (10, 9_000 + job.GAP),
    }
    summary = _driver(tmp_path, job.sessionizer(table)).run()
    assert summary.finished
    got = sorted((r["user"], r["clicks"], r["end"]) for r in read_table(table).to_pylist())
    assert got == job.expected_sessions()


def test_windows_without_event_time_or_with_two_aggregates_are_refused() -> None:
    p = Pipeline("x")
    src = p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=3))
    with pytest.raises(GraphError, match=r"window 'w': no source upstream reads with event time"):
        src.key_by(lambda r: r["k"]).window(Tumbling("1 s"), aggregate=count(), name="w")
    with pytest.raises(GraphError, match=r"window 'w': give aggregate=<count\(\)"):
        src.key_by(lambda r: r["k"]).window(
            Tumbling("1 s"), aggregate=count(), reduce=max, name="w"
        )
    with pytest.raises(GraphError, match=r"on_late='dead-letter' writes late records"):
        src.key_by(lambda r: r["k"]).window(
            Tumbling("1 s"), aggregate=count(), on_late="dead-letter", name="w"
        )
    with pytest.raises(GraphError, match=r"source 'ev': max_out_of_orderness='later'"):
        p.source(
            GeneratorSource(1, lambda s, n: {}),
            name="ev",
            event_time=len,
            max_out_of_orderness="later",
        )


def test_timers_without_a_callback_say_how_to_get_them(tmp_path: Path) -> None:
    p = Pipeline("t", records_per_epoch=5)
    (
        p.source(GeneratorSource(1, lambda s, n: {"k": n}, records_per_split=3), event_time=len)
        .key_by(lambda r: r["k"])
        .process(lambda ctx, r: ctx.timers.at_event_time(5), name="p")
        .sink(ParquetSink(str(tmp_path / "t")), name="out")
    )
    event = _driver(tmp_path, p).epoch()
    assert event.kind == "aborted"  # its one unit failed: the first checkpoint cannot fall back
    assert event.causes[0] == (
        "declined: TypeError: ctx.timers.at_event_time: this process has no timer callback; "
        "give one: "
        "keyed.process(fn, on_timer=lambda ctx, ts: ...)"
    )


@pytest.mark.parametrize("unit", [0, 1])
def test_the_job_watermark_never_goes_back_while_a_unit_falls_back(
    tmp_path: Path, unit: int
) -> None:
    """The event's watermark is the lowest over every unit, a fallen-back unit counted with its
    owner's: it does not jump ahead while a unit that is behind falls back and come back down
    when the unit is fresh again (issue 36)."""
    events: list[Any] = []
    faults = Faults(units={(3, unit): "fail", (4, unit): "fail"})
    _driver(tmp_path, job.pipeline("tumbling", str(tmp_path / "t")), faults,
            progress=events.append).run()  # fmt: skip
    assert [e.kind for e in events][1:5] == ["global", "regional", "regional", "global"]
    # checkpoints 2..6: no new split yet (a new split can lower a unit's own watermark)
    marks = [e.watermark_ms for e in events[1:6]]
    assert marks == sorted(marks)
