"""The versioned binary format of a `_metadata` file (DESIGN §5).

```
offset  size  field
0       4     magic  b"RGNL"
4       2     major version (big-endian)   incompatible changes: old readers refuse
6       2     minor version (big-endian)   additive changes: fields appended with defaults
8       8     body length (big-endian)
16      n     body: the CheckpointMetadata as msgpack (msgspec; sub-structs are arrays)
16+n    16    BLAKE2b-128 digest of bytes [0, 16+n): header and body
```

Minor versions are additive: fields are appended (with defaults) to the end of a struct, and
msgspec ignores trailing array items and map keys it does not know, so an older reader still
reads a newer minor version of its major one; a newer reader fills the defaults. One exception:
format 1.5 stores the subtasks as columns (`metadata.subtasks.SubtaskColumns`, a map where 1.0
to 1.4 hold an array of `SubtaskState` arrays), so that 100,000 of them decode in milliseconds
without building 100,000 objects. A 1.4 reader refuses a 1.5 file that has subtasks with "does
not decode (Expected `array`, got `object` - at `$.subtasks`); format 1.5 is newer than this
regional (1.4): upgrade regional"; a checkpoint without subtasks is written as before. This
reader reads both layouts under any 1.x header.

The digest covers the header too, so a flipped version or length byte is caught like a flipped
body byte. The length field tells a truncated file from a corrupt one. Every failure raises
`MetadataError` naming the file (`source`); nothing here touches a file system.

A reader keeps one decoder per major version it has ever written (`_DECODERS`): format 2 adds a
decoder that turns a version-1 body into the current model, and the committed fixture
`tests/fixtures/metadata/v1-*.bin` must keep decoding.

>>> from metadata.model import CheckpointMetadata
>>> md = CheckpointMetadata(checkpoint_id=7, job_id="j", kind="global",
...     trigger_time_ms=1, completion_time_ms=2)
>>> data = encode_metadata(md)
>>> data[:4], len(data)
(b'RGNL', 108)
>>> decode_metadata(data, source="chk-7/_metadata") == md
True
>>> decode_metadata(data[:-1], source="chk-7/_metadata")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.errors.MetadataError: chk-7/_metadata is truncated: ...
"""

from __future__ import annotations

import hashlib
import re
import struct
from collections.abc import Callable
from itertools import chain
from operator import add, attrgetter, gt

import msgspec
import pyarrow as pa
import pyarrow.compute as pc

from metadata import subtasks
from metadata.errors import MetadataError
from metadata.layout import path_problem
from metadata.model import CheckpointMetadata
from metadata.subtasks import (
    HANDLE_COLUMNS,
    SUBTASK_COLUMNS,
    SubtaskColumns,
    SubtaskState,
    SubtaskTable,
)

__all__ = [
    "DECODE_FAILURES",
    "DIGEST_SIZE",
    "FORMAT_MINOR",
    "FORMAT_VERSION",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_METADATA_FILE_BYTES",
    "decode_metadata",
    "encode_metadata",
    "segment_checksum",
]

MAGIC = b"RGNL"
#: Major version of what this code writes; readers refuse anything newer.
FORMAT_VERSION = 1
#: Minor version of what this code writes (additive changes within a major version).
#: 1.1 added `CheckpointMetadata.num_retained`; 1.2 `CheckpointMetadata.forced_global`; 1.3
#: `CheckpointMetadata.consecutive_regional`; 1.4 `CheckpointMetadata.sinks`; 1.5 the subtasks
#: as columns (`metadata.subtasks.SubtaskColumns`).
FORMAT_MINOR = 5

#: The largest `_metadata` file read (1 GiB): a thousand times a checkpoint of 20,000
#: subtasks (under 1 MiB), yet a bound, so a replaced or runaway file is refused as damaged
#: instead of being read until memory runs out (`metadata.bounded_read`).
MAX_METADATA_FILE_BYTES = 1024**3

_HEADER = struct.Struct(">4sHHQ")
_MAX_BYTES = 2**63 - 1
_INT64_MAX = 2**63 - 1
HEADER_SIZE = _HEADER.size
DIGEST_SIZE = 16

_encoder = msgspec.msgpack.Encoder()


def segment_checksum(data: bytes | memoryview) -> bytes:
    """The BLAKE2b-128 digest used for state segments and metadata files.

    >>> segment_checksum(b"abc").hex()
    'cf4ab791c62b8d2b2109c90275287816'
    """
    return hashlib.blake2b(data, digest_size=DIGEST_SIZE).digest()


