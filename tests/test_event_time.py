"""The pure event-time core (`regional.dataflow.event_time`, `regional.dataflow.windows`,
`metadata.watermarks`), with hypothesis: watermarks never go backwards and never pass a record
still to come, per split, per subtask and per exchange reader; window assignment; lateness."""

from __future__ import annotations

import datetime as dt
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metadata.watermarks import (
    MAX_WATERMARK,
    MIN_WATERMARK,
    SplitWatermark,
    WatermarkMark,
    unwrap_position,
    wrap_position,
)
from regional.dataflow.event_time import (
    EventTime,
    advance_split,
    reader_watermark,
    span_ms,
    subtask_watermark,
    to_millis,
)
from regional.dataflow.windows import (
    Session,
    Sliding,
    Tumbling,
    Window,
    closed,
    is_late,
    merge_sessions,
)
from regional.errors import PolicyError

times = st.integers(-(10**12), 10**12)


@st.composite
def bounded_disorder(draw: st.DrawFn) -> tuple[int, list[list[int]]]:
    """(bound, batches): event times none of which is more than `bound` behind the largest
    one before it (the promise `max_out_of_orderness` makes)."""
    bound = draw(st.integers(0, 1000))
    batches, top = [], None
    for _ in range(draw(st.integers(0, 8))):
        batch = []
        for _ in range(draw(st.integers(0, 6))):
            low = -5000 if top is None else top - bound
            ts = draw(st.integers(low, low + 3000))
            top = ts if top is None else max(top, ts)
            batch.append(ts)
        batches.append(batch)
    return bound, batches


@given(bounded_disorder())
def test_a_split_watermark_never_goes_back_and_never_passes_a_record_still_to_come(
    case: tuple[int, list[list[int]]],
) -> None:
    bound, batches = case
    mark = None
    for i, batch in enumerate(batches):
        before = MIN_WATERMARK if mark is None else mark.watermark
        mark = advance_split(mark, batch, bound, now_ms=i)
        assert mark.watermark >= before
        to_come = [ts for later in batches[i + 1 :] for ts in later]
        assert all(mark.watermark <= ts for ts in to_come)
        if batch:
            assert mark.watermark == max(ts for b in batches[: i + 1] for ts in b) - bound


@given(st.dictionaries(st.text(max_size=3), st.none() | st.tuples(times, times), max_size=5))
def test_a_subtask_watermark_is_the_minimum_over_its_splits(raw: dict) -> None:
    splits = {k: None if v is None else SplitWatermark(*v) for k, v in raw.items()}
    wm = subtask_watermark(splits, now_ms=0)
    for s in splits.values():
        assert wm <= (MIN_WATERMARK if s is None else s.watermark)
    if not splits:
        assert wm == MIN_WATERMARK
        assert subtask_watermark(splits, now_ms=0, ended=True) == MAX_WATERMARK


def test_an_idle_split_stops_holding_its_subtask_back_only_with_an_idle_timeout() -> None:
    splits = {"busy": SplitWatermark(9_000, 100_000), "quiet": SplitWatermark(1_000, 10_000)}
    assert subtask_watermark(splits, now_ms=100_500) == 1_000
    assert subtask_watermark(splits, now_ms=100_500, idle_timeout_ms=60_000) == 9_000
    # every split idle: the minimum again (an idle subtask holds, it does not jump)
    assert subtask_watermark(splits, now_ms=10**9, idle_timeout_ms=60_000) == 1_000


@st.composite
def writer_histories(draw: st.DrawFn) -> tuple[int, list[WatermarkMark]]:
    """Per writer an increasing run of (checkpoint, watermark) marks, some checkpoints
    skipped (the writer fell back and committed nothing then)."""
    writers = draw(st.integers(1, 4))
    marks = []
    for w in range(writers):
        wm = draw(times)
        for c in range(1, draw(st.integers(0, 6)) + 1):
            if draw(st.booleans()):
                wm += draw(st.integers(0, 100))
                marks.append(WatermarkMark(c, w, wm))
    return writers, marks


@given(writer_histories(), st.integers(0, 8))
def test_a_reader_watermark_only_grows_with_its_cursor_and_holds_for_silent_writers(
    history: tuple[int, list[WatermarkMark]], stop: int
) -> None:
    writers, marks = history
    previous = MIN_WATERMARK
    for cursor in range(0, 8):  # the reader has consumed every checkpoint < cursor
        wm = reader_watermark(marks, writers, lambda m, c=cursor: m.checkpoint_id < c)
        assert wm >= previous
        previous = wm
        for w in range(writers):
            reached = [m.watermark for m in marks if m.writer == w and m.checkpoint_id < cursor]
            # never past what a writer committed before the cursor: its later records are safe
            assert wm <= max(reached, default=MIN_WATERMARK)


