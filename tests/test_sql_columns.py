"""Stateful operators on columns (issue 44, §3): the schema every vertex of a SQL-style pipeline
produces, the refusals a user reads when the pipeline is built (exact text), and a property:
a windowed count or sum keyed and timed by columns gives exactly the record-wise window
operator's rows, as rows of its declared schema."""

from __future__ import annotations

import datetime as dt
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.watermarks import MAX_WATERMARK
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.epoch_time import EpochTime
from regional.dataflow.operators import WindowOp
from regional.dataflow.pipeline import Pipeline, Stream
from regional.dataflow.plan import compile_plan
from regional.dataflow.state import KEY_SCOPE, OperatorState
from regional.dataflow.window_operator import WindowSpec
from regional.dataflow.windows import (
    Sliding,
    Tumbling,
    count,
    count_distinct,
    max_of,
    mean_of,
    min_of,
    sum_of,
)
from regional.errors import GraphError
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

TS = pa.timestamp("us", "UTC")
ORDERS = pa.schema(
    [
        ("order_id", pa.int64()),
        ("user", pa.string()),
        ("country", pa.string()),
        ("amount", pa.int32()),
        ("price", pa.float32()),
        ("ts", TS),
    ]
)
PAYMENTS = pa.schema(
    [("order_id", pa.int64()), pa.field("amount", pa.float64(), nullable=False), ("ts", TS)]
)


def _order(split: int, n: int) -> dict[str, Any]:
    return {
        "order_id": n,
        "user": f"u{n % 3}",
        "country": "DE",
        "amount": n,
        "price": 1.5,
        "ts": dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=n),
    }


def _source(p: Pipeline, name: str, schema: pa.Schema, parallelism: int = 1) -> Stream:
    src = GeneratorSource(parallelism, _order, records_per_split=4)
    return p.source(src, name=name, schema=schema, event_time="ts", parallelism=parallelism)


def _error(build: Any) -> str:
    with pytest.raises(GraphError) as info:
        build()
    return str(info.value)


def test_windowed_aggregates_on_columns_have_exact_types() -> None:
    p = Pipeline("types")
    keyed = _source(p, "orders", ORDERS).key_by(["user", "country"])
    window = Tumbling("1 min")
    types = {
        agg.output_column: keyed.window(window, aggregate=agg).schema.field(-1).type  # type: ignore[union-attr]
        for agg in (
            count(),
            sum_of("amount"),
            sum_of("price"),
            mean_of("amount"),
            min_of("price"),
            max_of("amount"),
            count_distinct("order_id"),
        )
    }
    assert types == {
        "count": pa.int64(),
        "sum_amount": pa.int64(),
        "sum_price": pa.float64(),
        "mean_amount": pa.float64(),
        "min_price": pa.float32(),
        "max_amount": pa.int32(),
        "count_distinct_order_id": pa.int64(),
    }
    clicks = keyed.window(window, aggregate=count().alias("clicks"), name="w")
    assert clicks.schema == pa.schema(
        [
            ("user", pa.string()),
            ("country", pa.string()),
            pa.field("window_start", TS, nullable=False),
            pa.field("window_end", TS, nullable=False),
            pa.field("clicks", pa.int64(), nullable=False),
        ]
    )
    assert clicks.where("clicks > 1").select("user", "clicks").schema == pa.schema(
        [("user", pa.string()), pa.field("clicks", pa.int64(), nullable=False)]  # kept not null
    )


