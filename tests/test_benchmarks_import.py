"""Every benchmark is a module of the `benchmarks` package: importing one in a fresh interpreter
works and runs nothing, and run as a module with `--help` it answers without running (both in
one interpreter per benchmark). `make bench` runs each module, so a broken import is caught
here, by `make test`."""

from __future__ import annotations

import json
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


#: In one fresh interpreter (third-party modules and ours preloaded once: a fresh interpreter
#: per benchmark spent 20 s on those imports), a forked child per benchmark: import it (it must
#: print nothing), mark the end of the import on stdout, then run it as ``python -m
#: benchmarks.<name> --help`` would. The child's stdout and stderr go to files the parent hands
#: back as JSON: name -> [exit status, stdout, stderr].
_EACH_IMPORT_THEN_HELP = """
import json, os, runpy, sys, tempfile
import numpy, pyarrow, pyarrow.parquet, pyspark, msgspec, regional.runtime.spark  # preloaded
names, out = sys.argv[1:], {}
for name in names:
    files = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]
    pid = os.fork()
    if pid == 0:
        os.dup2(files[0].fileno(), 1)
        os.dup2(files[1].fileno(), 2)
        code = 0
        try:
            __import__("benchmarks." + name)
            print("imported", flush=True)
            del sys.modules["benchmarks." + name]  # run afresh as __main__, as `python -m` would
            sys.argv = ["benchmarks." + name, "--help"]
            runpy.run_module("benchmarks." + name, run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except BaseException:
            import traceback
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read())
    out[name] = [os.waitstatus_to_exitcode(status), *texts]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def helped() -> dict[str, list]:
    """Every benchmark imported, then run with `--help`, each in its own forked child."""
    done = _python("-c", _EACH_IMPORT_THEN_HELP, *BENCHES)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize("name", BENCHES)
def test_a_benchmark_imports_without_running_and_runs_as_a_module(name, helped):
    code, stdout, stderr = helped[name]
    assert code == 0, stderr
    assert stderr == ""
    imported, _, rest = stdout.partition("\n")
    assert imported == "imported", f"importing benchmarks.{name} printed {imported!r}"
    assert rest.startswith("usage: ")
    assert "--quick" in rest, (
        f"benchmarks/{name}.py has no --quick flag: add one (a small version that runs in "
        "seconds), `make bench BENCH_ARGS=--quick` passes it to every benchmark"
    )
