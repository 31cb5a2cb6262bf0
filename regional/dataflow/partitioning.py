"""Which partition of a keyed exchange a key belongs to: a stable hash, the same in every process.

Python's `hash` of a str is salted per process, so it cannot place keys: a writer and a reader
(or the same job after a restart) would disagree. `partition_of` hashes the key's msgpack
encoding with BLAKE2b (8 bytes, big-endian) and takes it modulo the number of partitions.

Keys that are equal are placed alike (`normal_key`), so the partition count never changes which
records meet: keyed state keeps a key's records in one dict slot by Python's ``==``, where
``7 == 7.0 == True``, so an integral float and a bool hash as the int they equal (Spark SQL
also compares ``7 = 7.0`` as true; bool keys equal 1 and 0 as in Python and Spark's default
coercion: key by ``str`` where they must differ). A key of another type is another key:
``"3"`` and ``3`` never meet. A tuple and a list of the same items are the same key. Keys are
what `msgspec.msgpack` encodes: str, int, float, bool, None, bytes, and tuples of them.

>>> partition_of("c07", 16)
10
>>> [partition_of(k, 4) for k in (1, 2, 3, "a", ("a", 1))]
[1, 2, 2, 1, 0]
>>> partition_of((1, 2), 7) == partition_of([1, 2], 7)
True
>>> [partition_of(k, 16) for k in (7, 7.0, (7,), [7.0], 1, True, "7")]
[13, 13, 12, 12, 13, 13, 11]

A writer places many records of few keys: `Placement` hashes each distinct key once and places
every other record of it from memory, exactly as `partition_of` would.

>>> Placement(16).of_keys([7, "c07", 7.0, (7,), 7]).tolist()
[13, 10, 13, 12, 13]
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Any

import msgspec
import numpy as np

__all__ = ["Placement", "key_bytes", "normal_key", "partition_of"]

_encode = msgspec.msgpack.Encoder().encode
_INTEGRAL = (-(2**63), 2**64)  # the ints msgpack encodes


def normal_key(key: Any) -> Any:
    """`key` with every number that equals an int as that int (a bool, an integral float in
    msgpack's int range, inside tuples and lists too), so keys that are ``==`` encode alike."""
    t = type(key)
    if t is str or t is int or key is None:
        return key
    if t is bool:
        return int(key)
    if t is float:
        if key.is_integer() and _INTEGRAL[0] <= key < _INTEGRAL[1]:
            return int(key)
        return key
    if t is tuple or t is list:
        return tuple(normal_key(k) for k in key)
    return key


def key_bytes(key: Any) -> bytes:
    """The encoding keys are hashed and ordered by (`normal_key`'s); `TypeError` naming the
    key's type when msgpack cannot encode it."""
    try:
        return _encode(normal_key(key))
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"the key {key!r:.200} ({type(key).__name__}) cannot be hashed for a keyed exchange: "
            f"{exc}; return a str, int, float, bytes or a tuple of them from the key function"
        ) from None


def partition_of(key: Any, partitions: int) -> int:
    """The partition (0 .. partitions-1) of `key`; `TypeError` naming the key's type when
    msgpack cannot encode it."""
    digest = hashlib.blake2b(key_bytes(key), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


#: Key types whose placement follows from (type, value): equal values of one of these types
#: encode alike (the only two equal floats that differ, 0.0 and -0.0, both place as 0).
_PLAIN = frozenset({str, int, float, bool, bytes, type(None)})


class Placement:
    """`partition_of(key, partitions)` for many keys, each distinct key hashed once.

    A key is remembered by its type and value when that decides its encoding (str, int,
    float, bool, bytes, None: `_PLAIN`), else by its encoding (`key_bytes`: a tuple, a
    datetime, ...), so a remembered partition is always the one `partition_of` gives: the
    placement of a key never depends on the keys placed before it. At most `remember` keys are
    kept (then forgotten all at once): keys change over a job's life."""

    __slots__ = ("_known", "partitions", "remember")

    def __init__(self, partitions: int, *, remember: int = 1 << 16) -> None:
        self.partitions = partitions
        self.remember = remember
        self._known: dict[Any, int] = {}

    def of(self, key: Any) -> int:
        """The partition of `key` (`partition_of`; `TypeError` as it raises)."""
        t = type(key)
        token = (t, key) if t in _PLAIN else key_bytes(key)
        known = self._known.get(token)
        if known is None:
            known = partition_of(key, self.partitions)
            if len(self._known) >= self.remember:
                self._known.clear()
            self._known[token] = known
        return known

    def of_keys(self, keys: Iterable[Any]) -> np.ndarray:
        """The partition of each key, in order (int64)."""
        of, known, plain = self.of, self._known, _PLAIN
        placed = [
            q if type(k) in plain and (q := known.get((type(k), k))) is not None else of(k)
            for k in keys
        ]
        return np.array(placed, dtype=np.int64)