def test_every_vertex_of_a_sql_style_pipeline_has_its_schema_in_the_plan(tmp_path) -> None:
    p = Pipeline("plan")
    orders = _source(p, "orders", ORDERS, parallelism=2)
    payments = _source(p, "payments", PAYMENTS, parallelism=2)
    big = orders.where("amount > 0", name="big")
    keyed = big.key_by("user", partitions=2, name="by-user")
    dedup = big.drop_duplicates(["order_id"], within="1 min", name="dedup")
    running = keyed.aggregate(sum_of("amount"), name="running")
    joined = orders.interval_join(
        payments, on="order_id", between=("0 s", "5 min"), how="left", partitions=2, name="paid"
    )
    nested = orders.key_by("order_id").interval_join(
        payments.key_by("order_id"), between=(0, 60), how="outer", partitions=2, name="nested"
    )
    opaque = big.map(lambda r: r, name="opaque")
    declared = big.map(lambda r: r, name="declared", schema=ORDERS)
    both = big.union(declared, name="both")
    for s in (dedup, running, joined, nested, opaque, both):
        s.sink(ParquetSink(str(tmp_path / s.vertex_id)), name=f"{s.vertex_id}-out")
    plan = compile_plan(p).vertices
    assert plan["by-user"].schema == plan["dedup"].schema == plan["both"].schema == ORDERS
    assert plan["running"].schema == pa.schema(
        [("user", pa.string()), pa.field("sum_amount", pa.int64(), nullable=False)]
    )
    assert plan["paid"].schema == pa.schema(
        [
            ("order_id", pa.int64()),
            ("user", pa.string()),
            ("country", pa.string()),
            ("left_amount", pa.int32()),
            ("price", pa.float32()),
            ("left_ts", TS),
            ("right_amount", pa.float64(), True),
            ("right_ts", TS),
        ]
    )
    assert plan["nested"].schema == pa.schema(
        [("left", pa.struct(list(ORDERS))), ("right", pa.struct(list(PAYMENTS)))]
    )
    assert plan["opaque"].schema is None and plan["declared"].schema == ORDERS
    inner = orders.interval_join(payments, on="order_id", between=(0, 60), partitions=2)
    assert not inner.schema.field("right_amount").nullable  # type: ignore[union-attr]


def test_columns_that_do_not_line_up_are_refused_when_built_naming_both_schemas() -> None:
    p = Pipeline("refusals")
    orders = _source(p, "orders", ORDERS)
    payments = _source(p, "payments", PAYMENTS)
    assert _error(lambda: orders.key_by("usr")) == (
        "key_by after 'orders': unknown column 'usr'; did you mean 'user'? The columns are: "
        "order_id, user, country, amount, price, ts"
    )
    assert _error(lambda: orders.drop_duplicates(["id"], within="1 min", name="d")) == (
        "drop_duplicates 'd': unknown column 'id'; The columns are: order_id, user, country, "
        "amount, price, ts"
    )
    orders_text = (
        "order_id int64, user string, country string, amount int32, price float, ts "
        "timestamp[us, tz=UTC]"
    )
    payments_text = "order_id int64, amount double, ts timestamp[us, tz=UTC]"
    assert _error(lambda: orders.union(payments, name="u")) == (
        f"union 'u' of 'orders', 'payments': the streams have different schemas, 'orders': "
        f"{orders_text}; 'payments': {payments_text}; make them alike first, e.g. "
        ".select(...) with the same columns and CASTs on each"
    )
    assert _error(
        lambda: orders.interval_join(payments, on="user", between=(0, 5), partitions=1, name="j")
    ) == (
        "interval join 'j': on='user' is not a column of 'payments'; both sides need it "
        f"('orders': {orders_text}; 'payments': {payments_text})"
    )
    as_text = payments.select("CAST(order_id AS STRING) AS order_id", "ts", name="as-text")
    assert _error(
        lambda: orders.key_by("order_id").interval_join(
            as_text.key_by("order_id"), between=(0, 5), partitions=1, name="j"
        )
    ) == (
        "interval join 'j': the key column 'order_id' is int64 on the left and 'order_id' "
        "string on the right, so equal keys could not meet; cast one side, e.g. "
        '.with_columns(order_id="CAST(order_id AS BIGINT)") '
        f"(left: {orders_text}; right: order_id string, ts timestamp[us, tz=UTC])"
    )
    keyed = orders.key_by("user")
    assert _error(lambda: keyed.window(Tumbling("1 s"), aggregate=sum_of("country"))) == (
        "window '(unnamed)': sum_of('country') adds numbers, but column 'country' is string; "
        'cast it first, e.g. .with_columns(country="CAST(country AS DOUBLE)"), or '
        "aggregate another column"
    )
    assert _error(
        lambda: keyed.window(Tumbling("1 s"), aggregate=count(), event_time="country")
    ) == (
        "window '(unnamed)': event_time='country' is a string column; an event time is a "
        "timestamp, a date or an int of ms since the epoch: convert it first, e.g. "
        '.with_columns(country="to_timestamp(country)")'
    )
    assert _error(lambda: keyed.window(Tumbling("1 s"), aggregate=count().alias("user"))) == (
        "window '(unnamed)': the output would have the column 'user' twice; name the "
        "aggregate's column otherwise, e.g. count().alias('clicks')"
    )
    no_time = orders.select("order_id", name="no-time")
    assert _error(lambda: no_time.drop_duplicates(["order_id"], within="1 s", name="d")) == (
        "drop_duplicates 'd': event_time: unknown column 'ts'; The columns are: order_id"
    )
    # count_distinct(exact=False) is no longer refused: tests/test_aggregates_several.py


