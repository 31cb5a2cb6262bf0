"""Crafted msgpack state: only `StateDecodeError` leaves `StateCodec.decode`, naming the operator,
the state file, the state and the key (an invalid Decimal, a 500-deep tuple, a 5,000-character
zone name, and fuzzed extension values)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from msgspec.msgpack import Ext

from regional.dataflow.state_codec import HEADER_MSGPACK, StateCodec, StateDecodeError

codec = StateCodec()
OF = "state of operator 'count' in chk-1/u0.state does not decode"
FIX = "the file is damaged or was not written by regional: restore another checkpoint"


def _blob(value: Any) -> bytes:
    return HEADER_MSGPACK + msgspec.msgpack.encode([{"s0": {("a", 1): {"total": value}}}, {}])


def _decode(data: bytes) -> Any:
    return codec.decode(data, operator="count", source="chk-1/u0.state")


def _nested(depth: int) -> Ext:
    value = Ext(1, msgspec.msgpack.encode([1]))
    for _ in range(depth):
        value = Ext(1, msgspec.msgpack.encode([value]))
    return value


def test_an_invalid_decimal_names_the_state_and_key():
    with pytest.raises(StateDecodeError) as err:
        _decode(_blob([1, Ext(2, b"one and a half")]))
    assert str(err.value) == (
        f"{OF} (ValueError: 'one and a half' is not a decimal number, in state 'total' "
        f"(split 's0', key ('a', 1)) at value[1]); {FIX}"
    )


def test_a_500_deep_tuple_is_damaged_state_not_a_recursion_error():
    with pytest.raises(StateDecodeError) as err:
        _decode(_blob(_nested(500)))
    message = str(err.value)
    assert message.startswith(
        f"{OF} (values nested deeper than 100 levels, in state 'total' (split 's0', "
        "key ('a', 1)) at value[0][0]"
    )
    assert message.endswith(f"...); {FIX}")


def test_a_5000_character_zone_name_is_damaged_state_not_an_os_error():
    zone = "x" * 5000
    with pytest.raises(StateDecodeError) as err:
        _decode(_blob({"at": Ext(3, msgspec.msgpack.encode(["2024-01-01T00:00:00", zone, 0]))}))
    assert str(err.value) == (
        f"{OF} (ValueError: time zone '{'x' * 39}... (5002 characters) is not a zoneinfo key, "
        f"in state 'total' (split 's0', key ('a', 1)) at value['at']); {FIX}"
    )


def test_a_zone_name_that_is_a_path_is_refused():
    with pytest.raises(
        StateDecodeError, match=r"time zone '\.\./\.\./etc/passwd' is not a zoneinfo"
    ):
        _decode(_blob(Ext(5, msgspec.msgpack.encode(["10:00:00", "../../etc/passwd", 0]))))


def test_good_values_still_decode():
    value = {"d": Decimal("1.5"), "t": dt.datetime(2024, 1, 1, tzinfo=dt.UTC), "s": {1, 2}}
    blob = codec.encode({"s0": {("a", 1): {"total": value}}}, {}, operator="count")
    assert _decode(blob) == ({"s0": {("a", 1): {"total": value}}}, {})


#: Extension payloads: msgpack of plausible shapes, or raw bytes.
_payloads = st.one_of(
    st.binary(max_size=40),
    st.builds(
        msgspec.msgpack.encode,
        st.one_of(
            st.lists(
                st.one_of(st.integers(-(2**63), 2**63 - 1), st.text(max_size=30), st.none()),
                max_size=4,
            ),
            st.text(max_size=60),
            st.tuples(
                st.text(max_size=30),
                st.one_of(st.text(max_size=300), st.none()),
                st.integers(-(2**63), 2**63 - 1),
            ),
        ),
    ),
)
_ext_values = st.recursive(
    st.builds(Ext, st.integers(0, 12), _payloads),
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.builds(lambda xs: Ext(1, msgspec.msgpack.encode(xs)), st.lists(inner, max_size=3)),
        st.builds(lambda xs: Ext(6, msgspec.msgpack.encode(xs)), st.lists(inner, max_size=3)),
    ),
    max_leaves=8,
)


@settings(max_examples=400, deadline=None)
@given(_ext_values)
def test_fuzzed_extension_values_decode_or_raise_the_codecs_error(value: Any) -> None:
    try:
        _decode(_blob(value))
    except StateDecodeError as err:
        assert str(err).startswith("state of operator 'count' in chk-1/u0.state ")


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_fuzzed_bodies_decode_or_raise_the_codecs_error(body: bytes) -> None:
    try:
        _decode(HEADER_MSGPACK + body)
    except StateDecodeError as err:
        assert str(err).startswith("state of operator 'count' in chk-1/u0.state ")
