"""`regional inspect ROOT report --html FILE`: the report's tables on a job run by the real
driver in the simulator (which cells fell back to which owner, which aborts with which causes,
lag, bytes), escaping of hostile stored strings, the caps for 10,000 units, the command, and the
page rendered by headless Chromium (DOM after load, screenshot)."""

from __future__ import annotations

import re
import struct
from html.parser import HTMLParser
from pathlib import Path

import pytest
from browser import chromium
from pyarrow import fs as pafs

from cleaner.run import scan
from cleaner.views import retention_totals
from metadata.events import CheckpointEvent, Outcome, read_events, write_event
from metadata.model import CheckpointMetadata, SubtaskState, UnitState
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from regional.cli import main
from regional.policy import Policy
from regional.report.html import render_html
from regional.report.summary import GRID_CHECKPOINTS, GRID_UNITS, build_report
from regional.runtime.sim import Simulation

T0 = 1_763_800_000_000  # 2025-11-22 08:26:40 UTC
#: unit 3 falls back in 2 (declines) and 3 (hangs), unit 1 in 4; units 0-2 fail 5 (ratio 0.5)
FAULTS = {(2, 3): "decline", (3, 3): "hang", (4, 1): "decline"} | {
    (5, u): "decline" for u in (0, 1, 2)
}
HOSTILE = "<img src=x onerror=alert(1)>"
HOSTILE_CAUSE = "declined: </td><script>document.title='owned'</script> & \"quoted\""


def simulated(root: Path | None = None, **kwargs) -> tuple[Simulation, JobStorage]:
    """Six units run by the real driver with `FAULTS`; copied to `root` when given."""
    sim = Simulation(6, Policy(), faults=FAULTS, records_per_split=12, job_id="orders", **kwargs)
    sim.clock.now = T0
    result = sim.run(40)
    assert result.finished, result.failed
    if root is None:
        return sim, sim.storage
    pafs.copy_files(
        sim.storage.job_path.rsplit("/", 1)[0],
        str(root),
        source_filesystem=sim.storage.filesystem,
        destination_filesystem=pafs.LocalFileSystem(),
    )
    return sim, JobStorage(str(root), "orders")


def report_of(storage: JobStorage, num_retained: int = 3):
    events, problems = read_events(storage)
    assert problems == []
    plan = scan(storage, num_retained=num_retained, live_unknown=True)
    store = CompletedCheckpointStore.load(storage)
    return build_report(store.all(), events, plan, job_id=storage.job_id), plan


