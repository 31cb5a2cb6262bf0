"""Schemas and the Spark SQL expression stages (`where`, `select`, `with_columns`, `sql`):
the errors a user reads when the pipeline is built, schema misfits as exactly the dead letters,
run-time failures under `on_error`, and one job end to end through the in-process runtime with
a unit fault (no Spark here: tests/test_sql_stages_spark.py compares with Spark SQL)."""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import duckdb
import msgspec
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from regional.dataflow.dead_letters import DeadLetters
from regional.dataflow.expressions import ExpressionError
from regional.dataflow.pipeline import Pipeline
from regional.dataflow.plan import compile_plan
from regional.dataflow.schema import fit, schema_of
from regional.dataflow.sql_stages import ExpressionFailed
from regional.errors import GraphError
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.faults import DriverCrash, Faults
from regional.runtime.local import InProcessDispatcher
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

ORDERS = pa.schema(
    [
        pa.field("id", pa.int64(), nullable=False),
        ("user", pa.string()),
        ("amount", pa.float64()),
        ("country", pa.string()),
    ]
)


def _order(split: int, n: int) -> dict[str, Any]:
    return {
        "id": split * 1000 + n,
        "user": f"u{n % 7}",
        "amount": float((n * 37) % 50 - 10),
        "country": ("DE", "FR", "IT")[n % 3],
    }


def _stream(p: Pipeline | None = None, **kw: Any) -> Any:
    p = p or Pipeline("sql")
    return p.source(GeneratorSource(2, _order, records_per_split=10), name="orders", **kw)


# -- errors when the pipeline is built ---------------------------------------------------------


def _error(build: Any) -> str:
    with pytest.raises(GraphError) as caught:
        build()
    return str(caught.value)


def test_an_unknown_column_names_the_stage_the_column_and_the_columns():
    orders = _stream(schema=ORDERS)
    assert _error(lambda: orders.where("amout > 0", name="big")) == (
        "stage 'big': unknown column 'amout' in 'amout > 0'; did you mean 'amount'? The "
        "columns are: id, user, amount, country"
    )
    assert _error(lambda: orders.select("zzz", name="s")) == (
        "stage 's': unknown column 'zzz' in 'zzz'; The columns are: id, user, amount, country"
    )


def test_a_type_error_names_the_expression_and_the_types():
    orders = _stream(schema=ORDERS)
    assert _error(lambda: orders.select("amount + user AS x", name="s")) == (
        "stage 's': 'amount + user AS x': + cannot take double and string; CAST an operand "
        "to the type you mean"
    )
    assert _error(lambda: orders.where("amount", name="w")) == (
        "stage 'w': 'amount' is double, not a condition (boolean); compare it, e.g. x > 0"
    )


def test_an_unsupported_construct_is_named():
    orders = _stream(schema=ORDERS)
    message = _error(lambda: orders.select("regexp_replace(user, 'u', 'v')", name="s"))
    assert message.startswith(
        "stage 's': the function \"REGEXP_REPLACE(user, 'u', 'v')\" in "
        "\"regexp_replace(user, 'u', 'v')\" is not supported in a SQL stage"
    )
    assert _error(lambda: orders.sql("SELECT user FROM other", name="q")) == (
        "stage 'q': sql() reads the stream as the table input (SELECT ... FROM input); "
        "'SELECT user FROM other' reads other"
    )


@pytest.mark.parametrize(
    ("query", "construct", "instead"),
    [
        ("SELECT user, count(*) FROM input GROUP BY user", "GROUP BY", "aggregate("),
        ("SELECT * FROM input ORDER BY amount", "ORDER BY", "process("),
        ("SELECT * FROM input LIMIT 3", "LIMIT", "process("),
        ("SELECT sum(amount) AS s FROM input", "the aggregate 'SUM(amount)'", "aggregate("),
        ("SELECT rank() OVER (ORDER BY amount) AS r FROM input", "the window function", "window("),
        ("SELECT * FROM input WHERE rand() < 0.5", "non-deterministic 'RAND()'", "event time"),
        ("SELECT now() AS t FROM input", "non-deterministic 'NOW()'", "event time"),
        ("SELECT current_timestamp() AS t FROM input", "non-deterministic", "event time"),
        ("SELECT uuid() AS u FROM input", "non-deterministic 'UUID()'", "event time"),
    ],
)
def test_sql_whose_result_depends_on_epochs_or_time_is_refused(query, construct, instead):
    orders = _stream(schema=ORDERS)
    message = _error(lambda: orders.sql(query, name="q"))
    assert message.startswith(f"stage 'q': {query!r} is refused: ")
    assert construct in message and instead in message and "determinism rule" in message


