"""What the Spark benchmarks print and write: a fixed-width table of result rows, and a
results JSON (the machine, the run's configuration, the rows) under `benchmarks/results/`."""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

__all__ = ["RESULTS", "Column", "print_table", "write_results"]

#: Where the benchmarks write their JSON (and plot) by default (their `--out`).
RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

#: One table column: the row's key, the column title, the format spec of title and values.
Column = tuple[str, str, str]


def print_table(columns: Sequence[Column], rows: Iterable[Mapping[str, Any]]) -> None:
    """Print a title line, then one line per row, each cell formatted by its column's spec."""
    print("  ".join(f"{title:{fmt}}" for _, title, fmt in columns))
    for r in rows:
        print("  ".join(f"{r[key]:{fmt}}" for key, _, fmt in columns))


def write_results(path: str, *, master: str, config: Mapping[str, Any], **fields: Any) -> None:
    """Write {"machine", "config", **fields} as JSON to `path` (its directory is created)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    machine = {"cpus": os.cpu_count(), "python": platform.python_version(), "master": master}
    with open(path, "w") as f:
        json.dump({"machine": machine, "config": dict(config), **fields}, f, indent=1)
