"""Every benchmark is a module of the `benchmarks` package: importing one in a fresh interpreter
works and runs nothing, and run as a module with `--help` it answers without running (both in
one interpreter per benchmark). `make bench` runs each module, so a broken import is caught
here, by `make test`."""

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


#: In one fresh interpreter: import the benchmark (it must print nothing), mark the end of the
#: import on stdout, then run it as ``python -m benchmarks.<name> --help`` would.
_IMPORT_THEN_HELP = """
import runpy, sys
import benchmarks.{name}
print("imported", flush=True)
del sys.modules["benchmarks.{name}"]  # run afresh as __main__, as `python -m` would
sys.argv = ["benchmarks.{name}", "--help"]
runpy.run_module("benchmarks.{name}", run_name="__main__", alter_sys=True)
"""


@pytest.mark.parametrize("name", BENCHES)
def test_a_benchmark_imports_without_running_and_runs_as_a_module(name):
    done = _python("-c", _IMPORT_THEN_HELP.format(name=name))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    imported, _, rest = done.stdout.partition("\n")
    assert imported == "imported", f"importing benchmarks.{name} printed {imported!r}"
    assert rest.startswith("usage: ")
    assert "--quick" in rest, (
        f"benchmarks/{name}.py has no --quick flag: add one (a small version that runs in "
        "seconds), `make bench BENCH_ARGS=--quick` passes it to every benchmark"
    )
