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
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from regional.errors import GraphError

__all__ = ["FieldKey", "KeyLike", "key_function"]

#: What `key_by` and `exchange` take: a function of a record, or a field name.
KeyLike = Callable[[Any], Any] | str


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


def key_function(key: KeyLike, what: str = "key_by") -> Callable[[Any], Any]:
    """`key` as a function of a record: a field name becomes a `FieldKey`; `GraphError`
    naming `what` for anything else that is not callable."""
    if isinstance(key, str):
        if not key:
            raise GraphError(f"{what}: the key field name is empty; give the field's name")
        return FieldKey(key)
    if not callable(key):
        raise GraphError(
            f"{what}: the key {key!r} is neither a field name nor callable; give a field "
            "name, e.g. 'customer', or a function of a record, e.g. lambda r: r['customer']"
        )
    return key
