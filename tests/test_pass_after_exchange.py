"""Units after a keyed exchange share their task's pass (`regional.dataflow.walker`): the
stateless and split-scoped vertices run once over all their records, the key-scoped counter once
per unit inside the pass; every order is still counted exactly once, and a run with the pass
equals one without it, checkpoint by checkpoint, through unit faults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orders_job as job
import pytest

from metadata.storage import JobStorage
from regional.dataflow import walker
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import Faults
from regional.runtime.task import TaskEnv

#: upstream units are 0-2, downstream (exchange reader) units 3-6
UNIT_FAULTS = {(2, 0): "fail", (2, 4): "fail", (3, 1): "fail", (4, 5): "fail", (4, 6): "fail"}


def _run(tmp_path: Path, *, task_pass: bool, faults: Faults) -> list[tuple[int, str]]:
    job.write_orders(str(tmp_path / "orders"))
    p = job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    # timeouts no loaded machine reaches: outcomes depend on the injected faults only
    overrides = {"checkpointing": {"timeout": "600 s", "region": {"max-failure-ratio": 0.3}}}
    policy = load_policy(env={}, overrides=overrides).policy
    env = TaskEnv(
        root, "orders", p, unit_timeout=600, faults=faults.unit_faults(), task_pass=task_pass
    )
    driver = JobDriver(
        p,
        job.InProcessDispatcher(env),
        storage=JobStorage(root, "orders"),
        policy=policy,
        faults=faults,
    )
    summary = driver.run()
    assert summary.finished
    assert job.rows(str(tmp_path / "table")) == job.expected_rows()
    return [(e.checkpoint_id, e.kind) for e in summary.checkpoints]


def test_reader_units_run_in_one_pass_with_their_counter_per_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passes: list[tuple[str, ...]] = []
    real = walker.run_epoch

    def counted(plan: Any, units: Any, **kw: Any) -> Any:
        if kw.get("as_pass") and len(units) > 1:
            passes.append(tuple(sorted(units[0].restore)))
        return real(plan, units, **kw)

    monkeypatch.setattr(walker, "run_epoch", counted)
    _run(tmp_path, task_pass=True, faults=Faults())
    assert ("by-customer", "out", "totals") in passes  # the four reader units together


@pytest.mark.parametrize("faults", [{}, UNIT_FAULTS], ids=["fault-free", "unit-faults"])
def test_a_run_with_the_pass_equals_one_without_it(
    tmp_path: Path, faults: dict[tuple[int, int], str]
) -> None:
    with_pass = _run(tmp_path / "pass", task_pass=True, faults=Faults(units=faults))
    alone = _run(tmp_path / "alone", task_pass=False, faults=Faults(units=faults))
    # checkpoint by checkpoint alike (the driver's end-of-input check never looks at the
    # segments the cleaner deletes meanwhile: `ExchangeReader._segments(after=...)`)
    assert with_pass == alone
