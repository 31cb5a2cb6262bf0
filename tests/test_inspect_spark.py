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


def test_regional_views_name_the_units_as_the_cli_does(spark, tmp_path) -> None:
    """`regional.runtime.spark_views`: `regional_lag` carries each unit's name (and consumer
    lag) as `regional inspect ROOT lag --json` prints it; `metadata.spark` alone leaves them
    null (it cannot know the naming rule)."""
    from metadata.model import SplitState
    from metadata.storage import JobStorage as Storage
    from regional.runtime.inspection import job_inspector
    from regional.runtime.spark_views import register_views as register_named

    storage = Storage(str(tmp_path), "orders")
    handles = [storage.write_state_file(f"chk-1/u{u}-a0.state", b"s") for u in (0, 1)]
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=1,
            job_id="orders",
            kind="global",
            trigger_time_ms=0,
            completion_time_ms=30,
            subtasks=tuple(
                SubtaskState(
                    "orders", u, u, handles=(h,), split_states=(SplitState(f"events:{u}", b"4"),)
                )
                for u, h in enumerate(handles)
            ),
        )
    )
    register_named(spark, str(tmp_path), prefix="named_")
    rows = spark.sql("SELECT unit_id, unit_name FROM named_lag ORDER BY unit_id").collect()
    assert [tuple(r) for r in rows] == [(0, "orders[0]"), (1, "orders[1]")]
    expected = job_inspector(storage).lag().select(["unit_id", "unit_name"]).to_pylist()
    assert [r.asDict() for r in rows] == expected
    register_views(spark, str(tmp_path), prefix="bare_")
    bare = spark.sql("SELECT unit_name FROM bare_lag").collect()
    assert [r.unit_name for r in bare] == [None, None]
