"""Every `regional ...` command shown on a docs page prints what the page shows (issue 45 item
6): `scripts/docs-outputs` runs each console block in its scenario and compares, by the
normalising rule its docstring states; `scripts/docs-outputs --update` rewrites the blocks from
real runs. No Spark: the scenarios run jobs in process."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

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
    # only `regional run` on Spark is left unchecked (minutes, and it prints its timings)
    unchecked = [b for b in found if b.not_checked is not None]
    runs = [c.text for b in unchecked for c in b.commands if docs_outputs._REGIONAL.search(c.text)]
    assert runs and all(text.startswith(RUN) for text in runs), runs


#: How the operations page runs a job on Spark (the one kind of block left unchecked).
RUN = (".venv/bin/regional run ", "PARALLELISM=2 .venv/bin/regional run ", "OPS_TABLE=")


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
    script = command.replace("regional ", f"{sys.executable} -m regional.cli ").replace(
        "/tmp/", f"{tmp_path}/"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100", "TZ": "UTC"}
    done = subprocess.run(
        ["bash", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, check=False
    )
    fresh = (done.stdout + done.stderr).replace(str(tmp_path), "/tmp")
    assert forked[1] == "exit 2", forked
    assert sorted(forked) == sorted(fresh.splitlines())


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
