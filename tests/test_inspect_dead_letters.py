"""`regional inspect ROOT dead-letters`: the committed dead letters of a job by operator and
reason, with samples and where each was read (`regional.report.dead_letters`)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orders_job
import pyarrow as pa
import pytest
import windows_job as job
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.storage import JobStorage
from regional.cli import main
from regional.dataflow.dead_letters import DEAD_LETTER_SCHEMA
from regional.report.dead_letters import dead_letter_view, reason_counts, reason_of
from regional.runtime.driver import JobDriver
from regional.runtime.task import TaskEnv
from regional.sinks.parquet import ParquetSink


def _run(tmp_path: Path) -> str:
    """The windows job after an exchange, with the poison check upstream: late clicks and
    poison clicks become dead letters."""
    p = job.pipeline(
        "tumbling",
        str(tmp_path / "table"),
        partitions=2,
        parallelism=job.SPLITS,
        on_late="dead-letter",
        dead_letter=ParquetSink(str(tmp_path / "dead")),
        checked=True,
    )
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "clicks", p, unit_timeout=30)
    driver = JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "clicks"))
    assert driver.run().finished
    return root


def test_dead_letters_are_counted_by_operator_and_reason_with_samples(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = _run(tmp_path)
    assert main(["inspect", root, "dead-letters", "--samples", "2", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    groups = {(r["operator"], r["reason"], r["error_type"], r["records"]) for r in rows}
    # the three poison clicks of each of the 4 splits, and every 23rd click (40 s behind) of
    # each split that its window judged late; each table holds them once though two
    # dead-letter vertices (one per part of the graph) share it
    late = [(s, n) for s in range(job.SPLITS) for n in range(22, job.PER_SPLIT, 23)]
    assert groups == {
        ("check", "user function error", "ValueError", 3 * job.SPLITS),
        ("win", "late", "LateRecord", len(late)),
    }
    assert len(rows) == 4  # two samples per group
    poison = [r for r in rows if r["operator"] == "check"]
    assert [(r["split"], r["position"], json.loads(r["sample"])["n"]) for r in poison] == [
        ("g0", "start + record 13", 13),
        ("g1", "start + record 13", 13),
    ]
    assert poison[0]["error"] == "click 13 of split 0 is poison"
    assert poison[0]["checkpoints"] == "1-7"
    assert main(["inspect", root, "dead-letters"]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[-1] == (
        f"{3 * job.SPLITS + len(late)} dead letter(s) committed in {tmp_path / 'dead'}; a record "
        "late for several window operators, joins or drop_duplicates is counted once per "
        "operator that judged it"
    )


def test_a_job_without_dead_letters_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p = job.pipeline("tumbling", str(tmp_path / "table"), partitions=2)
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "clicks", p, unit_timeout=30)
    JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "clicks")).run(
        max_checkpoints=2
    )
    assert main(["inspect", root, "dead-letters"]) == 0
    assert capsys.readouterr().out == (
        "checkpoint 2 records no dead-letter sink: the pipeline runs without "
        "on_error='dead-letter' (or its dead-letter sink records no location)\n"
    )


def test_samples_out_of_range_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["inspect", "/nonexistent", "dead-letters", "--samples", "0"])
    assert info.value.code == 2
    assert "'0': give a whole number from 1 to 100" in capsys.readouterr().err


def test_the_report_counts_dead_letters_by_operator_and_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The report's dead-letter section reads the tables `inspect dead-letters` reads: the
    poison clicks (user function error, operator `check`) and the late clicks (late, `win`)
    as an operator x reason table with totals, then each group's checkpoints and a sample
    position."""
    from test_report import Sections

    root = _run(tmp_path)
    page = tmp_path / "report.html"
    assert main(["inspect", root, "report", "--html", str(page)]) == 0
    capsys.readouterr()
    html = page.read_text()
    late, poison = len(range(22, job.PER_SPLIT, 23)) * job.SPLITS, 3 * job.SPLITS
    sections = Sections(html)
    assert (
        f'<h2 id="dead-letters-by-reason">Dead letters by operator and reason '
        f"({late + poison})</h2>" in html
    )
    assert (
        '<th>operator</th><th class="n">late</th><th class="n">user function error</th>'
        '<th class="n">total</th>'
    ) in html
    assert sections.rows["dead-letters-by-reason"] == [
        ["check", "0", str(poison), str(poison)],
        ["win", str(late), "0", str(late)],
        ["total", str(late), str(poison), str(late + poison)],
    ]
    samples = sections.rows["dead-letter-samples"]
    assert [row[:5] for row in samples] == [
        ["check", "user function error", "ValueError", str(poison), "1-7"],
        ["win", "late", "LateRecord", str(late), samples[1][4]],
    ]
    assert samples[0][5:] == ["g0", "start + record 13"]
    assert samples[1][5].startswith("by-user partition ")
    assert samples[1][6].startswith("after checkpoint ")
    # the same groups and numbers as `inspect dead-letters`
    assert main(["inspect", root, "dead-letters", "--json"]) == 0
    view = json.loads(capsys.readouterr().out)
    assert [[r["operator"], r["reason"], r["records"], r["checkpoints"]] for r in view] == [
        [row[0], row[1], int(row[3]), row[4]] for row in samples
    ]


