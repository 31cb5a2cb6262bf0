"""Drivers racing for one job root, as processes: `regional run` twice at once (one runs, one is
refused), then the runner killed with SIGKILL and a third taking over.

The crash points of one driver (os._exit after a checkpoint's metadata, after its acks) are
`tests/test_sink_parquet.py`'s hard-crash test, read back by four readers."""

from __future__ import annotations

import os
import queue
import subprocess
import sys
import textwrap
import threading

import pytest

from regional.sinks.parquet import read_table

pytestmark = pytest.mark.spark


def _run(file, root, **env):
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[2]"]
    return subprocess.run(
        [*cmd, "--checkpoint-dir", root],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


SLOW = textwrap.dedent(
    """
    import os
    import time
    from regional import GeneratorSource, ParquetSink, Pipeline

    def held(record):  # with HOLD set, the third epoch never ends (until the unit timeout)
        if os.environ.get("HOLD") and record["n"] >= 10:
            time.sleep(600)
        return record

    pipeline = Pipeline("leased", records_per_epoch=5)
    src = pipeline.source(
        GeneratorSource(4, lambda s, n: {"s": s, "n": n}, records_per_split=30), parallelism=4
    )
    src.map(held).sink(ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table"))
    """
)


def _lines(driver: subprocess.Popen[str], index: int, events: queue.Queue) -> None:
    """Hand each line `driver` prints to `events` as (index, line), then (index, None)."""
    assert driver.stdout is not None
    for line in driver.stdout:
        events.put((index, line))
    events.put((index, None))


def test_two_drivers_started_together_one_runs_and_once_it_is_killed_the_next_takes_over(tmp_path):
    """Two drivers race for the job root: one runs, the other is refused naming it. A driver
    started while the runner runs is refused before it starts Spark. The runner is then killed
    with SIGKILL mid-run; the next driver takes the lease over at once, restores, and the table
    holds every row once."""
    file = tmp_path / "job.py"
    file.write_text(SLOW)
    root = str(tmp_path / "ckpt")
    cmd = [sys.executable, "-m", "regional.cli", "run", str(file), "--master", "local[2]"]
    errors = [tmp_path / f"stderr-{i}" for i in range(2)]
    drivers = [
        subprocess.Popen(
            [*cmd, "--checkpoint-dir", root],
            stdout=subprocess.PIPE,
            stderr=error.open("w"),
            text=True,
            env={**os.environ, "HOLD": "1"},
        )
        for error in errors
    ]
    events: queue.Queue[tuple[int, str | None]] = queue.Queue()
    readers = [
        threading.Thread(target=_lines, args=(d, i, events), daemon=True)
        for i, d in enumerate(drivers)
    ]
    for reader in readers:
        reader.start()
    printed: list[list[str]] = [[], []]
    ended: set[int] = set()
    running: int | None = None
    try:
        while running is None or not ended:  # one checkpoints (and then holds), one exits
            index, line = events.get(timeout=300)
            if line is None:
                ended.add(index)
                assert len(ended) == 1, printed  # the runner holds its third epoch
            else:
                printed[index].append(line)
                if line.startswith("checkpoint"):
                    running = index
        [refused] = ended
        assert running == 1 - refused, printed
        assert drivers[refused].wait(timeout=60) == 2
        [message] = errors[refused].read_text().strip().splitlines()
        assert message.startswith(f"regional run: job root {root}/leased is in use by driver ")
        assert f"pid {drivers[running].pid})" in message
        late = _run(file, root)  # while the runner holds: refused before Spark starts
        assert late.returncode == 2
        assert f"pid {drivers[running].pid})" in late.stderr
        assert "starting Spark" not in late.stdout
    finally:
        for driver in drivers:
            driver.kill()
            driver.wait()
    resumed = _run(file, root)  # the killed driver's lease is taken over at once
    assert resumed.returncode == 0, resumed.stderr
    assert "restored from checkpoint" in resumed.stdout and "job finished" in resumed.stdout
    rows = read_table(root + "-table")
    got = sorted(zip(rows.column("s").to_pylist(), rows.column("n").to_pylist(), strict=True))
    assert got == [(s, n) for s in range(4) for n in range(30)]
