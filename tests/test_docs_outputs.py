"""Every `regional ...` command shown on a docs page prints what the page shows (issue 45 item
6): `scripts/docs-outputs` runs each console block in its scenario and compares, by the
normalising rule its docstring states; `scripts/docs-outputs --update` rewrites the blocks from
real runs. No Spark: the scenarios run jobs in process."""

from __future__ import annotations

import importlib.machinery
import importlib.util
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
    assert {"docs/reference/policy.md", "docs/how-to/dead-letters.md"} <= checked


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
