"""How operator state is encoded in a snapshot: msgpack by default, pickle only by opt-in.

Checkpoint storage is not trusted to run code (README, "Threat model"): a snapshot is data. The
default encoding is msgpack (msgspec) with extension types for what msgpack has no word for, so
every supported value comes back with its type:

======  ============================================  ======================================
ext     Python value                                  ext payload
======  ============================================  ======================================
1       tuple                                         msgpack array of the items
2       decimal.Decimal                               its str
3       datetime.datetime (naive or aware)            [isoformat, zoneinfo key or nil, fold]
4       datetime.date                                 isoformat
5       datetime.time                                 [isoformat, zoneinfo key or nil, fold]
6, 7    set, frozenset                                msgpack array of the items
8       msgspec Struct of a *declared* class          ["module:qualname", {field: value}]
9       datasketches.hll_sketch                       the sketch's compact serialization
                                                      (`count_distinct(exact=False)`)
======  ============================================  ======================================

int (64 bits), float, str, bytes, bool, None, list and dict are plain msgpack. A tuple used as a
dict key is a plain msgpack array (msgspec decodes arrays in key position as tuples). Exact types
only: a subclass (`defaultdict`, an `IntEnum`) would come back as its base, so it is refused.
A Struct decodes only into a class declared on the pipeline (`Pipeline(state_types=[...])`),
looked up by ``module:qualname``: no module named in the data is ever imported.

A snapshot starts with a 5-byte header, ``\\xc1RS`` (``\\xc1`` is never used by msgpack, and a
pickle starts with ``\\x80``), a kind and a format version: ``M\\x01`` msgpack (body
``[keyed, lists]``, every state name a str), ``M\\x02`` the same with TTL'd state (written only
when some entry has a ttl: a state's slot may also hold ``[name, "ttl"]`` keys with the update
times, see `regional.dataflow.state`; a regional that reads only ``M\\x01`` refuses it, naming the
format), ``P\\x01`` pickle (opt-in `PickledState`: an HMAC-SHA256 of the operator
id and the pickle, keyed with the job's secret, then the pickle). A pickle segment is unpickled
only after its MAC verifies; snapshots of regional 0.1 (a bare pickle) are refused unread.

>>> codec = StateCodec()
>>> blob = codec.encode({"s0": {("a", 1): {"n": Decimal("1.5")}}}, {}, operator="count")
>>> blob[:5]
b'\\xc1RSM\\x01'
>>> codec.decode(blob, operator="count", source="chk-1/u0.state")
({'s0': {('a', 1): {'n': Decimal('1.5')}}}, {})
"""

from __future__ import annotations

import datetime as dt
import hmac
import pickle
from collections.abc import Callable, Iterable, Mapping
from decimal import Decimal
from typing import Any, Literal
from zoneinfo import ZoneInfo

import msgspec
from msgspec.msgpack import Ext

from regional.dataflow.distinct_sketches import decode as decode_sketch
from regional.dataflow.distinct_sketches import encode as encode_sketch
from regional.dataflow.distinct_sketches import is_sketch
from regional.errors import RegionalError, RestoreError

__all__ = [
    "HEADER_MSGPACK",
    "HEADER_MSGPACK_TTL",
    "HEADER_PICKLE",
    "INT_RANGE",
    "MAX_NESTING",
    "PickledState",
    "StateCodec",
    "StateDecodeError",
    "StateTypeError",
]

_MAGIC = b"\xc1RS"
HEADER_MSGPACK = _MAGIC + b"M\x01"
HEADER_MSGPACK_TTL = _MAGIC + b"M\x02"
HEADER_PICKLE = _MAGIC + b"P\x01"
_MAC_SIZE = 32

_TUPLE, _DECIMAL, _DATETIME, _DATE, _TIME, _SET, _FROZENSET, _STRUCT, _HLL = range(1, 10)
_PLAIN = frozenset({str, float, bool, bytes, type(None)})
_INT_MIN, _INT_MAX = INT_RANGE = (-(2**63), 2**64 - 1)  # what msgpack's int holds

