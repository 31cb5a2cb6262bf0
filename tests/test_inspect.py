"""Inspector views (exact rows) and `regional inspect` (every view, table and JSON, every error)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import msgspec
import pytest

from metadata.inspect import (
    CHECKPOINTS_SCHEMA,
    DIFF_SCHEMA,
    LAG_HELP,
    LAG_SCHEMA,
    REFS_SCHEMA,
    SHOW_SCHEMA,
    SUMMARY_SCHEMA,
    CheckpointNotFoundError,
    Inspector,
    InspectorInputError,
)
from metadata.model import CheckpointMetadata, SplitState, SubtaskState, UnitState
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from metadata.validate import VALIDATE_SCHEMA, validate_job, validate_table
from regional.cli import main
from regional.runtime.inspection import job_inspector

T0 = 1_763_800_000_000  # 2025-11-22 08:26:40 UTC


def build_job(storage: JobStorage) -> list[CheckpointMetadata]:
    """Five checkpoints of two units: 1 global; 2, 3 unit 1 falls back to 1; 4 forced global;
    5 unit 0 falls back to 4."""
    written: list[CheckpointMetadata] = []
    owner_handles: dict[tuple[int, int], tuple] = {}

    def take(cid: int, kind: str, fallback: dict[int, str], reasons: tuple[str, ...] = ()):
        subtasks, units = [], []
        for unit, vertices in ((0, ("source", "map")), (1, ("source",))):
            if unit in fallback:
                owner = max(o for (o, u) in owner_handles if u == unit)
                handles = owner_handles[(owner, unit)]
                units.append(UnitState(unit, owner, fallback[unit]))
                for v, h in zip(vertices, handles, strict=True):
                    splits = (SplitState(f"part-{unit}", b"\x01"),) if v == "source" else ()
                    subtasks.append(
                        SubtaskState(
                            v,
                            unit,
                            unit,
                            ref_checkpoint_id=owner,
                            handles=(h,),
                            split_states=splits,
                        )
                    )
                continue
            payloads = [f"{v}-{unit}@{cid}".encode() for v in vertices]
            handles = storage.write_segments(f"chk-{cid}/u{unit}-a0.state", payloads)
            owner_handles[(cid, unit)] = handles
            units.append(UnitState(unit))
            for v, h in zip(vertices, handles, strict=True):
                splits = (SplitState(f"part-{unit}", b"\x01"),) if v == "source" else ()
                subtasks.append(
                    SubtaskState(v, unit, unit, handles=(h,), split_states=splits, attempt=0)
                )
        md = CheckpointMetadata(
            checkpoint_id=cid,
            job_id=storage.job_id,
            kind=kind,
            trigger_time_ms=T0 + 10_000 * cid,
            completion_time_ms=T0 + 10_000 * cid + 100 * cid,
            reasons=reasons,
            units=tuple(units),
            subtasks=tuple(subtasks),
        )
        storage.write_metadata(md)
        written.append(md)

    take(1, "global", {})
    take(2, "regional", {1: "timeout"}, ("unit 1: timeout",))
    take(3, "regional", {1: "declined: ValueError: bad record"}, ("unit 1 declined",))
    take(4, "global", {}, ("forced: unit 1 fell back 2 times in a row",))
    take(5, "regional", {0: "timeout"}, ("unit 0: timeout",))
    return written


@pytest.fixture
def job(tmp_path) -> tuple[str, JobStorage, list[CheckpointMetadata]]:
    root = str(tmp_path / "ckpt")
    storage = JobStorage(root, "orders")
    return root, storage, build_job(storage)


@pytest.fixture
def inspector(job) -> Inspector:
    return Inspector(CompletedCheckpointStore.load(job[1]), num_retained=3)


def rows(table, *columns):
    return [tuple(r[c] for c in columns) for r in table.to_pylist()]


# -- views ---------------------------------------------------------------------------------


def test_checkpoints_view(inspector: Inspector) -> None:
    t = inspector.checkpoints()
    assert t.schema == CHECKPOINTS_SCHEMA
    assert rows(
        t,
        "checkpoint_id",
        "kind",
        "duration_ms",
        "num_units",
        "num_fallback_units",
        "num_subtasks",
        "num_fallback_subtasks",
        "oldest_ref_checkpoint_id",
        "state_bytes",
        "retained",
        "referenced_by",
    ) == [
        (5, "regional", 500, 2, 1, 3, 2, 4, 27, True, []),
        (4, "global", 400, 2, 0, 3, 0, None, 27, True, [5]),
        (3, "regional", 300, 2, 1, 3, 1, 1, 27, True, []),
        (2, "regional", 200, 2, 1, 3, 1, 1, 27, False, []),
        (1, "global", 100, 2, 0, 3, 0, None, 27, False, [3]),
    ]
    first = t.to_pylist()[-1]
    assert first["trigger_time"] == dt.datetime(2025, 11, 22, 8, 26, 50, tzinfo=dt.UTC)
    assert first["complete_time"] - first["trigger_time"] == dt.timedelta(milliseconds=100)
    assert t.to_pylist()[1]["reasons"] == ["forced: unit 1 fell back 2 times in a row"]
    assert Inspector(inspector.store, num_retained=1).checkpoints()["retained"].to_pylist() == [
        True,
        False,
        False,
        False,
        False,
    ]


def test_show_view(inspector: Inspector) -> None:
    t = inspector.show(3)
    assert t.schema == SHOW_SCHEMA
    assert rows(
        t,
        "unit_id",
        "vertex_id",
        "subtask_index",
        "status",
        "owner_checkpoint_id",
        "files",
        "state_bytes",
        "num_splits",
        "reason",
    ) == [
        (0, "map", 0, "fresh", 3, ["chk-3/u0-a0.state"], 7, 0, None),
        (0, "source", 0, "fresh", 3, ["chk-3/u0-a0.state"], 10, 1, None),
        (
            1,
            "source",
            1,
            "fallback",
            1,
            ["chk-1/u1-a0.state"],
            10,
            1,
            "declined: ValueError: bad record",
        ),
    ]
    with pytest.raises(CheckpointNotFoundError, match=r"checkpoint 9 not found \(completed: 1, 2"):
        inspector.show(9)


def test_refs_view(inspector: Inspector) -> None:
    t = inspector.refs()
    assert t.schema == REFS_SCHEMA
    assert t.to_pylist() == [
        {"checkpoint_id": 5, "owner_checkpoint_id": 4, "units": [0], "num_subtasks": 2,
         "state_bytes": 17, "owner_completed": True},
        {"checkpoint_id": 3, "owner_checkpoint_id": 1, "units": [1], "num_subtasks": 1,
         "state_bytes": 10, "owner_completed": True},
        {"checkpoint_id": 2, "owner_checkpoint_id": 1, "units": [1], "num_subtasks": 1,
         "state_bytes": 10, "owner_completed": True},
    ]  # fmt: skip
    store = inspector.store
    store.remove(1)
    assert Inspector(store).refs()["owner_completed"].to_pylist() == [True, False, False]


def test_lag_view(inspector: Inspector) -> None:
    t = inspector.lag()
    assert t.schema == LAG_SCHEMA
    assert t.to_pylist() == [
        {"unit_id": 0, "unit_name": None, "reads": "part-0", "records_behind": None,
         "seconds_behind": None, "status": "fallback",
         "owner_checkpoint_id": 4, "checkpoints_behind": 1,
         "time_behind_ms": 10_000, "stuck_since": None, "reason": "timeout"},
        {"unit_id": 1, "unit_name": None, "reads": "part-1", "records_behind": None,
         "seconds_behind": None, "status": "fresh",
         "owner_checkpoint_id": 5, "checkpoints_behind": 0,
         "time_behind_ms": 0, "stuck_since": None, "reason": None},
    ]  # fmt: skip
    named = Inspector(inspector.store, names={0: "source[0]", 1: "source[1]"}).lag()
    assert named["unit_name"].to_pylist() == ["source[0]", "source[1]"]
    store = inspector.store
    store.remove(5)
    store.remove(4)
    lag = Inspector(store).lag()
    assert rows(lag, "unit_id", "checkpoints_behind", "time_behind_ms") == [
        (0, 0, 0),
        (1, 2, 20_000),
    ]
    store.remove(1)  # the owner's metadata is gone: the time is unknown
    assert Inspector(store).lag()["time_behind_ms"].to_pylist() == [0, None]
    assert Inspector(CompletedCheckpointStore()).lag().num_rows == 0


def test_summary_view(inspector: Inspector) -> None:
    t = inspector.summary()
    assert t.schema == SUMMARY_SCHEMA
    assert rows(t, "metric", "count", "min", "median", "max") == [
        ("completed", 5, None, None, None),
        ("global", 2, None, None, None),
        ("regional", 3, None, None, None),
        ("forced_global", 1, None, None, None),
        ("savepoint", 0, None, None, None),
        ("damaged", 0, None, None, None),
        ("duration_ms", 5, 100, 300.0, 500),
        ("state_bytes", 5, 27, 27.0, 27),
    ]
    empty = Inspector(CompletedCheckpointStore()).summary()
    assert rows(empty, "metric", "count", "median")[-1] == ("state_bytes", 0, None)


def test_diff_view(inspector: Inspector) -> None:
    t = inspector.diff(3, 5)
    assert t.schema == DIFF_SCHEMA
    assert rows(t, "vertex_id", "subtask_index", "unit_id", "change", "owner_a", "owner_b") == [
        ("map", 0, 0, "fell_back", 3, 4),
        ("source", 0, 0, "fell_back", 3, 4),
        ("source", 1, 1, "fresh", 1, 5),
    ]
    assert inspector.diff(2, 3)["change"].to_pylist() == ["fresh", "fresh", "unchanged_owner"]
    store = CompletedCheckpointStore(inspector.store.all())
    c5 = store.remove(5)
    store.add(msgspec.structs.replace(c5, subtasks=c5.subtasks[1:]))
    assert Inspector(store).diff(4, 5)["change"].to_pylist() == [
        "unchanged_owner",
        "removed",
        "fresh",
    ]
    assert Inspector(store).diff(5, 4)["change"].to_pylist() == ["fresh", "added", "fresh"]


def test_num_retained_must_be_positive(inspector: Inspector) -> None:
    with pytest.raises(InspectorInputError, match=r"num-retained must be at least 1 .got 0"):
        Inspector(inspector.store, num_retained=0)


def test_validate_reports_every_problem_and_the_restore_choice(job) -> None:
    _, storage, _ = job
    report = validate_job(storage)
    assert report.problems == () and report.restore_checkpoint_id == 5
    # unit 0's file of checkpoint 4 (needed by 4 and 5) corrupted at the same size
    with storage.filesystem.open_output_stream(f"{storage.job_path}/chk-4/u0-a0.state") as out:
        out.write(b"X" * 17)
    storage.delete_file("chk-3/u1-a0.state")  # unused: checkpoint 3's unit 1 is checkpoint 1's
    storage.delete_file("chk-1/u0-a0.state")  # needed by 1 and 2
    with storage.filesystem.open_output_stream(f"{storage.job_path}/chk-2/_metadata") as out:
        out.write(b"RGNL")
    table = validate_table(validate_job(storage))
    assert table.schema == VALIDATE_SCHEMA
    problems = rows(table, "checkpoint_id", "path", "problem")
    assert [p[:2] for p in problems] == [
        (1, "chk-1/u0-a0.state"),
        (2, "chk-2/_metadata"),
        (4, "chk-4/u0-a0.state"),
        (4, "chk-4/u0-a0.state"),
        (5, "chk-4/u0-a0.state"),
        (5, "chk-4/u0-a0.state"),
    ]
    assert problems[0][2] == "missing"
    assert "is truncated: 4 bytes" in problems[1][2]
    assert "segment at 0+10 fails its checksum" in problems[2][2]
    assert validate_job(storage).restore_checkpoint_id == 3
    assert validate_job(storage, verify_checksums=False).restore_checkpoint_id == 5


# -- CLI -----------------------------------------------------------------------------------


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["inspect", *argv])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    ("view", "header", "first_row"),
    [
        (["checkpoints"], "checkpoint_id  kind      trigger_time", "5  regional  2025-11-22"),
        (["show", "5"], "unit_id  vertex_id  subtask_index  status", "0  map"),
        (["refs"], "checkpoint_id  owner_checkpoint_id  units", "5                    4  0"),
        (["lag"], "unit_id  unit_name  reads   records_behind  seconds_behind  status",
         "0  source[0]  part-0"),
        (["summary"], "metric         count  min  median   max", "completed          5"),
        (["diff", "3", "5"], "vertex_id  subtask_index  unit_id  change", "map"),
    ],
)
def test_cli_views_as_tables(job, capsys, view, header, first_row) -> None:
    root = job[0]
    code, out, err = run(capsys, root, *view)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith(header) and set(lines[1]) <= {"-", " "}
    assert lines[2].strip().startswith(first_row)


@pytest.mark.parametrize(
    ("view", "expected"),
    [
        (["checkpoints"], {"checkpoint_id": 5, "kind": "regional", "retained": True}),
        (["show", "5"], {"unit_id": 0, "vertex_id": "map", "status": "fallback"}),
        (["refs"], {"checkpoint_id": 5, "owner_checkpoint_id": 4, "units": [0]}),
        (["lag"], {"unit_id": 0, "checkpoints_behind": 1, "time_behind_ms": 10000}),
        (["summary"], {"metric": "completed", "count": 5, "median": None}),
        (["diff", "3", "5"], {"vertex_id": "map", "change": "fell_back", "owner_b": 4}),
    ],
)
def test_cli_views_as_json(job, capsys, view, expected) -> None:
    root, storage, _ = job
    code, out, err = run(capsys, root, "--job", "orders", *view, "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert expected.items() <= data[0].items()
    table = getattr(Inspector(CompletedCheckpointStore.load(storage)), view[0])(*map(int, view[1:]))
    names = table.column_names
    assert [list(row) for row in data] == [names] * table.num_rows


def test_python_lag_view_is_what_the_cli_prints(job, capsys) -> None:
    """`job_inspector(storage).lag()` gives the rows `inspect ROOT lag --json` prints: the
    same unit names and consumer lag, not columns only the CLI adds."""
    root, storage, _ = job
    code, out, _ = run(capsys, root, "--job", "orders", "lag", "--json")
    assert code == 0
    rows = job_inspector(storage).lag().to_pylist()
    assert [r["unit_name"] for r in rows] == ["source[0]", "source[1]"]
    assert json.loads(out) == [{**r, "stuck_since": None} for r in rows]


def test_cli_checkpoints_json_keys_and_times(job, capsys) -> None:
    _, out, _ = run(capsys, job[0], "--num-retained", "1", "checkpoints", "--json")
    first = json.loads(out)[-1]
    assert first == {
        "checkpoint_id": 1,
        "kind": "global",
        "trigger_time": "2025-11-22T08:26:50Z",
        "complete_time": "2025-11-22T08:26:50.100000Z",
        "duration_ms": 100,
        "num_units": 2,
        "num_fallback_units": 0,
        "num_subtasks": 3,
        "num_fallback_subtasks": 0,
        "oldest_ref_checkpoint_id": None,
        "state_bytes": 27,
        "retained": False,
        "referenced_by": [],
        "reasons": [],
    }


def test_cli_validate(job, capsys) -> None:
    root, storage, _ = job
    code, out, err = run(capsys, root, "validate")
    assert code == 0 and err == ""
    assert out.splitlines()[-2:] == [
        "(no rows)",
        "a restore would use checkpoint 5 (5 checked, 0 problems)",
    ]
    storage.delete_file("chk-4/u0-a0.state")
    code, out, err = run(capsys, root, "validate")
    assert code == 1
    assert out.splitlines()[2:] == [
        "            4  chk-4/u0-a0.state  missing",
        "            5  chk-4/u0-a0.state  missing",
        "a restore would use checkpoint 3 (5 checked, 2 problems)",
    ]
    code, out, err = run(capsys, root, "validate", "--json", "--no-checksums")
    assert code == 1
    assert json.loads(out) == [
        {"checkpoint_id": 4, "path": "chk-4/u0-a0.state", "problem": "missing"},
        {"checkpoint_id": 5, "path": "chk-4/u0-a0.state", "problem": "missing"},
    ]
    assert err == "a restore would use checkpoint 3 (5 checked, 2 problems)\n"
    for cid in (1, 2, 3):
        storage.delete_file(f"chk-{cid}/_metadata")
    code, out, _ = run(capsys, root, "validate")
    assert (code, out.splitlines()[-1]) == (
        1,
        "no checkpoint is restorable (2 checked, 2 problems)",
    )


def test_cli_validate_empty_job(tmp_path, capsys) -> None:
    JobStorage(str(tmp_path), "fresh").write_state_file("chk-1/u0-a0.state", b"")
    code, out, _ = run(capsys, str(tmp_path), "validate")
    assert code == 0
    assert out.splitlines()[-1] == (
        "no completed checkpoint; a restore would start from the initial state "
        "(0 checked, 0 problems)"
    )


def test_cli_damaged_metadata_is_reported_not_fatal(job, capsys) -> None:
    root, storage, _ = job
    with storage.filesystem.open_output_stream(f"{storage.job_path}/chk-2/_metadata") as out:
        out.write(b"garbage!" * 4)
    code, out, err = run(capsys, root, "summary", "--json")
    assert code == 0
    assert err.startswith("warning: checkpoint 2 skipped: ")
    assert "chk-2/_metadata is not a regional checkpoint metadata file" in err
    assert {"metric": "damaged", "count": 1, "min": None, "median": None, "max": None} in (
        json.loads(out)
    )


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["{root}/nope", "checkpoints"], "checkpoint root '{root}/nope' does not exist"),
        (["{root}/orders/chk-1/_metadata", "lag"], "is a file, not a directory; check the path"),
        (["foo://x", "lag"], "'foo://x' is not a usable file system URI (Unrecognized"),
        (["{root}", "checkpoints"], "holds 2 jobs (orders, other); choose one with --job"),
        (["{root}", "--job", "x", "lag"], "job 'x' not found under '{root}'; jobs there: orders"),
        (["{root}", "--job", "orders", "show", "9"], "checkpoint 9 not found (completed: 1, 2"),
        (["{root}", "--job", "orders", "diff", "1", "7"], "checkpoint 7 not found"),
        (
            ["{root}", "--job", "orders", "--num-retained", "0", "checkpoints"],
            "--num-retained 0 is out of range",
        ),
    ],
)
def test_cli_errors_exit_2_with_one_line(job, capsys, argv, message) -> None:
    root, _, _ = job
    JobStorage(root, "other").write_state_file("chk-1/u0-a0.state", b"")
    code, out, err = run(capsys, *(a.format(root=root) for a in argv))
    assert code == 2 and out == ""
    assert err.startswith("regional inspect: ") and err.count("\n") == 1
    assert message.format(root=root) in err


def test_cli_usage_errors(job, capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["inspect", job[0], "show"])
    assert exc.value.code == 2
    assert "the following arguments are required: ID" in capsys.readouterr().err


@pytest.mark.s3
def test_cli_on_an_s3_root(s3_server, capsys) -> None:
    root = s3_server.uri(s3_server.new_bucket(), "checkpoints")
    build_job(JobStorage(root, "orders"))
    code, out, err = run(capsys, root, "refs", "--json")
    assert (code, err) == (0, "")
    assert [(r["checkpoint_id"], r["owner_checkpoint_id"]) for r in json.loads(out)] == [
        (5, 4),
        (3, 1),
        (2, 1),
    ]
    code, out, err = run(capsys, root, "validate")
    assert code == 0 and out.splitlines()[-1].startswith("a restore would use checkpoint 5")
    code, _, err = run(capsys, root, "--job", "nope", "lag")
    assert code == 2 and "testing:testing" not in err and "endpoint_override" not in err
    assert f"under 's3://{root.split('@')[1].split('?')[0]}'" in err


def test_cli_retention_view_shows_the_cleaners_plan_and_deletes_nothing(job, capsys) -> None:
    root, storage, _ = job
    before = sorted(f.path for f in storage.list_files())
    code, out, err = run(capsys, root, "--num-retained", "1", "retention", "--json")
    assert (code, err) == (0, "")
    rows = {(r["row"], r["checkpoint_id"], r["path"]): r for r in json.loads(out)}
    checkpoints = {
        cid: (r["action"], r["reason"], r["kept_by"])
        for (kind, cid, _), r in rows.items()
        if kind == "checkpoint"
    }
    assert checkpoints == {
        1: ("delete", "subsumed", []),
        2: ("delete", "subsumed", []),
        3: ("delete", "subsumed", []),
        4: ("keep-files", "referenced", [5]),
        5: ("keep", "retained", []),
    }
    assert rows[("file", 4, "chk-4/u0-a0.state")]["action"] == "keep"
    assert rows[("file", 4, "chk-4/_metadata")]["action"] == "delete"
    assert sorted(f.path for f in storage.list_files()) == before  # a view never deletes

    code, out, _ = run(capsys, root, "--num-retained", "1", "retention")
    assert code == 0
    assert out.splitlines()[0].startswith("row         checkpoint_id  path")
    assert "retained checkpoints: 5" in out


def test_lag_has_one_notion_of_lag_and_shows_stuck_units_from_the_event_log(job, capsys):
    """Issue 26 defect 5: `checkpoints_behind` 16 next to `consecutive_fallbacks` 3 for one
    unit (the streak counted only the retained checkpoints). One number now, explained under
    the table; a unit in the newest event's stuck list is `stuck`, with since when."""
    from metadata.events import CheckpointEvent, Outcome, StuckUnit, write_event

    root, storage, _ = job
    stuck = StuckUnit(
        unit_id=0, splits=("part-0",), since_ms=T0 + 50_500, owner_checkpoint_id=4, fallbacks=3,
        cause="timeout",
    )  # fmt: skip
    write_event(
        storage,
        CheckpointEvent(
            job_id="orders", checkpoint_id=5, kind=Outcome.REGIONAL, trigger_time_ms=T0 + 50_000,
            time_ms=T0 + 50_500, fresh_units=1, fallback_units=(0,), stuck=(stuck,),
        ),
    )  # fmt: skip
    code, out, err = run(capsys, root, "lag")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert "consecutive_fallbacks" not in lines[0]
    assert lines[2].split()[:7] == ["0", "source[0]", "part-0", "-", "-", "stuck", "4"]
    assert lines[-1] == LAG_HELP
    assert LAG_HELP.startswith(
        "checkpoints_behind: checkpoint ids since the checkpoint that wrote the unit's state"
    )
    code, out, _ = run(capsys, root, "lag", "--json")
    [row, _fresh] = json.loads(out)
    assert (row["status"], row["checkpoints_behind"]) == ("stuck", 1)
    assert row["stuck_since"] is not None


