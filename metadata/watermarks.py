"""Where event-time watermarks live in a checkpoint, and how they are encoded (DESIGN §4 r. 15).

Pure: no file system. Watermarks are integers of **milliseconds since the Unix epoch**;
`MIN_WATERMARK` means "nothing known yet" and `MAX_WATERMARK` "no record will come again".

**Per split.** A source split read with event time keeps its watermark in its split state: the
split's position (`metadata.model.SplitState.position`, opaque bytes to the rest of the
metadata layer) is *wrapped* as ``MAGIC + watermark + last record's processing time + the
source's own position``. So the watermark falls back with the split's unit, moves with the
split on a rescale, and a source never sees the wrapper (`unwrap_position`).

>>> wrapped = wrap_position(b"17", SplitWatermark(1_000, 99))
>>> unwrap_position(wrapped)
(b'17', SplitWatermark(watermark=1000, last_record_ms=99))
>>> unwrap_position(b"17")  # a position written without event time
(b'17', None)

**Per exchange writer.** A writer subtask of a durable exchange commits, with the segments of
checkpoint Y, a *watermark mark* ``(Y, writer, watermark)`` named like its segments
(`mark_name`), in ``exchange/<reader>/_watermarks/``; see `regional.dataflow.exchange`.

>>> mark_name(7, 2, -5), parse_mark("00000000000000000007-00002.-5.wm")
('00000000000000000007-00002.-5.wm', WatermarkMark(checkpoint_id=7, writer=2, watermark=-5))
"""

from __future__ import annotations

import re
import struct
from typing import NamedTuple

__all__ = [
    "MAX_WATERMARK",
    "MIN_WATERMARK",
    "WATERMARK_DIR",
    "SplitWatermark",
    "WatermarkMark",
    "format_watermark",
    "mark_name",
    "parse_mark",
    "unwrap_position",
    "wrap_position",
]

#: No record has been seen: nothing may be considered complete.
MIN_WATERMARK = -(2**63)
#: The input has ended: every window and event-time timer may fire.
MAX_WATERMARK = 2**63 - 1
#: Where an exchange's writers commit their watermark marks (under the exchange's directory).
WATERMARK_DIR = "_watermarks"

_MAGIC = b"\x00rwm1"  # no source position starts with a NUL byte
_HEAD = struct.Struct(">qq")
_MARK = re.compile(r"(\d{20})-(\d{5})\.(-?\d+)\.wm")


class SplitWatermark(NamedTuple):
    """A split's watermark, and when (processing time, ms) it last delivered a record (the
    idle-timeout's clock)."""

    watermark: int
    last_record_ms: int


def wrap_position(position: bytes, mark: SplitWatermark) -> bytes:
    """`position` with the split's watermark in front (see the module docstring)."""
    return _MAGIC + _HEAD.pack(*mark) + position


def unwrap_position(data: bytes) -> tuple[bytes, SplitWatermark | None]:
    """The source's position and the split's watermark (None when `data` has none)."""
    if not data.startswith(_MAGIC) or len(data) < len(_MAGIC) + _HEAD.size:
        return data, None
    body = len(_MAGIC) + _HEAD.size
    return data[body:], SplitWatermark(*_HEAD.unpack(data[len(_MAGIC) : body]))


class WatermarkMark(NamedTuple):
    """Writer subtask `writer`'s watermark as committed by checkpoint `checkpoint_id`."""

    checkpoint_id: int
    writer: int
    watermark: int


def mark_name(checkpoint_id: int, writer: int, watermark: int) -> str:
    """The file name of a watermark mark (sorts like the segments of the same commit)."""
    return f"{checkpoint_id:020d}-{writer:05d}.{watermark}.wm"


def parse_mark(name: str) -> WatermarkMark | None:
    """The mark a file name names, or None for any other name."""
    m = _MARK.fullmatch(name)
    return WatermarkMark(int(m[1]), int(m[2]), int(m[3])) if m else None


def format_watermark(watermark: int | None) -> str:
    """A watermark for people: ISO-8601 UTC, or ``-inf`` / ``+inf`` / ``-``.

    >>> format_watermark(0), format_watermark(MIN_WATERMARK), format_watermark(None)
    ('1970-01-01T00:00:00.000Z', '-inf', '-')
    """
    import datetime as dt

    if watermark is None:
        return "-"
    if watermark <= MIN_WATERMARK:
        return "-inf"
    if watermark >= MAX_WATERMARK:
        return "+inf"
    try:
        t = dt.datetime.fromtimestamp(watermark / 1000, tz=dt.UTC)
    except (OverflowError, ValueError, OSError):
        return f"{watermark} ms"
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"