def test_a_stream_without_schema_refuses_sql_stages_and_says_how_to_declare_one():
    orders = _stream()
    assert orders.schema is None
    assert "declare it at the source, p.source(src, schema=" in _error(
        lambda: orders.where("amount > 0")
    )
    assert "orders" not in str(_stream(schema=ORDERS).map(lambda r: r).schema)


# -- schemas --------------------------------------------------------------------------------


@dataclasses.dataclass
class Order:
    id: int
    amount: float
    note: str | None = None


class OrderStruct(msgspec.Struct):
    id: int
    amount: float
    note: str | None = None


def test_a_schema_is_derived_from_a_dataclass_or_a_struct_alike():
    expected = pa.schema(
        [
            pa.field("id", pa.int64(), nullable=False),
            pa.field("amount", pa.float64(), nullable=False),
            pa.field("note", pa.string()),
        ]
    )
    assert schema_of(Order) == expected == schema_of(OrderStruct)
    assert _error(lambda: _stream(schema=int)) == (
        "source 'orders': schema=<class 'int'>: give a pyarrow.Schema, a msgspec Struct class "
        "or a dataclass"
    )


def test_stage_schemas_are_computed_when_built_and_carried_by_the_plan(tmp_path):
    p = Pipeline("sql")
    orders = _stream(p, schema=ORDERS)
    out = (
        orders.where("amount > 0 AND country IN ('DE','FR')", name="big")
        .select("user", "amount * 1.19 AS gross", "upper(country) AS c", name="gross")
        .with_columns(cents="CAST(gross * 100 AS BIGINT)", name="cents")
    )
    out.sink(ParquetSink(str(tmp_path / "out")), name="out")
    plan = compile_plan(p)
    assert plan.vertices["orders"].schema == ORDERS
    assert plan.vertices["big"].schema == ORDERS
    assert (
        plan.vertices["cents"].schema
        == out.schema
        == pa.schema(
            [
                ("user", pa.string()),
                ("gross", pa.float64()),
                ("c", pa.string()),
                ("cents", pa.int64()),
            ]
        )
    )
    assert plan.vertices["out"].schema is None


ROW_VALUES = st.one_of(
    st.none(),
    st.integers(-(2**62), 2**62),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=3),
    st.booleans(),
)
FIELD_TYPES = st.sampled_from([pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.bool_()])


def _fits(value: Any, field: pa.Field) -> bool:
    """The rule of `regional.dataflow.schema`, written out per value."""
    if value is None:
        return field.nullable
    t = field.type
    if pa.types.is_boolean(t):
        return isinstance(value, bool)
    if pa.types.is_string(t):
        return isinstance(value, str)
    if isinstance(value, bool | str):
        return False
    if pa.types.is_integer(t):
        bits = t.bit_width
        return float(value).is_integer() and -(2 ** (bits - 1)) <= value < 2 ** (bits - 1)
    return isinstance(value, float) or abs(value) <= 2**53  # a double holds it exactly


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(FIELD_TYPES, st.booleans()), min_size=1, max_size=3),
    st.data(),
)
def test_records_that_misfit_a_random_schema_are_exactly_the_misfits(fields, data):
    schema = pa.schema(
        [pa.field(f"f{i}", t, nullable=nullable) for i, (t, nullable) in enumerate(fields)]
    )
    records = data.draw(
        st.lists(
            st.fixed_dictionaries(
                {},
                optional={f.name: ROW_VALUES for f in schema} | {"extra": ROW_VALUES},
            ),
            max_size=6,
        )
    )
    batch, misfits = fit(records, schema)
    expected_bad = [
        i for i, r in enumerate(records) if not all(_fits(r.get(f.name), f) for f in schema)
    ]
    assert [m.at for m in misfits] == expected_bad
    assert [m.record for m in misfits] == [records[i] for i in expected_bad]
    assert batch.schema == schema
    good = [r for i, r in enumerate(records) if i not in expected_bad]
    assert batch.to_pylist() == [{f.name: r.get(f.name) for f in schema} for r in good]
    for m in misfits:
        assert str(m.error).startswith("field 'f") and "expected" in str(m.error)