_KEYS = st.sampled_from(["a", "b", None])
_ROW = st.fixed_dictionaries(
    {"k": _KEYS, "ts": st.integers(0, 5_000), "v": st.one_of(st.none(), st.integers(-99, 99))}
)
COLUMNS = pa.schema([("k", pa.string()), ("ts", pa.int64()), ("v", pa.int64())])


def _window_rows(
    op: WindowOp, epochs: list[list[dict[str, Any]]], schema: pa.Schema | None
) -> list[Any]:
    """Every row `op` emits over `epochs` (each one chunk of split "p": an Arrow batch of
    `schema`, or the records when None; the watermark moving 1 s per epoch, then to the end),
    its state through its snapshot between epochs."""
    blob, rows, watermark = b"", [], 0
    for n, records in enumerate([*epochs, []]):
        state = OperatorState.from_bytes(blob, operator=op.name)
        end = MAX_WATERMARK if n == len(epochs) else watermark + 1_000
        data = records if schema is None else pa.RecordBatch.from_pylist(records, schema=schema)
        time = EpochTime(0, start={KEY_SCOPE: watermark}, end={KEY_SCOPE: end}, key_split="p")
        chunks = [("p", data)] if records else []
        out, _ = op.run(chunks, [watermark] * len(chunks), state, DeadLetters(n, {"p": "0"}), time)
        for _, batch in out:
            if op.output_schema is not None:
                assert batch.schema == op.output_schema
            rows += batch.to_pylist() if isinstance(batch, pa.RecordBatch) else batch
        blob, watermark = op.snapshot(state, ["p"]) or b"", end
    return rows


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(_ROW, max_size=8), min_size=1, max_size=4),
    st.sampled_from(["count", "sum", "distinct"]),
    st.sampled_from([Tumbling("1 s"), Sliding("2 s", "1 s")]),
)
def test_a_windowed_aggregate_by_column_equals_the_record_wise_window_operator(
    epochs: list[list[dict[str, Any]]], kind: str, assigner: Any
) -> None:
    agg = {"count": count(), "sum": sum_of("v"), "distinct": count_distinct("v")}[kind]
    p = Pipeline("property")
    stream = p.source(GeneratorSource(1, _order), name="s", schema=COLUMNS, event_time="ts")
    by_column = stream.key_by("k", partitions=1).window(assigner, aggregate=agg, name="w")
    column_op = p.vertices[by_column.vertex_id].operator
    assert isinstance(column_op, WindowOp)
    spec = WindowSpec(assigner, agg, time_of=lambda r: r["ts"])
    record_op = WindowOp(spec, lambda r: r["k"], name="w", scope="key")
    want = [
        {
            "k": r["key"],
            "window_start": r["window_start"],
            "window_end": r["window_end"],
            agg.output_column: r["value"],
        }
        for r in _window_rows(record_op, epochs, None)
    ]
    assert _window_rows(column_op, epochs, COLUMNS) == want