SUPPORTED = (
    "int (64 bits), float, str, bytes, bool, None, list, dict, tuple, set, frozenset, "
    "datetime, date, time, Decimal and declared msgspec Structs"
)


class StateTypeError(RegionalError, TypeError):
    """State holds a value the default encoding cannot keep faithfully; the message names the
    operator, the state, the type and where in the value it sits."""

    exit_code = 2


class StateDecodeError(RestoreError):
    """A state segment is refused: pickle without the opt-in, a MAC that does not verify, an
    undeclared Struct class, or bytes that do not decode. Names the file and the operator."""


class _Unsupported(Exception):
    """Internal: an unsupported value at `path` (innermost first while unwinding)."""

    def __init__(self, why: str, fix: str | None = None) -> None:
        self.why = why
        self.fix = fix  # None: keep a supported type, or opt in to pickle
        self.path: list[str] = []


class _Key:
    """A hashable stand-in for an `Ext` in a dict key (`Ext` is not hashable)."""

    __slots__ = ("ext",)

    def __init__(self, ext: Ext) -> None:
        self.ext = ext


def _unwrap(obj: Any) -> Any:
    if type(obj) is _Key:
        return obj.ext
    raise TypeError(f"cannot encode {type(obj).__name__}")  # not reached: values are prepared


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_unwrap)


def _zone(value: dt.datetime | dt.time) -> str | None:
    return value.tzinfo.key if isinstance(value.tzinfo, ZoneInfo) else None


class PickledState(msgspec.Struct, frozen=True):
    """Opt-in: encode state with pickle, so it may hold any picklable object.

    Each segment carries an HMAC-SHA256 keyed with `secret` (at least 16 bytes; keep it out of
    the checkpoint root, e.g. in an environment variable of the driver); a segment whose MAC does
    not verify is refused before it is unpickled. `accept_unsigned` also unpickles the bare
    pickle snapshots of regional 0.1 (a one-time migration of a checkpoint root you trust).
    """

    secret: bytes
    accept_unsigned: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) < 16:
            raise StateTypeError(
                "PickledState(secret=...) needs a secret of at least 16 bytes, e.g. "
                "os.environb[b'REGIONAL_STATE_SECRET'] holding secrets.token_bytes(32)"
            )

    def __repr__(self) -> str:  # never print the secret
        return f"PickledState(secret=<{len(self.secret)} bytes>)"

    def mac(self, operator: str, payload: bytes) -> bytes:
        """The MAC of a pickle payload of `operator` (binds the segment to its operator)."""
        return hmac.digest(self.secret, operator.encode() + b"\0" + payload, "sha256")


