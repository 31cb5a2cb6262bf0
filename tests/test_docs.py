"""The documentation: the site builds with no warning (every link and anchor resolves, every
generated reference renders), the reference covers every policy key, the README stays a front
page, and the quickstart commands of the docs run as written."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from regional.policy import KEY_DOCS, policy_keys

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent


def test_the_site_builds_with_no_warning(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    run = subprocess.run(
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert "WARNING" not in run.stderr
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text()
    assert "usage: regional inspect" in cli and "usage: regional run" in cli
    policy = (tmp_path / "site" / "reference" / "policy" / "index.html").read_text()
    assert all(key.path in policy for key in policy_keys())


def test_every_policy_key_is_documented() -> None:
    assert sorted(KEY_DOCS) == sorted(key.path for key in policy_keys())


def test_every_docs_page_is_in_the_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = sorted(str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md"))
    assert [p for p in pages if f": {p}" not in nav] == []


def test_the_readme_is_a_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / target).is_file(), target


def _quickstart_commands() -> list[str]:
    """The shell commands of the quickstart in docs/getting-started.md, as written."""
    text = (ROOT / "docs" / "getting-started.md").read_text()
    section = text.split("## Quickstart", 1)[1].split("\n### ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [line.split("#")[0].strip() for b in blocks for line in b.splitlines() if line.strip()]


@pytest.mark.spark
def test_the_quickstart_commands_run_as_written(tmp_path: Path) -> None:
    """Run in a copy of `examples/` (so `examples/.regional/` lands there), `.venv/bin/` being
    this interpreter's directory and `/tmp/...` a directory of the test's own."""
    commands = _quickstart_commands()
    assert commands[0] == ".venv/bin/python examples/quickstart.py"
    assert len(commands) == 4
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT)}
    outputs = []
    for command in commands:
        argv = [
            str(BIN / a[len(".venv/bin/") :])
            if a.startswith(".venv/bin/")
            else f"{tmp_path}/{a[len('/tmp/') :]}"
            if a.startswith("/tmp/")
            else a
            for a in command.split()
        ]
        run = subprocess.run(
            argv, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=600, check=False
        )
        assert run.returncode == 0, f"{command}: {run.stderr[-2000:]}"
        outputs.append(run.stdout)
    assert "IDENTICAL" in outputs[0]
    assert (tmp_path / "examples" / ".regional" / "checkpoints").is_dir()
    assert re.search(r"^\s*7\s+global", outputs[3], re.M), outputs[3]  # the newest, retained
