"""What the tests of bad command-line input share (with the `no_policy_env` and `no_spark`
fixtures of conftest.py): a refusal is one line on stderr and exit code 2."""

from __future__ import annotations

import pytest

from regional.cli import main

__all__ = ["one_line"]


def one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    """Run the CLI in-process; it must exit with 2 and print exactly one line on stderr."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.endswith("\n") and err.count("\n") == 1, err
    return err.rstrip("\n")
