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

Stored strings (dead letters' records and errors, decline causes, paths) are the job's data,
and a record can hold terminal escape sequences: text for a terminal goes through
`terminal_text`, which shows C0 and C1 control characters, DEL and the bidirectional
overrides and isolates as escapes (tables: every cell; plain lines: `say`). `--json` output is
the exact JSON of the values, unescaped.

>>> print(terminal_text("red\\x1b[31m \\u202egnp.exe\\ttab\\x7f\\x9b"))
red\\x1b[31m \\u202egnp.exe\\ttab\\x7f\\x9b
>>> say("two\\nlines\\x07")
two
lines\\x07
"""

from __future__ import annotations

import datetime as dt
import sys
from typing import Any, TextIO

import msgspec
import pyarrow as pa

__all__ = ["format_cell", "format_table", "print_table", "say", "terminal_text", "to_json"]

#: How `terminal_text` shows what a terminal would act on: C0 controls (tab, newline and
#: carriage return as \t \n \r), DEL and C1 controls as \xNN, the bidirectional embeddings
#: and overrides (U+202A-U+202E) and isolates (U+2066-U+2069) as \uNNNN.
_ESCAPES: dict[int, str] = {
    **{c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))},
    0x09: "\\t",
    0x0A: "\\n",
    0x0D: "\\r",
    **{c: f"\\u{c:04x}" for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A))},
}
_ESCAPES_BUT_NEWLINE = {c: e for c, e in _ESCAPES.items() if c != 0x0A}


def terminal_text(text: str, *, lines: bool = False) -> str:
    """`text` safe to write to a terminal: every character it would act on instead of showing
    (escape sequences, bidi overrides) escaped; with `lines`, newlines are kept (text made of
    several lines)."""
    return text.translate(_ESCAPES_BUT_NEWLINE if lines else _ESCAPES)


def say(text: str = "", *, file: TextIO | None = None) -> None:
    """Print `text` (one or more lines) for people: `terminal_text`, newlines kept, flushed
    (a pipe or a log file sees it at once). Every plain line the CLI prints goes through it."""
    out = file if file is not None else sys.stdout
    print(terminal_text(text, lines=True), file=out, flush=True)


def format_cell(value: Any) -> str:
    """How one value looks in a text table: lists joined by commas, structs' fields by colons,
    None as '-', text through `terminal_text` (a control character never reaches the
    terminal, a newline never breaks the table)."""
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
    return terminal_text(str(value))


def _is_numeric(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def format_table(table: pa.Table) -> str:
    """An aligned text table with a header; numeric columns right-aligned."""
    names = [terminal_text(n) for n in table.column_names]
    columns = [[format_cell(v) for v in c.to_pylist()] for c in table.columns]
    widths = [max([len(n), *(len(c) for c in col)]) for n, col in zip(names, columns, strict=True)]
    numeric = [_is_numeric(f.type) for f in table.schema]
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
