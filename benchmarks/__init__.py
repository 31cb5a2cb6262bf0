"""Benchmarks, run by hand or by `make bench`: ``python -m benchmarks.bench_<name>``.

Each `bench_*` module prints its table when run (`--help` lists its knobs, `--quick` runs a
small version); importing one runs nothing. The other modules hold what several share.
"""

__all__: list[str] = []
