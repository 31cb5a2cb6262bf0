"""The quickstart's pipeline (the README's first command) on the shared session: regional
checkpoints happen and the committed table equals a fault-free run's."""

from __future__ import annotations

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
    assert got == want and len(got) == 4341
