"""Rendering of Arrow tables for the CLI: aligned text tables for people, JSON for machines.

Views are computed elsewhere (as `pyarrow.Table`s with fixed schemas); this module only prints.

>>> import pyarrow as pa
>>> t = pa.table({"checkpoint_id": [1, 12], "kind": ["global", "regional"]})
>>> print(format_table(t))
checkpoint_id  kind
-------------  --------
            1  global
           12  regional
>>> to_json(t)
'[{"checkpoint_id":1,"kind":"global"},{"checkpoint_id":12,"kind":"regional"}]'
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any, TextIO

import msgspec
import pyarrow as pa

__all__ = ["format_cell", "format_table", "print_table", "to_json"]


def format_cell(value: Any) -> str:
    """How one value looks in a text table: lists joined by commas, structs' fields by colons,
    None as '-'."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, dt.datetime):
        return value.isoformat(sep=" ", timespec="seconds")
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dict):  # a struct: its fields in order, e.g. (unit 3, lag 2) "3:2"
        return ":".join(format_cell(v) for v in value.values())
    if isinstance(value, list | tuple):
        return ",".join(format_cell(v) for v in value) if value else "-"
    return str(value)


def _is_numeric(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def format_table(table: pa.Table) -> str:
    """An aligned text table with a header; numeric columns right-aligned."""
    names = table.column_names
    columns = [[format_cell(v) for v in table.column(n).to_pylist()] for n in names]
    widths = [max([len(n), *(len(c) for c in col)]) for n, col in zip(names, columns, strict=True)]
    numeric = [_is_numeric(table.schema.field(n).type) for n in names]
    lines = [
        "  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    for row in range(table.num_rows):
        cells = []
        for col, w, right in zip(columns, widths, numeric, strict=True):
            cells.append(col[row].rjust(w) if right else col[row].ljust(w))
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def to_json(table: pa.Table) -> str:
    """A JSON array with one object per row, keyed by the table's column names."""
    return msgspec.json.encode(table.to_pylist()).decode()


def print_table(table: pa.Table, *, as_json: bool, out: TextIO | None = None) -> None:
    """Print `table` as JSON (`as_json`) or as a text table (with '(no rows)' when empty)."""
    out = out or sys.stdout
    if as_json:
        out.write(to_json(table) + "\n")
    elif table.num_rows == 0:
        out.write(format_table(table) + "\n(no rows)\n")
    else:
        out.write(format_table(table) + "\n")
