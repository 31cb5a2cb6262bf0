"""`checkpointing.interval` in the driver loop, on the simulation's fake clock (no real sleeps):
an idle streaming job waits the interval from one trigger to the next instead of spinning;
epochs that read records (a backlog, a bounded job) follow each other at once."""

from __future__ import annotations

import itertools

from regional.policy import Policy
from regional.runtime.driver import IDLE_SLICE_S
from regional.runtime.sim import Simulation


def _triggers(summary) -> list[int]:
    return [e.trigger_time_ms for e in summary.checkpoints]


def test_an_idle_streaming_job_waits_the_interval_between_triggers():
    sim = Simulation(2, Policy(), bounded=False)
    sim.records_per_epoch = 0  # the log has no new records: every epoch reads nothing
    driver = sim.new_driver()
    driver.interval = 10.0
    summary = driver.run(max_checkpoints=5)
    triggers = _triggers(summary)
    assert [e.records_in for e in summary.checkpoints] == [0] * 5
    assert [b - a for a, b in itertools.pairwise(triggers)] == [10_000] * 4
    assert summary.seconds >= 4 * 10.0
    assert not summary.finished


def test_epochs_that_read_records_follow_each_other_without_waiting():
    sim = Simulation(2, Policy(), bounded=False, records_per_epoch=3)
    driver = sim.new_driver()
    driver.interval = 10.0
    summary = driver.run(max_checkpoints=5)
    assert all(e.records_in == 6 for e in summary.checkpoints)
    gaps = [b - a for a, b in itertools.pairwise(_triggers(summary))]
    assert max(gaps) < 1_000  # the dispatch's own (simulated) time only
    assert summary.seconds < 10.0


def test_a_bounded_job_runs_to_its_end_without_idling():
    sim = Simulation(4, Policy(), splits_per_unit=2, records_per_split=5, records_per_epoch=3)
    driver = sim.new_driver()
    driver.interval = 10.0
    summary = driver.run()
    assert summary.finished
    assert summary.seconds < 10.0
    assert sorted(sim.sink.rows()) == sorted(
        (s, i) for s in sim.source.splits for i in range(sim.source.records_per_split)
    )


def test_a_stop_request_ends_the_idle_wait():
    sim = Simulation(1, Policy(), bounded=False)
    sim.records_per_epoch = 0
    driver = sim.new_driver()
    driver.interval = 3600.0
    slept: list[float] = []

    def sleep(seconds: float) -> None:  # the operator presses Ctrl-C during the first wait
        slept.append(seconds)
        sim.clock.now += round(seconds * 1000)
        driver.request_stop()

    sim.clock.sleep = sleep  # type: ignore[method-assign]
    summary = driver.run()
    assert len(summary.checkpoints) == 1
    assert slept == [IDLE_SLICE_S]
