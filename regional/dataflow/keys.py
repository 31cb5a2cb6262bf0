"""Keys of records: a function of a record, or the name of a field (`key_by("user")`).

A field name becomes a `FieldKey`: called on a record it is ``record[field]``, like the
function a user would write, so it keys exchanges and state the same way; unlike a function it
says which column holds the key, so columnar operators (`KeyedStream.apply_in_arrow`) group an
Arrow table by that column without turning its rows into Python records. Two `FieldKey`s of one
field are equal, so `exchange("user", ...)` and a later `key_by("user")` agree.

>>> key = key_function("user")
>>> key({"user": "ann", "n": 1}), key == key_function("user"), key.field
('ann', True, 'user')
>>> f = lambda r: r["user"]
>>> key_function(f) is f
True

A key is judged per record (`read_key`): a key function that raises, a record without the key
field, or a key that is unhashable is that record's failure (a `UserFunctionError` naming the
operator, the function and the record), never its unit's: with ``on_error="dead-letter"`` the
record is a dead letter and the others go on. A None key is a key (grouping, deduplication,
exchanges keep it as one); the joins match it with nothing, as SQL does.

>>> read_key(key, {"n": 1}, "join 'j' (left side)")
Traceback (most recent call last):
...
regional.dataflow.failures.UserFunctionError: join 'j' (left side): the key field 'user' is \
missing from record {'n': 1}; give every record that field, or run the pipeline with \
on_error='dead-letter' to set such records aside
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa

from regional.dataflow.dead_letters import DeadLetters, set_aside
from regional.dataflow.failures import FIX, UserFunctionError, function_error, raised_on
from regional.dataflow.partitioning import key_bytes
from regional.errors import GraphError

__all__ = [
    "FieldKey",
    "FieldsKey",
    "KeyLike",
    "exchange_chunks",
    "exchange_key",
    "key_columns",
    "key_function",
    "read_key",
]

#: What `key_by` and `exchange` take: a function of a record, a field name, or a list of
#: field names (the key is then the tuple of their values).
KeyLike = Callable[[Any], Any] | str | Sequence[str]


class FieldKey:
    """The key held in field `field` of a record (``record[field]``)."""

    __slots__ = ("field",)

    def __init__(self, field: str) -> None:
        self.field = field

    def __call__(self, record: Any) -> Any:
        return record[self.field]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldKey) and other.field == self.field

    def __hash__(self) -> int:
        return hash(("FieldKey", self.field))

    def __repr__(self) -> str:
        return f"FieldKey({self.field!r})"


class FieldsKey:
    """The key held in several fields of a record: the tuple of their values
    (``key_by(["user", "country"])``)."""

    __slots__ = ("fields",)

    def __init__(self, fields: Sequence[str]) -> None:
        self.fields = tuple(fields)

    def __call__(self, record: Any) -> Any:
        return tuple([record[f] for f in self.fields])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FieldsKey) and other.fields == self.fields

    def __hash__(self) -> int:
        return hash(("FieldsKey", self.fields))

    def __repr__(self) -> str:
        return f"FieldsKey({list(self.fields)!r})"


def key_columns(key: Callable[[Any], Any]) -> tuple[str, ...] | None:
    """The columns a key reads (a `FieldKey`'s one, a `FieldsKey`'s), None for a function.

    >>> key_columns(key_function(["user", "country"])), key_columns(key_function("user"))
    (('user', 'country'), ('user',))
    """
    if isinstance(key, FieldKey):
        return (key.field,)
    if isinstance(key, FieldsKey):
        return key.fields
    return None


def key_function(key: KeyLike, what: str = "key_by") -> Callable[[Any], Any]:
    """`key` as a function of a record: a field name becomes a `FieldKey`, a list of field
    names a `FieldsKey` (one name: a `FieldKey`); `GraphError` naming `what` for anything
    else that is not callable."""
    if isinstance(key, str):
        if not key:
            raise GraphError(f"{what}: the key field name is empty; give the field's name")
        return FieldKey(key)
    if isinstance(key, list | tuple):
        names = tuple(key)
        if not names or not all(isinstance(n, str) and n for n in names):
            raise GraphError(
                f"{what}: the key {key!r} is no list of field names; give at least one "
                "non-empty name, e.g. ['user', 'country']"
            )
        if len(set(names)) < len(names):
            raise GraphError(f"{what}: the key {list(names)!r} names a field twice")
        return FieldKey(names[0]) if len(names) == 1 else FieldsKey(names)
    if not callable(key):
        raise GraphError(
            f"{what}: the key {key!r} is neither a field name nor callable; give a field "
            "name, e.g. 'customer', or a function of a record, e.g. lambda r: r['customer']"
        )
    return key


def _missing(owner: str, key: FieldKey | FieldsKey, record: Any) -> UserFunctionError:
    if isinstance(key, FieldsKey):
        fields = ", ".join(repr(f) for f in key.fields)
        return UserFunctionError(
            f"{owner}: a key field of {fields} is missing from record {record!r:.200}; give "
            f"every record those fields, {FIX}"
        )
    return UserFunctionError(
        f"{owner}: the key field {key.field!r} is missing from record {record!r:.200}; give "
        f"every record that field, {FIX}"
    )


def _unusable(owner: str, key: Any, record: Any, value: Any, why: str) -> UserFunctionError:
    what = (
        f"key field {key.field!r}"
        if isinstance(key, FieldKey)
        else f"key fields {list(key.fields)!r}"
        if isinstance(key, FieldsKey)
        else "key function"
    )
    named = isinstance(key, FieldKey | FieldsKey)
    name = "" if named else f" {getattr(key, '__qualname__', repr(key))}"
    return UserFunctionError(
        f"{owner}: the {what}{name} gave {value!r:.100} ({type(value).__name__}) for record "
        f"{record!r:.200}, which cannot be a key ({why}); key by a str, int, float, bool, "
        f"bytes, None or a tuple of them, {FIX}"
    )


def _applied(key: Callable[[Any], Any], record: Any, owner: str) -> Any:
    """`key(record)`; `UserFunctionError` naming `owner`, the function (or the missing
    field) and the record when it raises."""
    try:
        return key(record)
    except Exception as exc:
        if isinstance(key, FieldKey | FieldsKey) and isinstance(
            exc, KeyError | IndexError | TypeError
        ):
            raise _missing(owner, key, record) from exc
        raise function_error(owner, "key", key, record, exc) from exc


def read_key(key: Callable[[Any], Any], record: Any, owner: str) -> Any:
    """`key(record)`, hashable; `UserFunctionError` naming `owner` (the operator), the
    function or field and the record when it raises or gives an unhashable value."""
    value = _applied(key, record, owner)
    try:
        hash(value)
    except TypeError as exc:
        raise _unusable(owner, key, record, value, str(exc)) from None
    return value


def exchange_key(key: Callable[[Any], Any], record: Any, owner: str) -> Any:
    """`key(record)` as a keyed exchange can place it (msgpack encodes it:
    `regional.dataflow.partitioning.key_bytes`); `UserFunctionError` as `read_key` (a list
    key is placed like a tuple: the exchange needs no hash)."""
    value = _applied(key, record, owner)
    t = type(value)
    if t is str or t is float or t is bool or value is None or t is bytes:
        return value  # the hot path: encodable, no encoding made
    if t is int and -(2**63) <= value < 2**64:
        return value
    try:
        key_bytes(value)
    except TypeError:
        raise _unusable(owner, key, record, value, "msgpack cannot encode it") from None
    return value


def exchange_chunks(
    chunks: Sequence[tuple[str, Any]],
    key: Callable[[Any], Any],
    operator: str,
    dead: DeadLetters | None,
) -> list[tuple[str, Any]]:
    """The chunks (split, Arrow batch or records) an exchange writer `operator` gets, without
    the records it cannot place (`exchange_key`): each is a dead letter of `operator`, or
    (without dead letters) its unit declines with the error. An Arrow batch holding the
    field of a field key is placed by column (a null is the key None) and needs no check."""
    owner = f"exchange writer {operator!r}"
    field = key.field if isinstance(key, FieldKey) else None
    out: list[tuple[str, Any]] = []
    seen: dict[str, int] = {}
    for split, data in chunks:
        arrow = isinstance(data, pa.RecordBatch)
        base = seen.get(split, 0)
        seen[split] = base + (data.num_rows if arrow else len(data))
        if arrow and field is not None and field in data.schema.names:
            out.append((split, data))
            continue
        records = data.to_pylist() if arrow else data
        kept: list[int] = []
        for i, record in enumerate(records):
            try:
                exchange_key(key, record, owner)
            except UserFunctionError as exc:
                set_aside(dead, exc, operator, split, base + i, record)
                continue
            except BaseException as exc:  # SystemExit too: `failures.as_exception`
                raised_on(exc, split)
                raise
            kept.append(i)
        if len(kept) == len(records):
            out.append((split, data))
        elif kept:
            rows = data.take(pa.array(kept, pa.int64())) if arrow else [records[i] for i in kept]
            out.append((split, rows))
    return out