def _body_fields() -> list[tuple[str, object, object] | tuple[str, object]]:
    """`CheckpointMetadata`'s fields, with `subtasks` in either layout: rows (1.0 to 1.4) or
    columns (1.5). One list, so a field added to the model is in the format."""
    fields: list[tuple[str, object, object] | tuple[str, object]] = []
    for f in msgspec.structs.fields(CheckpointMetadata):
        kind = tuple[SubtaskState, ...] | SubtaskColumns if f.name == "subtasks" else f.type
        if f.required:
            fields.append((f.name, kind))
        elif f.default is not msgspec.NODEFAULT:
            fields.append((f.name, kind, f.default))
        else:
            fields.append((f.name, kind, msgspec.field(default_factory=f.default_factory)))
    return fields


#: The body of a `_metadata` file: `CheckpointMetadata` with the subtasks as stored.
_Body = msgspec.defstruct("MetadataBody", _body_fields(), frozen=True, omit_defaults=True)


def encode_metadata(md: CheckpointMetadata) -> bytes:
    """The bytes of a `_metadata` file holding `md` (current format version)."""
    fields = msgspec.structs.asdict(md)
    fields["subtasks"] = md.subtask_table.columns() if md.subtasks else ()
    body = _encoder.encode(_Body(**fields))
    header = _HEADER.pack(MAGIC, FORMAT_VERSION, FORMAT_MINOR, len(body))
    h = hashlib.blake2b(header, digest_size=DIGEST_SIZE)
    h.update(body)
    return b"".join((header, body, h.digest()))


def _decode_v1(body: memoryview) -> CheckpointMetadata:
    fields = msgspec.structs.asdict(_v1_decoder.decode(body))
    if isinstance(fields["subtasks"], SubtaskColumns):
        fields["subtasks"] = SubtaskTable.from_columns(fields["subtasks"])
    return CheckpointMetadata(**fields)


_v1_decoder = msgspec.msgpack.Decoder(_Body)
#: What msgspec raises for bytes that do not decode: `DecodeError` (with `ValidationError`),
#: `UnicodeDecodeError` for invalid UTF-8 in a string (a `ValueError`), `OverflowError` for an
#: integer out of range, `RecursionError` for nesting too deep. Every decoder of stored bytes
#: (metadata, events, commit records, coordinator snapshots) catches exactly these and raises
#: its own error naming the thing, so hostile input never escapes as a bare exception.
#: (`SubtaskTable.from_columns` raises `ValueError` for columns whose shapes do not fit.)
DECODE_FAILURES = (msgspec.DecodeError, ValueError, OverflowError, RecursionError)
#: One body decoder per major version ever written; each returns the current model.
_DECODERS: dict[int, Callable[[memoryview], CheckpointMetadata]] = {1: _decode_v1}


def decode_metadata(data: bytes, *, source: str) -> CheckpointMetadata:
    """Decode a `_metadata` file of any supported version; `source` names it in errors.

    Raises `MetadataError` for a bad magic, a newer major version, truncation, trailing bytes,
    a checksum mismatch, a body that does not decode, or values that cannot be right.
    """
    view = memoryview(data)
    if len(view) < len(MAGIC) and MAGIC.startswith(bytes(view)):
        raise MetadataError(
            f"{source} is truncated: {len(view)} bytes, shorter than the {HEADER_SIZE}-byte "
            "header; the write was interrupted, restore from an older checkpoint"
        )
    if bytes(view[: len(MAGIC)]) != MAGIC:
        raise MetadataError(
            f"{source} is not a regional checkpoint metadata file (bad magic "
            f"{bytes(view[: len(MAGIC)])!r}, expected {MAGIC!r})"
        )
    if len(view) < HEADER_SIZE:
        raise MetadataError(
            f"{source} is truncated: {len(view)} bytes, shorter than the {HEADER_SIZE}-byte "
            "header; the write was interrupted, restore from an older checkpoint"
        )
    _, major, minor, body_len = _HEADER.unpack_from(view)
    if major > FORMAT_VERSION:  # checked first: a newer major may lay out the rest differently
        raise MetadataError(
            f"{source} has format version {major}.{minor}, written by a newer regional; this "
            f"one reads up to {FORMAT_VERSION}.x: upgrade regional"
        )
    expected = HEADER_SIZE + body_len + DIGEST_SIZE
    if len(view) < expected:
        raise MetadataError(
            f"{source} is truncated: {len(view)} of {expected} bytes; the write was "
            "interrupted, restore from an older checkpoint"
        )
    if len(view) > expected:
        raise MetadataError(
            f"{source} has {len(view) - expected} unexpected trailing bytes after the "
            f"{expected}-byte file; it was damaged or overwritten"
        )
    digest = view[expected - DIGEST_SIZE :]
    h = hashlib.blake2b(view[:HEADER_SIZE], digest_size=DIGEST_SIZE)
    h.update(view[HEADER_SIZE : expected - DIGEST_SIZE])
    if h.digest() != digest:
        raise MetadataError(
            f"{source} fails its checksum (BLAKE2b-128 of header and body); the file is "
            "corrupt, restore from an older checkpoint"
        )
    decoder = _DECODERS.get(major)
    if decoder is None:
        raise MetadataError(
            f"{source} has format version {major}.{minor}, which no regional release writes; "
            "the file is damaged"
        )
    try:
        md = decoder(view[HEADER_SIZE : expected - DIGEST_SIZE])
    except DECODE_FAILURES as exc:
        hint = (
            f"format {major}.{minor} is newer than this regional ({FORMAT_VERSION}."
            f"{FORMAT_MINOR}): upgrade regional"
            if major == FORMAT_VERSION and minor > FORMAT_MINOR
            else "the file is damaged"
        )
        raise MetadataError(f"{source} does not decode ({exc}); {hint}") from None
    _check_columns(md.subtask_table, source)
    _check_values(md, source)
    return md