class StateCodec:
    """Encodes and decodes one pipeline's operator state (see the module docstring).

    `types` are the msgspec Struct classes state may hold; `pickled` switches to the opt-in
    pickle encoding.
    """

    def __init__(self, types: Iterable[type] = (), pickled: PickledState | None = None) -> None:
        self.types: dict[str, type] = {}
        for cls in types:
            if not (isinstance(cls, type) and issubclass(cls, msgspec.Struct)):
                raise StateTypeError(
                    f"state_types: {cls!r} is not a msgspec Struct class; declare only Struct "
                    f"classes (state keeps {SUPPORTED})"
                )
            self.types[_class_name(cls)] = cls
        if pickled is not None and not isinstance(pickled, PickledState):
            raise StateTypeError(
                f"state_serializer={pickled!r}: give PickledState(secret=...) to pickle state, "
                "or nothing for the default (msgpack) encoding"
            )
        self.pickled = pickled
        self._decoder = msgspec.msgpack.Decoder(
            tuple[dict[str, dict[Any, dict[str, Any]]], dict[str, list[Any]]],
            ext_hook=self._ext,
        )
        self._decoder_ttl = msgspec.msgpack.Decoder(  # slots keyed by name or (name, "ttl")
            tuple[
                dict[str, dict[Any, dict[str | tuple[str, Literal["ttl"]], Any]]],
                dict[str, list[Any]],
            ],
            ext_hook=self._ext,
        )
        self._items = msgspec.msgpack.Decoder(ext_hook=self._ext)  # payloads of ext types

    def __reduce__(self) -> tuple[Any, ...]:  # shipped to executors with the pipeline
        return (StateCodec, (tuple(self.types.values()), self.pickled))

    # -- checks -------------------------------------------------------------------------------

    def check(self, value: Any, *, what: str, operator: str, at: str = "") -> None:
        """Raise `StateTypeError` unless `value` can be kept (no-op with `PickledState`).

        `what` names the state for the message (``state 'totals'``), `at` where `value` sits
        in it (``['c07']``).
        """
        if self.pickled is not None:
            return
        try:  # in key mode a tuple is not encoded: the same checks, less work
            self._prepare(value, True)
        except _Unsupported as exc:
            raise self._type_error(exc, what, operator, at) from None

    def _type_error(
        self, exc: _Unsupported, what: str, operator: str, at: str = ""
    ) -> StateTypeError:
        at += "".join(reversed(exc.path))
        fix = exc.fix or (
            f"state keeps {SUPPORTED}; convert it, or pass Pipeline(state_serializer="
            "PickledState(secret=...)) to pickle state"
        )
        return StateTypeError(
            f"{what} of operator {operator!r} holds {exc.why}{' at ' + at if at else ''}: {fix}"
        )

    def _prepare(self, v: Any, key: bool = False) -> Any:
        """`v` as msgpack can take it (the same object when nothing changes)."""
        t = type(v)
        if t in _PLAIN:
            return v
        if t is int:
            if _INT_MIN <= v <= _INT_MAX:
                return v
            raise _Unsupported(
                f"an int that does not fit in 64 bits ({v})",
                "state keeps ints from -2**63 to 2**64-1 (msgpack); keep it as a str or Decimal",
            )
        if t is dict:
            return self._dict(v)
        if t is list:
            return self._list(v)
        if t is tuple:
            items = [self._item(x, i, key) for i, x in enumerate(v)]
            return tuple(items) if key else Ext(_TUPLE, _ENCODER.encode(items))
        if t is Decimal:
            ext = Ext(_DECIMAL, str(v).encode())
        elif t is dt.datetime or t is dt.time:
            ext = Ext(
                _DATETIME if t is dt.datetime else _TIME,
                _ENCODER.encode((v.isoformat(), _zone(v), v.fold)),
            )
        elif t is dt.date:
            ext = Ext(_DATE, v.isoformat().encode())
        elif t is set or t is frozenset:
            items = [self._item(x, i, False) for i, x in enumerate(v)]
            ext = Ext(_SET if t is set else _FROZENSET, _ENCODER.encode(items))
        elif isinstance(v, msgspec.Struct):
            name = _class_name(t)
            if self.types.get(name) is not t:
                raise _Unsupported(
                    f"a {t.__name__} ({name}), a msgspec Struct not declared for state",
                    f"declare it: Pipeline(state_types=[{t.__name__}]), from a module the "
                    "Python workers import",
                )
            fields = {}
            for f in t.__struct_fields__:
                try:
                    fields[f] = self._prepare(getattr(v, f))
                except _Unsupported as exc:
                    exc.path.append(f".{f}")
                    raise
            ext = Ext(_STRUCT, _ENCODER.encode((name, fields)))
        elif is_sketch(v):
            ext = Ext(_HLL, encode_sketch(v))
        else:
            raise _Unsupported(f"a value of type {t.__module__}.{t.__qualname__}")
        return _Key(ext) if key else ext

    def _dict(self, v: dict[Any, Any]) -> dict[Any, Any]:
        # leaves are checked inline and dicts recursed into directly: this loop is most of the
        # cost of a snapshot
        out: dict[Any, Any] | None = None
        for k, x in v.items():
            t = type(k)
            if t in _PLAIN or (t is int and _INT_MIN <= k <= _INT_MAX):
                pk = k
            else:
                try:
                    pk = self._prepare(k, True)
                except _Unsupported as exc:
                    exc.path.append(f".keys()[{list(v).index(k)}]")
                    raise
            t = type(x)
            if t in _PLAIN or (t is int and _INT_MIN <= x <= _INT_MAX):
                px = x
            else:
                try:
                    px = self._dict(x) if t is dict else self._prepare(x)
                except _Unsupported as exc:
                    exc.path.append(f"[{k!r}]")
                    raise
            if out is None:
                if pk is k and px is x:
                    continue
                out = {}
                for k0, x0 in v.items():  # the entries before this one, unchanged
                    if k0 is k:
                        break
                    out[k0] = x0
            out[pk] = px
        return v if out is None else out

    def _list(self, v: list[Any]) -> list[Any]:
        new: list[Any] | None = None
        for i, x in enumerate(v):
            t = type(x)
            if t in _PLAIN or (t is int and _INT_MIN <= x <= _INT_MAX):
                px = x
            else:
                try:
                    px = self._dict(x) if t is dict else self._prepare(x)
                except _Unsupported as exc:
                    exc.path.append(f"[{i}]")
                    raise
            if new is None:
                if px is x:
                    continue
                new = v[:i]
            new.append(px)
        return v if new is None else new

    def _item(self, x: Any, i: int, key: bool) -> Any:
        try:
            return self._prepare(x, key)
        except _Unsupported as exc:
            exc.path.append(f"[{i}]")
            raise

    # -- snapshots ----------------------------------------------------------------------------

    def encode(
        self,
        keyed: Mapping[str, Mapping[Any, Mapping[str, Any]]],
        lists: Mapping[str, list[Any]],
        *,
        operator: str,
        ttl: bool | None = None,
    ) -> bytes:
        """The snapshot bytes of one subtask's state; `StateTypeError` names what cannot be kept.
        `ttl`: some slot holds TTL update times (format ``M\\x02``); None: look."""
        if self.pickled is not None:
            payload = pickle.dumps((keyed, lists), protocol=5)
            return HEADER_PICKLE + self.pickled.mac(operator, payload) + payload
        try:
            body = (self._dict(dict(keyed)), self._dict(dict(lists)))
        except _Unsupported:
            raise self._explain(keyed, lists, operator) from None
        if ttl is None:
            ttl = any(type(n) is tuple for s in keyed.values() for x in s.values() for n in x)
        return (HEADER_MSGPACK_TTL if ttl else HEADER_MSGPACK) + _ENCODER.encode(body)

    def _explain(
        self,
        keyed: Mapping[str, Mapping[Any, Mapping[str, Any]]],
        lists: Mapping[str, list[Any]],
        operator: str,
    ) -> StateTypeError:
        """The error naming the first value `encode` cannot keep (errors only: walks again)."""
        for split, slots in keyed.items():
            for key, slot in slots.items():
                try:
                    self._prepare(key, True)
                except _Unsupported as exc:
                    return self._type_error(exc, f"the key of split {split!r}", operator)
                for name, value in slot.items():
                    try:
                        self._prepare(value)
                    except _Unsupported as exc:
                        what = f"state {name!r} (split {split!r}, key {key!r})"
                        return self._type_error(exc, what, operator)
        for name, entries in lists.items():
            try:
                self._prepare(entries)
            except _Unsupported as exc:
                return self._type_error(exc, f"list state {name!r}", operator)
        return StateTypeError(f"state of operator {operator!r} cannot be encoded")

    def decode(
        self, data: bytes, *, operator: str, source: str
    ) -> tuple[dict[str, dict[Any, dict[Any, Any]]], dict[str, list[Any]]]:
        """`(keyed, lists)` of a snapshot taken by `encode`; `source` (the state file) and
        `operator` are named in a `StateDecodeError`. Empty bytes: empty state."""
        if not data:
            return {}, {}
        of = f"state of operator {operator!r} in {source}"
        header = bytes(data[:5])
        if header in (HEADER_MSGPACK, HEADER_MSGPACK_TTL):
            decoder = self._decoder if header == HEADER_MSGPACK else self._decoder_ttl
            try:
                keyed, lists = decoder.decode(memoryview(data)[5:])
            except _UnknownStruct as exc:
                raise StateDecodeError(
                    f"{of} holds a {exc.name} Struct{self._locate(data)}, a class not declared "
                    f"for state; declare it: Pipeline(state_types=[{exc.name.split(':')[-1]}]) "
                    f"(declared: {', '.join(self.types) or 'none'})"
                ) from None
            except Exception as exc:  # anything crafted data can raise: only ours leaves
                raise StateDecodeError(
                    f"{of} does not decode ({self._diagnose(data, exc)}); the file is damaged "
                    "or was not written by regional: restore another checkpoint"
                ) from None
            return keyed, lists
        if header == HEADER_PICKLE:
            return self._unpickle(data, of, operator, signed=True)
        if data[:1] == b"\x80":
            if self.pickled is not None and self.pickled.accept_unsigned:
                return self._unpickle(data, of, operator, signed=False)
            raise StateDecodeError(
                f"{of} is an unsigned pickle (a snapshot of regional 0.1, or forged): refused "
                "unread, since unpickling data from storage can run code. To migrate a "
                "checkpoint root you trust, run once with Pipeline(state_serializer="
                "PickledState(secret=..., accept_unsigned=True)) and keep PickledState(secret="
                "...) afterwards; otherwise start the job over with empty state"
            )
        if header[:3] == _MAGIC:
            raise StateDecodeError(
                f"{of} has state format {header[3:]!r}, which this regional does not read "
                "(written by a newer regional?); upgrade regional"
            )
        raise StateDecodeError(
            f"{of} is not a regional state snapshot (starts with {header!r}); the file is "
            "damaged or was not written by regional: restore another checkpoint"
        )

    def key_count(self, data: bytes, *, operator: str, source: str) -> int | None:
        """How many keys the keyed state of a snapshot holds (one per key and input split on a
        forward chain, one per key after a keyed exchange), read from the layout alone: the
        length of each split's map, without decoding a key or a value, so no declared Struct
        class is needed and no Struct is built. None for a pickled snapshot (its keys are not
        read without unpickling it); a snapshot `decode` refuses is refused the same way.

        >>> codec = StateCodec()
        >>> keyed = {"g0": {"a": {"n": 1}, "b": {"n": 2}}, "g1": {"a": {"n": 1}}}
        >>> codec.key_count(codec.encode(keyed, {}, operator="count"), operator="count",
        ...                 source="chk-1/u0.state")
        3
        """
        if not data:
            return 0
        header = bytes(data[:5])
        if header == HEADER_PICKLE or data[:1] == b"\x80":
            return None
        if header not in (HEADER_MSGPACK, HEADER_MSGPACK_TTL):
            self.decode(data, operator=operator, source=source)  # refuses it, naming the format
        try:
            splits, _ = _LAYOUT.decode(memoryview(data)[5:])
            return sum(_map_length(memoryview(raw)) for raw in splits.values())
        except (msgspec.DecodeError, ValueError) as exc:
            raise StateDecodeError(
                f"state of operator {operator!r} in {source} does not decode ({_what(exc)}); the "
                "file is damaged or was not written by regional: restore another checkpoint"
            ) from None

    def _unpickle(
        self, data: bytes, of: str, operator: str, *, signed: bool
    ) -> tuple[dict[str, dict[Any, dict[str, Any]]], dict[str, list[Any]]]:
        if self.pickled is None:
            raise StateDecodeError(
                f"{of} is pickled (PickledState) and is refused unread: this pipeline does not "
                "opt in to pickled state. Pass the job's secret: Pipeline(state_serializer="
                "PickledState(secret=...))"
            )
        payload = bytes(data)
        if signed:
            mac, payload = payload[5 : 5 + _MAC_SIZE], payload[5 + _MAC_SIZE :]
            if not hmac.compare_digest(mac, self.pickled.mac(operator, payload)):
                raise StateDecodeError(
                    f"{of} does not carry a valid MAC for this job's secret: refused unread "
                    "(tampered with, written by another job or operator, or the secret "
                    "changed); restore another checkpoint, or run with the secret that wrote it"
                )
        try:
            keyed, lists = pickle.loads(payload)
        except Exception as exc:
            raise StateDecodeError(f"{of} does not unpickle: {type(exc).__name__}: {exc}") from None
        return keyed, lists

    def _ext(
        self, code: int, data: memoryview, decode: Callable[[memoryview], Any] | None = None
    ) -> Any:
        items = self._items.decode if decode is None else decode
        if code == _TUPLE:
            return tuple(items(data))
        if code == _DECIMAL:
            text = str(data, "utf-8")
            try:
                return Decimal(text)
            except ArithmeticError:  # decimal.InvalidOperation
                raise ValueError(f"{_short(text)} is not a decimal number") from None
        if code in (_DATETIME, _TIME):
            iso, zone, fold = items(data)
            kind = dt.datetime if code == _DATETIME else dt.time
            value = kind.fromisoformat(iso)
            if zone is not None:
                value = value.replace(tzinfo=_zone_info(zone))
            return value.replace(fold=fold)
        if code == _DATE:
            return dt.date.fromisoformat(str(data, "utf-8"))
        if code == _SET:
            return set(items(data))
        if code == _FROZENSET:
            return frozenset(items(data))
        if code == _STRUCT:
            name, fields = items(data)
            if not isinstance(name, str) or not isinstance(fields, dict):
                raise ValueError(f"a Struct needs a class name and fields, got {_short(name)}")
            cls = self.types.get(name)
            if cls is None:
                raise _UnknownStruct(name)
            return cls(**fields)
        if code == _HLL:
            return decode_sketch(bytes(data))
        raise ValueError(f"unknown msgpack extension type {code}")

    def _diagnose(self, data: bytes, exc: BaseException) -> str:
        """What is wrong with a snapshot that failed to decode with `exc`, and where: decoded
        again tolerantly (each extension value on its own, nesting bounded), the first bad
        value's state, split, key and item path (slow, errors only)."""
        depth = [0]

        def hook(code: int, payload: memoryview) -> Any:
            if depth[0] >= MAX_NESTING:
                return _Bad(f"values nested deeper than {MAX_NESTING} levels")
            depth[0] += 1
            try:
                return self._ext(code, payload, decode=inner.decode)
            except _UnknownStruct as unknown:
                return _Bad(f"a {unknown.name} Struct, a class not declared for state")
            except Exception as bad:
                return _Bad(_what(bad))
            finally:
                depth[0] -= 1

        inner = msgspec.msgpack.Decoder(ext_hook=hook)
        try:
            decoded = msgspec.msgpack.decode(memoryview(data)[5:], ext_hook=hook)
            keyed, lists = decoded
            found = _find_bad(keyed, lists)
        except Exception:
            return _what(exc)
        return _what(exc) if found is None else found

    def _locate(self, data: bytes) -> str:
        """Where the first undeclared Struct sits, for the error message (slow, errors only)."""

        def hook(code: int, payload: memoryview) -> Any:
            if code == _STRUCT:
                name, fields = msgspec.msgpack.decode(payload, ext_hook=hook)
                return _MARKER if name not in self.types else tuple(fields.values())
            if code in (_TUPLE, _SET, _FROZENSET):
                return tuple(msgspec.msgpack.decode(payload, ext_hook=hook))
            return None

        try:
            keyed, lists = msgspec.msgpack.decode(memoryview(data)[5:], ext_hook=hook)
        except Exception:
            return ""
        for split, slots in keyed.items():
            for key, slot in slots.items():
                if _contains_marker(key):
                    return f" in the key {key!r} of split {split!r}"
                for name, value in slot.items():
                    if _contains_marker(value):
                        return f" in state {name!r} (split {split!r}, key {key!r})"
        for name, entries in lists.items():
            if _contains_marker(entries):
                return f" in list state {name!r}"
        return ""


