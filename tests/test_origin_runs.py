"""A merged exchange segment's rows as runs of one origin watermark each (`_origin_runs`): the
runs cover exactly the rows asked for, each row's origin is its run's, and neighbouring runs
differ (a null origin is the segment's own, a value of its own)."""

from __future__ import annotations

import itertools

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from regional.dataflow.exchange import ORIGIN_COLUMN, _origin_runs

SEGMENT_ORIGIN = 77


@settings(deadline=None)
@given(
    st.lists(st.one_of(st.none(), st.sampled_from([-5, 0, 1, 2, SEGMENT_ORIGIN])), max_size=30),
    st.data(),
)
def test_runs_cover_the_rows_with_each_rows_origin(origins: list[int | None], data) -> None:  # type: ignore[no-untyped-def]
    n = len(origins)
    start = data.draw(st.integers(0, n))
    rows = data.draw(st.integers(0, n - start))
    table = pa.table({ORIGIN_COLUMN: pa.array(origins, pa.int64()), "x": list(range(n))})
    runs = _origin_runs(table, start, rows, SEGMENT_ORIGIN)
    assert [i for first, k, _ in runs for i in range(first, first + k)] == list(
        range(start, start + rows)
    )
    assert all(k > 0 for _, k, _ in runs)
    for first, k, origin in runs:
        for v in origins[first : first + k]:
            assert (SEGMENT_ORIGIN if v is None else v) == origin
    for (a, k, _), (b, _, _) in itertools.pairwise(runs):
        assert origins[a + k - 1] != origins[b]


def test_a_segment_without_an_origin_column_is_one_run() -> None:
    assert _origin_runs(pa.table({"x": [1, 2, 3]}), 1, 2, 5) == [(1, 2, 5)]
