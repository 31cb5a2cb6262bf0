"""What `regional run` shows: plain lines off a terminal, JSON lines with `--json`, and the live
`rich` view of the running epoch (units answered / pending / falling back, records/s, commit
lag) on a terminal."""

from __future__ import annotations

import io

import msgspec
from rich.console import Console

from metadata.events import CheckpointEvent, Outcome
from metadata.model import SubtaskState
from regional.cli.progress import JsonProgress, LiveProgress, PlainProgress
from regional.coordinator.messages import Ack, Decline

EVENTS = [
    CheckpointEvent(
        job_id="clicks",
        checkpoint_id=1,
        kind=Outcome.GLOBAL,
        trigger_time_ms=1_000,
        time_ms=1_400,
        fresh_units=4,
        records_in=20,
    ),
    CheckpointEvent(
        job_id="clicks",
        checkpoint_id=2,
        kind=Outcome.REGIONAL,
        trigger_time_ms=2_000,
        time_ms=2_250,
        fresh_units=3,
        fallback_units=(1,),
        records_in=15,
        commit_lag=1,
        unit_lag={1: 1},
        oldest_ref_checkpoint_id=1,
    ),
    CheckpointEvent(
        job_id="clicks",
        checkpoint_id=3,
        kind=Outcome.ABORTED,
        trigger_time_ms=3_000,
        time_ms=3_500,
        fresh_units=0,
        fallback_units=(0, 1, 2),
        abort_rule="3c-failure-ratio",
        message="3 of 4 units failed (75%), over max-failure-ratio 0.3",
    ),
]


def test_plain_lines():
    out = io.StringIO()
    view = PlainProgress(out)
    for event in EVENTS:
        view(event)
    assert out.getvalue().splitlines() == [
        "checkpoint    1  global    fresh   4  fallback -           commit lag 0  records      20"
        "   0.40 s",
        "checkpoint    2  regional  fresh   3  fallback 1           commit lag 1  records      15"
        "   0.25 s",
        "checkpoint    3  aborted   fresh   0  fallback 0,1,2       commit lag 0  records       0"
        "   0.50 s",
        "    3 of 4 units failed (75%), over max-failure-ratio 0.3",
    ]


def test_json_lines_are_the_events_and_nothing_else():
    out = io.StringIO()
    view = JsonProgress(out)
    for event in EVENTS:
        view(event)
    lines = out.getvalue().splitlines()
    assert [msgspec.json.decode(line, type=CheckpointEvent) for line in lines] == EVENTS
    assert msgspec.json.decode(lines[1]) == {
        "event": "checkpoint",
        "job_id": "clicks",
        "checkpoint_id": 2,
        "kind": "regional",
        "trigger_time_ms": 2000,
        "time_ms": 2250,
        "fresh_units": 3,
        "fallback_units": [1],
        "causes": {},
        "abort_rule": None,
        "message": "",
        "records_in": 15,
        "commit_lag": 1,
        "oldest_ref_checkpoint_id": 1,
        "unit_lag": {"1": 1},
        "regional_checkpoint_count": 0,
        "global_checkpoint_count": 0,
        "savepoint_count": 0,
        "aborted_by_rule": {},
        "records_dead_lettered": 0,
        "records_late": 0,
        "watermark_ms": None,
        "watermark_unit": None,
        "tracebacks": {},
        "stuck": [],
        "unit_reads": {},
        "warnings": [],
        "started": None,
        "records_exchanged": 0,
        "records_behind": {},
        "seconds_behind": {},
        "replays": [],
    }


def _ack(cid: int, unit: int, records: int, attempt: int = 1) -> Ack:
    return Ack(cid, unit, attempt, (SubtaskState("src", unit, unit, attempt=attempt),), records)


def _text(view: LiveProgress) -> str:
    console = Console(file=io.StringIO(), force_terminal=True, width=200, color_system=None)
    console.print(view.render())
    return console.file.getvalue().strip()  # type: ignore[attr-defined]


def test_the_live_view_counts_the_running_epoch():
    clock = [100.0]
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=200, color_system=None)
    view = LiveProgress(console, now=lambda: clock[0])
    with view:
        view(EVENTS[1])  # the last outcome: commit lag 1, 15 records in 0.25 s
        assert _text(view) == "between checkpoints  records/s 60  commit lag 1"
        view.epoch_started(4, [0, 1, 2, 3])
        clock[0] += 2.0
        view.unit_answered(_ack(4, 0, 300))
        view.unit_answered(_ack(4, 0, 300))  # reported live, then again at the batch's end
        view.unit_answered(Decline(4, 2, 1, "ValueError: bad record"))
        view.unit_answered(_ack(3, 1, 999))  # a late answer of an older checkpoint
        assert _text(view) == (
            "checkpoint 4 running: units answered 2/4, pending 2, falling back 1  "
            "records/s 150  commit lag 1"
        )
        view.unit_answered(_ack(4, 2, 100, attempt=2))  # its retry, alone, succeeded
        assert _text(view).startswith(
            "checkpoint 4 running: units answered 2/4, pending 2, falling back 0  records/s 200"
        )
    assert "checkpoint    2  regional  fresh   3  fallback 1" in out.getvalue()


def test_a_job_watermark_lower_than_the_last_one_shown_says_why() -> None:
    def event(cid: int, watermark: int) -> CheckpointEvent:
        return CheckpointEvent(
            job_id="j", checkpoint_id=cid, kind=Outcome.GLOBAL, trigger_time_ms=0, time_ms=1,
            fresh_units=2, watermark_ms=watermark, watermark_unit=1,
        )  # fmt: skip

    out = io.StringIO()
    view = PlainProgress(out)
    view(event(1, 60_000))
    view(event(2, 120_000))
    view(event(3, 90_000))
    lines = out.getvalue().splitlines()
    assert "back from" not in lines[0] + lines[1]
    assert lines[2].endswith(
        "watermark 1970-01-01T00:01:30.000Z (unit 1) back from 1970-01-01T00:02:00.000Z: a "
        "unit's watermark is the lowest of its splits', and a split it was just given holds it "
        "until its records arrive"
    )
