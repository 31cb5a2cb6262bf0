"""The built-in window aggregates `min_of`, `max_of` and `mean_of` equal a direct computation
over each (key, window), None values skipped as in SQL, in any record order and split into
any epochs (their accumulators merge, so fallback and replay cannot change them)."""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.operators import WindowOp
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.window_operator import WindowSpec
from regional.dataflow.windows import Tumbling, count, max_of, mean_of, min_of

records = st.lists(
    st.fixed_dictionaries(
        {
            "k": st.sampled_from("abc"),
            "ts": st.integers(0, 5_999),
            "v": st.one_of(st.none(), st.integers(-1000, 1000)),
        }
    ),
    max_size=60,
)


def _direct(rows: list[dict[str, Any]]) -> dict[tuple[str, int], tuple[Any, Any, Any, int]]:
    groups: dict[tuple[str, int], list[Any]] = defaultdict(list)
    for r in rows:
        groups[r["k"], r["ts"] // 1000 * 1000].append(r["v"])
    out = {}
    for group, values in groups.items():
        present = [v for v in values if v is not None]
        mean = sum(present) / len(present) if present else None
        out[group] = (min(present, default=None), max(present, default=None), mean, len(values))
    return out


def _windowed(rows: list[dict[str, Any]], cuts: list[int]) -> dict[tuple[str, int], list[Any]]:
    """The rows of four window operators (min, max, mean, count) fed `rows` in epochs cut at
    `cuts`, restored from a snapshot between epochs; the last epoch's watermark closes all."""
    aggregates = [min_of("v"), max_of("v"), mean_of("v"), count()]
    results: dict[tuple[str, int], list[Any]] = defaultdict(lambda: [None] * 4)
    for n, aggregate in enumerate(aggregates):
        op = WindowOp(
            WindowSpec(Tumbling("1 s"), aggregate, time_of=lambda r: r["ts"]),
            key=lambda r: r["k"],
            name=f"w{n}",
            scope="key",
        )
        blob = b""
        bounds = [0, *sorted(cuts), len(rows)]
        for i, (start, end) in enumerate(itertools.pairwise(bounds)):
            state = OperatorState.from_bytes(blob)
            time = EpochTime(0)
            last = i == len(bounds) - 2
            time.start[KEY_SCOPE] = MIN_WATERMARK
            time.end[KEY_SCOPE] = MAX_WATERMARK if last else MIN_WATERMARK
            out, _ = op.run([("s", rows[start:end])], [MIN_WATERMARK], state, None, time)
            for _, emitted in out:
                for row in emitted:
                    key = (row["key"], int(row["window_start"].timestamp() * 1000))
                    results[key][n] = row["value"]
            blob = op.snapshot(state, ()) or b""
    return results


@settings(max_examples=60, deadline=None)
@given(rows=records, cuts=st.lists(st.integers(0, 60), max_size=3))
def test_min_max_mean_equal_a_direct_computation_in_any_epochs(
    rows: list[dict[str, Any]], cuts: list[int]
) -> None:
    cuts = [c for c in cuts if c <= len(rows)]
    got = _windowed(rows, cuts)
    want = _direct(rows)
    assert set(got) == set(want)
    for group, (low, high, mean, n) in want.items():
        assert got[group][:2] == [low, high]
        assert got[group][3] == n
        assert (got[group][2] is None) == (mean is None)
        if mean is not None:
            assert abs(got[group][2] - mean) < 1e-9
