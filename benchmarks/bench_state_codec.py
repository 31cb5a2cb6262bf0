"""Operator state: pickle vs the msgpack codec (`regional.dataflow.state_codec`), and the update
check.

A realistic subtask state: 100,000 keys over 4 splits, each with a value state (an int) and a
map state (a small dict of str -> int). Encode + decode both ways, best of 5, printed side by
side; then the cost of `ValueState.update` and `MapState[k] = v` with the type check, against
assigning into the slot dict directly (what the update did before the check).

    python -m benchmarks.bench_state_codec [--quick]   # --quick: 10,000 keys, fewer updates
"""

from __future__ import annotations

import argparse
import functools
import pickle
import time
from collections.abc import Callable
from typing import Any

from regional.dataflow.state import OperatorState

__all__ = ["main"]

KEYS = 100_000
SPLITS = 4
REPEAT = 5


def build_state(keys: int = KEYS) -> OperatorState:
    """The benchmark state, built through the state API (so it passes the update check)."""
    state = OperatorState(operator="count")
    for k in range(keys):
        ctx = state.context(f"split-{k % SPLITS}", f"user-{k:06d}")
        ctx.value_state("count").update(k)
        pages = ctx.map_state("pages")
        pages["home"] = k % 7
        pages["cart"] = k % 3
    return state


class _UncheckedValue:
    """`ValueState` before the check: `update` only stores."""

    def __init__(self, slot: dict[str, Any], name: str) -> None:
        self._slot = slot
        self._name = name

    def update(self, value: Any) -> None:
        self._slot[self._name] = value


class _UncheckedMap:
    """`MapState.__setitem__` before the check."""

    def __init__(self, slot: dict[str, Any], name: str) -> None:
        self._slot = slot
        self._name = name

    def __setitem__(self, key: Any, value: Any) -> None:
        self._slot.setdefault(self._name, {})[key] = value


def best(fn: Callable[[], Any], repeat: int = REPEAT) -> float:
    """The fastest of `repeat` runs, in seconds."""
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return min(times)


def _updates(state: Any, value: Any, n: int) -> None:
    update = state.update
    for _ in range(n):
        update(value)


def _puts(m: Any, n: int) -> None:
    for _ in range(n):
        m["home"] = 3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 keys, 30,000 updates")
    args = parser.parse_args()
    keys = KEYS // 10 if args.quick else KEYS
    state = build_state(keys)
    data = (state.keyed, state.lists)
    blob_pickle = pickle.dumps(data, protocol=5)
    blob_codec = state.to_bytes()

    rows = [
        ("encode", best(lambda: pickle.dumps(data, protocol=5)), best(state.to_bytes)),
        (
            "decode",
            best(lambda: pickle.loads(blob_pickle)),
            best(lambda: OperatorState.from_bytes(blob_codec, operator="count")),
        ),
    ]
    rows.append(("encode+decode", rows[0][1] + rows[1][1], rows[0][2] + rows[1][2]))
    print(f"state: {keys:,} keys over {SPLITS} splits, an int and a 2-entry dict each")
    print(f"size: pickle {len(blob_pickle):,} B, msgpack codec {len(blob_codec):,} B")
    print(f"{'':14} {'pickle':>10} {'codec':>10} {'codec/pickle':>13}")
    for name, p, c in rows:
        print(f"{name:14} {p * 1e3:8.1f}ms {c * 1e3:8.1f}ms {c / p:12.2f}x")

    n = 30_000 if args.quick else 300_000
    ctx = OperatorState(operator="count").context("s", "k")
    small = {"home": 1, "cart": 2}
    cases = [
        ("ValueState.update(int)", ctx.value_state("count", 0), _UncheckedValue({}, "c"), 7),
        ("ValueState.update(2-entry dict)", ctx.value_state("d"), _UncheckedValue({}, "d"), small),
        ("ValueState.update((str, int))", ctx.value_state("t"), _UncheckedValue({}, "t"), ("a", 1)),
    ]
    print(f"\nper update ({n:,} updates, best of {REPEAT})    unchecked    checked")
    for name, checked, unchecked, value in cases:
        r = best(functools.partial(_updates, unchecked, value, n)) / n
        c = best(functools.partial(_updates, checked, value, n)) / n
        print(f"{name:36} {r * 1e9:7.0f} ns {c * 1e9:8.0f} ns  (+{(c - r) * 1e9:.0f} ns)")
    pages, old = ctx.map_state("pages"), _UncheckedMap({}, "pages")

    r = best(functools.partial(_puts, old, n)) / n
    c = best(functools.partial(_puts, pages, n)) / n
    name = "MapState[str] = int"
    print(f"{name:36} {r * 1e9:7.0f} ns {c * 1e9:8.0f} ns  (+{(c - r) * 1e9:.0f} ns)")


if __name__ == "__main__":
    main()