class Page(HTMLParser):
    """The grid's cells and headers, every element's tag, and the text of `<title>`."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.title = ""
        self.columns: list[int] = []
        self.cells: dict[tuple[int, int], tuple[str, str, str]] = {}  # (cid, unit) -> cell
        self._in: list[str] = []
        self._grid = False
        self._unit: int | None = None
        self._col = 0
        self._cell: dict[str, str] | None = None
        self._text = ""
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        self.tags.append(tag)
        if tag not in ("meta", "link", "br", "img", "input", "hr"):  # void: no end tag
            self._in.append(tag)
        if tag == "table" and a.get("class") == "grid":
            self._grid = True
        if self._grid and tag == "tr":
            self._unit, self._col = None, 0
        if self._grid and tag in ("th", "td"):
            self._cell, self._text = a, ""

    def handle_endtag(self, tag: str) -> None:
        while self._in and self._in.pop() != tag:
            pass
        if tag == "table":
            self._grid = False
        if not self._grid or self._cell is None or tag not in ("th", "td"):
            return
        text = self._text.strip()
        if tag == "th" and "thead" in self._in and text:
            self.columns.append(int(text))
        elif tag == "th" and (unit := re.search(r"\bunit (\d+)\b", text)):
            self._unit = int(unit[1])  # `unit 3`, `unit 3 (s3)` or `orders[3] (unit 3)`
        elif tag == "td":
            assert self._unit is not None
            cid = self.columns[self._col]
            self.cells[(cid, self._unit)] = (
                self._cell.get("class", ""),
                text,
                self._cell.get("title", ""),
            )
            self._col += 1
        self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._text += data
        if self._in[-2:] == ["head", "title"]:
            self.title += data


# -- the tables and the page -------------------------------------------------------------


def test_grid_cells_fall_back_to_their_owners_and_failed_cells_name_the_cause() -> None:
    _, storage = simulated()
    report, _ = report_of(storage)
    assert report.num_units == 6
    assert report.grid_checkpoints == tuple(range(1, 13))
    assert report.grid_units == (0, 1, 2, 3) and report.always_fresh_units == 2
    aborted = "declined: injected"  # each failed unit's own cause (AbortCheckpoint.causes)
    assert report.grid.to_pylist() == [
        dict(checkpoint_id=2, unit_id=3, status="fallback", owner_checkpoint_id=1,
             cause="declined: injected"),
        dict(checkpoint_id=3, unit_id=3, status="fallback", owner_checkpoint_id=1,
             cause="timeout: no answer after 120 s"),
        dict(checkpoint_id=4, unit_id=1, status="fallback", owner_checkpoint_id=3,
             cause="declined: injected"),
        *(
            dict(checkpoint_id=5, unit_id=u, status="failed", owner_checkpoint_id=None,
                 cause=aborted)
            for u in (0, 1, 2)
        ),
    ]  # fmt: skip

    page = Page(render_html(report))
    assert page.columns == list(range(1, 13))
    assert page.cells[(2, 3)] == (
        "b",
        "1",
        "unit 3 (s3), checkpoint 2: fell back to the state of checkpoint 1 - declined: injected",
    )
    assert page.cells[(4, 1)][:2] == ("b", "3")
    assert page.cells[(5, 0)] == ("x", "\u00d7", f"unit 0 (s6), checkpoint 5: failed, checkpoint "
                                  f"aborted - {aborted}")  # fmt: skip
    assert page.cells[(5, 3)] == ("a", "", "")  # answered, but the checkpoint aborted
    assert page.cells[(6, 3)] == ("f", "", "")
    fallback = sorted(k for k, (cls, _, _) in page.cells.items() if cls == "b")
    assert fallback == [(2, 3), (3, 3), (4, 1)]
    assert len(page.cells) == 12 * 4


def test_metadata_gives_the_owner_when_the_event_log_no_longer_does() -> None:
    sim = Simulation(6, Policy(), faults={(6, 2): "decline", (7, 2): "hang"}, bounded=False)
    sim.run(8)
    events, _ = read_events(sim.storage)
    store = CompletedCheckpointStore.load(sim.storage)
    assert {6, 7} <= set(store.ids())
    newest_only = [e for e in events if e.checkpoint_id >= 6]  # older events were cleaned
    report = build_report(store.all(), newest_only, job_id="sim")
    assert [(r["checkpoint_id"], r["owner_checkpoint_id"], r["cause"]) for r in
            report.grid.to_pylist()] == [(6, 5, "declined: injected"),
                                         (7, 5, "timeout: no answer after 120 s")]  # fmt: skip
    without_metadata = build_report([], newest_only, job_id="sim")
    assert [r["owner_checkpoint_id"] for r in without_metadata.grid.to_pylist()] == [None, None]
    assert Page(render_html(without_metadata)).cells[(6, 2)][1] == "?"


def test_timeline_lag_aborts_and_bytes() -> None:
    _, storage = simulated()
    report, plan = report_of(storage)
    timeline = report.timeline.to_pylist()
    assert [(r["checkpoint_id"], r["kind"], r["duration_ms"]) for r in timeline[:6]] == [
        (1, "global", 10),
        (2, "regional", 10),
        (3, "regional", 120_000),  # unit 3 hung until the timeout
        (4, "regional", 10),
        (5, "aborted", 10),
        (6, "global", 10),
    ]
    assert [r["has_metadata"] for r in timeline] == [False] * 9 + [True] * 3
    assert timeline[4]["abort_rule"] == "3c-failure-ratio"
    lag = [(r["checkpoint_id"], r["max_lag"], r["units_behind"]) for r in report.lag.to_pylist()]
    assert lag[:6] == [(1, 0, 0), (2, 1, 1), (3, 2, 1), (4, 1, 1), (5, 1, 1), (6, 0, 0)]
    assert report.lag.column("mean_lag").to_pylist()[2] == pytest.approx(2 / 6)
    [abort] = report.aborts.to_pylist()
    assert (abort["checkpoint_id"], abort["abort_rule"], abort["failed_units"]) == (
        5,
        "3c-failure-ratio",
        [0, 1, 2],
    )
    page = render_html(report)
    totals = retention_totals(plan).to_pylist()[0]
    assert f"<title>kept {totals['kept_bytes']} bytes</title>" in page
    assert f"<title>deletable {totals['deleted_bytes']} bytes</title>" in page
    assert '<h2 id="aborts">Aborted checkpoints (1)</h2>' in page
    assert "<td>3c-failure-ratio</td><td>0, 1, 2</td><td>checkpoint 5 aborted (rule 3c)" in page


def hostile_root(root: Path) -> JobStorage:
    """A job whose id and stored causes are markup: two checkpoints and an aborted one."""
    storage = JobStorage(str(root), HOSTILE)

    def md(cid: int, kind: str, fallback: bool) -> CheckpointMetadata:
        return CheckpointMetadata(
            checkpoint_id=cid,
            job_id=HOSTILE,
            kind=kind,
            trigger_time_ms=T0 + cid * 1000,
            completion_time_ms=T0 + cid * 1000 + 40,
            units=(UnitState(0), UnitState(1, 1, HOSTILE_CAUSE) if fallback else UnitState(1)),
            subtasks=(
                SubtaskState("src", 0, 0),
                SubtaskState("src", 1, 1, ref_checkpoint_id=1 if fallback else None),
            ),
        )

    for m in (md(1, "global", False), md(2, "regional", True)):
        storage.write_metadata(m)
    for cid, kind, failed in ((1, Outcome.GLOBAL, ()), (2, Outcome.REGIONAL, (1,)),
                              (3, Outcome.ABORTED, (0, 1))):  # fmt: skip
        write_event(
            storage,
            CheckpointEvent(
                job_id=HOSTILE,
                checkpoint_id=cid,
                kind=kind,
                trigger_time_ms=T0 + cid * 1000,
                time_ms=T0 + cid * 1000 + 50,
                fresh_units=2 - len(failed),
                fallback_units=failed,
                causes={u: HOSTILE_CAUSE for u in failed},
                abort_rule="3a-must-be-fresh<b>" if kind is Outcome.ABORTED else None,
                message=f"split <s3://x/{HOSTILE}> failed" if kind is Outcome.ABORTED else "",
            ),
        )
    return storage


def test_every_stored_string_is_escaped(tmp_path: Path) -> None:
    report, _ = report_of(hostile_root(tmp_path))
    page = render_html(report)
    for raw in (HOSTILE, HOSTILE_CAUSE, "<script>", "<img", "fresh<b>", "<s3:"):
        assert raw not in page
    assert "<td>3a-must-be-fresh&lt;b&gt;</td>" in page
    assert "<title>regional report: &lt;img src=x onerror=alert(1)&gt;</title>" in page
    assert "<li>unit 1: declined: &lt;/td&gt;&lt;script&gt;document.title=&#x27;owned&#x27;" in page
    parsed = Page(page)
    assert {"script", "img", "s3:"} & set(parsed.tags) == set()
    assert parsed.cells[(2, 1)] == (
        "b",
        "1",
        f"unit 1, checkpoint 2: fell back to the state of checkpoint 1 - {HOSTILE_CAUSE}",
    )


def test_a_job_of_10000_units_keeps_the_page_small() -> None:
    units, rounds = 10_000, 80
    events = [CheckpointEvent(job_id="big", checkpoint_id=1, kind=Outcome.GLOBAL,
                              trigger_time_ms=0, time_ms=5, fresh_units=units)]  # fmt: skip
    for cid in range(2, rounds + 1):  # unit 9999 always falls back; three others each time
        failed = tuple(sorted({9999, *((cid * 37 + k * 1000) % units for k in range(3))}))
        events.append(
            CheckpointEvent(
                job_id="big",
                checkpoint_id=cid,
                kind=Outcome.REGIONAL,
                trigger_time_ms=cid * 1000,
                time_ms=cid * 1000 + 5,
                fresh_units=units - len(failed),
                fallback_units=failed,
                causes={u: "timeout" for u in failed},
                unit_lag={u: 1 for u in failed} | {9999: cid - 1},
            )
        )
    report = build_report([], events, job_id="big")
    newest = range(rounds - GRID_CHECKPOINTS + 1, rounds + 1)
    behind = {9999} | {(c * 37 + k * 1000) % units for c in newest for k in range(3)}
    assert report.grid_checkpoints == tuple(newest)
    assert len(report.grid_units) == GRID_UNITS and 9999 in report.grid_units
    assert report.hidden_units == len(behind) - GRID_UNITS
    assert report.always_fresh_units == units - len(behind)
    cells = {(r["checkpoint_id"], r["unit_id"]): r for r in report.grid.to_pylist()}
    assert cells[(rounds, 9999)]["owner_checkpoint_id"] == 1
    page = render_html(report)
    assert len(page.encode()) < 300_000
    assert f"{units - len(behind)} units were fresh in every one of these checkpoints" in page
    assert f"{len(behind) - GRID_UNITS} more units fell back or failed here" in page
    assert len(Page(page).cells) == GRID_CHECKPOINTS * GRID_UNITS


# -- the command -----------------------------------------------------------------------------


def test_cli_writes_the_page_and_says_where(tmp_path: Path, capsys) -> None:
    simulated(tmp_path / "ckpt")
    out_file = tmp_path / "report.html"
    code = main(["inspect", str(tmp_path / "ckpt"), "report", "--html", str(out_file)])
    out, err = capsys.readouterr()
    page = out_file.read_text(encoding="utf-8")
    size = len(page.encode()) // 1024 + 1
    assert (code, err) == (0, "")
    assert out == (
        f"report of job orders written to {out_file} (12 checkpoint attempts, {size} KiB)\n"
    )
    assert "Planned with num-retained 3 (recorded in checkpoint 12)." in page

    assert main(["inspect", str(tmp_path / "ckpt"), "report", "--html", "-"]) == 0
    assert capsys.readouterr().out == page


def test_cli_refuses_a_file_it_cannot_write(tmp_path: Path, capsys) -> None:
    simulated(tmp_path / "ckpt")
    target = tmp_path / "missing" / "r.html"
    code = main(["inspect", str(tmp_path / "ckpt"), "report", "--html", str(target)])
    assert code == 2
    assert capsys.readouterr().err == (
        f"regional inspect: cannot write the report to '{target}' (No such file or directory); "
        "pass --html with a path in an existing, writable directory, or '-' for stdout\n"
    )


# -- in a browser ------------------------------------------------------------------------------


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def test_the_page_renders_in_headless_chromium(tmp_path: Path, capsys) -> None:
    simulated(tmp_path / "ckpt")
    out_file = tmp_path / "report.html"
    assert main(["inspect", str(tmp_path / "ckpt"), "report", "--html", str(out_file)]) == 0
    dom, png = chromium(out_file, tmp_path, (1200, 900))
    page = Page(dom)
    assert page.columns == list(range(1, 13))
    assert len(page.cells) == 12 * 4
    classes = sorted(cls for cls, _, _ in page.cells.values())
    assert classes.count("b") == 3 and classes.count("x") == 3 and classes.count("a") == 1
    assert page.cells[(4, 1)][:2] == ("b", "3")
    assert page.tags.count("svg") == 3 and "script" not in page.tags
    assert png_size(png) == (1200, 900) and len(png) > 10_000


def test_hostile_strings_stay_text_in_the_browser(tmp_path: Path, capsys) -> None:
    hostile_root(tmp_path / "ckpt")
    out_file = tmp_path / "report.html"
    assert main(["inspect", str(tmp_path / "ckpt"), "report", "--html", str(out_file)]) == 0
    dom, png = chromium(out_file, tmp_path, (800, 600))
    page = Page(dom)
    assert page.title == f"regional report: {HOSTILE}"  # the payload did not set the title
    assert {"script", "img", "s3:"} & set(page.tags) == set()
    assert f"split <s3://x/{HOSTILE}> failed" in dom.replace("&lt;", "<").replace("&gt;", ">")
    assert page.cells[(3, 0)][0] == "x" and HOSTILE_CAUSE in page.cells[(3, 0)][2]
    assert png_size(png) == (800, 600)


def test_a_job_without_checkpoints_gets_a_page_that_says_so() -> None:
    page = render_html(build_report([], [], job_id="new"))
    assert 'Checkpoint timeline</h2><p class="muted">No checkpoint yet.</p>' in page
    assert "No unit fell back or failed in these checkpoints." in page
    assert "No event log (events/): lag over time needs it." in page
    assert '<h2 id="aborts">Aborted checkpoints (0)</h2>' in page


def test_stuck_units_dead_letters_and_records_per_second_are_on_the_page() -> None:
    """Issue 26: the report shows the stuck units by name (what they read), and per
    checkpoint the records read, records/s and the dead letters."""
    from metadata.events import StuckUnit

    stuck = StuckUnit(
        unit_id=3, splits=("events:3",), since_ms=T0 + 2_000, owner_checkpoint_id=1,
        fallbacks=3, cause="declined: ValueError: bad record",
    )  # fmt: skip
    events = [
        CheckpointEvent(
            job_id="j", checkpoint_id=1, kind=Outcome.GLOBAL, trigger_time_ms=T0,
            time_ms=T0 + 500, fresh_units=4, records_in=1_000, records_dead_lettered=2,
        ),
        CheckpointEvent(
            job_id="j", checkpoint_id=2, kind=Outcome.REGIONAL, trigger_time_ms=T0 + 1_000,
            time_ms=T0 + 1_250, fresh_units=3, fallback_units=(3,), records_in=750,
            causes={3: "declined: ValueError: bad record"}, unit_reads={3: ("events:3",)},
            stuck=(stuck,),
        ),
    ]  # fmt: skip
    report = build_report([], events, job_id="j")
    assert report.timeline.select(
        ["checkpoint_id", "records_in", "records_per_s", "records_dead_lettered"]
    ).to_pylist() == [
        {"checkpoint_id": 1, "records_in": 1_000, "records_per_s": 2_000.0,
         "records_dead_lettered": 2},
        {"checkpoint_id": 2, "records_in": 750, "records_per_s": 3_000.0,
         "records_dead_lettered": 0},
    ]  # fmt: skip
    assert report.stuck.select(["name", "fallbacks"]).to_pylist() == [
        {"name": "unit 3 (events:3)", "fallbacks": 3}
    ]
    page = render_html(report)
    assert '<h2 id="stuck">Stuck units (1)</h2>' in page
    assert "<td>unit 3 (events:3)</td>" in page
    assert '<th class="n">records/s</th>' in page and '<td class="n">3,000</td>' in page
    assert '<th class="n">dead letters</th>' in page
    assert page.index('id="stuck"') < page.index('id="timeline"')  # loud: first


def test_the_page_keeps_history_stuck_episodes_driver_restarts_and_dead_letters() -> None:
    """Issue 36: a unit stuck at checkpoints 3-4 that recovers at 5 leaves an episode; a driver
    that crashed after 5 (attempt 6 left no outcome) and restored shows as a restart; the
    attempts that set records aside are listed; the watermark lag is in human units."""
    from metadata.events import StuckUnit

    def stuck(cid: int) -> tuple[StuckUnit, ...]:
        return (
            StuckUnit(
                unit_id=3, splits=("events:3",), since_ms=T0 + 2_000, owner_checkpoint_id=2,
                fallbacks=cid - 1, cause="declined: ValueError: bad record",
            ),
        )  # fmt: skip

    def event(cid: int, kind: Outcome, counts: tuple[int, int], **kw: object) -> CheckpointEvent:
        return CheckpointEvent(
            job_id="j", checkpoint_id=cid, kind=kind, trigger_time_ms=T0 + cid * 1_000,
            time_ms=T0 + cid * 1_000 + 100, fresh_units=4,
            global_checkpoint_count=counts[0], regional_checkpoint_count=counts[1], **kw,
        )  # fmt: skip

    events = [
        event(1, Outcome.GLOBAL, (1, 0)),
        event(2, Outcome.REGIONAL, (1, 1), fallback_units=(3,)),
        event(3, Outcome.REGIONAL, (1, 2), fallback_units=(3,), stuck=stuck(3)),
        event(4, Outcome.REGIONAL, (1, 3), fallback_units=(3,), stuck=stuck(4),
              records_dead_lettered=4, records_late=2),
        event(5, Outcome.GLOBAL, (2, 3), watermark_ms=T0 - 149_748_400, watermark_unit=1),
        # the driver crashed in attempt 6; a new one restored checkpoint 5
        event(7, Outcome.GLOBAL, (1, 0), records_late=1),
    ]  # fmt: skip
    report = build_report([], events, job_id="j")
    assert report.episodes.select(
        ["unit_id", "first_checkpoint_id", "last_checkpoint_id", "ended"]
    ).to_pylist() == [
        {"unit_id": 3, "first_checkpoint_id": 3, "last_checkpoint_id": 4,
         "ended": "recovered at checkpoint 5"},
    ]  # fmt: skip
    assert report.restarts.select(
        ["first_checkpoint_id", "restored_from", "discarded"]
    ).to_pylist() == [{"first_checkpoint_id": 7, "restored_from": 5, "discarded": [6]}]
    assert report.dead_letters.to_pylist() == [
        {"checkpoint_id": 4, "kind": "regional", "records_dead_lettered": 4, "records_late": 2},
        {"checkpoint_id": 7, "kind": "global", "records_dead_lettered": 0, "records_late": 1},
    ]
    assert report.stuck.num_rows == 0  # nobody is stuck now: the history still says who was
    page = render_html(report)
    assert '<h2 id="episodes">Stuck episodes (1)</h2>' in page
    assert "<td>unit 3 (events:3)</td><td>3-4</td>" in page
    assert "<td>recovered at checkpoint 5</td>" in page
    assert '<h2 id="restarts">Driver restarts (1)</h2>' in page
    assert "<td>checkpoint 5</td><td>6</td>" in page
    assert '<h2 id="dead-letters">Dead letters (4; late records 3)</h2>' in page
    assert "<td>1 d 17 h</td>" in page  # the watermark's lag, in human units
    assert page.index('id="episodes"') < page.index('id="timeline"')


class Sections(HTMLParser):
    """Per `<h2 id=...>` of a page: the rows (cell texts) of the table that follows it."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.rows: dict[str, list[list[str]]] = {}
        self.order: list[str] = []
        self._section: str | None = None
        self._row: list[str] | None = None
        self._cell: str | None = None
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "h2" and a.get("id"):
            self._section = a["id"]
            self.order.append(str(self._section))
            self.rows[str(self._section)] = []
        elif tag == "tr" and self._section is not None:
            self._row = []
        elif tag == "td" and self._row is not None:
            self._cell = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "td" and self._row is not None and self._cell is not None:
            self._row.append(self._cell.strip())
            self._cell = None
        elif tag == "tr" and self._row and self._section is not None:
            self.rows[self._section].append(self._row)
            self._row = None
        elif tag == "table":
            self._section = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell += data


