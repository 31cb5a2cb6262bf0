"""Bounded JSON text: what a source checks before any JSON parser sees a line or a value.

JSON parsers recurse once per level of nesting: pyarrow's JSON reader overflows the C stack
(the worker dies with SIGSEGV, taking every unit of its Spark task along) and `json.loads`
raises `RecursionError`. Neither checks UTF-8 everywhere either: pyarrow keeps invalid bytes in
a string column (a Parquet reader then fails with `UnicodeDecodeError`) and `json.loads` turns
``"\\ud800"`` into a string no Arrow array or Parquet file can hold. So a line or value is
screened first (`problem`): its size, its nesting depth (a bytes-level scan, not recursive),
its UTF-8; after decoding, its strings are checked for lone surrogates (`decode`). What fails
is a poison record of its source, with the reason naming the limit.

>>> bounds = JsonBounds(max_bytes=64, max_depth=3)
>>> problem(b'{"a": [1, {"b": "[[[["}]}', bounds) is None
True
>>> problem(b'[[[[1]]]]', bounds)
'nested more than 3 levels deep, the limit'
>>> problem(b'"' + b'x' * 70 + b'"', bounds)
'72 bytes long, more than the limit of 64 bytes'
>>> problem(b'{"a": "\\xff"}', bounds)
'not UTF-8 (byte 0xff at offset 7 is invalid)'
>>> decode(b'{"a": "\\\\ud800"}', bounds)
Traceback (most recent call last):
...
ValueError: a string holds a lone UTF-16 surrogate (\\ud800), which UTF-8 cannot encode
"""

from __future__ import annotations

import json
import re
from typing import Any, NamedTuple

__all__ = ["DEFAULT_BOUNDS", "JsonBounds", "decode", "nesting_depth", "problem"]

#: Where a string or a bracket starts: the depth scan steps over strings whole (escapes
#: included), so brackets inside them do not count.
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')
#: A `\uD800`-`\uDFFF` escape: the only way JSON text that is valid UTF-8 can still decode to
#: a string UTF-8 cannot encode (an unpaired surrogate).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


class JsonBounds(NamedTuple):
    """The limits on one JSON text (a JSON-lines line, a Kafka value): `max_bytes` long and
    `max_depth` levels of arrays and objects. The defaults fit every ordinary record (a Kafka
    broker's default largest message is 1 MB; Arrow and Parquet readers handle 64 levels) and
    keep every parser far from its stack's end."""

    max_bytes: int = 1 << 20
    max_depth: int = 64


DEFAULT_BOUNDS = JsonBounds()


def nesting_depth(text: bytes, stop_after: int | None = None) -> int:
    """How deep arrays and objects nest in the JSON `text` (0 for a scalar), scanning bytes
    (never recursing); with `stop_after`, returns as soon as the depth passes it. Brackets in
    strings do not count; `text` need not be valid JSON (unbalanced brackets are counted as
    they come)."""
    depth = deepest = 0
    for token in _TOKEN.finditer(text):
        bracket = token.group()
        if bracket in (b"[", b"{"):
            depth += 1
            if depth > deepest:
                deepest = depth
                if stop_after is not None and deepest > stop_after:
                    return deepest
        elif bracket in (b"]", b"}"):
            depth -= 1
    return deepest


def problem(text: bytes, bounds: JsonBounds = DEFAULT_BOUNDS) -> str | None:
    """Why `text` must not reach a JSON parser (too long, nested too deep, not UTF-8), or
    None. Cheap for ordinary text: the depth is scanned only when `text` has more brackets
    than `bounds.max_depth`."""
    if len(text) > bounds.max_bytes:
        return f"{len(text):,} bytes long, more than the limit of {bounds.max_bytes:,} bytes"
    brackets = text.count(b"[") + text.count(b"{")
    if brackets > bounds.max_depth and nesting_depth(text, bounds.max_depth) > bounds.max_depth:
        return f"nested more than {bounds.max_depth} levels deep, the limit"
    try:
        text.decode("utf-8")
    except UnicodeDecodeError as exc:
        return f"not UTF-8 (byte 0x{text[exc.start]:02x} at offset {exc.start} is invalid)"
    return None


def decode(text: bytes, bounds: JsonBounds = DEFAULT_BOUNDS) -> Any:
    """The JSON value of `text`, screened first (`problem`); `ValueError` saying why it
    cannot be used (also for a string holding an unpaired surrogate escape)."""
    if (why := problem(text, bounds)) is not None:
        raise ValueError(why)
    value = json.loads(text)
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:  # nesting is bounded above, so this recursion is too
            json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"a string holds a lone UTF-16 surrogate (\\u{ord(exc.object[exc.start]):04x}), "
                "which UTF-8 cannot encode"
            ) from None
    return value
