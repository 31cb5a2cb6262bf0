"""The report page: `render_html` turns a `regional.report.summary.Report` (Arrow tables) into one
self-contained HTML document — inline CSS and SVG, no script, no network (a Content Security
Policy forbids both), every string read from storage escaped. Pure: tables in, text out.
"""

from __future__ import annotations

import datetime as dt
import html
from collections import Counter
from collections.abc import Callable, Iterable, Sequence

from metadata.watermarks import format_watermark
from regional.report.dead_letters import REASONS
from regional.report.summary import Report

__all__ = ["render_html"]

#: The newest checkpoint attempts the timeline and lag charts show.
CHART_CHECKPOINTS = 500
#: The newest rows the timeline, retention and abort tables show.
TABLE_ROWS = 50

_KINDS = ("global", "regional", "savepoint", "aborted")

_CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:20px 28px;color:#1d2329;
max-width:1180px;background:#fff}
h1{font-size:21px;margin:0 0 4px}h2{font-size:16px;margin:26px 0 8px;padding-bottom:3px;
border-bottom:1px solid #d8dde3}summary{cursor:pointer;color:#5f6b76;margin:6px 0}
code{font-size:13px}.muted{color:#5f6b76}.note{color:#8a4b00}
table{border-collapse:collapse;font-size:12px}th,td{padding:2px 7px;text-align:left;
border-bottom:1px solid #eceff2;vertical-align:top}td.n,th.n{text-align:right;
font-variant-numeric:tabular-nums}.kpis{display:flex;gap:22px;margin:10px 0 4px;flex-wrap:wrap}
.kpi b{display:block;font-size:20px}.kpi{font-size:12px;color:#5f6b76}
.k-global{fill:#3b6fb6;background:#3b6fb6}.k-regional{fill:#5fb3b3;background:#5fb3b3}
.k-savepoint{fill:#8e6bbf;background:#8e6bbf}.k-aborted{fill:#d64541;background:#d64541}
.sw{display:inline-block;width:10px;height:10px;margin:0 4px 0 12px;border-radius:2px}
table.grid{font-size:10px}table.grid td,table.grid th{border:1px solid #fff;padding:0;
text-align:center;min-width:15px;height:15px}table.grid thead th{writing-mode:vertical-rl;
transform:rotate(180deg);color:#fff;font-weight:500;padding:3px 0}
table.grid tbody th{text-align:right;padding:0 6px;color:#5f6b76;font-weight:400;
white-space:nowrap}table.grid td{vertical-align:middle}
td.f{background:#cfe8cf}td.b{background:#f5b44a}td.x{background:#d64541;color:#fff}
td.a{background:#e6e8eb}svg text{font-size:11px;fill:#5f6b76}
.max{stroke:#d64541;fill:none;stroke-width:1.5}.mean{stroke:#3b6fb6;fill:none;stroke-width:1.5}
.scroll{overflow-x:auto}.kept{fill:#3b6fb6}.deletable{fill:#f5b44a}.axis{stroke:#c9d0d6}
"""
# No script and no network: the page renders offline, and injected markup could not run.
_CSP = "default-src 'none'; style-src 'unsafe-inline'"


def _e(value: object) -> str:
    """Escaped for HTML text and attribute values: every stored string goes through here."""
    return html.escape(str(value), quote=True)


def _when(value: dt.datetime | None) -> str:
    return "-" if value is None else value.strftime("%Y-%m-%d %H:%M:%S")


def _bytes(n: int | None) -> str:
    """1536 -> '1.5 KiB' (binary units)."""
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _files(n: int) -> str:
    return f"{n} file" if n == 1 else f"{n} files"


def _ms(n: int) -> str:
    return f"{n} ms" if n < 10_000 else f"{n / 1000:.1f} s"


def _id_runs(ids: Sequence[int]) -> str:
    """Checkpoint ids for people, consecutive ones as a range.

    >>> _id_runs([3, 5, 6, 7, 9])
    '3, 5-7, 9'
    """
    runs: list[list[int]] = []
    for i in ids:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ", ".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def human_span(ms: int) -> str:
    """A duration for people: the two largest units, rounded down.

    >>> [human_span(n) for n in (850, 4_200, 95_000, 149_748_400, 3_600_000)]
    ['850 ms', '4.2 s', '1 min 35 s', '1 d 17 h', '1 h']
    """
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    parts = []
    rest = ms // 1000
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "min"), (1, "s")):
        if rest >= size:
            parts.append(f"{rest // size} {unit}")
            rest %= size
        elif parts:
            break
        if len(parts) == 2:
            break
    return " ".join(parts)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], numeric: set[int]) -> str:
    """A table of already escaped cells; columns in `numeric` right-aligned."""
    head = "".join(
        f'<th class="n">{h}</th>' if i in numeric else f"<th>{h}</th>"
        for i, h in enumerate(headers)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="n">{c}</td>' if i in numeric else f"<td>{c}</td>"
            for i, c in enumerate(row)
        )
        + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _count(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _stuck_section(report: Report) -> str:
    """The units stuck after the newest checkpoint attempt: loud, above everything else."""
    rows = report.stuck.to_pylist()
    if not rows:
        return ""
    table = _table(
        ["unit (what it reads)", "stuck since (UTC)", "on the state of", "fallbacks", "cause"],
        (
            [
                _e(r["name"]),
                _when(r["since"]),
                "its initial state"
                if r["owner_checkpoint_id"] == 0
                else f"checkpoint {r['owner_checkpoint_id']}",
                str(r["fallbacks"]),
                _e(r["cause"]),
            ]
            for r in rows
        ),
        {3},
    )
    return (
        f'<h2 id="stuck">Stuck units ({len(rows)})</h2><p class="note">These units fell back '
        "in max-unit-fallbacks checkpoints in a row or more: checkpoints complete without them "
        "(the other units keep committing) and they are retried every epoch; the job fails "
        "once one stays stuck longer than max-stuck-time (docs/stuck-units.md).</p>" + table
    )


def _history_section(report: Report) -> str:
    """What happened before now: every stuck episode (also the ones that recovered), every
    driver restart, and the attempts that set records aside."""
    out = []
    episodes = report.episodes.to_pylist()
    if episodes:
        out.append(
            f'<h2 id="episodes">Stuck episodes ({len(episodes)})</h2><p class="muted">Every '
            "time a unit was stuck (over max-unit-fallbacks), also the ones that recovered.</p>"
            + _table(
                ["unit (what it reads)", "checkpoints", "stuck since (UTC)", "cause", "ended"],
                (
                    [
                        _e(r["name"]),
                        f"{r['first_checkpoint_id']}"
                        if r["first_checkpoint_id"] == r["last_checkpoint_id"]
                        else f"{r['first_checkpoint_id']}-{r['last_checkpoint_id']}",
                        _when(r["since"]),
                        _e(r["cause"]),
                        _e(r["ended"]),
                    ]
                    for r in episodes
                ),
                set(),
            )
        )
    restarts = report.restarts.to_pylist()
    if restarts:
        out.append(
            f'<h2 id="restarts">Driver restarts ({len(restarts)})</h2><p class="muted">A new '
            "driver restored a checkpoint; the attempts after it were discarded (their staged "
            "output deleted or rolled back, their work done again). Events written before "
            "drivers recorded their start show the newest completed checkpoint before.</p>"
            + _table(
                [
                    "at (UTC)",
                    "first checkpoint",
                    "restored from",
                    "discarded attempts",
                    "what the restore changed",
                ],
                (
                    [
                        _when(r["trigger_time"]),
                        str(r["first_checkpoint_id"]),
                        "its initial state"
                        if r["restored_from"] is None
                        else f"checkpoint {r['restored_from']}",
                        _id_runs(r["discarded"]) or "-",
                        _e("; ".join(r["notes"])) or "-",
                    ]
                    for r in restarts
                ),
                {1},
            )
        )
    dead = report.dead_letters.to_pylist()
    if dead:
        total = sum(r["records_dead_lettered"] for r in dead)
        late = sum(r["records_late"] for r in dead)
        out.append(
            f'<h2 id="dead-letters">Dead letters ({total:,}; late records {late:,})</h2>'
            '<p class="muted">Per checkpoint attempt, the records set aside: dead letters '
            "(regional inspect ROOT dead-letters: by operator and reason, with samples) and "
            "late records.</p>"
            + _table(
                ["checkpoint", "outcome", "dead letters", "late"],
                (
                    [
                        str(r["checkpoint_id"]),
                        _e(r["kind"]),
                        _count(r["records_dead_lettered"]),
                        _count(r["records_late"]),
                    ]
                    for r in dead[-CHART_CHECKPOINTS:]
                ),
                {0, 2, 3},
            )
        )
    return "".join(out)


def _committed_dead_letters_section(report: Report) -> str:
    """The committed dead letters by operator and reason (operator x reason, with totals),
    then per (operator, reason, error type) the checkpoints they came in and one sample
    position; one line when the job has no dead-letter sink or none could be read."""
    if not report.committed_dead_letters_read:
        return ""
    counts = report.dead_letter_counts.to_pylist()
    total = sum(r["records"] for r in counts)
    head = f'<h2 id="dead-letters-by-reason">Dead letters by operator and reason ({total:,})</h2>'
    note = f'<p class="note">{_e(report.dead_letter_note)}</p>' if report.dead_letter_note else ""
    if not counts:
        if note:
            return head + note
        return head + '<p class="muted">No dead letter committed.</p>'
    reasons = [r for r in REASONS if any(c["reason"] == r for c in counts)]
    operators = list(dict.fromkeys(c["operator"] for c in counts))
    cell = {(c["operator"], c["reason"]): c["records"] for c in counts}
    rows = [
        [_e(o)]
        + [_count(cell.get((o, r), 0)) for r in reasons]
        + [_count(sum(cell.get((o, r), 0) for r in reasons))]
        for o in operators
    ]
    rows.append(
        ["total"]
        + [_count(sum(cell.get((o, r), 0) for o in operators)) for r in reasons]
        + [_count(total)]
    )
    numeric = set(range(1, len(reasons) + 2))
    crosstab = _table(["operator", *(_e(r) for r in reasons), "total"], rows, numeric)
    groups = report.committed_dead_letters.to_pylist()
    samples = _table(
        [
            "operator",
            "reason",
            "error type",
            "dead letters",
            "checkpoints",
            "split",
            "first one at",
        ],
        (
            [
                _e(g["operator"]),
                _e(g["reason"]),
                _e(g["error_type"]),
                _count(g["records"]),
                _e(g["checkpoints"]),
                _e(g["split"]),
                _e(g["position"]),
            ]
            for g in groups
        ),
        {3},
    )
    return (
        head + '<p class="muted">The dead letters committed in the tables the newest checkpoint '
        "records (as regional inspect ROOT dead-letters reads them; a record late for several "
        "operators counts once per operator that judged it).</p>"
        + note
        + crosstab
        + '<h2 id="dead-letter-samples">Where the dead letters came from</h2>'
        '<p class="muted">Per operator, reason and error type: the checkpoints they came in and '
        "where the first one was read (regional dead-letters ROOT list shows each).</p>" + samples
    )


def _legend() -> str:
    return "".join(f'<span class="sw k-{k}"></span>{k}' for k in _KINDS)


def _timeline_section(report: Report) -> str:
    rows = report.timeline.to_pylist()
    if not rows:
        return '<h2 id="timeline">Checkpoint timeline</h2><p class="muted">No checkpoint yet.</p>'
    charted = rows[-CHART_CHECKPOINTS:]
    width, height, left = 960, 120, 48
    longest = max(r["duration_ms"] for r in charted) or 1
    step = (width - left) / len(charted)
    bars = []
    for i, r in enumerate(charted):
        h = max(2.0, r["duration_ms"] / longest * height)
        tip = f"checkpoint {r['checkpoint_id']} {r['kind']}, {_ms(r['duration_ms'])}, " + _when(
            r["trigger_time"]
        )
        bars.append(
            f'<rect class="k-{_e(r["kind"])}" x="{left + i * step:.1f}" y="{height - h:.1f}" '
            f'width="{max(step - 1, 0.6):.1f}" height="{h:.1f}"><title>{_e(tip)}</title></rect>'
        )
    svg = (
        f'<svg role="img" aria-label="checkpoint durations" width="{width}" '
        f'height="{height + 18}" viewBox="0 0 {width} {height + 18}">'
        f'<line class="axis" x1="{left}" y1="{height}" x2="{width}" y2="{height}"/>'
        f'<text x="0" y="10">{_e(_ms(longest))}</text><text x="0" y="{height}">0</text>'
        f'<text x="{left}" y="{height + 14}">{charted[0]["checkpoint_id"]}</text>'
        f'<text x="{width}" y="{height + 14}" text-anchor="end">'
        f"{charted[-1]['checkpoint_id']}</text>{''.join(bars)}</svg>"
    )
    table = _table(
        [
            "checkpoint",
            "kind",
            "triggered (UTC)",
            "duration",
            "units fallen back / failed",
            "rule",
            "records",
            "records/s",
            "dead letters",
        ],
        (
            [
                str(r["checkpoint_id"]),
                f'<span class="sw k-{_e(r["kind"])}"></span>{_e(r["kind"])}',
                _when(r["trigger_time"]),
                _ms(r["duration_ms"]),
                str(r["num_fallback_units"]),
                _e(r["abort_rule"] or ""),
                _count(r["records_in"]),
                "-" if r["records_per_s"] is None else f"{r['records_per_s']:,.0f}",
                _count(r["records_dead_lettered"]),
            ]
            for r in reversed(rows[-TABLE_ROWS:])
        ),
        {0, 3, 4, 6, 7, 8},
    )
    shown = f"the newest {len(charted)} of {len(rows)}" if len(charted) < len(rows) else "all"
    return (
        '<h2 id="timeline">Checkpoint timeline</h2>'
        f'<p class="muted">Duration of {shown} checkpoint attempts (bar height), oldest left.'
        f"{_legend()}</p>{svg}<details><summary>The newest {min(len(rows), TABLE_ROWS)} as a "
        f"table</summary>{table}</details>"
    )


def _grid_section(report: Report) -> str:
    kinds = dict(
        zip(
            report.timeline.column("checkpoint_id").to_pylist(),
            report.timeline.column("kind").to_pylist(),
            strict=True,
        )
    )
    cells: dict[tuple[int, int], dict[str, object]] = {
        (r["checkpoint_id"], r["unit_id"]): r for r in report.grid.to_pylist()
    }
    head = "".join(
        f'<th class="k-{_e(kinds[c])}" title="checkpoint {c}: {_e(kinds[c])}">{c}</th>'
        for c in report.grid_checkpoints
    )
    body = []
    for u in report.grid_units:
        name = report.unit_names.get(u) or f"unit {u}"  # `orders[1] (unit 1)`: id to type
        tds = []
        for c in report.grid_checkpoints:
            cell = cells.get((c, u))
            if cell is None:
                tds.append(f'<td class="{"a" if kinds[c] == "aborted" else "f"}"></td>')
            elif cell["status"] == "fallback":
                owner = cell["owner_checkpoint_id"]
                tip = (
                    f"{name}, checkpoint {c}: fell back to the state of checkpoint "
                    f"{'unknown (older than the event log)' if owner is None else owner}"
                )
                if cell["cause"]:
                    tip += f" - {cell['cause']}"
                label = "?" if owner is None else str(owner)
                tds.append(f'<td class="b" title="{_e(tip)}">{label}</td>')
            else:
                tip = f"{name}, checkpoint {c}: failed, checkpoint aborted"
                if cell["cause"]:
                    tip += f" - {cell['cause']}"
                tds.append(f'<td class="x" title="{_e(tip)}">&#215;</td>')
        body.append(f"<tr><th>{_e(name)}</th>{''.join(tds)}</tr>")
    notes = []
    if report.always_fresh_units:
        n = report.always_fresh_units
        notes.append(
            f"{n} unit{' was' if n == 1 else 's were'} fresh in every one of these checkpoints "
            "and {} not shown.".format("is" if n == 1 else "are")
        )
    if report.hidden_units:
        notes.append(
            f"{report.hidden_units} more units fell back or failed here; only the "
            f"{len(report.grid_units)} that did so most often are shown."
        )
    columns = len(report.grid_checkpoints)
    total = len(report.timeline)
    intro = (
        f"The newest {columns} of {total} checkpoint attempts"
        if columns < total
        else f"All {total} checkpoint attempts"
    )
    legend = (
        '<span class="sw" style="background:#cfe8cf"></span>fresh'
        '<span class="sw" style="background:#f5b44a"></span>fallback (the owner checkpoint '
        'whose state it re-uses)<span class="sw" style="background:#d64541"></span>failed '
        '(checkpoint aborted)<span class="sw" style="background:#e6e8eb"></span>aborted, '
        "answered. Hover a cell for the cause."
    )
    if not report.grid_units:
        grid = '<p class="muted">No unit fell back or failed in these checkpoints.</p>'
    else:
        grid = (
            f'<div class="scroll"><table class="grid"><thead><tr><th></th>{head}</tr>'
            f"</thead><tbody>{''.join(body)}</tbody></table></div>"
        )
    return (
        '<h2 id="grid">Units &#215; checkpoints</h2>'
        f'<p class="muted">{intro}, one column each, oldest left. {legend}</p>'
        + "".join(f'<p class="note">{_e(n)}</p>' for n in notes)
        + grid
    )


def _backlog_section(report: Report) -> str:
    """Consumer lag over the checkpoints (jobs whose sources say it): the records the sources
    have not read yet, in all, after each checkpoint attempt, and below it the age of the
    oldest of them where the sources tell it; nothing when none said."""
    rows = report.backlog.to_pylist()[-CHART_CHECKPOINTS:]
    if not rows:
        return ""
    records = _lag_plot(
        "consumer lag in records",
        [(r["checkpoint_id"], r["records_behind"]) for r in rows],
        str,
        [
            f"{r['records_behind']} records behind ("
            + ", ".join(f"{source} {n}" for source, n in r["by_source"])
            + ")"
            for r in rows
        ],
    )
    last = rows[-1]
    html = (
        '<h2 id="backlog">Consumer lag</h2><p class="muted">Records the sources have not read '
        "yet (a Kafka partition's end offset, a file's rows, minus where the next read starts), "
        "after each checkpoint attempt (from the event log; per split: regional inspect ROOT "
        f"lag). Latest: {last['records_behind']} behind after checkpoint "
        f"{last['checkpoint_id']}.</p>{records}"
    )
    timed = [r for r in rows if r["seconds_behind"] is not None]
    if not timed:
        return html
    ages = [(r["checkpoint_id"], round(r["seconds_behind"] * 1000)) for r in timed]
    plot = _lag_plot(
        "consumer lag in time",
        ages,
        human_span,
        [f"oldest unread record {human_span(ms)} old" for _, ms in ages],
    )
    return (
        html + '<p class="muted">The age of the oldest record not read yet, over all splits, '
        "at each checkpoint attempt (a Kafka record's timestamp, a file's modification time). "
        f"Latest: {human_span(ages[-1][1])} after checkpoint {ages[-1][0]}.</p>{plot}"
    )


def _lag_plot(
    label: str, points: Sequence[tuple[int, int]], shown: Callable[[int], str], tips: Sequence[str]
) -> str:
    """A line of (checkpoint id, value) from 0 to the largest value (`shown` writes the axis
    label), one hover tip per checkpoint (`tips`, not yet escaped)."""
    width, height, left = 960, 120, 64
    top = max(max(v for _, v in points), 1)
    step = (width - left) / len(points)
    line = " ".join(
        f"{left + i * step:.1f},{height - v / top * (height - 4):.1f}"
        for i, (_, v) in enumerate(points)
    )
    dots = "".join(
        f'<rect x="{left + i * step:.1f}" y="0" width="{step:.1f}" height="{height}" '
        f'fill="transparent"><title>checkpoint {cid}: {_e(tip)}</title></rect>'
        for i, ((cid, _), tip) in enumerate(zip(points, tips, strict=True))
    )
    return (
        f'<svg role="img" aria-label="{label}" width="{width}" height="{height + 18}" '
        f'viewBox="0 0 {width} {height + 18}">'
        f'<line class="axis" x1="{left}" y1="{height}" x2="{width}" y2="{height}"/>'
        f'<text x="0" y="10">{_e(shown(top))}</text><text x="0" y="{height}">0</text>'
        f'<text x="{left}" y="{height + 14}">{points[0][0]}</text>'
        f'<text x="{width}" y="{height + 14}" text-anchor="end">{points[-1][0]}</text>'
        f'<polyline class="max" points="{line}"/>{dots}</svg>'
    )


def _warnings_section(report: Report) -> str:
    """What went wrong without failing a checkpoint (a stalled input, a failed compaction),
    newest first; nothing when there was none."""
    rows = report.warnings.to_pylist()
    if not rows:
        return ""
    table = _table(
        ["checkpoint", "warning"],
        ([str(r["checkpoint_id"]), _e(r["warning"])] for r in reversed(rows[-TABLE_ROWS:])),
        {0},
    )
    return f'<h2 id="warnings">Warnings ({len(rows)})</h2>' + table


def _watermark_section(report: Report) -> str:
    """Event-time jobs only: per checkpoint the lowest unit watermark, who holds it, how far
    it is behind the checkpoint's trigger time, and the late records (newest last)."""
    rows = report.watermarks.to_pylist()[-CHART_CHECKPOINTS:]
    if not rows:
        return ""

    def cells(r: dict[str, object]) -> str:
        unit = "-" if r["watermark_unit"] is None else str(r["watermark_unit"])
        lag = r["lag_ms"]
        behind = "-" if not isinstance(lag, int) else human_span(lag)
        mark = r["watermark_ms"]
        assert isinstance(mark, int)
        return (
            f"<tr><td>{r['checkpoint_id']}</td><td>{_e(format_watermark(mark))}</td>"
            f"<td>{unit}</td><td>{behind}</td><td>{r['records_late']}</td></tr>"
        )

    body = "".join(cells(r) for r in rows)
    return (
        '<h2 id="watermarks">Watermarks</h2><p class="muted">Per checkpoint, the lowest '
        "event-time watermark of a unit fresh in it, the unit holding it, its lag behind the "
        "checkpoint's trigger time, and the records windows judged late "
        "(regional inspect ROOT watermarks: per split and exchange partition).</p>"
        "<table><tr><th>checkpoint</th><th>watermark</th><th>held by unit</th><th>lag</th>"
        f"<th>late</th></tr>{body}</table>"
    )


def _lag_section(report: Report) -> str:
    rows = report.lag.to_pylist()[-CHART_CHECKPOINTS:]
    if not rows:
        return (
            '<h2 id="lag">Unit lag</h2><p class="muted">No event log (events/): lag over time '
            "needs it.</p>"
        )
    width, height, left = 960, 140, 48
    top = max(max(r["max_lag"] for r in rows), 1)
    step = (width - left) / len(rows)

    def line(key: str) -> str:
        points = []
        for i, r in enumerate(rows):
            y = height - r[key] / top * (height - 4)
            points += [f"{left + i * step:.1f},{y:.1f}", f"{left + (i + 1) * step:.1f},{y:.1f}"]
        return " ".join(points)

    dots = "".join(
        f'<rect x="{left + i * step:.1f}" y="0" width="{step:.1f}" height="{height}" '
        f'fill="transparent"><title>checkpoint {r["checkpoint_id"]} ({_e(r["kind"])}): max '
        f"{r['max_lag']}, mean {r['mean_lag']:.2f}, {r['units_behind']} units behind</title></rect>"
        for i, r in enumerate(rows)
    )
    svg = (
        f'<svg role="img" aria-label="unit lag" width="{width}" height="{height + 18}" '
        f'viewBox="0 0 {width} {height + 18}">'
        f'<line class="axis" x1="{left}" y1="{height}" x2="{width}" y2="{height}"/>'
        f'<text x="0" y="10">{top}</text><text x="0" y="{height}">0</text>'
        f'<text x="{left}" y="{height + 14}">{rows[0]["checkpoint_id"]}</text>'
        f'<text x="{width}" y="{height + 14}" text-anchor="end">{rows[-1]["checkpoint_id"]}</text>'
        f'<polyline class="max" points="{line("max_lag")}"/>'
        f'<polyline class="mean" points="{line("mean_lag")}"/>{dots}</svg>'
    )
    worst = max(rows, key=lambda r: (r["max_lag"], r["checkpoint_id"]))
    return (
        '<h2 id="lag">Unit lag</h2><p class="muted">Checkpoint ids a unit\'s state is behind '
        "(since the checkpoint that wrote it, aborted attempts included), after each checkpoint "
        "attempt (from the event log): "
        '<span class="sw" style="background:#d64541"></span>max over units'
        '<span class="sw" style="background:#3b6fb6"></span>mean over '
        f"{report.num_units} units. Worst: {worst['max_lag']} after checkpoint "
        f"{worst['checkpoint_id']}.</p>{svg}"
    )


def _retention_section(report: Report) -> str:
    head = '<h2 id="retention">Retained vs deletable bytes</h2>'
    if report.totals.num_rows == 0:
        return head + '<p class="muted">No retention plan.</p>'
    t = report.totals.to_pylist()[0]
    kept, deletable = t["kept_bytes"] or 0, t["deleted_bytes"] or 0
    width = 960
    kept_w = width * kept / (kept + deletable) if kept + deletable else width
    svg = (
        f'<svg role="img" aria-label="retained vs deletable bytes" width="{width}" height="22" '
        f'viewBox="0 0 {width} 22"><rect class="kept" x="0" y="0" width="{kept_w:.1f}" '
        f'height="22"><title>kept {kept} bytes</title></rect><rect class="deletable" '
        f'x="{kept_w:.1f}" y="0" width="{width - kept_w:.1f}" height="22"><title>deletable '
        f"{deletable} bytes</title></rect></svg>"
    )
    retained = ", ".join(map(str, t["retained"] or [])) or "none"
    summary = (
        f'<p><span class="sw kept" style="background:#3b6fb6"></span>kept '
        f"<b>{_bytes(kept)}</b> in {_files(t['kept_files'])} "
        f'<span class="sw" style="background:#f5b44a"></span>deletable '
        f"<b>{_bytes(deletable)}</b> in {_files(t['deleted_files'])} (what "
        "<code>regional clean</code> would delete now). Retained checkpoints: "
        f"{_e(retained)}; keeping every referenced checkpoint whole would keep "
        f"{_bytes(t['whole_checkpoint_bytes'])}. State files kept: live / physical bytes "
        f"{_bytes(t['live_bytes'] or 0)} / {_bytes(t['physical_bytes'] or 0)} (a merged "
        "file stays whole while any segment of it is referenced).</p>"
    )
    if report.retention_note:
        summary += f'<p class="muted">Planned with {_e(report.retention_note)}.</p>'

    rows = [r for r in report.retention.to_pylist() if r["row"] == "checkpoint"]
    table = _table(
        ["checkpoint", "action", "reason", "kept", "deletable", "detail"],
        (
            [
                str(r["checkpoint_id"]),
                _e(r["action"]),
                _e(r["reason"]),
                _bytes(r["kept_bytes"]),
                _bytes(r["deleted_bytes"]),
                _e(r["detail"]),
            ]
            for r in reversed(rows[-TABLE_ROWS:])
        ),
        {0, 3, 4},
    )
    return head + svg + summary + (table if rows else "")


def _aborts_section(report: Report) -> str:
    rows = report.aborts.to_pylist()
    head = f'<h2 id="aborts">Aborted checkpoints ({len(rows)})</h2>'
    if not rows:
        return head + '<p class="muted">None in the event log.</p>'

    def causes(r: dict[str, object]) -> str:
        listed = r["causes"]
        assert isinstance(listed, list)
        if not listed:
            return _e(r["message"])
        names = report.unit_names
        items = "".join(
            f"<li>{_e(names.get(c['unit_id']) or 'unit ' + str(c['unit_id']))}: "
            f"{_e(c['cause'])}</li>"
            for c in listed
        )
        return f"{_e(r['message'])}<ul>{items}</ul>"

    table = _table(
        ["checkpoint", "triggered (UTC)", "rule", "failed units", "cause"],
        (
            [
                str(r["checkpoint_id"]),
                _when(r["trigger_time"]),
                _e(r["abort_rule"] or "-"),
                _e(", ".join(map(str, r["failed_units"])) or "-"),
                causes(r),
            ]
            for r in reversed(rows[-TABLE_ROWS:])
        ),
        {0},
    )
    more = (
        f'<p class="note">The newest {TABLE_ROWS} are listed.</p>' if len(rows) > TABLE_ROWS else ""
    )
    return head + more + table


def render_html(report: Report) -> str:
    """The page: one self-contained HTML document (inline CSS and SVG, no script)."""
    kinds = Counter(report.timeline.column("kind").to_pylist())
    kpis = [
        ("units", report.num_units),
        ("checkpoint attempts", len(report.timeline)),
        *((k, kinds.get(k, 0)) for k in _KINDS),
    ]
    job = _e(report.job_id)
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f'<meta http-equiv="Content-Security-Policy" content="{_CSP}">'
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>regional report: {job}</title><style>{_CSS}</style></head><body>"
        f"<h1>Job <code>{job}</code></h1>"
        '<div class="kpis">'
        + "".join(f'<div class="kpi"><b>{n}</b>{_e(k)}</div>' for k, n in kpis)
        + "</div>"
        + "".join(f'<p class="note">{_e(n)}</p>' for n in report.notes)
        + _stuck_section(report)
        + _warnings_section(report)
        + _history_section(report)
        + _committed_dead_letters_section(report)
        + _timeline_section(report)
        + _grid_section(report)
        + _lag_section(report)
        + _backlog_section(report)
        + _watermark_section(report)
        + _retention_section(report)
        + _aborts_section(report)
        + "</body></html>\n"
    )