def test_lag_after_the_job_finished_names_the_splits_each_unit_read_last(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A final checkpoint holds no split (they all finished): `lag` names the ones each unit
    read last, from the checkpoints and events before it, instead of nothing."""
    import orders_job

    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    p = Pipeline("lag", records_per_epoch=4)
    p.source(
        GeneratorSource(2, lambda s, n: {"n": n}, records_per_split=6), parallelism=2, name="src"
    ).sink(ParquetSink(str(tmp_path / "t")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "lag", p, unit_timeout=30)
    assert (
        JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "lag"))
        .run()
        .finished
    )
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["unit_id"], r["reads"]) for r in rows] == [
        (0, "g0 (finished)"),
        (1, "g1 (finished)"),
    ]


def test_watermarks_after_the_job_finished_show_each_finished_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A final checkpoint holds no split: `watermarks` shows each split a source subtask read
    last, at +inf, with its last watermark and the checkpoint that held it."""
    import orders_job

    from regional.dataflow.pipeline import Pipeline
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    p = Pipeline("wm", records_per_epoch=4)
    p.source(
        GeneratorSource(2, lambda s, n: {"n": n, "ts": 1000 * n + s}, records_per_split=6),
        parallelism=2,
        name="src",
        event_time="ts",
    ).sink(ParquetSink(str(tmp_path / "t")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "wm", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "wm"))
    assert driver.run().finished
    capsys.readouterr()
    assert main(["inspect", root, "watermarks", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["split"], r["watermark"], r["held_by"]) for r in rows] == [
        ("g0", "+inf", "finished: its last watermark was 1970-01-01T00:00:03.000Z (checkpoint 1)"),
        ("g1", "+inf", "finished: its last watermark was 1970-01-01T00:00:03.001Z (checkpoint 1)"),
    ]


@pytest.mark.parametrize("num_retained", [1, 100])
def test_lag_after_the_job_finished_names_splits_that_left_every_retained_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], num_retained: int
) -> None:
    """Files finish well before the job (the exchange is still read): with one checkpoint
    retained none holds a split any more, and `lag` names what each source unit read last
    from the split enumerators' snapshots, as it does from the checkpoints when all are
    kept."""
    import orders_job

    from regional.policy import CheckpointingPolicy, Policy
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv

    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "orders", p, unit_timeout=30)
    policy = Policy(checkpointing=CheckpointingPolicy(num_retained=num_retained))
    storage = JobStorage(root, "orders")
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=storage, policy=policy)
    assert driver.run().finished
    kept = CompletedCheckpointStore.load(storage).all()
    holding = [c.checkpoint_id for c in kept if any(s.split_states for s in c.subtasks_of("files"))]
    assert bool(holding) == (num_retained == 100)  # else only the enumerators know the files
    capsys.readouterr()
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["unit_id"], r["reads"]) for r in rows] == [
        (0, "orders-03.jsonl (finished)"),
        (1, "orders-04.jsonl (finished)"),
        (2, "orders-05.jsonl (finished)"),
        (3, "n4-p0"),
        (4, "n4-p1"),
        (5, "n4-p2"),
        (6, "n4-p3"),
    ]


