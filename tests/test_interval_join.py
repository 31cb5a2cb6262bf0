"""The interval join (`regional.dataflow.joins`, DESIGN §4 rule 17): the pure operator against a
brute-force join over random epochs and watermarks; jobs in this process that equal the batch
join minus exactly the dead-lettered late records, row for row under unit faults on either
side, a driver crash at every crash point, and a rescale of the join; the errors."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import orders_job
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from metadata.watermarks import MAX_WATERMARK, MIN_WATERMARK
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.joins import IntervalJoin, IntervalJoinSpec
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.errors import GraphError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import CRASH_STEPS, DriverCrash, Faults
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

HOWS = ("inner", "left", "right", "outer")


# --- the operator alone --------------------------------------------------------------------


def _brute(
    lefts: list[tuple[int, int, int]],
    rights: list[tuple[int, int, int]],
    lo: int,
    hi: int,
    how: str,
) -> Counter[tuple[Any, Any]]:
    """Every joined row of a batch interval join over (key, ts, id) rows."""
    out: Counter[tuple[Any, Any]] = Counter()
    matched_l, matched_r = set(), set()
    for lk, lt, li in lefts:
        for rk, rt, ri in rights:
            if lk == rk and lt + lo <= rt <= lt + hi:
                out[li, ri] += 1
                matched_l.add(li)
                matched_r.add(ri)
    if how in ("left", "outer"):
        out.update((li, None) for _, _, li in lefts if li not in matched_l)
    if how in ("right", "outer"):
        out.update((None, ri) for _, _, ri in rights if ri not in matched_r)
    return out


_rows = st.lists(st.tuples(st.integers(0, 2), st.integers(0, 60)), max_size=6)


@settings(max_examples=300, deadline=None)
@given(
    epochs=st.lists(st.tuples(_rows, _rows, st.integers(0, 25)), min_size=1, max_size=6),
    bounds=st.tuples(st.integers(-10, 10), st.integers(0, 15)),
    how=st.sampled_from(HOWS),
)
def test_the_operator_emits_the_batch_join_of_the_records_that_were_not_late(
    epochs: list[Any], bounds: tuple[int, int], how: str
) -> None:
    """Random rows cut into random epochs, a watermark that grows by random steps: the rows
    emitted (state snapshotted and restored between epochs) are the batch join of the records
    that were not late, every one once, and the state is empty at the end of the input."""
    lo, hi = min(bounds), max(bounds)
    op = IntervalJoin(
        IntervalJoinSpec(
            between=(lo, hi), how=how, emit=lambda a, b: (a and a["id"], b and b["id"])
        ),
        (lambda r: r["k"], lambda r: r["k"]),
        (lambda r: r["ts"], lambda r: r["ts"]),
        name="j",
    )
    blob = OperatorState(operator="j").to_bytes()
    watermark, emitted, kept_l, kept_r = MIN_WATERMARK, Counter(), [], []
    ids = iter(range(10**6))
    plan = [*epochs, ([], [], None)]  # the end of the input: the watermark goes to +inf
    for left, right, step in plan:
        end = (
            MAX_WATERMARK
            if step is None
            else (0 if watermark == MIN_WATERMARK else watermark) + step
        )
        lrows = [{"k": k, "ts": ts, "id": next(ids)} for k, ts in left]
        rrows = [{"k": k, "ts": ts, "id": next(ids)} for k, ts in right]
        kept_l += [(r["k"], r["ts"], r["id"]) for r in lrows if r["ts"] >= watermark]
        kept_r += [(r["k"], r["ts"], r["id"]) for r in rrows if r["ts"] >= watermark]
        state = OperatorState.from_bytes(blob, operator="j", source="test")
        time = EpochTime(0, start={KEY_SCOPE: watermark}, end={KEY_SCOPE: end}, key_split="p0")
        inputs = [([("a", lrows)], [watermark]), ([("b", rrows)], [watermark])]
        out, _ = op.run_inputs(inputs, state, None, time)
        emitted.update(row for _, rows in out for row in rows)
        blob = state.to_bytes()
        watermark = end
    assert emitted == _brute(kept_l, kept_r, lo, hi, how)
    final = OperatorState.from_bytes(blob, operator="j", source="test")
    assert KEY_SCOPE not in final.keyed  # every row left


def test_a_late_record_is_counted_and_dead_lettered_naming_the_join_and_its_side() -> None:
    from regional.dataflow.dead_letters import DeadLetters

    op = IntervalJoin(
        IntervalJoinSpec(between=(0, 10)),
        (lambda r: r["k"], lambda r: r["k"]),
        (lambda r: r["ts"], lambda r: r["ts"]),
        on_late="dead-letter",
        name="paid",
    )
    dead = DeadLetters(3, {"p0": "0"})
    time = EpochTime(0, start={KEY_SCOPE: 100}, end={KEY_SCOPE: 100}, key_split="p0")
    inputs = [([("p0", [{"k": 1, "ts": 99}])], [100]), ([("p0", [])], [100])]
    out, _ = op.run_inputs(inputs, OperatorState(operator="paid"), dead, time)
    assert out == [] and time.late == 1
    [row] = dead.batch(("paid",)).to_pylist()
    assert row["error_type"] == "LateRecord" and row["operator"] == "paid"
    assert row["error_message"] == (
        "interval join 'paid': the left record's event time 1970-01-01T00:00:00.099Z is "
        "behind its watermark 1970-01-01T00:00:00.100Z, so rows it would match may have left "
        "the join's state; raise max_out_of_orderness of the source to keep such records"
    )


# --- jobs in this process ------------------------------------------------------------------

SPLITS, PER_SPLIT, PER_EPOCH, KEYS = 3, 40, 8, 7


def order(split: int, n: int) -> dict[str, Any]:
    """Order n of split `split`, about one per second, up to 2 s out of order; every 17th is
    9 s behind (late, when its split's watermark is ahead already)."""
    ts = 100_000 + n * 1_000 + split * 300 - (n * 7919 % 3) * 1_000
    if n % 17 == 16:
        ts -= 9_000
    return {"id": f"o{split}-{n}", "k": (n * 5 + split) % KEYS, "ts": ts}


def payment(split: int, n: int) -> dict[str, Any]:
    """Payment n of split `split`: key and time drawn so some match an order within 0..5 s."""
    ts = 100_000 + n * 1_100 + split * 500 - (n * 31 % 3) * 1_000
    if n % 19 == 18:
        ts -= 9_000
    return {"id": f"p{split}-{n}", "k": (n * 3 + split) % KEYS, "ts": ts}


def pair(left: Any, right: Any) -> dict[str, Any]:
    return {"order": left and left["id"], "payment": right and right["id"]}


def join_pipeline(table: str, dead: str, *, how: str, partitions: int = 3) -> Pipeline:
    """orders (3 subtasks) and payments (3) -> exchanges by k -> interval join 0..5 s."""
    p = Pipeline(
        "paid", records_per_epoch=PER_EPOCH, on_error="dead-letter", dead_letter=ParquetSink(dead)
    )
    orders, payments = (
        p.source(
            GeneratorSource(SPLITS, fn, records_per_split=PER_SPLIT),
            parallelism=SPLITS,
            name=name,
            event_time="ts",
            max_out_of_orderness="2 s",
        )
        for name, fn in (("orders", order), ("payments", payment))
    )
    orders.key_by("k").interval_join(
        payments.key_by("k"),
        between=("0 s", "5 s"),
        how=how,
        emit=pair,
        partitions=partitions,
        on_late="dead-letter",
        name="join",
    ).sink(ParquetSink(table), name="out")
    return p


def _driver(tmp_path: Path, how: str, faults: Faults | None = None, **kw: Any) -> JobDriver:
    p = join_pipeline(str(tmp_path / "table"), str(tmp_path / "dead"), how=how, **kw)
    root = str(tmp_path / "ckpt")
    overrides = {"checkpointing": {"timeout": "30 s", "region": {"max-failure-ratio": 0.5}}}
    policy = load_policy(env={}, overrides=overrides).policy
    faults = faults or Faults()
    env = TaskEnv(root, "paid", p, unit_timeout=30, faults=faults.unit_faults())
    return JobDriver(
        p,
        orders_job.InProcessDispatcher(env),
        storage=JobStorage(root, "paid"),
        policy=policy,
        faults=faults,
    )


def _rows(tmp_path: Path) -> Counter[tuple[Any, Any]]:
    return Counter(
        (r["order"], r["payment"]) for r in read_table(str(tmp_path / "table")).to_pylist()
    )


def _late(tmp_path: Path) -> set[str]:
    rows = read_table(str(tmp_path / "dead")).to_pylist()
    assert all(r["error_type"] == "LateRecord" and r["operator"] == "join" for r in rows)
    return {json.loads(r["record"])["id"] for r in rows}


def _batch_join(how: str, late: set[str]) -> Counter[tuple[Any, Any]]:
    orders = [order(s, n) for s in range(SPLITS) for n in range(PER_SPLIT)]
    payments = [payment(s, n) for s in range(SPLITS) for n in range(PER_SPLIT)]
    number = {r["id"]: i for i, r in enumerate(orders + payments)}
    lefts = [(r["k"], r["ts"], number[r["id"]]) for r in orders if r["id"] not in late]
    rights = [(r["k"], r["ts"], number[r["id"]]) for r in payments if r["id"] not in late]
    names = {i: r for r, i in number.items()}
    return Counter(
        {
            (names.get(a), names.get(b)): n
            for (a, b), n in _brute(lefts, rights, 0, 5_000, how).items()
        }
    )


@pytest.mark.parametrize("how", HOWS)
def test_the_join_equals_a_batch_join_without_exactly_the_dead_lettered_records(
    tmp_path: Path, how: str
) -> None:
    assert _driver(tmp_path, how).run().finished
    late = _late(tmp_path)
    assert late  # the job has late records on both sides, and they are the only ones missing
    assert {i[0] for i in late} == {"o", "p"}
    rows = _rows(tmp_path)
    assert rows == _batch_join(how, late)
    assert max(rows.values()) == 1


def test_a_dead_letter_names_the_position_its_own_side_read_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # both exchange readers of a join unit read a split named n3-p<q>: each dead letter's
    # split_position must be where its own side's reader started, so that reading that side
    # from there finds the record at record_index (it showed the other side's position)
    from regional.dataflow.exchange import ExchangeReader
    from regional.dataflow.operators import records_of

    reads: dict[tuple[str, str, str], list[Any]] = {}
    read_timed = ExchangeReader.read_timed

    def spy(self: ExchangeReader, split: str, position: bytes, n: int) -> Any:
        got = read_timed(self, split, position, n)
        rows = [r for b in got[0].batches for r in records_of(b)]
        reads.setdefault((self.reader, split, position.decode()), rows)
        return got

    monkeypatch.setattr(ExchangeReader, "read_timed", spy)
    driver = _driver(tmp_path, "inner")
    assert driver.run().finished
    left, right = driver.pipeline.vertices["join"].inputs
    readers = {
        side: driver.pipeline.vertices[v].source.reader  # type: ignore[union-attr]
        for side, v in (("o", left), ("p", right))
    }
    rows = read_table(str(tmp_path / "dead")).to_pylist()
    assert {json.loads(r["record"])["id"][0] for r in rows} == {"o", "p"}
    for r in rows:
        record = json.loads(r["record"])
        read = reads[readers[record["id"][0]], r["split_id"], r["split_position"]]
        assert read[r["record_index"]] == record


#: units 0-2 orders, 3-5 payments (upstream, each side on its own), 6-8 the join
UNIT_FAULTS = {(2, 1): "fail", (3, 1): "fail", (3, 4): "fail", (4, 7): "fail", (6, 8): "fail"}


@pytest.mark.parametrize("step", CRASH_STEPS)
def test_faults_on_each_side_and_a_crash_give_the_fault_free_rows(
    tmp_path: Path, step: str
) -> None:
    assert _driver(tmp_path / "clean", "outer").run().finished
    first = _driver(tmp_path, "outer", Faults(units=UNIT_FAULTS, crash_at=(6, step)))
    with pytest.raises(DriverCrash):
        first.run()
    summary = _driver(tmp_path, "outer").run()
    assert summary.finished and summary.restored_from is not None
    assert _rows(tmp_path) == _rows(tmp_path / "clean")
    assert _late(tmp_path) == _late(tmp_path / "clean")


def test_a_failing_orders_partition_leaves_the_payments_side_committing(tmp_path: Path) -> None:
    """Orders unit 1 fails checkpoints 2-6: meanwhile every payments unit commits fresh state
    every checkpoint (their exchange segments commit), the join keeps committing rows of the
    data it has, and the result is still exact."""
    faults = Faults(units={(c, 1): "fail" for c in range(2, 7)})
    driver = _driver(tmp_path, "inner", faults)
    committed: dict[int, int] = {}

    def progress(event: Any) -> None:
        committed[event.checkpoint_id] = read_table(str(tmp_path / "table")).num_rows

    driver.progress = progress
    summary = driver.run()
    assert summary.finished
    for event in summary.checkpoints[1:6]:
        assert event.kind == "regional" and event.fallback_units == (1,), event
    assert committed[6] > committed[2] > 0  # joined rows committed while unit 1 fails
    assert _rows(tmp_path) == _batch_join("inner", _late(tmp_path))


def test_a_rescaled_join_gives_the_fault_free_rows(tmp_path: Path) -> None:
    """3 join subtasks for three checkpoints, then 2, then 4: the rows, and the late records,
    equal the fault-free run at 3 (waiting rows move with their key)."""
    assert _driver(tmp_path / "clean", "outer").run().finished
    for partitions in (3, 2):
        assert not _driver(tmp_path, "outer", partitions=partitions).run(max_checkpoints=3).finished
    summary = _driver(tmp_path, "outer", partitions=4).run()
    assert summary.finished and summary.restored_from is not None
    assert _rows(tmp_path) == _rows(tmp_path / "clean")
    assert _late(tmp_path) == _late(tmp_path / "clean")


def test_errors_name_the_join_and_the_fix() -> None:
    p = Pipeline("bad")
    a = p.source(GeneratorSource(1, order, records_per_split=3), name="a", event_time="ts")
    b = p.source(GeneratorSource(1, payment, records_per_split=3), name="b", event_time="ts")
    cases = [
        (dict(between=("0 s", "5 s"), how="cross"),
         "interval join 'j': how='cross'; use one of 'inner', 'left', 'right', 'outer'"),
        (dict(between=("5 s", "0 s")),
         "interval join 'j': between=('5 s', '0 s') has its lower bound above its upper one; "
         "give (lower, upper) with lower <= upper"),
        (dict(between="5 s"),
         "interval join 'j': between='5 s'; give (lower, upper), e.g. ('0 s', '15 min')"),
        (dict(between=("0 s", "400 d")),
         "interval join 'j': upper bound='400 d'; give a duration of at most 365 days either "
         'way: "-5 min", "0 s", "15 min", a datetime.timedelta or a number of seconds'),
        (dict(between=("0 s", "5 s"), on_late="dead-letter"),
         "interval join 'j': on_late='dead-letter' writes late records to the pipeline's "
         "dead-letter sink; build the pipeline with on_error='dead-letter', "
         "dead_letter=<a sink>"),
    ]  # fmt: skip
    for kw, message in cases:
        with pytest.raises(GraphError) as info:
            a.key_by("k").interval_join(b.key_by("k"), partitions=2, name="j", **kw)
        assert str(info.value) == message
    c = p.source(GeneratorSource(1, payment, records_per_split=3), name="c")
    with pytest.raises(GraphError, match="no source upstream reads with event time"):
        a.key_by("k").interval_join(c.key_by("k"), between=(0, 5), partitions=2, name="j2")


def test_negative_lower_bounds_join_records_before_the_left_one() -> None:
    spec = IntervalJoinSpec(between=(-5, 0))
    slot: dict[str, Any] = {}
    assert spec.match(slot, left=[(10, "l")], right=[(4, "a"), (5, "b"), (10, "c"), (11, "d")]) == [
        ("l", "b"),
        ("l", "c"),
    ]
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(slot)) == slot


def test_a_join_on_a_stream_that_is_not_keyed_says_to_key_it_first() -> None:
    from regional.dataflow.pipeline import KeyedOnlyError

    p = Pipeline("unkeyed")
    a = p.source(GeneratorSource(1, order, records_per_split=3), name="a", event_time="ts")
    b = p.source(GeneratorSource(1, payment, records_per_split=3), name="b", event_time="ts")
    with pytest.raises(KeyedOnlyError) as info:
        a.interval_join(b.key_by("k"), between=(0, 5))  # type: ignore[attr-defined]
    assert str(info.value) == (
        "interval_join(...) after 'a': interval_join works on keyed records; key the stream "
        "first, e.g. .key_by(lambda r: r['user']).interval_join(...)"
    )
