"""The event log on real storage (no Spark): one new object per event, read back in checkpoint
order by the inspector (`regional inspect ROOT events`), damaged files reported and skipped,
and the cleaner keeping the newest N events while deleting older ones (never as `unknown`)."""

from __future__ import annotations

import json

import pytest

from cleaner.plan import Action, Reason
from cleaner.run import execute, scan
from metadata.errors import StorageError
from metadata.events import CheckpointEvent, events_table, read_events, write_event
from metadata.model import CheckpointMetadata
from metadata.storage import JobStorage
from regional.cli import main


def _event(cid: int, kind: str = "global", **kw) -> CheckpointEvent:
    fields = {
        "job_id": "job",
        "checkpoint_id": cid,
        "kind": kind,
        "trigger_time_ms": 1_000 * cid,
        "time_ms": 1_000 * cid + 40,
        "fresh_units": 4,
        "global_checkpoint_count": cid,
    }
    return CheckpointEvent(**{**fields, **kw})


def _log(storage: JobStorage) -> list[CheckpointEvent]:
    events = [
        _event(1),
        _event(
            2,
            "regional",
            fresh_units=3,
            fallback_units=(1,),
            causes={1: "declined: ValueError: boom"},
            oldest_ref_checkpoint_id=1,
            unit_lag={1: 1},
            regional_checkpoint_count=1,
            global_checkpoint_count=1,
        ),
        _event(
            3,
            "aborted",
            fresh_units=0,
            fallback_units=(0, 1, 2),
            abort_rule="3c-failure-ratio",
            unit_lag={1: 1},
            regional_checkpoint_count=1,
            global_checkpoint_count=1,
            aborted_by_rule={"3c-failure-ratio": 1},
        ),
    ]
    for e in reversed(events):  # written out of order: read back by checkpoint id
        write_event(storage, e)
    return events


def test_events_round_trip_in_checkpoint_order_and_are_never_rewritten(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    events = _log(storage)
    assert sorted(p.name for p in (tmp_path / "job" / "events").iterdir()) == [
        "000000000001-1000.json",
        "000000000002-2000.json",
        "000000000003-3000.json",
    ]
    # each file is one JSON line: the directory concatenated is a JSON-lines log
    line = (tmp_path / "job" / "events" / "000000000002-2000.json").read_text()
    assert line.count("\n") == 1 and json.loads(line)["unit_lag"] == {"1": 1}
    assert read_events(storage) == (events, [])
    with pytest.raises(StorageError, match=r"events/000000000002-2000.json already exists"):
        write_event(storage, events[1])


def test_damaged_and_foreign_files_in_the_log_are_reported_or_ignored(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    events = _log(storage)
    (tmp_path / "job" / "events" / "000000000004-4000.json").write_text('{"event":"checkp')
    (tmp_path / "job" / "events" / "notes.txt").write_text("mine")
    got, problems = read_events(storage)
    assert got == events
    assert [(p.checkpoint_id, p.path) for p in problems] == [(4, "events/000000000004-4000.json")]
    assert "is not a checkpoint event" in problems[0].problem


def test_inspect_events_view_as_text_and_json(tmp_path, capsys):
    _log(JobStorage(str(tmp_path), "job"))
    assert main(["inspect", str(tmp_path), "events", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["checkpoint_id"], r["kind"], r["abort_rule"]) for r in rows] == [
        (1, "global", None),
        (2, "regional", None),
        (3, "aborted", "3c-failure-ratio"),
    ]
    assert rows[1]["unit_lag"] == [{"unit_id": 1, "lag": 1}]
    assert rows[1]["causes"] == [{"unit_id": 1, "cause": "declined: ValueError: boom"}]
    assert (rows[1]["oldest_ref_checkpoint_id"], rows[1]["duration_ms"]) == (1, 40)
    assert rows[2]["aborted_count"] == 1 and rows[2]["fallback_units"] == [0, 1, 2]
    assert main(["inspect", str(tmp_path), "events"]) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[0].split()[:3] == ["checkpoint_id", "kind", "trigger_time"]
    header, row = text[0].split(), text[3].split()
    assert row[1] == "regional" and row[header.index("unit_lag") + 1] == "1:1"  # +1: time
    assert "1:declined: ValueError: boom" in text[3]


def test_inspect_events_of_a_job_without_a_log_is_empty(tmp_path, capsys):
    JobStorage(str(tmp_path), "job").write_metadata(
        CheckpointMetadata(
            checkpoint_id=1, job_id="job", kind="global", trigger_time_ms=0, completion_time_ms=1
        )
    )
    assert main(["inspect", str(tmp_path), "events"]) == 0
    assert capsys.readouterr().out.endswith("(no rows)\n")


def test_cleaner_keeps_the_newest_events_and_deletes_older_ones(tmp_path):
    storage = JobStorage(str(tmp_path), "job")
    storage.write_metadata(
        CheckpointMetadata(
            checkpoint_id=5, job_id="job", kind="global", trigger_time_ms=0, completion_time_ms=1
        )
    )
    for cid in range(1, 6):
        write_event(storage, _event(cid))
    (tmp_path / "job" / "events" / "notes.txt").write_text("mine")
    plan = scan(storage, num_retained=1, num_retained_events=2)
    verdicts = {f.path: (f.action, f.reason) for f in plan.files if f.path.startswith("events/")}
    expired = (Action.DELETE, Reason.EXPIRED_EVENT)
    kept = (Action.KEEP, Reason.EVENT_LOG)
    assert verdicts == {
        "events/000000000001-1000.json": expired,
        "events/000000000002-2000.json": expired,
        "events/000000000003-3000.json": expired,
        "events/000000000004-4000.json": kept,
        "events/000000000005-5000.json": kept,
        "events/notes.txt": (Action.KEEP, Reason.UNKNOWN),
    }
    assert execute(plan, storage).ok
    assert [e.checkpoint_id for e in read_events(storage)[0]] == [4, 5]
    assert sorted(p.name for p in (tmp_path / "job" / "events").iterdir()) == [
        "000000000004-4000.json",
        "000000000005-5000.json",
        "notes.txt",
    ]
    # the default keeps a long history: nothing more goes
    assert not [f for f in scan(storage, num_retained=1).files if f.action is Action.DELETE]


def test_clean_cli_takes_the_number_of_events_to_keep(tmp_path, capsys):
    storage = JobStorage(str(tmp_path), "job")
    for cid in (1, 2):
        write_event(storage, _event(cid))
    assert main(["clean", str(tmp_path), "--num-retained-events", "1", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["path"], r["reason"]) for r in rows if r["path"]] == [
        ("events/000000000001-1000.json", "expired-event"),
        ("events/000000000002-2000.json", "event-log"),
    ]
    assert [e.checkpoint_id for e in read_events(storage)[0]] == [2]
    with pytest.raises(SystemExit):
        main(["clean", str(tmp_path), "--num-retained-events", "-1"])
    assert "must be at least 0 (got -1)" in capsys.readouterr().err


def test_events_table_schema_is_fixed_even_when_empty():
    assert events_table([]).num_rows == 0
    assert events_table([]).schema == events_table([_event(1)]).schema