def test_a_misfit_names_the_field_and_both_types():
    _, misfits = fit(
        [{"id": 1, "amount": "12.5"}, {"amount": 2.0}, {"id": 2**40, "amount": 1.0}],
        schema_of(Order),
    )
    assert [str(m.error) for m in misfits] == [
        "field 'amount': expected double, found string ('12.5')",
        "field 'id': expected int64 (required), found no value (null or missing)",
    ]


def test_a_parquet_source_infers_its_schema_from_its_first_file(tmp_path):
    import pyarrow.parquet as pq

    from regional.sources.files import FileSource

    (tmp_path / "in").mkdir()
    pq.write_table(pa.table({"id": [1, 2], "v": [0.5, 1.5]}), tmp_path / "in" / "a.parquet")
    p = Pipeline("infer")
    src = p.source(FileSource(str(tmp_path / "in")), name="files", schema="infer")
    assert src.schema == pa.schema([("id", pa.int64()), ("v", pa.float64())])
    assert src.where("v > 1").schema == src.schema
    empty = FileSource(str(tmp_path / "none"))
    assert _error(lambda: p.source(empty, name="empty", schema="infer")).startswith(
        "source 'empty': schema='infer' takes the schema of the first file of a "
        "FileSource(format='parquet') that has one"
    )


# -- run time ---------------------------------------------------------------------------------


def _run(stage: Any, batch: pa.RecordBatch, dead: DeadLetters | None) -> list[dict]:
    op = compile_plan(stage.pipeline).vertices[stage.vertex_id].operator
    out, _ = op.run([("s0", batch)], None, None, dead, None)
    return [r for _, b in out for r in b.to_pylist()]


def test_a_row_an_expression_fails_on_is_a_dead_letter_and_the_rest_go_on():
    schema = pa.schema([("n", pa.string())])
    p = Pipeline("sql")
    stage = p.source(GeneratorSource(1, lambda s, n: {}), schema=schema).select(
        "CAST(n AS INT) AS n", "try_cast(n AS INT) AS t", name="parse"
    )
    batch = pa.RecordBatch.from_pydict({"n": ["1", "x", "3"]}, schema=schema)
    dead = DeadLetters(4, {"s0": "0"})
    assert _run(stage, batch, dead) == [{"n": 1, "t": 1}, {"n": 3, "t": 3}]
    [row] = dead.rows(("parse",))
    assert (row["record_index"], row["record"], row["error_type"]) == (
        1,
        '{"n":"x"}',
        "ExpressionFailed",
    )
    assert row["error_message"].startswith(
        "stage 'parse' (SELECT CAST(n AS INT) AS n, try_cast(n AS INT) AS t) failed on record 1 "
        "of split 's0': "
    )
    with pytest.raises(ExpressionFailed, match="failed on record 1 of split 's0'"):
        _run(stage, batch, None)


def test_null_semantics_follow_spark():
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    p = Pipeline("sql")
    src = p.source(GeneratorSource(1, lambda s, n: {}), schema=schema)
    batch = pa.RecordBatch.from_pydict({"a": [1, None, 3], "s": ["x", None, "DE"]}, schema=schema)
    got = _run(
        src.select(
            "a > 1 AS gt",
            "a > 1 OR s = 'x' AS either",
            "s IN ('DE', 'x') AS listed",
            "s IN ('DE', NULL) AS with_null",
            "a / 2 AS half",
            "coalesce(a, 0) AS filled",
            "CASE WHEN a > 2 THEN 'big' WHEN a > 0 THEN 'small' END AS size",
        ),
        batch,
        None,
    )
    assert got == [
        dict(gt=False, either=True, listed=True, with_null=None, half=0.5, filled=1, size="small"),
        dict(gt=None, either=None, listed=None, with_null=None, half=None, filled=0, size=None),
        dict(gt=True, either=True, listed=True, with_null=True, half=1.5, filled=3, size="big"),
    ]
    assert _run(src.where("a > 1 OR s = 'x'"), batch, None) == [
        {"a": 1, "s": "x"},
        {"a": 3, "s": "DE"},
    ]


