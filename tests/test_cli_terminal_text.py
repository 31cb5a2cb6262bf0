"""Stored strings reach a terminal escaped (issue 41 item 7): a record or an error message
holding an escape sequence, other C0/C1 controls, DEL or a bidi override is printed by
`regional inspect ROOT dead-letters` and `inspect ROOT events` (tables and plain lines) with
those characters as escapes (`regional.cli.render.terminal_text`); `--json` keeps the exact
strings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import orders_job
import pytest

from metadata.storage import JobStorage
from regional.cli import main
from regional.cli.render import format_cell, terminal_text
from regional.dataflow.pipeline import Pipeline
from regional.policy import load_policy
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink
from regional.sources.generator import GeneratorSource

#: What a hostile record carries: a colour change, a window-title OSC ending in BEL, a C1 CSI,
#: DEL, a right-to-left override and an isolate, a tab and a newline.
HOSTILE = "\x1b[31mred\x1b]0;owned\x07 \x9b2J\x7f \u202egnp.exe\u2066 a\tb\nc"
ESCAPED = "\\x1b[31mred\\x1b]0;owned\\x07 \\x9b2J\\x7f \\u202egnp.exe\\u2066 a\\tb\\nc"
RAW = ("\x1b", "\x07", "\x9b", "\x7f", "\u202e", "\u2066")
#: The views show an error's first line.
FIRST_LINE, ESCAPED_FIRST_LINE = HOSTILE.split("\n")[0], ESCAPED.split("\\n")[0]


def _record(split: int, n: int) -> dict[str, Any]:
    return {"n": n, "text": HOSTILE}


def _check(r: dict[str, Any]) -> dict[str, Any]:
    if r["n"] == 1:
        raise ValueError(f"bad: {r['text']}")
    return {"n": r["n"]}


def _run(tmp_path: Path, on_error: str) -> str:
    dead = ParquetSink(str(tmp_path / "dead")) if on_error == "dead-letter" else None
    p = Pipeline("hostile", records_per_epoch=3, on_error=on_error, dead_letter=dead)
    src = p.source(GeneratorSource(1, _record, records_per_split=3), parallelism=1, name="src")
    src.map(_check, name="check").sink(ParquetSink(str(tmp_path / "out")), name="out")
    root = str(tmp_path / "ckpt")
    policy = load_policy(env={}, overrides={"checkpointing": {"timeout": "30 s"}}).policy
    env = TaskEnv(root, "hostile", p, unit_timeout=30)
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "hostile"), policy=policy
    )
    driver.run(max_checkpoints=2)
    return root


def test_terminal_text_escapes_controls_del_and_bidi_and_nothing_else() -> None:
    assert terminal_text(HOSTILE) == ESCAPED
    assert terminal_text("x\ny\x00", lines=True) == "x\ny\\x00"
    assert terminal_text("café ü → 日本 \\x1b") == "café ü → 日本 \\x1b"  # printable: as is
    assert format_cell(["a\x1b", {"k": "\u202e"}]) == "a\\x1b,\\u202e"


def test_inspect_dead_letters_prints_stored_strings_escaped_and_json_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path, "dead-letter")
    capsys.readouterr()
    assert main(["inspect", root, "dead-letters", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert json.loads(row["sample"]) == {"n": 1, "text": HOSTILE}
    assert row["error"] == f"bad: {FIRST_LINE}"
    assert main(["inspect", root, "dead-letters"]) == 0
    text = capsys.readouterr().out
    assert not any(c in text for c in RAW)
    _, _, line, summary = text.splitlines()  # header, rule, the one group, the summary
    assert line.split() == [
        "check",
        "user",
        "function",
        "error",
        "ValueError",
        "1",
        "1",
        "g0",
        "start",
        "+",
        "record",
        "1",
        *terminal_text(row["sample"]).split(" "),
        *f"bad: {ESCAPED_FIRST_LINE}".split(" "),
    ]
    assert summary.startswith("1 dead letter(s) committed in")


def test_inspect_events_prints_decline_causes_escaped_and_json_exact(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path, "fail")
    capsys.readouterr()
    assert main(["inspect", root, "events"]) == 0
    text = capsys.readouterr().out
    assert not any(c in text for c in RAW)
    _, _, *rows = text.splitlines()  # header, rule, the rows
    assert len(rows) == 2  # two checkpoints
    assert f"  0:declined: ValueError: bad: {ESCAPED_FIRST_LINE}  " in rows[0]
    assert main(["inspect", root, "events", "--json"]) == 0
    events = json.loads(capsys.readouterr().out)
    cause = f"declined: ValueError: bad: {FIRST_LINE}"
    assert events[0]["causes"] == [{"unit_id": 0, "cause": cause}]
