"""Which partition of a keyed exchange a key belongs to: a stable hash, the same in every process.

Python's `hash` of a str is salted per process, so it cannot place keys: a writer and a reader
(or the same job after a restart) would disagree. `partition_of` hashes the key's msgpack
encoding with BLAKE2b (8 bytes, big-endian) and takes it modulo the number of partitions. The
result depends only on the key's encoding: ``1`` and ``1.0`` encode differently and may land in
different partitions, while a tuple and a list of the same items are the same key. Keys are what
`msgspec.msgpack` encodes: str, int, float, bool, None, bytes, and tuples or lists of them.

>>> partition_of("c07", 16)
10
>>> [partition_of(k, 4) for k in (1, 2, 3, "a", ("a", 1))]
[1, 2, 2, 1, 0]
>>> partition_of((1, 2), 7) == partition_of([1, 2], 7)
True
"""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec

__all__ = ["partition_of"]

_encode = msgspec.msgpack.Encoder().encode


def partition_of(key: Any, partitions: int) -> int:
    """The partition (0 .. partitions-1) of `key`; `TypeError` naming the key's type when
    msgpack cannot encode it."""
    try:
        data = _encode(key)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(
            f"the key {key!r} ({type(key).__name__}) cannot be hashed for a keyed exchange: "
            f"{exc}; return a str, int, float, bytes or a tuple of them from the key function"
        ) from None
    digest = hashlib.blake2b(data, digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions
