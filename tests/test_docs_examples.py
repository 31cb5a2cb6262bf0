"""Every Python example on the documentation pages runs (issue 36).

The blocks of a page run in order in one namespace (a page may build an example step by step),
in a scratch directory where `examples/` is the repository's, with `spark` (the shared session)
defined for pages that read a table with Spark. A block that cannot run here says why on the
line before it, ``<!-- not run: <reason> -->`` (a Kafka broker, an S3 bucket, a fragment of a
larger function); its code still compiles and its imports still run, so a renamed function
fails the test. Blocks shown from `examples/` files (``--8<--``) run with those files' tests.
"""

from __future__ import annotations

import ast
import os
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).parent.parent
_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.S | re.M)
_NOT_RUN = re.compile(r"<!-- not run: (.+?) -->\s*$")


def blocks(page: Path) -> list[tuple[int, str, str | None]]:
    """(line, code, why it is not run or None) of every Python block of `page`."""
    text = page.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        code = textwrap.dedent(m.group(2))
        if code.lstrip().startswith("--8<--"):
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[: m.start()].rstrip("\n").splitlines()
        marker = _NOT_RUN.search(before[-1]) if before else None
        out.append((line, code, marker.group(1) if marker else None))
    return out


PAGES = sorted(p for p in (ROOT / "docs").rglob("*.md") if blocks(p))


def _imports(code: str, filename: str) -> str:
    """The top-level import statements of `code` (what a block that is not run still runs)."""
    tree = ast.parse(code, filename)
    kept = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


@pytest.mark.spark
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_every_python_block_of_the_page_runs(
    page: Path, spark: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    monkeypatch.chdir(tmp_path)
    namespace: dict[str, Any] = {"__name__": "__main__", "spark": spark}  # shipped by value
    for line, code, not_run in blocks(page):
        where = f"{page.relative_to(ROOT)}:{line}"
        if not_run is not None:
            exec(compile(_imports(code, where), where, "exec"), {})
            continue
        try:
            exec(compile(code, where, "exec"), namespace)
        except Exception as exc:
            raise AssertionError(f"the example at {where} fails: {exc!r}") from exc


def test_a_block_not_run_says_why_and_still_compiles() -> None:
    reasons = [(p, line, why) for p in PAGES for line, _, why in blocks(p) if why is not None]
    assert all(why.strip() for _, _, why in reasons)
    for page in PAGES:
        for line, code, _ in blocks(page):
            compile(code, f"{page}:{line}", "exec")
    assert os.path.isdir(ROOT / "examples")
