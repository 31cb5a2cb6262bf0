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
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

__all__ = ["key_bytes", "normal_key", "partition_of"]

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
