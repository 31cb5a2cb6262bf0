"""Headless Chromium for the tests that look at a page as a person would (Debian's `chromium`,
installed by `make test` through scripts/require-chromium): the DOM after load, a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

__all__ = ["CHROMIUM_FLAGS", "chromium"]

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium(page: Path, tmp_path: Path, size: tuple[int, int]) -> tuple[str, bytes]:
    """The DOM after load and a screenshot of `page`, from headless Chromium."""
    exe = shutil.which("chromium")
    if exe is None:
        message = (
            "chromium is not on PATH; install Debian's package: "
            "apt-get update && apt-get install -y chromium"
        )
        if os.environ.get("CI"):  # make test installs it there: never skip silently in CI
            pytest.fail(message)
        pytest.skip(message)
    png = tmp_path / "shot.png"
    done = subprocess.run(
        [
            exe,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile'}",
            f"--window-size={size[0]},{size[1]}",
            f"--screenshot={png}",
            "--dump-dom",
            page.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, png.read_bytes()
