"""`metadata.spark`: the inspector views as Spark DataFrames, queried with SQL."""

from __future__ import annotations

import datetime as dt

import pytest

from metadata.events import CheckpointEvent, write_event
from metadata.model import CheckpointMetadata, SubtaskState, UnitState
from metadata.spark import VIEW_NAMES, register_views
from metadata.storage import JobStorage

pytestmark = pytest.mark.spark


def test_views_are_queryable_with_sql(spark, tmp_path) -> None:
    storage = JobStorage(str(tmp_path), "orders")
    h0 = storage.write_state_file("chk-1/u0-a0.state", b"zero")
    h1 = storage.write_state_file("chk-1/u1-a0.state", b"one")
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=1,
            job_id="orders",
            kind="global",
            trigger_time_ms=0,
            completion_time_ms=30,
            subtasks=(
                SubtaskState("map", 0, 0, handles=(h0,)),
                SubtaskState("map", 1, 1, handles=(h1,)),
            ),
        )
    )
    h2 = storage.write_state_file("chk-2/u0-a0.state", b"zero'")
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=2,
            job_id="orders",
            kind="regional",
            trigger_time_ms=1000,
            completion_time_ms=1050,
            units=(UnitState(0), UnitState(1, 1, "timeout")),
            subtasks=(
                SubtaskState("map", 0, 0, handles=(h2,)),
                SubtaskState("map", 1, 1, ref_checkpoint_id=1, handles=(h1,)),
            ),
        )
    )
    write_event(
        storage,
        CheckpointEvent(
            job_id="orders",
            checkpoint_id=2,
            kind="regional",
            trigger_time_ms=1000,
            time_ms=1050,
            fresh_units=1,
            fallback_units=(1,),
            causes={1: "timeout"},
            oldest_ref_checkpoint_id=1,
            unit_lag={1: 1},
        ),
    )
    names = register_views(spark, str(tmp_path), num_retained=1)
    assert names == [f"regional_{n}" for n in VIEW_NAMES]
    rows = spark.sql(
        "SELECT checkpoint_id, kind, num_fallback_units, retained, referenced_by, trigger_time "
        "FROM regional_checkpoints ORDER BY checkpoint_id"
    ).collect()
    assert [tuple(r)[:5] for r in rows] == [
        (1, "global", 0, False, [2]),
        (2, "regional", 1, True, []),
    ]
    assert rows[1].trigger_time.astimezone(dt.UTC) == dt.datetime(
        1970, 1, 1, 0, 0, 1, tzinfo=dt.UTC
    )
    lag = spark.sql(
        "SELECT unit_id, checkpoints_behind FROM regional_lag WHERE status = 'fallback'"
    )
    assert [tuple(r) for r in lag.collect()] == [(1, 1)]
    assert spark.table("regional_validate").columns == ["checkpoint_id", "path", "problem"]
    assert spark.table("regional_refs").schema["units"].dataType.simpleString() == "array<bigint>"
    events = spark.sql(
        "SELECT checkpoint_id, duration_ms, u.unit_id, u.lag "
        "FROM regional_events LATERAL VIEW explode(unit_lag) AS u"
    )
    assert [tuple(r) for r in events.collect()] == [(2, 50, 1, 1)]