def test_the_report_of_a_job_without_a_dead_letter_sink_says_so(tmp_path: Path) -> None:
    from test_report import Sections

    p = job.pipeline("tumbling", str(tmp_path / "table"), partitions=2)
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "clicks", p, unit_timeout=30)
    JobDriver(p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "clicks")).run(
        max_checkpoints=2
    )
    page = tmp_path / "report.html"
    assert main(["inspect", root, "report", "--html", str(page)]) == 0
    html = page.read_text()
    assert "dead-letters-by-reason" in Sections(html).order
    assert "dead-letter-samples" not in html
    assert (
        '<p class="note">checkpoint 2 records no dead-letter sink: the pipeline runs without '
        "on_error=&#x27;dead-letter&#x27; (or its dead-letter sink records no location)</p>"
    ) in html


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["parse", "win", "join"]),
            st.sampled_from(["LateRecord", "EventTimeError", "KafkaSourceError", "KeyError"]),
            st.integers(1, 4),
        ),
        max_size=30,
    ),
    st.integers(1, 3),
)
def test_reason_counts_add_up_to_the_dead_letters_whatever_the_samples(
    letters: list[tuple[str, str, int]], samples: int
) -> None:
    """Every dead letter is counted once in the report's operator x reason table, under its
    operator and `reason_of` its error type, however many samples the view shows."""
    rows = pa.Table.from_pylist(
        [
            {"checkpoint_id": cid, "operator": op, "split_id": "s", "split_position": "",
             "record_index": i, "record": "{}", "error_type": et, "error_message": "e",
             "traceback": ""}
            for i, (op, et, cid) in enumerate(letters)
        ],
        schema=DEAD_LETTER_SCHEMA,
    )  # fmt: skip
    counts = reason_counts(dead_letter_view(rows, samples=samples)).to_pylist()
    want = Counter((op, reason_of(et)) for op, et, _ in letters)
    assert {(r["operator"], r["reason"]): r["records"] for r in counts} == want
    assert len(counts) == len(want)


def test_a_dead_letter_table_regional_cannot_read_is_named_not_fatal_in_the_report() -> None:
    """Two dead-letter vertices sharing one Parquet table count it once; an Iceberg one is a
    line naming it and what to read it with, and the report says the same line."""
    from metadata.model import CheckpointMetadata, SinkRetention
    from regional.cli.dead_letter_tables import committed_dead_letters, dead_letter_tables
    from regional.report.html import render_html
    from regional.report.summary import build_report

    checkpoint = CheckpointMetadata(
        checkpoint_id=4, job_id="j", kind="global", trigger_time_ms=0, completion_time_ms=1,
        sinks=(SinkRetention("out", "parquet", "/out"),
               SinkRetention("dead-letters", "iceberg", "db.dead"),
               SinkRetention("dead-letters-1", "iceberg", "db.dead")),
    )  # fmt: skip
    assert [(t.vertex_id, t.kind, t.location) for t in dead_letter_tables(checkpoint)] == [
        ("dead-letters", "iceberg", "db.dead")
    ]
    committed = committed_dead_letters(checkpoint)
    assert committed.rows is None
    assert committed.unread == (
        "the dead-letter sink 'dead-letters' at db.dead is of kind 'iceberg'; regional reads "
        "Parquet and Delta dead-letter tables: read this one with your iceberg reader (columns: "
        f"{', '.join(DEAD_LETTER_SCHEMA.names)})",
    )
    page = render_html(
        build_report([checkpoint], [], job_id="j", dead_letter_note=committed.unread[0])
    )
    assert "Dead letters by operator and reason (0)</h2>" in page
    assert "at db.dead is of kind &#x27;iceberg&#x27;" in page
