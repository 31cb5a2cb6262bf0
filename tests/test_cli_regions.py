"""`regional regions GRAPH [--json]`: output for people and machines, exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from regional.cli import main

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "graphs"


def test_json_for_the_mixed_example(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regions", str(EXAMPLES / "mixed.json"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["regional_allowed"] is True
    assert out["reason"] is None
    assert (out["num_regions"], out["num_units"]) == (5, 3)
    first = "backfill#0 clean#0 clean#1 clean#2 clean#3 orders#0 orders#1 orders#2 orders#3"
    assert out["units"] == [
        [*first.split(), "orders_sink#0", "orders_sink#1"],
        ["clicks#0", "clicks_sink#0", "sessions#0"],
        ["clicks#1", "clicks_sink#1", "sessions#1"],
    ]
    assert out["regions"][:3] == [
        ["backfill#0"],
        ["clicks#0", "clicks_sink#0", "sessions#0"],
        ["clicks#1", "clicks_sink#1", "sessions#1"],
    ]
    assert out["regions"][3] == ["clean#0", "clean#1", "orders#0", "orders#1", "orders_sink#0"]
    assert out["warnings"] == [
        "edge backfill -> clean (rescale, blocking) joins different pipelined regions through a "
        "blocking exchange, so they fall back together as one unit; make the exchange "
        "pipelined for finer units"
    ]
    assert len(out["graph_fingerprint"]) == 64


def test_json_when_regional_is_not_possible(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regions", str(EXAMPLES / "keyby.toml"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["regional_allowed"], out["num_units"]) == (False, 1)
    assert out["reason"].startswith("the job has a single fallback unit")


def test_table_for_people(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["regions", str(EXAMPLES / "mixed.json"), "--limit", "2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[2:8] == [
        "vertex    name                    kind    parallelism  units",
        "--------  ----------------------  ------  -----------  -----",
        "backfill  Source: order backfill  source            1      1",
        "clicks    Source: clicks          source            2      2",
        "... 5 more vertices (--limit 0 shows all)",
        "",
    ]
    del lines[2:8]
    assert lines[0] == (
        f"{EXAMPLES / 'mixed.json'}: 7 vertices, 17 subtasks, 5 regions, 3 fallback units; "
        "regional checkpoints: yes"
    )
    assert lines[1].startswith("warning: edge backfill -> clean (rescale, blocking)")
    assert lines[2:] == [
        "unit  regions  subtasks  members",
        "----  -------  --------  --------------------------------------------------",
        "   0        3        11  backfill#0, orders#0-3, clean#0-3, orders_sink#0-1",
        "   1        1         3  clicks#0, sessions#0, clicks_sink#0",
        "... 1 more units (--limit 0 shows all, --json lists them)",
    ]


def test_bad_graph_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('vertices = [{id = "a", parallelism = 0}]\n')
    assert main(["regions", str(bad)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        f"regional regions: {bad}: vertex 'a': parallelism 0 is < 1; set `parallelism` to at "
        "least 1\n"
    )


def test_console_script_runs() -> None:
    script = Path(sys.executable).parent / "regional"
    done = subprocess.run(
        [str(script), "regions", str(EXAMPLES / "forward_chain.toml"), "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert (out["num_regions"], out["num_units"]) == (8, 8)
    assert out["units"][7] == ["enrich#7", "parse#7", "read#7", "write#7"]


PIPELINE = """
from regional.dataflow.pipeline import Pipeline
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

pipeline = Pipeline("wide")
src = pipeline.source(GeneratorSource(8, lambda s, n: {"n": n}), parallelism=4, name="src")
src.map(lambda r: r, name="copy").sink(ParquetSink("/nonexistent/out"), name="out")
"""


def test_a_pipeline_file_is_analysed_as_regional_run_loads_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: `regional regions PIPELINE.py` said "neither valid JSON nor TOML"."""
    file = tmp_path / "wide.py"
    file.write_text(PIPELINE)
    assert main(["regions", str(file), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["num_regions"], out["num_units"]) == (4, 4)
    assert out["regions"][0] == ["copy#0", "out#0", "src#0"]
    empty = tmp_path / "empty.py"
    empty.write_text("x = 1\n")
    assert main(["regions", str(empty)]) == 2
    assert capsys.readouterr().err.strip() == (
        f"regional regions: {empty} defines no module-level `pipeline` (a regional.Pipeline); "
        "assign one, e.g. `pipeline = Pipeline('clicks')`"
    )