def test_watermarks_after_the_job_finished_name_splits_that_left_every_retained_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With one checkpoint retained, no checkpoint holds a split's last watermark: each split
    a source subtask read last (from the enumerators' snapshots) still gets its row at +inf,
    saying its last watermark is no longer recorded; a job without event time gets none."""
    import orders_job

    from regional.dataflow.pipeline import Pipeline
    from regional.policy import CheckpointingPolicy, Policy
    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv
    from regional.sinks.parquet import ParquetSink
    from regional.sources.generator import GeneratorSource

    policy = Policy(checkpointing=CheckpointingPolicy(num_retained=1))
    p = Pipeline("wm", records_per_epoch=4)
    p.source(
        GeneratorSource(2, lambda s, n: {"n": n, "ts": 1000 * n + s}, records_per_split=6),
        parallelism=2,
        name="src",
        event_time="ts",
    ).sink(ParquetSink(str(tmp_path / "t")), name="out")
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "wm", p, unit_timeout=30)
    storage = JobStorage(root, "wm")
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=storage, policy=policy)
    assert driver.run().finished
    newest = CompletedCheckpointStore.load(storage).latest()
    assert [c.checkpoint_id for c in CompletedCheckpointStore.load(storage).all()] == [3]
    capsys.readouterr()
    assert main(["inspect", root, "watermarks", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    gone = "finished before checkpoint 3, the oldest kept: its last watermark is no longer recorded"
    assert [(r["subtask"], r["unit"], r["split"], r["watermark"], r["held_by"]) for r in rows] == [
        (0, 0, "g0", "+inf", gone),
        (1, 1, "g1", "+inf", gone),
    ]
    assert newest is not None and all(not s.split_states for s in newest.subtasks)

    orders_job.write_orders(str(tmp_path / "orders"))
    untimed = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt-orders")
    env = TaskEnv(root, "orders", untimed, unit_timeout=30)
    storage = JobStorage(root, "orders")
    driver = JobDriver(untimed, orders_job.InProcessDispatcher(env), storage=storage, policy=policy)
    assert driver.run().finished
    capsys.readouterr()
    assert main(["inspect", root, "watermarks", "--json"]) == 0
    assert {r["kind"] for r in json.loads(capsys.readouterr().out)} == {"exchange"}


def test_lag_text_shows_time_behind_in_human_units_and_json_keeps_ms(job, capsys) -> None:
    """The report writes lag as `1 d 17 h`, not `149748.4 s`; `inspect lag` prints the same
    function's text (10 s behind: `10.0 s`), and `--json` keeps the milliseconds."""
    root = job[0]
    code, out, _ = run(capsys, root, "lag")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "unit_id", "unit_name", "reads", "records_behind", "seconds_behind", "status",
        "owner_checkpoint_id", "checkpoints_behind", "time_behind", "stuck_since", "reason",
    ]  # fmt: skip
    assert [line.split()[:9] for line in lines[2:4]] == [
        ["0", "source[0]", "part-0", "-", "-", "fallback", "4", "1", "10.0"],
        ["1", "source[1]", "part-1", "-", "-", "fresh", "5", "0", "0"],
    ]
    assert lines[2].split()[9] == "s" and lines[3].split()[9] == "ms"
    code, out, _ = run(capsys, root, "lag", "--json")
    assert code == 0
    assert [r["time_behind_ms"] for r in json.loads(out)] == [10_000, 0]
