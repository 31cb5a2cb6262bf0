"""The integer ranges of the metadata model, checked by msgspec when a file is decoded.

A value no writer produces (a timestamp past year 9999, an id beyond 64 bits) makes the file
damaged instead of crashing a view later; structs built in code are not checked.

>>> import msgspec
>>> msgspec.convert(-1, Count)
Traceback (most recent call last):
...
msgspec.ValidationError: Expected `int` >= 0
"""

from __future__ import annotations

from typing import Annotated

import msgspec

__all__ = ["Count", "EpochMs", "Int64"]

#: An integer a 64-bit signed column (Arrow `int64`, the inspector's views) can hold: a decoded
#: file with a bigger one is damaged, not a checkpoint (msgspec checks it while decoding).
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
#: A count, size, offset or id: not negative, and fits `Int64`.
Count = Annotated[int, msgspec.Meta(ge=0, le=2**63 - 1)]
#: Epoch milliseconds up to the end of year 9999 (what `datetime` and the views can show);
#: a later timestamp is no real one.
EpochMs = Annotated[int, msgspec.Meta(ge=0, le=253_402_300_799_999)]