#: A snapshot body read as far as `key_count` needs: each split's keyed state left encoded.
_LAYOUT = msgspec.msgpack.Decoder(tuple[dict[str, msgspec.Raw], msgspec.Raw])


def _map_length(raw: memoryview) -> int:
    """The number of entries a msgpack map holds, from its header (fixmap, map 16, map 32):
    msgspec decodes a map only whole, keys and all."""
    first = raw[0]
    if 0x80 <= first <= 0x8F:
        return first & 0x0F
    if first in (0xDE, 0xDF):
        width = 2 if first == 0xDE else 4
        if len(raw) < 1 + width:
            raise ValueError("a split's keyed state ends inside its map header")
        return int.from_bytes(raw[1 : 1 + width], "big")
    raise ValueError(f"a split's keyed state is not a map (msgpack type byte {first:#04x})")


def _zone_info(key: Any) -> ZoneInfo:
    """The zone named `key` in a snapshot; `ValueError` for anything that is not a zoneinfo
    key (too long, a path, unknown), never the file system's own error."""
    if not isinstance(key, str) or not 0 < len(key) <= 255:
        raise ValueError(f"time zone {_short(key)} is not a zoneinfo key")
    try:
        return ZoneInfo(key)
    except (OSError, ValueError, LookupError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ValueError(
            f"time zone {_short(key)} is not a zoneinfo key ({type(exc).__name__})"
        ) from None


def _short(value: Any) -> str:
    """`repr(value)`, cut to 40 characters, for messages about crafted data."""
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:40]}... ({len(text)} characters)"