def test_a_real_job_leaves_its_stuck_episode_and_driver_restart_on_the_page(
    tmp_path: Path, capsys
) -> None:
    """Issue 36, in a browser: unit 4 fails checkpoints 2-4 (stuck at 3 with
    max-unit-fallbacks 2) and recovers at 5; the driver crashes at 6 after its metadata is
    written, and a new one restores checkpoint 6 (not 5: nothing was discarded) and finishes.
    The page shows both once the job is done and nobody is stuck."""
    import orders_job

    from regional.policy import CheckpointingPolicy, RegionPolicy
    from regional.runtime.driver import JobDriver
    from regional.runtime.faults import DriverCrash, Faults
    from regional.runtime.task import TaskEnv

    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    policy = Policy(checkpointing=CheckpointingPolicy(region=RegionPolicy(max_unit_fallbacks=2)))
    faults = Faults(units={(c, 4): "fail" for c in (2, 3, 4)}, crash_at=(6, "after-metadata"))
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=faults.unit_faults())
    first = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"),
        faults=faults, policy=policy,
    )  # fmt: skip
    with pytest.raises(DriverCrash):
        first.run()
    env = TaskEnv(root, "orders", p, unit_timeout=30)
    second = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"), policy=policy
    )
    assert second.run().finished and second.restored_from == 6
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()

    out_file = tmp_path / "report.html"
    assert main(["inspect", root, "report", "--html", str(out_file)]) == 0
    dom, _ = chromium(out_file, tmp_path, (1200, 900))
    page = Sections(dom)
    assert page.order[:2] == ["episodes", "restarts"]  # the history first
    [episode] = page.rows["episodes"]
    assert [episode[0], episode[1], episode[3], episode[4]] == [
        "by-customer[1] (unit 4)",
        "3-4",
        "declined: InjectedFault: unit 4 fails checkpoint 4 (injected fault)",
        "recovered at checkpoint 5",
    ]
    [restart] = page.rows["restarts"]
    assert restart[1:] == ["7", "checkpoint 6", "-", "-"]


