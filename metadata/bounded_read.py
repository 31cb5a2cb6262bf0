"""Reading a file up to a size limit (DESIGN §8): a file handed to us (a policy, a pipeline, a
job graph, checkpoint metadata) may be `/dev/zero`, a FIFO or a runaway file, so a read stops
after `limit + 1` bytes and the caller refuses the file, naming it and the limit, instead of
reading until the kernel kills the process.

`read_bounded` reads any binary stream (a local file, a `pyarrow` input stream) in chunks, so a
large limit costs memory only for what is there; `read_local_file` opens a local path first
without waiting for a FIFO's writer. Both return None for a file over the limit: the caller
raises its own error (a `PolicyError`, a `GraphError`, a `MetadataError`), with `byte_size`
for the limit.

>>> import io
>>> read_bounded(io.BytesIO(b"abc"), 3)
b'abc'
>>> read_bounded(io.BytesIO(b"abcd"), 3) is None
True
>>> read_local_file("/dev/zero", 1024) is None
True
>>> byte_size(4 * 1024 * 1024), byte_size(1536), byte_size(100)
('4 MiB', '1.5 KiB', '100 bytes')
"""

from __future__ import annotations

import os
from typing import Protocol

__all__ = ["Readable", "byte_size", "read_bounded", "read_local_file"]

#: Bytes asked for per read: a big limit does not allocate its whole size up front.
_CHUNK = 1024 * 1024


class Readable(Protocol):
    """A binary stream: a file opened with "rb", an `io.BytesIO`, a `pyarrow` input stream."""

    def read(self, size: int, /) -> bytes: ...


def read_bounded(stream: Readable, limit: int) -> bytes | None:
    """All of `stream`'s bytes if there are at most `limit`, else None (after reading at most
    `limit + 1` bytes: an endless stream ends the read too)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = bytes(stream.read(min(_CHUNK, limit + 1 - size)))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None


def read_local_file(path: str | os.PathLike[str], limit: int) -> bytes | None:
    """The bytes of the local file at `path` if there are at most `limit`, else None.

    The file is opened without blocking, so a FIFO that no process writes to reads as empty
    instead of waiting for a writer for ever (`open` alone would); reads then block as usual,
    so a pipe being written (`<(generate-policy)`) is read to its end. OSError as `open` raises
    it (missing file, no permission, a directory)."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        os.set_blocking(fd, True)
        stream = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with stream:
        return read_bounded(stream, limit)


def byte_size(n: int) -> str:
    """A size for people, in binary units: whole ones where exact (a limit reads '4 MiB')."""
    if n < 1024:
        return f"{n} bytes"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        size /= 1024
        if size < 1024 or unit == "GiB":
            break
    return f"{size:.0f} {unit}" if size.is_integer() else f"{size:.1f} {unit}"