def test_count_distinct_counts_each_value_once_per_window_across_epochs() -> None:
    p = Pipeline("distinct")
    stream = p.source(GeneratorSource(1, _order), name="s", schema=COLUMNS, event_time="ts")
    agg = count_distinct("v").alias("values")
    window = stream.key_by("k", partitions=1).window(Tumbling("10 s"), aggregate=agg, name="w")
    op = p.vertices[window.vertex_id].operator
    assert isinstance(op, WindowOp)
    epochs = [
        [{"k": "a", "ts": 1, "v": 1}, {"k": "a", "ts": 2, "v": None}],
        [{"k": "a", "ts": 3, "v": 1}, {"k": "a", "ts": 4, "v": 2}],
    ]
    assert [r["values"] for r in _window_rows(op, epochs, COLUMNS)] == [2]


def test_regional_regions_shows_the_schema_of_exchanges_and_windows(tmp_path, capsys) -> None:
    from regional.cli import main

    job = tmp_path / "job.py"
    job.write_text(
        "import pyarrow as pa\n"
        "from regional import GeneratorSource, ParquetSink, Pipeline\n"
        "from regional.dataflow.windows import Tumbling, count\n"
        "pipeline = Pipeline('cli')\n"
        "rows = lambda s, n: {'user': str(n % 3), 'ts': n}\n"
        "clicks = pipeline.source(GeneratorSource(2, rows), name='clicks', event_time='ts',\n"
        "                         schema=pa.schema([('user', pa.string()), ('ts', pa.int64())]))\n"
        "clicks.key_by('user', partitions=2, name='by-user').window(\n"
        "    Tumbling('1 s'), aggregate=count(), name='w').sink(\n"
        f"    ParquetSink({str(tmp_path / 'out')!r}), name='out')\n"
    )
    assert main(["regions", str(job)]) == 0
    out = capsys.readouterr().out
    assert "schema of by-user: user string, ts int64\n" in out
    assert (
        "schema of w: user string, window_start timestamp[us, tz=UTC], window_end "
        "timestamp[us, tz=UTC], count int64\n"
    ) in out


_ROW2 = st.fixed_dictionaries(
    {
        "k": _KEYS,
        "k2": st.sampled_from([1, 2, None]),
        "ts": st.integers(0, 5_000),
        "v": st.one_of(st.none(), st.integers(-99, 99), st.sampled_from([0.1, 0.2, 0.3])),
    }
)
COLUMNS2 = pa.schema([("k", pa.string()), ("k2", pa.int64()), ("ts", pa.int64()),
                      ("v", pa.float64())])  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.lists(_ROW2, max_size=8), min_size=1, max_size=4),
    st.sampled_from(["count", "sum", "mean", "max"]),
)
def test_a_window_keyed_by_two_columns_folds_columns_as_the_record_wise_path_adds_records(
    epochs: list[list[dict[str, Any]]], kind: str
) -> None:
    from regional.dataflow.keys import FieldsKey

    agg = {"count": count(), "sum": sum_of("v"), "mean": mean_of("v"), "max": max_of("v")}[kind]
    rows = [[{**r, "v": None if r["v"] is None else float(r["v"])} for r in e] for e in epochs]
    spec = WindowSpec(Sliding("2 s", "1 s"), agg, time_of=lambda r: r["ts"], time_field="ts")
    by_columns = WindowOp(spec, FieldsKey(["k", "k2"]), name="w", scope="key")
    record_spec = WindowSpec(Sliding("2 s", "1 s"), agg, time_of=lambda r: r["ts"])
    record_wise = WindowOp(record_spec, lambda r: (r["k"], r["k2"]), name="w", scope="key")
    got = _window_rows(by_columns, rows, COLUMNS2)
    assert repr(got) == repr(_window_rows(record_wise, rows, None))