#: State paths every writer produces (`chk-7/u0-a1.state`, `shared/...`), one per line: each
#: component starts with a letter, digit, `_` or `-` (so it is never `.` or `..`) and holds no
#: `/`, backslash, NUL or `:` (no drive, no URI). A path outside it gets the full check.
_SAFE_COMPONENT = r"[A-Za-z0-9_-][A-Za-z0-9._-]*"
_SAFE_PATHS = re.compile(rf"(?:{_SAFE_COMPONENT}(?:/{_SAFE_COMPONENT})*\n)*")
_refs = attrgetter("ref_checkpoint_id")
_handles = attrgetter("handles")


def _rows_of(table: SubtaskTable, name: str) -> int:
    c = table.columns()
    return c.handle_count if name in HANDLE_COLUMNS else c.count


def _largest(table: SubtaskTable, name: str) -> int:
    """The largest value of integer column `name` (0 for no rows)."""
    if _rows_of(table, name) < subtasks.ARROW_FROM_ROWS:
        return max(table.column(name), default=0)
    values = table.arrow(name)
    return values if isinstance(values, int) else pc.max(values).as_py()


def _total(table: SubtaskTable, name: str) -> int:
    if _rows_of(table, name) < subtasks.ARROW_FROM_ROWS:
        return sum(table.column(name))
    values = table.arrow(name)
    return values * _rows_of(table, name) if isinstance(values, int) else pc.sum(values).as_py()


def _distinct(table: SubtaskTable, name: str) -> int:
    if _rows_of(table, name) < subtasks.ARROW_FROM_ROWS:
        return len(set(table.column(name)))
    values = table.arrow(name)
    return 1 if isinstance(values, int) else pc.count_distinct(values).as_py()


def _segments_fit(table: SubtaskTable) -> bool:
    """Every handle's offset + length is within its file's size."""
    names = ("offset", "length", "size")
    if table.columns().handle_count < subtasks.ARROW_FROM_ROWS:
        offset, length, size = map(table.column, names)
        return not any(map(gt, map(add, offset, length), size))
    start, span, whole = map(table.arrow, names)
    if isinstance(start, int) and isinstance(span, int) and isinstance(whole, int):
        return start + span <= whole
    ends = pc.add(_uint64(start), _uint64(span))  # each fits 63 bits: no overflow
    return not pc.any(pc.greater(ends, _uint64(whole))).as_py()


def _uint64(values: pa.Array | int) -> pa.Array | pa.Scalar:
    return pa.scalar(values, pa.uint64()) if isinstance(values, int) else values.cast(pa.uint64())


def _check_columns(table: SubtaskTable, source: str) -> None:
    """Refuse subtask columns that do not fit together (indexes past their lists, lists with
    entries no row uses, handle counts that do not add up, counts beyond 64-bit signed), before
    any row is read from them. Rows decoded as rows (1.0 to 1.4) have nothing to check here."""
    if not table.is_columnar:
        return
    c = table.columns()

    def damaged(what: str) -> MetadataError:
        return MetadataError(
            f"{source} does not decode (subtask column {what}); the file is damaged"
        )

    for name in (*SUBTASK_COLUMNS, *HANDLE_COLUMNS):
        if (top := _largest(table, name)) > _INT64_MAX:
            raise damaged(f"`{name}` holds {top}, more than a 64-bit count")
    if (total := _total(table, "handles")) != c.handle_count:
        raise damaged(f"`handles` counts {total} handles, `handle_count` {c.handle_count}")
    for index, names, rows, what in (
        ("vertex", c.vertex_ids, c.count, "vertex ids"),
        ("path", c.paths, c.handle_count, "paths"),
    ):
        if rows and (top := _largest(table, index)) >= len(names):
            raise damaged(f"`{index}` holds {top}, past its {len(names)} {what}")
        used = _distinct(table, index) if rows else 0
        if len(set(names)) != len(names) or used != len(names):
            raise damaged(f"`{index}` uses {used} of {len(names)} {what}, each listed once")


