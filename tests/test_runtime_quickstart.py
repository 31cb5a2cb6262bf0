"""The quickstart's pipeline (the README's first command, a SQL-style job: declared schema,
where/select, a windowed count by column) on the shared session: regional checkpoints happen,
and the committed table equals a fault-free run's and a Spark SQL batch of the same query."""

from __future__ import annotations

import datetime as dt
import importlib.util
from pathlib import Path

import pytest

from regional.runtime.spark import SparkRuntime

pytestmark = pytest.mark.spark

_FILE = Path(__file__).parent.parent / "examples" / "quickstart.py"


def _quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_example", _FILE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_quickstart_output_with_faults_equals_a_fault_free_run(spark, tmp_path):
    qs = _quickstart()
    data = qs.make_clickstream(str(tmp_path / "data"))  # the demo's own data set
    faulty = qs.build_pipeline(data, str(tmp_path / "faulty"))
    summary = SparkRuntime(faulty, spark, root=str(tmp_path / "c1"), faults=qs.FAULTS).run()
    assert [c.kind for c in summary.checkpoints[:4]] == ["global", *["regional"] * 3]
    assert all(c.fallback_units == (3,) for c in summary.checkpoints[1:4])
    clean = qs.build_pipeline(data, str(tmp_path / "clean"))
    assert SparkRuntime(clean, spark, root=str(tmp_path / "c2")).run().finished
    got, want = qs._rows(str(tmp_path / "faulty")), qs._rows(str(tmp_path / "clean"))
    assert got == want and len(got) == 1713
    assert _as_ms(got) == _spark_sql_batch(spark, data)


def _as_ms(rows: list[tuple]) -> list[tuple]:
    """(user, window start and end in ms, clicks) of the committed rows, sorted."""
    epoch = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
    one = dt.timedelta(milliseconds=1)
    return sorted((u, (s - epoch) // one, (e - epoch) // one, n) for u, s, e, n in rows)


def _spark_sql_batch(spark, data: str) -> list[tuple]:
    """The quickstart's query as a Spark SQL batch over the same files: the human clicks
    counted per user and 100 ms window of event time, within each input file (the job's
    window state is scoped by split)."""
    spark.read.schema("user STRING, page STRING, bot BOOLEAN, ts BIGINT").json(
        data
    ).createOrReplaceTempView("clicks")
    rows = spark.sql(
        """SELECT user, unix_millis(w.start) AS s, unix_millis(w.end) AS e, count(*) AS n
           FROM (SELECT user, window(timestamp_millis(ts), '100 milliseconds') AS w,
                        input_file_name() AS file
                 FROM clicks WHERE NOT bot)
           GROUP BY user, w, file"""
    ).collect()
    return sorted((r.user, r.s, r.e, r.n) for r in rows)
