"""Every benchmark is a module of the `benchmarks` package: importing one in a fresh interpreter
works and runs nothing, and `python -m benchmarks.bench_<name> --help` answers without running
it. `make bench` runs each module, so a broken import is caught here, by `make test`."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
BENCHES = sorted(p.stem for p in (ROOT / "benchmarks").glob("bench_*.py"))


def _python(*args: str) -> subprocess.CompletedProcess[str]:
    """Run the test's Python in the repository root (so `benchmarks` is importable there)."""
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=120
    )


def test_every_benchmark_is_found():
    assert {"bench_regions", "bench_partial_failures", "bench_spark_overhead"} <= set(BENCHES)


@pytest.mark.parametrize("name", BENCHES)
def test_a_benchmark_imports_in_a_fresh_interpreter_and_runs_nothing(name):
    done = _python("-c", f"import benchmarks.{name}")
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "")


@pytest.mark.parametrize("name", BENCHES)
def test_a_benchmark_runs_as_a_module(name):
    done = _python("-m", f"benchmarks.{name}", "--help")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: ")
    assert "--quick" in done.stdout, (
        f"benchmarks/{name}.py has no --quick flag: add one (a small version that runs in "
        "seconds), `make bench BENCH_ARGS=--quick` passes it to every benchmark"
    )
