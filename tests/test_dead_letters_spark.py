"""A poison record on Spark (`on_error="dead-letter"`): every other row committed exactly once
and exactly one dead-letter row, across a driver crash right after the metadata write."""

from __future__ import annotations

import pytest

from regional.dataflow.pipeline import Pipeline
from regional.runtime.faults import DriverCrash
from regional.runtime.spark import Faults, SparkRuntime
from regional.sinks.parquet import ParquetSink, read_table
from regional.sources.generator import GeneratorSource

pytestmark = pytest.mark.spark


def _record(split: int, n: int) -> dict:
    return {"split": split, "n": n}


def _check(r: dict) -> dict:
    if (r["split"], r["n"]) == (3, 7):
        raise ValueError(f"n={r['n']} is poison")
    return r


def _pipeline(tmp_path) -> Pipeline:
    p = Pipeline(
        "poison",
        records_per_epoch=5,
        on_error="dead-letter",
        dead_letter=ParquetSink(str(tmp_path / "dead")),
    )
    src = p.source(GeneratorSource(4, _record, records_per_split=10), parallelism=4, name="src")
    src.map(_check, name="check").sink(ParquetSink(str(tmp_path / "out")), name="out")
    return p


def test_poison_record_on_spark_is_dead_lettered_once_across_a_crash(spark, tmp_path):
    root = str(tmp_path / "ckpt")
    crashing = SparkRuntime(
        _pipeline(tmp_path), spark, root=root, faults=Faults(crash_at=(2, "after-metadata"))
    )
    with pytest.raises(DriverCrash):
        crashing.run()
    runtime = SparkRuntime(_pipeline(tmp_path), spark, root=root)
    summary = runtime.run()
    assert summary.finished and summary.restored_from == 2

    out = read_table(str(tmp_path / "out"))
    rows = sorted(zip(out.column("split").to_pylist(), out.column("n").to_pylist(), strict=True))
    assert rows == sorted((s, n) for s in range(4) for n in range(10) if (s, n) != (3, 7))
    [dead] = read_table(str(tmp_path / "dead")).to_pylist()
    assert (dead["checkpoint_id"], dead["split_id"], dead["split_position"]) == (2, "g3", "5")
    assert (dead["record_index"], dead["record"]) == (2, '{"split":3,"n":7}')
    assert (dead["operator"], dead["error_type"], dead["error_message"]) == (
        "check",
        "ValueError",
        "n=7 is poison",
    )
    assert "in _check" in dead["traceback"]
    # checkpoint 2 completed under the crashed driver: counters restart at 0 with a driver
    assert runtime.metrics.records_dead_lettered == 0
