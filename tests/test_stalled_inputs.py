"""The stalled-input warning (issue 45 item 4): an operator whose state grows while one input's
watermark stands still is named, with the input, once per episode, in the event log, the
progress line, the metrics and the report. The rule is `regional.runtime.stalled_inputs`."""

from __future__ import annotations

import itertools
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.events import CheckpointEvent
from metadata.storage import JobStorage
from regional.runtime.stalled_inputs import StallWatch


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=30),
    st.integers(1, 4),
)
def test_a_stall_is_reported_once_per_episode_and_only_while_state_grows(
    steps: list[tuple[int, int]], n: int
) -> None:
    """Random growth of the state and moves of one input's watermark: a stall is reported
    exactly when the watermark stood for n checkpoints while the state grew without
    shrinking, and never twice in one episode."""
    watch = StallWatch({"join": {"slow": frozenset({0})}}, n)
    size, mark, episode = 100, 0, False
    sizes: list[int] = []
    marks: list[int] = []
    for cid, (grow, move) in enumerate(steps, start=1):
        size += grow
        mark += 1 if move == 2 else 0
        if marks and marks[-1] != mark:
            episode, marks = False, []
        sizes.append(size)
        marks.append(mark)
        found = watch.observe(cid, {"join": size}, {0: mark})
        window = sizes[-(n + 1) :]
        expected = (
            not episode
            and len(marks) >= n + 1
            and len(window) == n + 1
            and window[-1] > window[0]
            and all(a <= b for a, b in itertools.pairwise(window))
        )
        assert bool(found) == expected, (cid, sizes, marks)
        if found:
            episode = True
            [stall] = found
            assert (stall.operator, stall.input, stall.until) == ("join", "slow", cid)
        assert (("join", "slow") in watch.stalled) == episode


def test_a_join_whose_payments_never_advance_says_so_once(tmp_path: Path) -> None:
    """orders advance, payments come with one event time forever: the join keeps every
    order waiting for a payment that the watermark says may still come, and its state grows.
    The checkpoint that finds it names the join and its stalled input, once."""
    import orders_job
    from prometheus_client import generate_latest

    from regional.cli.progress import checkpoint_line
    from regional.dataflow.pipeline import Pipeline
    from regional.report.html import render_html
    from regional.report.summary import build_report
    from regional.runtime.driver import JobDriver
    from regional.runtime.prometheus import job_registry
    from regional.runtime.stalled_inputs import STALL_CHECKPOINTS
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    p = Pipeline("stall", records_per_epoch=6)
    orders = p.source(
        GeneratorSource(2, lambda s, n: {"id": 2 * n + s, "ts": 1_000 * n}, records_per_split=60),
        parallelism=2, name="orders", event_time="ts",
    )  # fmt: skip
    payments = p.source(
        GeneratorSource(1, lambda s, n: {"id": -1, "ts": 0}, records_per_split=60),
        parallelism=1, name="payments", event_time="ts",
    )  # fmt: skip
    orders.key_by("id").interval_join(
        payments.key_by("id"), between=("0 s", "10 s"), how="left", partitions=2, name="paid"
    ).sink(ParquetSink(str(tmp_path / "out")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "stall", p, unit_timeout=30)
    events: list[CheckpointEvent] = []
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "stall"))
    driver.progress = events.append
    driver.run(max_checkpoints=STALL_CHECKPOINTS + 4)
    warned = [(e.checkpoint_id, w) for e in events for w in e.warnings]
    assert len(warned) == 1, warned
    cid, text = warned[0]
    assert text.startswith("operator 'paid' keeps growing its state (")
    assert "while its input 'payments' has not advanced its watermark since checkpoint" in text
    event = next(e for e in events if e.checkpoint_id == cid)
    assert f"\n    warning: {text}" in checkpoint_line(event)
    metrics = generate_latest(job_registry(driver)).decode().splitlines()
    assert 'regional_stalled_input{input="payments",job="stall",operator="paid"} 1.0' in metrics
    page = render_html(build_report([], events, job_id="stall"))
    assert "keeps growing its state" in page


def test_the_policy_key_stall_after_sets_how_long_a_watermark_may_stand_still(
    tmp_path: Path,
) -> None:
    """`event-time.stall-after = 2`: the stall is reported over 2 checkpoints, not 5."""
    import orders_job

    from regional.dataflow.pipeline import Pipeline
    from regional.policy import load_policy
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    p = Pipeline("stall", records_per_epoch=6)
    orders = p.source(
        GeneratorSource(1, lambda s, n: {"id": n, "ts": 1_000 * n}, records_per_split=60),
        parallelism=1, name="orders", event_time="ts",
    )  # fmt: skip
    payments = p.source(
        GeneratorSource(1, lambda s, n: {"id": -1, "ts": 0}, records_per_split=60),
        parallelism=1, name="payments", event_time="ts",
    )  # fmt: skip
    orders.key_by("id").interval_join(
        payments.key_by("id"), between=("0 s", "10 s"), how="left", partitions=1, name="paid"
    ).sink(ParquetSink(str(tmp_path / "out")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "stall", p, unit_timeout=30)
    policy = load_policy(env={}, overrides={"event-time.stall-after": 2}).policy
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "stall"), policy=policy
    )
    events: list[CheckpointEvent] = []
    driver.progress = events.append
    driver.run(max_checkpoints=6)
    [(cid, text)] = [(e.checkpoint_id, w) for e in events for w in e.warnings]
    assert f"over checkpoints {cid - 2}-{cid})" in text, text
