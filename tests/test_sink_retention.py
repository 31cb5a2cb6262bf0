"""The sinks' table retention is recorded in every checkpoint (format 1.4), and
`regional inspect ROOT validate` warns when a table may drop the commit marker deduplication
relies on before the oldest retained checkpoint is too old to restore."""

from __future__ import annotations

import dataclasses

import pyarrow as pa

from metadata.model import CheckpointMetadata, SinkRetention
from metadata.storage import JobStorage
from metadata.validate import validate_job
from regional.cli import main
from regional.policy import Policy
from regional.runtime.sim import Simulation

TXN = "delta.setTransactionRetentionDuration"
DAY = 86_400_000


class _Retaining:
    """The simulation's table, reporting a Delta-like marker retention of one day."""

    def __init__(self, table: object) -> None:
        self.table = table

    def marker_retention(self) -> SinkRetention:
        return SinkRetention("", "delta", "/tables/clicks", TXN, DAY)

    def __getattr__(self, name: str) -> object:
        return getattr(self.table, name)


def test_the_driver_records_each_sinks_retention_and_validate_warns_from_it():
    sim = Simulation(4, Policy(), records_per_split=9)
    spec = sim.pipeline.vertices["sink"]
    sim.pipeline.vertices["sink"] = dataclasses.replace(spec, sink=_Retaining(sim.sink))
    sim.new_driver().run(max_checkpoints=3)
    ids = sim.storage.list_checkpoint_ids()
    newest = sim.storage.read_metadata(ids[-1])
    assert newest.sinks == (SinkRetention("sink", "delta", "/tables/clicks", TXN, DAY),)
    oldest = sim.storage.read_metadata(ids[0])
    assert validate_job(sim.storage, now_ms=oldest.completion_time_ms + DAY).warnings == ()
    late = validate_job(sim.storage, now_ms=oldest.completion_time_ms + 3 * DAY)
    assert late.problems == () and late.warnings == (
        f"sink 'sink' (delta table /tables/clicks): {TXN} is 24.0 h, but the oldest retained "
        f"checkpoint {ids[0]} completed 3.0 d ago; after the table drops the job's commit "
        f"marker, restoring it would commit its output again. Make {TXN} longer than the job "
        "may stay stopped, or restore a newer checkpoint",
    )


def test_a_sink_without_retention_and_older_metadata_give_no_warning():
    sim = Simulation(4, Policy(), records_per_split=9)  # InMemoryTableSink: no retention
    sim.run(2)
    assert all(not sim.storage.read_metadata(c).sinks for c in sim.storage.list_checkpoint_ids())
    assert validate_job(sim.storage, now_ms=10**12).warnings == ()


def test_inspect_validate_prints_the_warning_and_exits_0(tmp_path, capsys):
    storage = JobStorage(str(tmp_path), "orders")
    sink = SinkRetention("out", "paimon", "/wh db.orders", "snapshot.time-retained", 3_600_000)
    for cid in (1, 2):
        storage.write_metadata(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id="orders",
                kind="global",
                trigger_time_ms=cid,
                completion_time_ms=cid,
                sinks=(sink,),
            )
        )
    assert main(["inspect", str(tmp_path), "validate"]) == 0
    out, err = capsys.readouterr()
    assert out.splitlines()[-1] == "a restore would use checkpoint 2 (2 checked, 0 problems)"
    [warning] = err.splitlines()
    assert warning.startswith(
        "warning: sink 'out' (paimon table /wh db.orders): snapshot.time-retained is 1.0 h, but "
        "the oldest retained checkpoint 1 completed "
    )


def test_delta_and_paimon_report_their_tables_settings(tmp_path):
    from regional.sinks.delta import DeltaSink
    from regional.sinks.paimon import PaimonSink

    schema = pa.schema([("x", pa.int64())])
    delta = DeltaSink(str(tmp_path / "d"), schema=schema, configuration={TXN: "interval 2 days"})
    assert delta.marker_retention() == SinkRetention("", "delta", delta.path, TXN, 2 * DAY)
    plain = DeltaSink(str(tmp_path / "plain"), schema=schema)
    assert plain.marker_retention().retention_ms is None  # markers kept forever
    paimon = PaimonSink(
        str(tmp_path / "wh"),
        "db.t",
        schema=schema,
        table_options={"snapshot.time-retained": "30 min"},
    )
    assert paimon.marker_retention() == SinkRetention(
        "", "paimon", f"{tmp_path}/wh db.t", "snapshot.time-retained", 1_800_000
    )


def test_iceberg_reports_its_snapshot_age_for_expiry(tmp_path):
    from regional.sinks.iceberg import IcebergSink

    schema = pa.schema([("x", pa.int64())])
    age = "history.expire.max-snapshot-age-ms"
    expiring = IcebergSink(
        str(tmp_path / "wh"), "db.t", schema=schema, table_properties={age: str(2 * DAY)}
    )
    assert expiring.marker_retention() == SinkRetention(
        "", "iceberg", f"{tmp_path}/wh db.t", age, 2 * DAY
    )
    plain = IcebergSink(str(tmp_path / "wh"), "db.plain", schema=schema)
    assert plain.marker_retention().retention_ms is None  # expired only when someone asks
