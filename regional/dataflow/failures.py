"""How a failure in user code is described: one line (a decline's reason, an event's cause, a
dead letter's message) and a bounded traceback (the event log, the dead-letter table).

>>> failure_line(ValueError("bad record\\nsecond line"), "upload failed: ")
'upload failed: ValueError: bad record'
>>> failure_line(KeyError("user"))
"KeyError: 'user'"
"""

from __future__ import annotations

import contextlib
import os
import traceback
from pathlib import Path
from typing import Any

from regional.errors import RegionalError

__all__ = [
    "FIX",
    "TRACE_LIMIT",
    "USER_EXITS",
    "UserFunctionError",
    "as_exception",
    "failure_line",
    "failure_trace",
    "function_error",
    "function_name",
    "raised_on",
    "split_of_failure",
]

#: The `BaseException`s that are no `Exception` a user function may raise on a record: its
#: unit's failure (`as_exception`). Any other (the runtime's own timeout alarm) is not.
USER_EXITS = (SystemExit, KeyboardInterrupt, GeneratorExit)
#: The end of a `UserFunctionError`'s message: what fixes it.
FIX = "or run the pipeline with on_error='dead-letter' to set such records aside"


class UserFunctionError(RegionalError):
    """A user function of an operator failed on one record (a key function that raised or gave
    no usable key, a join's ``emit`` or ``is_delete`` that raised). The message names the
    operator, the function, the record and the reason. With ``on_error="dead-letter"`` the
    record is a dead letter with this message; otherwise its unit declines with it."""


#: How much of a failure's traceback is kept: its last characters, the innermost frames, where
#: the user's code raised.
TRACE_LIMIT = 4096


def failure_line(exc: BaseException, prefix: str = "") -> str:
    """The exception's type and the first line of its message, after `prefix`."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return prefix + (text.splitlines() or [""])[0]


#: How a frame in this package is named in a traceback, up to its package-relative path.
_OWN_FRAMES = f'File "{Path(__file__).parent.parent.parent}{os.sep}regional{os.sep}'


def failure_trace(exc: BaseException, limit: int = TRACE_LIMIT) -> str:
    """The exception's full traceback, cut to its last `limit` characters. A frame in
    `regional` itself names its file from the package (``File "regional/runtime/task.py"``),
    not from where the package is installed: the same failure reads the same from every
    machine and install, and more of the user's frames fit in the limit."""
    text = "".join(traceback.format_exception(exc))
    return text.replace(_OWN_FRAMES, f'File "regional{os.sep}')[-limit:]


_SPLIT = "_regional_split"


def raised_on(exc: BaseException, split: str) -> None:
    """Note on `exc` the input split whose records it was raised on (the innermost operator
    to see it decides): a task's pass (`regional.dataflow.walker`) finds the unit holding
    that split, which alone declines."""
    if getattr(exc, _SPLIT, None) is None:
        with contextlib.suppress(AttributeError):  # a type without instance attributes
            setattr(exc, _SPLIT, split)


def split_of_failure(exc: BaseException) -> str | None:
    """The split `raised_on` noted on `exc`, or None."""
    return getattr(exc, _SPLIT, None)


def function_name(fn: Any) -> str:
    """How a user function is named in errors: its qualified name, else its repr."""
    return str(getattr(fn, "__qualname__", None) or repr(fn))


def function_error(
    owner: str, function: str, fn: Any, record: Any, exc: BaseException
) -> UserFunctionError:
    """The error of `owner`'s `function` (``key``, ``emit``, ``is_delete``) `fn` raising
    `exc` on `record` (cut to 200 characters)."""
    return UserFunctionError(
        f"{owner}: the {function} function {function_name(fn)} raised "
        f"{failure_line(exc)} on record {record!r:.200}; fix the function or the record, {FIX}"
    )


def as_exception(exc: BaseException) -> Exception | None:
    """`exc`, raised on a record (`raised_on`), as an `Exception` its unit declines with: a
    `USER_EXITS` one becomes a `UserFunctionError` naming it (from it, with its split), so only
    the unit whose record raised it declines; None for any other `BaseException` (it is not
    the record's: let it propagate)."""
    if isinstance(exc, Exception):
        return exc
    if not isinstance(exc, USER_EXITS):
        return None
    error = UserFunctionError(
        f"a user function raised {failure_line(exc)} on a record; a user function must not "
        "raise it (it is no bad record, so it is never a dead letter): fix the function"
    )
    error.__cause__ = exc
    split = split_of_failure(exc)
    if split is not None:
        raised_on(error, split)
    return error
