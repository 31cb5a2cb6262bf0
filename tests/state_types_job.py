"""A msgspec Struct kept in operator state by the Spark state test. It lives in its own module,
imported by reference on the Python workers: a Struct class shipped by value (cloudpickle, as
the pipeline's own module is) loses its fields (msgspec issue #394), so state types belong in an
importable module."""

from __future__ import annotations

from decimal import Decimal

import msgspec


class Last(msgspec.Struct, frozen=True):
    """The last order of a key."""

    n: int
    amount: Decimal
