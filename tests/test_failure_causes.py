"""Why a unit fell back or a checkpoint aborted, as the user sees it: the first line of the
user's exception per unit in the event (`causes`), its traceback in the event log
(`tracebacks`), the progress line of `regional run`, the `message` column of
`regional inspect ROOT events`, and `inspect show` of an aborted checkpoint. The driver runs
the real task code in this process (no Spark)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import regional as regional_package
from metadata.events import CheckpointEvent, read_events
from metadata.storage import JobStorage
from regional.cli import main
from regional.cli.progress import checkpoint_line
from regional.dataflow.failures import TRACE_LIMIT
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.driver import JobDriver, RunSummary
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource


def _record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def _run(tmp_path: Path, poison: set[tuple[int, int]]) -> RunSummary:
    """4 splits of 10 records, 5 per epoch; each (split, n) in `poison` fails once."""

    def poisoned(r: dict) -> dict:
        if (r["split"], r["n"]) in poison:
            poison.discard((r["split"], r["n"]))
            raise ValueError(f"poison record {r['n']} of split {r['split']}\nsecond line")
        return r

    p = Pipeline("causes", records_per_epoch=5)
    src = p.source(GeneratorSource(4, _record, records_per_split=10), parallelism=4, name="src")
    src.map(poisoned, name="check").sink(ParquetSink(str(tmp_path / "table")), name="out")
    root = str(tmp_path / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    env = TaskEnv(root, "causes", p, unit_timeout=10)
    storage = JobStorage(root, "causes")
    driver = JobDriver(p, InProcessDispatcher(env), storage=storage, policy=policy)
    return driver.run()


def test_a_fallback_carries_the_first_line_and_the_log_the_traceback(tmp_path, capsys):
    summary = _run(tmp_path, {(1, 7)})
    assert [c.kind for c in summary.checkpoints][:3] == ["global", "regional", "global"]
    regional = summary.checkpoints[1]
    assert regional.causes == {1: "declined: ValueError: poison record 7 of split 1"}
    [trace] = regional.tracebacks.values()
    assert list(regional.tracebacks) == [1]
    assert "in poisoned" in trace and trace.endswith(
        "ValueError: poison record 7 of split 1\nsecond line\n"
    )
    assert len(trace) <= TRACE_LIMIT
    # regional's own frames are named from the package, the user's file as it is
    assert f'File "{os.path.join("regional", "dataflow", "walker.py")}", line' in trace
    assert str(Path(regional_package.__file__).parent) not in trace
    assert f'File "{__file__}", line' in trace
    # the event log holds the same, traceback included
    events, _ = read_events(JobStorage(str(tmp_path / "ckpt"), "causes"))
    assert events[1] == regional and events[0].tracebacks == {}
    # the progress line of `regional run` shows the unit's cause
    print(checkpoint_line(regional))
    out = capsys.readouterr().out.splitlines()
    assert out[1:] == ["    unit 1 (g1): declined: ValueError: poison record 7 of split 1"]
    # `inspect show 2`: the fallback unit's reason
    assert main(["inspect", str(tmp_path / "ckpt"), "show", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert {r["reason"] for r in rows if r["unit_id"] == 1} == {
        "declined: ValueError: poison record 7 of split 1"
    }


def test_an_aborted_checkpoint_names_every_failed_unit_everywhere(tmp_path, capsys):
    summary = _run(tmp_path, {(0, 2), (1, 2), (2, 2)})
    aborted = summary.checkpoints[0]
    assert (aborted.kind, aborted.abort_rule) == ("aborted", "3c-failure-ratio")
    assert aborted.causes == {
        u: f"declined: ValueError: poison record 2 of split {u}" for u in (0, 1, 2)
    }
    assert sorted(aborted.tracebacks) == [0, 1, 2]
    assert all("in poisoned" in t for t in aborted.tracebacks.values())

    print(checkpoint_line(aborted))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("    checkpoint 1 aborted (rule 3c): 3 of 4 units failed")
    assert lines[2:] == [
        f"    unit {u} (g{u}): declined: ValueError: poison record 2 of split {u}"
        for u in (0, 1, 2)
    ]

    root = str(tmp_path / "ckpt")
    assert main(["inspect", root, "events", "--json"]) == 0
    first = json.loads(capsys.readouterr().out)[0]
    assert first["message"] == aborted.message and first["kind"] == "aborted"
    assert first["causes"] == [
        {"unit_id": u, "cause": f"declined: ValueError: poison record 2 of split {u}"}
        for u in (0, 1, 2)
    ]
    assert "traceback" not in json.dumps(first).lower()  # tracebacks stay in the event files

    assert main(["inspect", root, "show", "1"]) == 2
    err = capsys.readouterr().err
    assert "checkpoint 1 was aborted (3c-failure-ratio), so it holds no state" in err
    assert "unit 0 (g0): declined: ValueError: poison record 2 of split 0; unit 1 (g1): " in err
    assert "events/000000000001-" in err


def test_progress_lists_at_most_five_causes(capsys):
    event = CheckpointEvent(
        job_id="j",
        checkpoint_id=4,
        kind="regional",
        trigger_time_ms=0,
        time_ms=10,
        fresh_units=2,
        fallback_units=tuple(range(7)),
        causes={u: f"timeout\nsecond line of {u}" for u in range(7)},
    )
    print(checkpoint_line(event))
    lines = capsys.readouterr().out.splitlines()
    assert lines[1:] == [f"    unit {u}: timeout" for u in range(5)] + [
        "    +2 more (regional inspect ROOT events)"
    ]
