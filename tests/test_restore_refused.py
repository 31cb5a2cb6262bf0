"""A restore that one sink refuses changes no table: every sink's rollback is decided before any
table is touched (Parquet and Iceberg could roll back, Delta cannot: nothing is rolled back)."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa
import pytest

from regional.coordinator.commit import CommitCoordinator
from regional.errors import RestoreError
from regional.runtime.restore import roll_back_sinks
from regional.sinks.base import WriteContext
from regional.sinks.delta import DeltaSink
from regional.sinks.iceberg import IcebergSink
from regional.sinks.parquet import ParquetSink, read_table

SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])


def _stage(sink: object, cid: int) -> tuple[bytes, ...]:
    writer = pickle.loads(pickle.dumps(sink))  # as a Spark task gets it
    return writer.write(  # type: ignore[no-any-return]
        [pa.RecordBatch.from_pylist([{"user": "a", "n": cid}], schema=SCHEMA)],
        WriteContext(
            job_id="job",
            run_id="r1",
            checkpoint_id=cid,
            attempt=0,
            unit_id=0,
            vertex_id="out",
            index=0,
        ),
    )


def _hashes(root: Path) -> dict[str, str]:
    """Every file under `root` with the SHA-256 of its bytes."""
    out = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                out[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return out


def test_a_restore_refused_by_one_sink_leaves_every_table_byte_identical(tmp_path):
    parquet = ParquetSink(str(tmp_path / "parquet"))
    iceberg = IcebergSink(str(tmp_path / "warehouse"), "db.clicks", schema=SCHEMA)
    delta = DeltaSink(str(tmp_path / "delta"), schema=SCHEMA)
    sinks = {"parquet": parquet, "iceberg": iceberg, "delta": delta}  # delta refuses last
    for sink in sinks.values():
        for cid in (1, 3, 5):
            sink.commit("job", cid, _stage(sink, cid))
    pipeline = SimpleNamespace(sink_of=sinks.__getitem__)
    committers = {v: CommitCoordinator(v, commit_user="job") for v in sinks}
    before = _hashes(tmp_path)
    with pytest.raises(RestoreError) as refused:
        roll_back_sinks(pipeline, committers, 2, own_root=True)  # type: ignore[arg-type]
    assert str(refused.value) == (
        "sink 'delta' holds commits of commit user 'job' up to 5, newer than the restored "
        "checkpoint 2; restoring would write their output again and the sink cannot roll back. "
        "Restore a checkpoint at or after 5, or remove those commits from the table by hand and "
        "start again (nothing was rolled back: 'parquet', 'iceberg' left as they were)"
    )
    assert _hashes(tmp_path) == before
    assert sorted(read_table(str(tmp_path / "parquet")).column("n").to_pylist()) == [1, 3, 5]
    # without the refusing sink, both roll back
    del committers["delta"]
    notes = roll_back_sinks(pipeline, committers, 2, own_root=True)  # type: ignore[arg-type]
    assert [n.split(":")[0] for n in notes] == [
        "sink 'parquet' holds commits of commit user 'job' up to 5, newer than the restored "
        "checkpoint 2",
        "sink 'iceberg' holds commits of commit user 'job' up to 5, newer than the restored "
        "checkpoint 2",
    ]
    assert read_table(str(tmp_path / "parquet")).column("n").to_pylist() == [1]
