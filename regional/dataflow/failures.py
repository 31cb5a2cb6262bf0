"""How a failure in user code is described: one line (a decline's reason, an event's cause, a
dead letter's message) and a bounded traceback (the event log, the dead-letter table).

>>> failure_line(ValueError("bad record\\nsecond line"), "upload failed: ")
'upload failed: ValueError: bad record'
>>> failure_line(KeyError("user"))
"KeyError: 'user'"
"""

from __future__ import annotations

import contextlib
import traceback

__all__ = ["TRACE_LIMIT", "failure_line", "failure_trace", "raised_on", "split_of_failure"]

#: How much of a failure's traceback is kept: its last characters, the innermost frames, where
#: the user's code raised.
TRACE_LIMIT = 4096


def failure_line(exc: BaseException, prefix: str = "") -> str:
    """The exception's type and the first line of its message, after `prefix`."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return prefix + (text.splitlines() or [""])[0]


def failure_trace(exc: BaseException, limit: int = TRACE_LIMIT) -> str:
    """The exception's full traceback, cut to its last `limit` characters."""
    return "".join(traceback.format_exception(exc))[-limit:]


_SPLIT = "_regional_split"


def raised_on(exc: BaseException, split: str) -> None:
    """Note on `exc` the input split whose records it was raised on (the innermost operator
    to see it decides): a task's pass (`regional.dataflow.task_epoch`) finds the unit holding
    that split, which alone declines."""
    if getattr(exc, _SPLIT, None) is None:
        with contextlib.suppress(AttributeError):  # a type without instance attributes
            setattr(exc, _SPLIT, split)


def split_of_failure(exc: BaseException) -> str | None:
    """The split `raised_on` noted on `exc`, or None."""
    return getattr(exc, _SPLIT, None)