def test_times_from_numbers_and_text_and_back():
    import datetime

    schema = pa.schema([("ms", pa.int64()), ("t", pa.string())])
    src = Pipeline("sql").source(GeneratorSource(1, lambda s, n: {}), schema=schema)
    batch = pa.RecordBatch.from_pydict(
        {"ms": [1_700_000_000_123, -1], "t": ["2024-01-01T10:00:00", "2024-01-01 00:00:01Z"]},
        schema=schema,
    )
    got = _run(
        src.select(
            "timestamp_millis(ms) AS at",
            "unix_millis(timestamp_millis(ms)) AS back",
            "unix_seconds(to_timestamp(t)) AS secs",
            "to_date(t) AS day",
        ),
        batch,
        None,
    )
    utc = datetime.UTC
    assert got == [
        {
            "at": datetime.datetime(2023, 11, 14, 22, 13, 20, 123000, tzinfo=utc),
            "back": 1_700_000_000_123,
            "secs": 1_704_103_200,
            "day": datetime.date(2024, 1, 1),
        },
        {
            "at": datetime.datetime(1969, 12, 31, 23, 59, 59, 999000, tzinfo=utc),
            "back": -1,
            "secs": 1_704_067_201,
            "day": datetime.date(2024, 1, 1),
        },
    ]
    assert "use timestamp_seconds(x), timestamp_millis(x)" in _error(
        lambda: src.select("CAST(ms AS TIMESTAMP) AS t")
    )


def test_with_columns_replaces_a_column_in_place_and_select_star_keeps_all():
    orders = _stream(schema=ORDERS)
    replaced = orders.with_columns(amount="amount * 2", big="amount > 10")
    assert replaced.schema.names == ["id", "user", "amount", "country", "big"]
    batch = pa.RecordBatch.from_pylist([_order(0, 1)], schema=ORDERS)
    assert _run(replaced, batch, None) == [{**_order(0, 1), "amount": 54.0, "big": True}]
    star = orders.select("*", "upper(user) AS u")
    assert star.schema.names == [*ORDERS.names, "u"]
    assert "more than one column 'user'" in _error(lambda: orders.select("*", "user"))


# -- end to end -------------------------------------------------------------------------------


def _job(tmp_path: Path, run: str) -> Pipeline:
    """Orders with one misfit per split (a text amount) -> where/select/sql -> Parquet."""

    def order(split: int, n: int) -> dict[str, Any]:
        record = _order(split, n)
        if n == 7:
            record["amount"] = "7 EUR"
        return record

    p = Pipeline(
        "sqljob",
        records_per_epoch=5,
        on_error="dead-letter",
        dead_letter=ParquetSink(str(tmp_path / run / "dead")),
    )
    orders = p.source(
        GeneratorSource(3, order, records_per_split=20), parallelism=3, name="orders", schema=ORDERS
    )
    (
        orders.where("amount > 0 AND country IN ('DE', 'FR')", name="big")
        .select("id", "user", "amount * 2 AS twice", name="twice")
        .sql("SELECT id, user, twice, CAST(twice * 100 AS BIGINT) AS cents FROM input", name="q")
        .sink(ParquetSink(str(tmp_path / run / "out")), name="out")
    )
    return p