@given(times, st.integers(1, 10**6), st.integers(0, 10**6))
def test_tumbling_puts_every_record_in_the_one_aligned_window_holding_it(
    ts: int, size: int, offset: int
) -> None:
    (w,) = Tumbling(dt.timedelta(milliseconds=size), dt.timedelta(milliseconds=offset)).assign(ts)
    assert w.start <= ts < w.end and w.end - w.start == size
    assert (w.start - offset) % size == 0


@given(times, st.integers(1, 5000), st.integers(1, 5000))
def test_sliding_assigns_exactly_the_aligned_windows_holding_the_record(
    ts: int, a: int, b: int
) -> None:
    size, slide = max(a, b), min(a, b)
    got = Sliding(dt.timedelta(milliseconds=size), dt.timedelta(milliseconds=slide)).assign(ts)
    first = ts - ts % slide - size - slide
    want = [
        Window(s, s + size)
        for s in range(first - first % slide, ts + 1, slide)
        if s <= ts < s + size
    ]
    assert got == want


@given(times, st.integers(0, 5000), st.integers(0, 5000), st.integers(1, 5000))
def test_a_record_is_late_exactly_when_every_window_of_it_has_closed(
    ts: int, lateness: int, behind: int, size: int
) -> None:
    windows = Sliding(dt.timedelta(milliseconds=size * 2), dt.timedelta(milliseconds=size)).assign(
        ts
    )
    watermark = ts + behind
    late = is_late(windows, watermark, lateness)
    assert late == all(w.end + lateness <= watermark for w in windows)
    assert late == closed(max(windows, key=lambda w: w.end), watermark, lateness)


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 30)), max_size=20))
def test_merged_sessions_stay_disjoint_and_count_every_record(events: list) -> None:
    sessions: list = []
    for ts, gap in events:
        sessions = merge_sessions(sessions, (ts, ts + gap, 1), lambda a, b: a + b)
        for a, b in itertools.pairwise(sessions):
            assert a[1] < b[0]
    assert sum(s[2] for s in sessions) == len(events)
    for ts, gap in events:
        assert any(s[0] <= ts and ts + gap <= s[1] for s in sessions)


def test_wrapped_positions_round_trip_and_plain_ones_pass_through() -> None:
    for pos in (b"", b"12", b"\x00odd"):
        assert unwrap_position(wrap_position(pos, SplitWatermark(-3, 4))) == (
            pos,
            SplitWatermark(-3, 4),
        )
        assert unwrap_position(pos) == (pos, None)


def test_bad_times_and_spans_are_named() -> None:
    with pytest.raises(TypeError, match=r"the record's ts is '12:00' \(str\); it must be a"):
        to_millis("12:00", "the record's ts")
    with pytest.raises(ValueError, match=r"max_out_of_orderness='soon'; give a duration"):
        EventTime(lambda r: r, "soon")
    with pytest.raises(ValueError, match=r"Session\(gap\)=0; give a duration of more than 0"):
        Session(0)
    with pytest.raises(ValueError, match=r"the slide is longer than the size"):
        Sliding("1 s", "2 s")
    assert span_ms("250 ms", "x") == 250


def test_the_event_time_policy_table_reaches_the_tasks_and_keeps_old_fingerprints(
    tmp_path: Path,
) -> None:
    from regional.policy import Policy, load_policy, policy_fingerprint
    from regional.runtime.spark import event_time_env

    path = tmp_path / "policy.toml"
    path.write_text(
        '[event-time]\nidle-timeout = "30 s"\nwriter-fallback = "exclude"\nexclude-after = 2\n'
    )
    policy = load_policy(path, env={}).policy
    assert event_time_env(policy) == {"exclude_after": 2, "idle_timeout_ms": 30_000}
    assert event_time_env(Policy()) == {"exclude_after": None, "idle_timeout_ms": None}
    # the default [event-time] table leaves the fingerprint of a policy without it unchanged
    assert policy_fingerprint(Policy()) == (
        "ceffd579c084e027f8e13c65801c1eb27ff8a87b14cb1386aa680b785e9e3f36"
    )
    assert policy_fingerprint(policy) != policy_fingerprint(Policy())
    path.write_text('[event-time]\nwriter-fallback = "drop"\n')
    with pytest.raises(PolicyError, match=r'writer-fallback = "drop" is invalid; expected one of'):
        load_policy(path, env={})