def test_driver_restarts_are_what_the_new_driver_recorded() -> None:
    """A driver records its start in its first event: the job's first start is no restart; a
    later one names the checkpoint restored, the attempts after it that were thrown away (5
    completed but was rolled back, 6 left no outcome) and what the restore changed."""
    from metadata.events import DriverStart

    def event(cid: int, started: DriverStart | None = None) -> CheckpointEvent:
        return CheckpointEvent(
            job_id="j", checkpoint_id=cid, kind=Outcome.GLOBAL, trigger_time_ms=T0 + cid * 1_000,
            time_ms=T0 + cid * 1_000 + 100, fresh_units=2, global_checkpoint_count=cid,
            started=started,
        )  # fmt: skip

    note = (
        "sink 'out' holds commits of commit user 'u' up to 5, newer than the restored checkpoint 4"
    )
    events = [
        event(1, DriverStart()),
        *(event(c) for c in range(2, 6)),
        event(7, DriverStart(restored_from=4, location="chk-4", notes=(note,))),
    ]
    report = build_report([], events, job_id="j")
    assert report.restarts.select(
        ["first_checkpoint_id", "restored_from", "discarded", "notes"]
    ).to_pylist() == [
        {"first_checkpoint_id": 7, "restored_from": 4, "discarded": [5, 6], "notes": [note]}
    ]
    page = render_html(report)
    assert "<td>checkpoint 4</td><td>5-6</td><td>sink &#x27;out&#x27; holds commits" in page