def _drive(tmp_path: Path, run: str, faults: Faults | None = None) -> Any:
    p = _job(tmp_path, run)
    root = str(tmp_path / run / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    faults = faults or Faults()
    env = TaskEnv(root, "sqljob", p, unit_timeout=10, faults=faults.unit_faults())
    driver = JobDriver(
        p,
        InProcessDispatcher(env),
        storage=JobStorage(root, "sqljob"),
        policy=policy,
        faults=faults,
    )
    return driver.run()


def test_a_sql_job_under_a_unit_fault_equals_a_fault_free_run_and_duckdb(tmp_path):
    clean = _drive(tmp_path, "clean")
    faulty = _drive(tmp_path, "faulty", Faults(units={(2, 1): "fail", (3, 2): "fail"}))
    assert clean.finished and faulty.finished
    assert any(c.kind != "global" for c in faulty.checkpoints)  # a unit did fall back
    query = "SELECT id, user, twice, cents FROM read_parquet('{}/*.parquet') ORDER BY id"
    rows = {
        run: duckdb.sql(query.format(tmp_path / run / "out")).fetchall()
        for run in ("clean", "faulty")
    }
    expected = sorted(
        (r["id"], r["user"], r["amount"] * 2, int(r["amount"] * 2 * 100))
        for s in range(3)
        for n in range(20)
        if n != 7
        for r in [_order(s, n)]
        if r["amount"] > 0 and r["country"] in ("DE", "FR")
    )
    assert rows["clean"] == rows["faulty"] == expected
    for run in ("clean", "faulty"):
        dead = read_table(str(tmp_path / run / "dead")).to_pylist()
        assert sorted((d["operator"], d["split_id"], d["error_type"]) for d in dead) == [
            ("orders", f"g{s}", "SchemaMismatch") for s in range(3)
        ]
        assert all(
            "field 'amount': expected double, found string ('7 EUR')" in d["error_message"]
            for d in dead
        )


def test_a_sql_job_restored_after_a_driver_crash_equals_a_fault_free_run(tmp_path):
    clean = _drive(tmp_path, "clean")
    with pytest.raises(DriverCrash):
        _drive(tmp_path, "crashed", Faults(units={(2, 0): "fail"}, crash_at=(3, "after-metadata")))
    resumed = _drive(tmp_path, "crashed")
    assert clean.finished and resumed.finished and resumed.restored_from == 3
    query = "SELECT id, user, twice, cents FROM read_parquet('{}/*.parquet') ORDER BY id"
    rows = [
        duckdb.sql(query.format(tmp_path / run / "out")).fetchall() for run in ("clean", "crashed")
    ]
    assert rows[0] == rows[1] and rows[0]
    dead = read_table(str(tmp_path / "crashed" / "dead")).column("split_id").to_pylist()
    assert sorted(dead) == ["g0", "g1", "g2"]  # each misfit once, across the crash


def test_expression_errors_are_expression_errors():
    assert issubclass(ExpressionError, GraphError)


def test_regional_regions_shows_each_vertex_schema(tmp_path, capsys):
    from regional.cli import main

    job = tmp_path / "job.py"
    job.write_text(
        "import pyarrow as pa\n"
        "from regional import GeneratorSource, ParquetSink, Pipeline\n"
        "pipeline = Pipeline('cli')\n"
        "orders = pipeline.source(GeneratorSource(2, lambda s, n: {'id': n}), name='orders',\n"
        "                         schema=pa.schema([('id', pa.int64())]))\n"
        "orders.select('id', 'id * 2 AS twice', name='twice').sink(\n"
        f"    ParquetSink({str(tmp_path / 'out')!r}), name='out')\n"
    )
    assert main(["regions", str(job)]) == 0
    out = capsys.readouterr().out
    assert "schema of orders: id int64\nschema of twice: id int64, twice int64\n" in out
    assert "schema of out" not in out


def test_a_misfit_is_numbered_among_the_records_of_its_read_around_undecodable_ones():
    from regional.dataflow.fitted_source import FittedSource
    from regional.sources.base import PoisonRecord, ReadResult

    class Read:
        bounded = True

        def discover(self) -> list[str]:
            return ["s"]

        def read(self, split_id: str, position: bytes, max_records: int) -> ReadResult:
            # records 0..5 of the read: 1 and 4 could not be decoded by the source itself
            poison = tuple(PoisonRecord(i, {"raw": i}, ValueError("bad")) for i in (1, 4))
            batches = [[{"id": 0}, {"id": "two"}], [{"id": 3}, {"id": None}]]
            return ReadResult(batches, b"6", True, poison, behind=7)

    schema = pa.schema([pa.field("id", pa.int64(), nullable=False)])
    result = FittedSource(Read(), schema, name="orders").read("s", b"", 10)
    assert [(p.ordinal, p.record) for p in result.poison] == [
        (1, {"raw": 1}),
        (2, {"id": "two"}),
        (4, {"raw": 4}),
        (5, {"id": None}),
    ]
    assert str(result.poison[1].error) == (
        "source 'orders', split 's', record 2 of the read: field 'id': expected int64, found "
        "string ('two'); fix the record, or declare the field's type as it comes (or nullable) "
        "in schema=..."
    )
    assert [b.to_pylist() for b in result.batches] == [[{"id": 0}], [{"id": 3}]]
    assert (result.position, result.finished) == (b"6", True)
    assert result.behind == 7  # the consumer lag of a source with a declared schema is kept


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.fixed_dictionaries(
            {"a": st.none() | st.integers(-5, 5), "s": st.none() | st.sampled_from(["1", "x"])}
        ),
        max_size=12,
    ),
    st.lists(st.integers(0, 12), max_size=4),
)
def test_a_stage_gives_the_same_rows_however_its_input_is_cut_into_chunks(rows, cuts):
    schema = pa.schema([("a", pa.int64()), ("s", pa.string())])
    src = Pipeline("sql").source(GeneratorSource(1, lambda s, n: {}), schema=schema)
    stage = src.sql("SELECT a * 2 AS d, CAST(s AS INT) AS n FROM input WHERE a > -3", name="q")
    op = compile_plan(src.pipeline).vertices["q"].operator
    bounds = sorted({0, len(rows), *(c for c in cuts if c <= len(rows))})
    chunks = [
        ("s0", pa.RecordBatch.from_pylist(rows[lo:hi], schema=schema))
        for lo, hi in itertools.pairwise(bounds)
    ]
    whole = DeadLetters(1, {"s0": "0"})
    cut = DeadLetters(1, {"s0": "0"})
    one, _ = op.run(
        [("s0", pa.RecordBatch.from_pylist(rows, schema=schema))], None, None, whole, None
    )
    many, _ = op.run(chunks, None, None, cut, None)
    assert [r for _, b in one for r in b.to_pylist()] == [r for _, b in many for r in b.to_pylist()]
    assert [(d["record_index"], d["record"]) for d in whole.rows(("q",))] == [
        (d["record_index"], d["record"]) for d in cut.rows(("q",))
    ]
    assert stage.schema == pa.schema([("d", pa.int64()), ("n", pa.int32())])


