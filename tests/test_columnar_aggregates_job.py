"""The built-in aggregates over Arrow columns in a whole job, in this process
(`tests/windows_job.builtin_aggregates`: sum, mean, max and count in tumbling and sliding
windows and a running sum, after an exchange by a field): fault-free, their rows equal the
record-wise job's row for row; rescaled after the exchange (3 -> 2) with unit faults on both
sides and a driver crash, the windows and dead letters still equal the fault-free record-wise
run's, and each user's running sum ends at the same value."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orders_job
import pytest
import windows_job as job

from metadata.storage import JobStorage
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import read_table


def _driver(
    directory: Path, partitions: int, *, columnar: bool, faults: Faults | None = None
) -> JobDriver:
    p = job.builtin_aggregates(str(directory / "out"), partitions, columnar=columnar)
    root = str(directory / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "priced", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, "priced"),
        policy=policy,
        faults=faults,
    )


def outputs(directory: Path) -> dict[str, Any]:
    """Per window operator its rows (user, start, end, value) sorted, the dead letters as
    (operator, split, n) sorted, and the running sum's rows in commit order."""
    out: dict[str, Any] = {}
    for name in job.BUILTINS:
        rows = read_table(str(directory / "out" / name)).to_pylist()
        out[name] = sorted((r["user"], r["start"], r["end"], r["value"]) for r in rows)
    dead = read_table(str(directory / "out" / "dead")).to_pylist()
    out["dead"] = sorted(
        (r["operator"], json.loads(r["record"])["split"], json.loads(r["record"])["n"])
        for r in dead
    )
    running = read_table(str(directory / "out" / job.RUNNING)).to_pylist()
    out[job.RUNNING] = [(r["user"], r["value"]) for r in running]
    return out


def final_values(rows: list[tuple[str, float]]) -> dict[str, float]:
    """Each user's last committed running value."""
    return dict(rows)


@pytest.fixture(scope="module")
def record_wise(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    directory = tmp_path_factory.mktemp("record-wise")
    assert _driver(directory, 3, columnar=False).run().finished
    out = outputs(directory)
    late = [(s, n) for s in range(job.SPLITS) for n in range(22, job.PER_SPLIT, 23)]
    assert out["dead"] == sorted((op, s, n) for op in job.BUILTINS for s, n in late)
    assert all(out[name] for name in (*job.BUILTINS, job.RUNNING))
    return out


@pytest.fixture
def folds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The operators that folded a batch over Arrow columns (window or running aggregate)."""
    import regional.dataflow.columnar_aggregates as columnar
    import regional.dataflow.running_aggregate as running
    import regional.dataflow.window_operator as windows

    seen: list[str] = []
    real = columnar.fold

    def spy(agg: Any, *args: Any) -> Any:
        seen.append(agg.columnar)
        return real(agg, *args)

    monkeypatch.setattr(windows, "fold", spy)
    monkeypatch.setattr(running, "fold", spy)
    return seen


def test_the_columnar_job_gives_the_record_wise_rows_row_for_row(
    tmp_path: Path, record_wise: dict[str, Any], folds: list[str]
) -> None:
    assert _driver(tmp_path, 3, columnar=True).run().finished
    assert outputs(tmp_path) == record_wise
    assert set(folds) == {"sum", "mean", "max", "count"}


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_a_rescale_unit_faults_and_a_driver_crash_change_no_window_nor_final_total(
    tmp_path: Path, record_wise: dict[str, Any], folds: list[str], step: str
) -> None:
    assert not _driver(tmp_path, 3, columnar=True).run(max_checkpoints=3).finished
    # at 2 partitions: upstream units 0-3, downstream 4-5 fall back, then the driver crashes
    units = {(5, 1): "fail", (5, 4): "fail", (6, 5): "fail", (6, 2): "fail", (7, 4): "fail"}
    faults = Faults(units=units, crash_at=(7, step))
    with pytest.raises(DriverCrash):
        _driver(tmp_path, 2, columnar=True, faults=faults).run()
    summary = _driver(tmp_path, 2, columnar=True).run()
    assert summary.finished and summary.restored_from is not None
    out = outputs(tmp_path)
    for name in (*job.BUILTINS, "dead"):
        assert out[name] == record_wise[name], name
    assert final_values(out[job.RUNNING]) == final_values(record_wise[job.RUNNING])
    assert set(folds) == {"sum", "mean", "max", "count"}
