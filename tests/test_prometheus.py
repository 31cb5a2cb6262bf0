"""The Prometheus endpoint, scraped over HTTP on a free loopback port while the real `JobDriver`
runs a simulated job (regional.runtime.sim) in which unit 1 fails checkpoints 2 and 3."""

from __future__ import annotations

import socket
import urllib.request

import pytest

from regional.policy import Policy, load_policy
from regional.runtime.prometheus import MetricsPortError, serve_metrics
from regional.runtime.sim import Simulation

pytest.importorskip("prometheus_client")


def _scrape(port: int) -> dict[str, float]:
    """Every sample of the endpoint (comments left out), by its name and labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_scraped_during_a_run_with_regional_checkpoints_and_an_abort():
    overrides = {"checkpointing": {"region": {"max-failure-ratio": 0.25}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = {(2, 1): "decline", (3, 1): "decline", (4, 0): "decline", (4, 2): "decline"}
    sim = Simulation(4, policy, faults=faults, bounded=False, records_per_epoch=3)
    driver = sim.new_driver()
    scraped: dict[int, dict[str, float]] = {}

    def progress(event) -> None:  # scraped from the endpoint while the driver runs
        scraped[event.checkpoint_id] = _scrape(port)

    driver.progress = progress
    with serve_metrics(driver, port=0) as port:
        driver.run(max_checkpoints=4)
    job = 'job="sim"'
    assert scraped[3] == {
        f'regional_checkpoints_total{{{job},kind="global"}}': 1.0,
        f'regional_checkpoints_total{{{job},kind="regional"}}': 2.0,
        f'regional_checkpoints_total{{{job},kind="savepoint"}}': 0.0,
        f"regional_records_in_total{{{job}}}": 30.0,  # 4 units x 3 records, unit 1 declined twice
        f"regional_commit_failures_total{{{job}}}": 0.0,
        f"regional_commit_lag{{{job}}}": 0.0,
        f'regional_unit_lag{{{job},name="unit 1",unit="1"}}': 2.0,
        f"regional_stuck_units{{{job}}}": 0.0,
        f"regional_latest_completed_checkpoint_id{{{job}}}": 3.0,
        f"regional_oldest_ref_checkpoint_id{{{job}}}": 1.0,
        f"regional_last_checkpoint_duration_seconds{{{job}}}": 0.01,
    }
    # checkpoint 4: units 0 and 2 failed too, 3 of 4 > 0.25: aborted by the failure ratio
    assert scraped[4][f'regional_checkpoints_aborted_total{{{job},rule="3c-failure-ratio"}}'] == 1
    assert scraped[4][f"regional_latest_completed_checkpoint_id{{{job}}}"] == 3.0
    with pytest.raises(OSError):  # the server is gone after the block
        _scrape(port)


def test_a_global_checkpoint_refers_to_itself_and_units_at_0_are_left_out():
    sim = Simulation(2, Policy(), bounded=False)
    driver = sim.new_driver()
    with serve_metrics(driver, port=0) as port:
        before = _scrape(port)
        driver.run(max_checkpoints=2)
        after = _scrape(port)
    assert "regional_latest_completed_checkpoint_id" not in "".join(before)
    assert after['regional_oldest_ref_checkpoint_id{job="sim"}'] == 2.0
    assert not [name for name in after if name.startswith("regional_unit_lag")]


def test_a_taken_port_names_itself_and_the_fix():
    sim = Simulation(1, Policy())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(MetricsPortError) as error, serve_metrics(sim.new_driver(), port=port):
            pass
    assert str(error.value) == (
        f"cannot serve metrics on 127.0.0.1:{port}: Address already in use; pick a free port "
        "(--metrics-port) or stop what uses it"
    )


def test_a_stuck_unit_is_a_gauge_named_by_what_it_reads():
    faults = {(c, 1): "decline" for c in range(1, 10)}
    sim = Simulation(4, Policy(), faults=faults, bounded=False)
    driver = sim.new_driver()
    scraped: dict[int, dict[str, float]] = {}

    def progress(event) -> None:
        sim.clock.sleep(2.0)
        scraped[event.checkpoint_id] = _scrape(port)

    driver.progress = progress
    with serve_metrics(driver, port=0) as port:
        driver.run(max_checkpoints=5)
    job = 'job="sim"'
    assert scraped[2][f"regional_stuck_units{{{job}}}"] == 0.0
    assert not [k for k in scraped[2] if k.startswith("regional_unit_stuck_seconds")]
    assert scraped[5][f"regional_stuck_units{{{job}}}"] == 1.0
    # stuck since checkpoint 3 completed: its scrape's 2 s wait and two more 2 s waits and two
    # 10 ms epochs later, on the driver's (simulated) clock
    stuck = f'regional_unit_stuck_seconds{{{job},name="unit 1",reads="s1",unit="1"}}'
    assert scraped[5][stuck] == 6.02


def test_a_scrape_during_an_epoch_sees_the_snapshot_published_after_the_previous_one():
    sim = Simulation(2, Policy(), bounded=False, records_per_epoch=3)
    driver = sim.new_driver()
    run = sim.dispatcher.run
    during: list[dict[str, float]] = []

    def scraped_while_running(*args, **kwargs):
        during.append(_scrape(port))
        return run(*args, **kwargs)

    sim.dispatcher.run = scraped_while_running  # type: ignore[method-assign]
    with serve_metrics(driver, port=0) as port:
        driver.run(max_checkpoints=3)
        after = _scrape(port)
    records = 'regional_records_in_total{job="sim"}'
    latest = 'regional_latest_completed_checkpoint_id{job="sim"}'
    assert [s[records] for s in during] == [0.0, 6.0, 12.0]
    assert [s.get(latest) for s in during] == [None, 1.0, 2.0]
    assert (after[records], after[latest]) == (18.0, 3.0)


def test_the_collector_reads_a_snapshot_and_a_clock_only():
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from metadata.events import StuckUnit
    from regional.runtime.metrics import MetricsSnapshot
    from regional.runtime.prometheus import JobCollector

    snapshot = MetricsSnapshot(
        job_id="j",
        latest_completed_id=7,
        regional_checkpoint_count=2,
        global_checkpoint_count=5,
        savepoint_count=0,
        aborted_by_rule={},
        oldest_ref_checkpoint_id=None,
        unit_lag={},
        commit_lag=1,
        commit_failures=0,
        records_in=42,
        event_time=True,
        records_late=3,
        watermark_ms=5_000,
        watermark_unit=2,
        last_checkpoint_seconds=0.5,
        stuck_units=(
            StuckUnit(unit_id=4, splits=("a", "b"), since_ms=1_000, owner_checkpoint_id=3,
                      fallbacks=9),
        ),
    )  # fmt: skip
    registry = CollectorRegistry(auto_describe=False)
    registry.register(JobCollector(lambda: snapshot, lambda: 3_500, {4: "orders[1]"}))
    text = generate_latest(registry).decode()
    for sample in (
        'regional_records_in_total{job="j"} 42.0',
        'regional_records_late_total{job="j"} 3.0',
        'regional_oldest_ref_checkpoint_id{job="j"} 7.0',  # global: the latest itself
        'regional_unit_stuck_seconds{job="j",name="orders[1]",reads="a,b",unit="4"} 2.5',
        'regional_watermark_seconds{job="j",name="unit 2",unit="2"} 5.0',
        'regional_last_checkpoint_duration_seconds{job="j"} 0.5',
    ):
        assert sample in text.splitlines()


def test_an_unknown_watermark_is_nan_and_an_ended_one_inf_not_9e15() -> None:
    """Issue 45: a -inf watermark (no record read yet) was exported as -9.22e15 seconds, a
    time 292 million years ago that a dashboard plots as a cliff. It is NaN (unknown) now,
    and +inf (input ended) is +Inf."""
    from prometheus_client import generate_latest
    from prometheus_client.registry import CollectorRegistry

    from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
    from regional.runtime.metrics import MetricsSnapshot
    from regional.runtime.prometheus import JobCollector

    for ms, shown in ((MIN_WATERMARK, "NaN"), (MAX_WATERMARK, "+Inf"), (1_500, "1.5")):
        snapshot = MetricsSnapshot(
            job_id="j", latest_completed_id=1, regional_checkpoint_count=0,
            global_checkpoint_count=1, savepoint_count=0, aborted_by_rule={},
            oldest_ref_checkpoint_id=None, unit_lag={}, commit_lag=0, commit_failures=0,
            event_time=True, watermark_ms=ms, watermark_unit=0,
        )  # fmt: skip
        registry = CollectorRegistry(auto_describe=False)
        registry.register(JobCollector(lambda s=snapshot: s, lambda: 0, {0: "clicks[0]"}))
        lines = generate_latest(registry).decode().splitlines()
        assert f'regional_watermark_seconds{{job="j",name="clicks[0]",unit="0"}} {shown}' in lines