def test_a_kafka_json_value_is_declared_as_a_struct_and_read_by_field():
    value = pa.struct(
        [pa.field("user", pa.string()), pa.field("amount", pa.float64(), nullable=False)]
    )
    envelope = pa.schema([("offset", pa.int64()), ("value", value)])
    records = [
        {"offset": 0, "value": {"user": "u", "amount": 5, "extra": True}},
        {"offset": 1, "value": {"user": "v", "amount": "5 EUR"}},
        {"offset": 2, "value": {"user": "w"}},
        {"offset": 3, "value": {"user": "x", "amount": False}},
    ]
    batch, misfits = fit(records, envelope)
    assert [str(m.error) for m in misfits] == [
        "field 'value.amount': expected double, found string ('5 EUR')",
        "field 'value.amount': expected double (required), found no value (null or missing)",
        "field 'value.amount': expected double, found bool (False)",
    ]
    src = Pipeline("kafka").source(GeneratorSource(1, lambda s, n: {}), schema=envelope)
    stage = src.sql("SELECT offset, value.user, value.amount * 2 AS twice FROM input", name="q")
    assert stage.schema.names == ["offset", "user", "twice"]
    assert _run(stage, batch, None) == [{"offset": 0, "user": "u", "twice": 10.0}]
    assert _error(lambda: src.select("value.amout")) == (
        "stage 'select-2': no field 'amout' in 'value.amout': 'value' has the fields user, "
        "amount; did you mean 'amount'?"
    )
