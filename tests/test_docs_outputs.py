"""Every `regional ...` command shown on a docs page prints what the page shows (issue 45 item
6): `scripts/docs-outputs` runs each console block in its scenario and compares, by the
normalising rule its docstring states; `scripts/docs-outputs --update` rewrites the blocks from
real runs. The scenarios run their jobs in process, except the operations page's, which runs
`regional run` on Spark (one Spark host process for the page)."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script() -> ModuleType:
    path = ROOT / "scripts" / "docs-outputs"
    loader = importlib.machinery.SourceFileLoader("docs_outputs", str(path))
    spec = importlib.util.spec_from_loader("docs_outputs", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_outputs"] = module  # dataclasses look their module up
    loader.exec_module(module)
    return module


docs_outputs = _script()


def test_every_block_with_a_regional_command_is_checked_or_says_why_not() -> None:
    found = [b for page in docs_outputs.pages() for b in docs_outputs.blocks(page)]
    assert len(found) > 10
    unknown = [b.where for b in found if b.scenario not in docs_outputs.SCENARIOS]
    assert unknown == []
    assert all(b.not_checked is None or b.not_checked.strip() for b in found)
    checked = {str(b.page.relative_to(ROOT)) for b in found if b.not_checked is None}
    assert {
        "docs/reference/policy.md",
        "docs/how-to/dead-letters.md",
        "docs/reference/inspector.md",
        "docs/how-to/cleaning.md",
        "docs/how-to/operations.md",
        "docs/concepts/retention.md",
        "docs/concepts/regions.md",
        "docs/file-merging.md",
    } <= checked
    # every block runs, `regional run` on Spark included (the operations page)
    assert [b.where for b in found if b.not_checked is not None] == []
    on_spark = [b for b in found if b.scenario in docs_outputs.SPARK_SCENARIOS]
    assert len(on_spark) == 5
    assert all(any("regional run " in c.text for c in b.commands) for b in on_spark)


def test_a_command_goes_on_over_backslash_lines(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "```console\n$ regional inspect /tmp/ckpt \\\n      lag\nprinted\n$ regional x\n```\n"
    )
    [block] = docs_outputs.blocks(page)
    assert [(c.text, c.output) for c in block.commands] == [
        ("regional inspect /tmp/ckpt \\\n      lag", ["printed"]),
        ("regional x", []),
    ]


def test_the_forked_regional_prints_and_exits_as_the_console_script(tmp_path: Path) -> None:
    """The blocks' `regional` is forked from a process that imported it (a second less per
    command): what it prints, in what order, and its exit code are the console script's."""
    command = 'regional inspect /tmp/no-such-root lag; echo "exit $?"; regional --version'
    page = tmp_path / "page.md"
    page.write_text(f"```console\n$ {command}\n```\n")
    [block] = docs_outputs.blocks(page)
    [forked] = docs_outputs.run_block(block, tmp_path)
    script = command.replace("/tmp/", f"{tmp_path}/").replace(
        "regional ", f"{sys.executable} -m regional.cli "
    )  # the page's /tmp first: the interpreter may live under /tmp too
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "TZ": "UTC"}
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    fresh = (done.stdout + done.stderr).replace(str(tmp_path), "/tmp")
    assert forked[1] == "exit 2", forked
    assert sorted(forked) == sorted(fresh.splitlines())


@pytest.mark.spark
def test_every_checked_block_prints_what_the_page_shows() -> None:
    problems, ran = docs_outputs.check(docs_outputs.pages(), write=False)
    assert ran >= 5
    assert problems == [], "\n".join(problems) + "\n(refresh: scripts/docs-outputs --update)"


def test_the_normalising_rule_leaves_values_alone() -> None:
    normal = docs_outputs.normal
    assert normal("at 2026-12-07T07:52:37Z, by root@vm)") == normal(
        "at 2025-01-01T00:00:00.123Z, by someone@host.example)"
    )
    assert normal("a    b  ") == "a b"
    assert normal("10 s") != normal("10 min") and normal("exit 1") != normal("exit 2")
    assert normal("u0-a1-3e9b1c0d7a52.state") != normal("u0-a1-000000000000.state")


def test_a_run_on_the_wall_clock_compares_durations_and_run_ids_as_placeholders() -> None:
    normal = docs_outputs.normal
    page = "checkpoint 2 global records 400 1.91 s; done in 12.9 s, u0-a1-3e9b1c0d7a52.state"
    run = "checkpoint 2 global records 400 0.36 s; done in 7 s, u0-a1-0123456789ab.state"
    assert normal(page, timed=True) == normal(run, timed=True)
    assert normal(page, timed=True) != normal(run.replace("400", "401"), timed=True)


def test_an_elision_line_stands_for_any_lines_at_its_place() -> None:
    matches = docs_outputs.matches
    assert matches(["first", "...", "last"], ["first", "last"])
    assert matches(["first", "...", "last"], ["first", "2", "3", "last"])
    assert matches(["first", "...", "mid", "...", "last"], ["first", "x", "mid", "y", "last"])
    assert not matches(["first", "...", "last"], ["first", "2", "3"])
    assert not matches(["first", "...", "mid", "...", "last"], ["first", "x", "last"])
    assert not matches(["first", "...", "last"], ["last"])
    # --update keeps the page's head and tail around the elision
    shown = docs_outputs._elided_like(["a", "...", "y", "z"], ["a", "b", "c", "x", "y", "z"])
    assert shown == ["a", "...", "y", "z"]