def _values_plausible(md: CheckpointMetadata) -> bool:
    """The checks of `_check_values`, over whole columns in C (100,000 subtasks: milliseconds,
    not a Python loop); False means "look closer", not "damaged"."""
    cid = md.checkpoint_id
    if cid < 0 or (md.num_retained is not None and md.num_retained < 1):
        return False
    table = md.subtask_table
    if not table.is_columnar:
        return _rows_plausible(md)
    refs = set(map(_refs, md.units)) - {None}
    if refs and not (min(refs) >= 0 and max(refs) < cid):
        return False
    if _largest(table, "ref") > cid:  # `ref` is the owner's id + 1
        return False
    c = table.columns()
    if not c.handle_count:
        return True
    if _largest(table, "length") * c.handle_count > _MAX_BYTES:  # the walk adds exactly
        return False
    if not _segments_fit(table):
        return False
    return _SAFE_PATHS.fullmatch("\n".join(c.paths) + "\n") is not None


def _rows_plausible(md: CheckpointMetadata) -> bool:
    """`_values_plausible` for subtasks decoded as rows (format 1.0 to 1.4)."""
    cid = md.checkpoint_id
    refs = {*map(_refs, md.units), *map(_refs, md.subtasks)} - {None}
    if refs and not (min(refs) >= 0 and max(refs) < cid):
        return False
    handles = list(chain.from_iterable(map(_handles, md.subtasks)))
    if not handles:
        return True
    offsets = list(map(attrgetter("offset"), handles))
    lengths = list(map(attrgetter("length"), handles))
    if min(offsets) < 0 or min(lengths) < 0 or sum(lengths) > _MAX_BYTES:
        return False
    if any(map(gt, map(add, offsets, lengths), map(attrgetter("size"), handles))):
        return False
    paths = set(map(attrgetter("path"), handles))
    return _SAFE_PATHS.fullmatch("\n".join(paths) + "\n") is not None


def _check_values(md: CheckpointMetadata, source: str) -> None:
    """Refuse values no writer produces (negative ids, refs to the future, bad segments, state
    paths that would leave the job root: `metadata.layout.path_problem`). Split ids are the
    source's own names (a URL, a topic partition): the sources that join them into paths check
    them there. A file that passes `_values_plausible` is fine; any other is walked subtask by
    subtask, so the error names the first bad value. A new check goes into both."""
    if _values_plausible(md):
        return

    def bad(what: str) -> MetadataError:
        return MetadataError(
            f"{source}: {what}; the metadata of checkpoint {md.checkpoint_id} is damaged"
        )

    if md.checkpoint_id < 0:
        raise bad(f"negative checkpoint id {md.checkpoint_id}")
    if md.state_bytes > _MAX_BYTES:
        raise bad(f"{md.state_bytes} bytes of state (more than a 64-bit count)")
    if md.num_retained is not None and md.num_retained < 1:
        raise bad(f"num-retained {md.num_retained} (at least 1 is always retained)")
    for u in md.units:
        if u.ref_checkpoint_id is not None and not 0 <= u.ref_checkpoint_id < md.checkpoint_id:
            raise bad(f"unit {u.unit_id} refers to checkpoint {u.ref_checkpoint_id}")
    for s in md.subtasks:
        where = f"subtask {s.vertex_id}[{s.index}]"
        ref = s.ref_checkpoint_id
        if ref is not None and not 0 <= ref < md.checkpoint_id:
            raise bad(f"{where} refers to checkpoint {ref}")
        for h in s.handles:
            if (problem := path_problem(h.path)) is not None:
                raise bad(
                    f"{where} has state handle path {h.path!r} ({problem}); state paths are "
                    "relative to the job root and never leave it"
                )
            if h.offset < 0 or h.length < 0 or h.offset + h.length > h.size:
                raise bad(
                    f"{where} has segment {h.offset}+{h.length} "
                    f"outside file {h.path!r} of {h.size} bytes"
                )