def _running_rows(op: Any, epochs: list[list[dict[str, Any]]], schema: pa.Schema | None) -> str:
    """The rows a running aggregate emits over `epochs` (Arrow batches of `schema`, or the
    records), its state through its snapshot between epochs (their repr: floats bit for bit)."""
    blob, rows = b"", []
    for n, records in enumerate(epochs):
        state = OperatorState.from_bytes(blob, operator=op.name)
        data = records if schema is None else pa.RecordBatch.from_pylist(records, schema=schema)
        out, _ = op.run([("p", data)] if records else [], None, state, DeadLetters(n, {}), None)
        rows += [r for _, batch in out for r in batch]
        blob = op.snapshot(state, ["p"]) or b""
    return repr(rows)


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(_ROW2, max_size=8), min_size=1, max_size=4),
    st.sampled_from(["count", "sum", "min"]),
)
def test_a_running_aggregate_keyed_by_two_columns_folds_as_the_record_wise_path_adds(
    epochs: list[list[dict[str, Any]]], kind: str
) -> None:
    from regional.dataflow.keys import FieldsKey
    from regional.dataflow.running_aggregate import RunningAggregate

    agg = {"count": count(), "sum": sum_of("v"), "min": min_of("v")}[kind]
    rows = [[{**r, "v": None if r["v"] is None else float(r["v"])} for r in e] for e in epochs]
    by_columns = RunningAggregate(agg, FieldsKey(["k", "k2"]), name="a")
    assert by_columns.key_column == ("k", "k2")
    record_wise = RunningAggregate(agg, lambda r: (r["k"], r["k2"]), name="a")
    assert _running_rows(by_columns, rows, COLUMNS2) == _running_rows(record_wise, rows, None)


def test_select_keeps_a_not_null_column_not_null_and_makes_expressions_nullable() -> None:
    """A column (or struct field) referenced as it is keeps its not-null flag through
    `select`, `with_columns`, `sql` and `where`, so a window keyed or timed by it after a
    select still says so; an expression may be null (a literal only when it is NULL)."""
    value = pa.struct([pa.field("id", pa.int64(), nullable=False), ("amount", pa.float64())])
    schema = pa.schema(
        [
            pa.field("order_id", pa.int64(), nullable=False),
            ("user", pa.string()),
            pa.field("value", value, nullable=False),
            ("maybe", value),
        ]
    )
    p = Pipeline("not-null")
    stream = p.source(GeneratorSource(1, lambda s, n: {}), name="s", schema=schema)
    selected = stream.select(
        "order_id", "order_id AS id", "user", "value.id AS vid", "maybe.id AS mid",
        "value.amount AS amount", "order_id + 1 AS next", "CAST(order_id AS STRING) AS text",
        "1 AS one", "NULL AS nothing", name="sel",
    )  # fmt: skip
    assert selected.schema is not None
    assert {f.name: f.nullable for f in selected.schema} == {
        "order_id": False,
        "id": False,
        "user": True,
        "vid": False,
        "mid": True,  # the struct may be null
        "amount": True,
        "next": True,
        "text": True,
        "one": False,
        "nothing": True,
    }
    starred = stream.with_columns(twice="order_id * 2", name="wc").where("user IS NOT NULL")
    assert starred.schema is not None and starred.schema.field("order_id").nullable is False
    queried = stream.sql("SELECT order_id FROM input WHERE user = 'a'", name="q")
    assert queried.schema == pa.schema([pa.field("order_id", pa.int64(), nullable=False)])
    op = p.vertices[selected.vertex_id].operator
    batch = pa.RecordBatch.from_pylist(
        [{"order_id": 1, "user": None, "value": {"id": 7, "amount": None}, "maybe": None}],
        schema=schema,
    )
    out, _ = op.run([("p", batch)], None, None, None, None)
    assert out[0][1].schema == selected.schema
    assert out[0][1].to_pylist()[0]["vid"] == 7
