"""Approximate distinct counts: `count_distinct(field, exact=False)` as an HLL sketch of Apache
DataSketches (the optional extra ``regional-checkpoints[sketches]``). Pure.

The accumulator is a ``datasketches.hll_sketch`` of ``2**lg_k`` registers (HLL_8). Its state
codec encoding (`encode` / `decode`, extension type 9 of `regional.dataflow.state_codec`) is
the sketch's own compact serialization, so it survives a checkpoint, a restore and a rescale.

**Deterministic estimates.** A sketch's own estimate (HIP) depends on the order in which
values were added, which a fallback or a rescale can change. `estimate` reads the composite
estimator instead (a union of the sketch with itself), which depends only on the registers,
and a register is the maximum over the values that hash to it: the same set of values gives
the same number whatever the order, the merges or the epochs they came in (a property test
holds it to that). Its relative error is within `relative_error(lg_k)` at 2 standard
deviations (95.4%); with few values (list and set modes) it is exact.

>>> a = approximate_distinct("user", 12)
>>> acc = a.init()
>>> for n in range(1000): acc = a.add(acc, {"user": f"u{n % 300}"})
>>> a.result(acc)
300
>>> round(relative_error(12), 4)
0.0318
"""

from __future__ import annotations

from typing import Any

from regional.dataflow.windows import Aggregate

__all__ = [
    "LG_K_RANGE",
    "MissingSketches",
    "approximate_distinct",
    "check_layout",
    "decode",
    "encode",
    "estimate",
    "is_sketch",
    "relative_error",
]

#: The precisions DataSketches' HLL sketch takes (``lg_k``).
LG_K_RANGE = (7, 21)
_COMPACT = 8  # the preamble's flag of a compact serialization
_INSTALL = "install regional-checkpoints[sketches] (pip install 'regional-checkpoints[sketches]')"


class MissingSketches(ImportError):
    """`count_distinct(exact=False)` without the ``datasketches`` package installed."""


def _library() -> Any:
    try:
        import datasketches  # type: ignore[import-untyped]
    except ImportError as exc:
        raise MissingSketches(
            f"count_distinct(exact=False) needs Apache DataSketches' Python package "
            f"'datasketches', which is not installed: {_INSTALL}, or use exact=True"
        ) from exc
    return datasketches


def relative_error(lg_k: int, std_devs: int = 2) -> float:
    """The documented bound on the relative error of an estimate of `lg_k` at `std_devs`
    standard deviations (1: 68.3%, 2: 95.4%, 3: 99.7% of cases), for the composite estimator
    `estimate` reads (DataSketches' a priori bound of a unioned sketch)."""
    ds = _library()
    return float(abs(ds.hll_sketch.get_rel_err(True, True, lg_k, std_devs)))


def is_sketch(value: Any) -> bool:
    """True for a DataSketches HLL sketch (without importing the library when it is none)."""
    t = type(value)
    return t.__name__ == "hll_sketch" and t.__module__.endswith("datasketches")


def encode(sketch: Any) -> bytes:
    """The sketch's compact serialization (what a snapshot keeps)."""
    return bytes(sketch.serialize_compact())


def check_layout(data: bytes) -> None:
    """`ValueError` unless `data` has the layout of what `encode` writes: DataSketches' compact
    HLL serialization (version 1, family 7) of an HLL_8 sketch with an `lg_k` in
    `LG_K_RANGE`, in list, set or HLL mode, every size field consistent with the length.

    Snapshots are data from storage, not trusted to run code, and the library's C++
    deserializer trusts its size fields (a set-mode sketch claiming 2**224 slots corrupts the
    heap), so `decode` checks them here first, in Python."""
    if len(data) < 8:
        raise ValueError(f"{len(data)} bytes are too short for an HLL sketch's preamble")
    ints, version, family, lg_k, lg_arr, flags, count, mode_byte = data[:8]
    mode, target = mode_byte & 3, (mode_byte >> 2) & 3
    low, high = LG_K_RANGE
    if (version, family, target) != (1, 7, 2) or not low <= lg_k <= high:
        raise ValueError(
            f"not an HLL_8 sketch of serialization version 1 (version {version}, family "
            f"{family}, target {target}, lg_k {lg_k})"
        )
    if not flags & _COMPACT or mode > 2 or ints != (2, 3, 10)[mode] or lg_arr > lg_k:
        raise ValueError(f"an inconsistent HLL preamble ({list(data[:8])})")
    if mode == 0:  # a list of coupons
        size, entries = 8 + 4 * count, count
    elif mode == 1:  # a hash set of coupons
        entries = int.from_bytes(data[8:12], "little") if len(data) >= 12 else -1
        size = 12 + 4 * entries
    else:  # the registers, one byte each, without an exception table
        entries, size = 0, 40 + 2**lg_k
        if len(data) >= 40 and int.from_bytes(data[36:40], "little") != 0:
            raise ValueError("an HLL_8 sketch with an exception table")
    if entries < 0 or entries > 2**lg_arr or len(data) != size:
        raise ValueError(f"an HLL sketch of {len(data)} bytes whose preamble says {size}")


def decode(data: bytes) -> Any:
    """A sketch from `encode`'s bytes; `MissingSketches` without the library, `ValueError`
    when the bytes are no HLL sketch `encode` writes (`check_layout`)."""
    ds = _library()
    check_layout(data)
    try:
        return ds.hll_sketch.deserialize(bytes(data))
    except Exception as exc:  # the C++ library's errors come as RuntimeError and kin
        raise ValueError(f"not an HLL sketch ({type(exc).__name__}: {exc})") from None


def estimate(sketch: Any) -> int:
    """The distinct count `sketch` estimates, rounded, by the order-independent composite
    estimator (see the module)."""
    ds = _library()
    union = ds.hll_union(sketch.lg_config_k)
    union.update(sketch)
    union.update(sketch)  # a second, non-empty update switches to the composite estimator
    return round(union.get_estimate())


def approximate_distinct(field: str, lg_k: int) -> Aggregate:
    """`count_distinct(field, exact=False, lg_k=lg_k)`: an HLL sketch per accumulator.
    `ValueError` for an `lg_k` out of `LG_K_RANGE`, `MissingSketches` without the library."""
    low, high = LG_K_RANGE
    if type(lg_k) is not int or not low <= lg_k <= high:
        raise ValueError(
            f"count_distinct({field!r}, exact=False, lg_k={lg_k!r}): lg_k is the sketch's "
            f"precision, an int from {low} to {high} (the default 12: within 3.2% at 2 "
            "standard deviations; each step up divides the error by about 1.41 and doubles "
            "the state)"
        )
    ds = _library()
    hll, union_of, hll_8 = ds.hll_sketch, ds.hll_union, ds.tgt_hll_type.HLL_8

    def init() -> Any:
        return hll(lg_k)

    def add(acc: Any, record: Any) -> Any:
        v = record[field]
        if v is not None:
            acc.update(v if type(v) in (int, float, str) else _as_text(v))
        return acc

    def merge(a: Any, b: Any) -> Any:
        union = union_of(lg_k)
        union.update(a)
        union.update(b)
        return union.get_result(hll_8)

    return Aggregate(
        init,
        add,
        merge,
        estimate,
        field=field,
        kind="approx_count_distinct",
        call=f"count_distinct({field!r}, exact=False, lg_k={lg_k})",
    )


def _as_text(value: Any) -> str:
    """A value the sketch takes no other way (a date, a Decimal, bytes...) as text that tells
    equal values apart from unequal ones of its type: its type name and repr."""
    return f"{type(value).__name__}:{value!r}"
