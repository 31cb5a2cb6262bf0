"""Damage in the job root never duplicates output: a restore below the sink's latest commit rolls
the sink back (or is refused), a root whose checkpoints are all damaged is not silently started
fresh, and new checkpoint ids never reuse a damaged checkpoint's."""

from __future__ import annotations

import dataclasses

import pytest

from regional.errors import RestoreError
from regional.policy import Policy
from regional.runtime.sim import Simulation


def _expected(sim: Simulation) -> list[tuple[str, int]]:
    return sorted((s, n) for s in sim.source.splits for n in range(sim.source.records_per_split))


def _truncate(sim: Simulation, checkpoint_id: int) -> None:
    path = f"{sim.storage.job_path}/chk-{checkpoint_id}/_metadata"
    fs = sim.storage.filesystem
    with fs.open_input_stream(path) as f:
        data = f.read()
    with fs.open_output_stream(path) as f:
        f.write(data[: len(data) // 2])


def test_a_damaged_newest_checkpoint_rolls_the_sink_back_and_the_output_is_exact():
    sim = Simulation(4, Policy(), records_per_split=9)
    first = sim.run(3)
    assert not first.finished and [i for _, i, _ in sim.sink.log][-1] == 3
    _truncate(sim, 3)  # committed, then its metadata was damaged
    driver = sim.new_driver()
    summary = driver.run()
    assert summary.restored_from == 2
    assert summary.restore_notes[-1] == (
        f"sink 'sink' holds commits of commit user '{driver.committers['sink'].commit_user}' "
        "up to 3, newer than the restored checkpoint 2: commit(s) 3 rolled back, their output "
        "is written again"
    )
    assert summary.finished and sorted(sim.sink.rows()) == _expected(sim)
    assert summary.checkpoints[0].checkpoint_id == 4  # id 3 is never reused


class _AppendOnly:
    """A table that cannot roll back (like a table format without a rollback API)."""

    def __init__(self, table: object) -> None:
        self.table = table

    def __getattr__(self, name: str) -> object:
        if name == "rollback":
            raise AttributeError(name)
        return getattr(self.table, name)


def test_a_sink_that_cannot_roll_back_makes_the_restore_refuse():
    sim = Simulation(4, Policy(), records_per_split=9)
    sim.run(3)
    _truncate(sim, 3)
    spec = sim.pipeline.vertices["sink"]
    sim.pipeline.vertices["sink"] = dataclasses.replace(spec, sink=_AppendOnly(sim.sink))
    driver = sim.new_driver()
    user = sim.sink.log[-1][0]  # the commit user of the run that wrote the checkpoints
    with pytest.raises(RestoreError) as refused:
        driver.start()
    assert str(refused.value) == (
        f"sink 'sink' holds commits of commit user '{user}' up to 3, newer than the restored "
        "checkpoint 2; restoring would write their output again and the sink cannot roll back. "
        "Restore a checkpoint at or after 3, or remove those commits from the table by hand "
        "and start again"
    )
    assert [i for _, i, _ in sim.sink.log] == [1, 2, 3]  # the table is untouched


def test_a_root_whose_checkpoints_are_all_damaged_is_refused_then_started_over_on_purpose():
    sim = Simulation(4, Policy(), records_per_split=9)
    sim.run(3)
    for cid in sim.storage.list_checkpoint_ids():
        _truncate(sim, cid)
    with pytest.raises(RestoreError, match="holds checkpoints, but none can be restored"):
        sim.new_driver().start()
    driver = sim.new_driver()
    driver.allow_fresh_start = True
    event = driver.epoch() if driver.start() else None
    assert event is not None and event.checkpoint_id == 4  # after the damaged 1..3
    assert sim.storage.read_file("chk-1/_metadata") is not None  # damaged files untouched