#: How deep `StateCodec._diagnose` follows nested extension values (tuples, sets, Structs) of a
#: snapshot that failed to decode (deeper ones are reported as too deep, not followed).
MAX_NESTING = 100


class _Bad:
    """A value that did not decode, in `StateCodec._diagnose`'s tolerant decoding."""

    def __init__(self, why: str) -> None:
        self.why = why

    def __repr__(self) -> str:
        return "<undecodable>"


def _what(exc: BaseException) -> str:
    """An exception as words for a message: `RecursionError` as too deep, else type: text."""
    if isinstance(exc, RecursionError):
        return "values nested too deeply"
    text = str(exc)
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _find_bad(keyed: Any, lists: Any) -> str | None:
    """Where the first `_Bad` sits in decoded `[keyed, lists]`, with why, or None."""
    if isinstance(keyed, dict):
        for split, slots in keyed.items():
            if not isinstance(slots, dict):
                continue
            for key, slot in slots.items():
                if (found := _bad_in(key)) is not None:
                    bad, path = found
                    return f"{bad.why}, in a key of split {split!r}{path}"
                if not isinstance(slot, dict):
                    continue
                for name, value in slot.items():
                    if (found := _bad_in(value)) is not None:
                        bad, path = found
                        return (
                            f"{bad.why}, in state {name!r} (split {split!r}, key {key!r}) "
                            f"at value{path}"
                        )
    if isinstance(lists, dict):
        for name, entries in lists.items():
            if (found := _bad_in(entries)) is not None:
                bad, path = found
                return f"{bad.why}, in list state {name!r} at value{path}"
    return None


def _bad_in(value: Any) -> tuple[_Bad, str] | None:
    """The first `_Bad` in `value` and its item path (`[0]['a']`), without recursion."""
    todo: list[tuple[Any, str]] = [(value, "")]
    while todo:
        v, path = todo.pop()
        if isinstance(v, _Bad):
            return v, path if len(path) <= 80 else f"{path[:80]}..."
        if isinstance(v, dict):
            todo.extend((x, f"{path}[{k!r}]") for k, x in reversed(list(v.items())))
            todo.extend((k, f"{path} (a key)") for k in v if not isinstance(k, str | int))
        elif isinstance(v, list | tuple | set | frozenset):
            todo.extend((x, f"{path}[{i}]") for i, x in reversed(list(enumerate(v))))
    return None


class _UnknownStruct(Exception):
    def __init__(self, name: str) -> None:
        self.name = name


_MARKER = ("undeclared struct",)


def _contains_marker(value: Any) -> bool:
    if value is _MARKER:
        return True
    if isinstance(value, dict):
        return any(_contains_marker(k) or _contains_marker(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_contains_marker(v) for v in value)
    return False


def _class_name(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"
