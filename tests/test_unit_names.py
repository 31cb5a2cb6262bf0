"""One naming rule (issue 45 item 2): a unit is shown as what it reads, positions in the
source's own terms, in `inspect`, progress, the report and metrics; `Faults` takes the names.
Pure tests and in-process jobs (no Spark)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metadata.events import CheckpointEvent, Outcome, StuckUnit
from metadata.storage import JobStorage
from regional.cli import main
from regional.cli.progress import checkpoint_line
from regional.graph.unit_names import UnitNameError, names_of_plan, unit_names
from regional.runtime.faults import Faults

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_the_orders_payments_example_names_its_units_by_what_they_read() -> None:
    sys.path.insert(0, str(EXAMPLES))
    try:
        import orders_payments
    finally:
        sys.path.remove(str(EXAMPLES))
    names = names_of_plan(orders_payments.build_pipeline("/in", "/out").regions())
    assert list(names.labels.values()) == [
        *(f"clicks[{i}]" for i in range(4)),
        *(f"orders[{i}]" for i in range(4)),
        *(f"orders⨝payments[{i}]" for i in range(4)),
        *(f"payments[{i}]" for i in range(4)),
        "profiles[0]",
        "profiles[1]",
        *(f"clicks⨝profiles[{i}]" for i in range(4)),
    ]
    # the example's FAULTS by name are its numeric ids
    assert [names.resolve(n) for n in ("orders[1]", "clicks[1]", "paid[3]", "paid-left[3]")] == [
        5,
        1,
        11,
        11,
    ]


def test_two_joins_of_the_same_inputs_are_named_by_their_vertices() -> None:
    def side(join: str, q: int) -> list[tuple[str, int]]:
        return [(f"{join}-left", q), (f"{join}-right", q), (join, q)]

    units = {
        0: [("a", 0), ("inner-left-writer", 0), ("outer-left-writer", 0)],
        1: [("b", 0), ("inner-right-writer", 0), ("outer-right-writer", 0)],
        2: side("inner", 0),
        3: side("outer", 0),
    }
    names = unit_names(units, sources={"a", "b"})
    assert names.labels == {0: "a[0]", 1: "b[0]", 2: "inner[0]", 3: "outer[0]"}


def test_an_unknown_name_is_refused_listing_the_names() -> None:
    names = unit_names({0: [("orders", 0)], 1: [("orders", 1)]}, sources={"orders"})
    with pytest.raises(UnitNameError) as err:
        names.resolve("orders[7]")
    assert str(err.value) == (
        "no unit named 'orders[7]'; the job's units are orders[0], orders[1] (or give a unit "
        "id; `regional regions` lists them)"
    )


@st.composite
def _graphs(draw: st.DrawFn) -> tuple[dict[int, list[tuple[str, int]]], set[str]]:
    """Units of a random graph: sources, key_by exchanges fed by one source and joins of two
    sources, each with its parallelism."""
    units: list[list[tuple[str, int]]] = []
    sources = [f"s{i}" for i in range(draw(st.integers(1, 4)))]
    par = {s: draw(st.integers(1, 4)) for s in sources}
    feeds: dict[str, list[str]] = {s: [] for s in sources}  # source -> writers it feeds
    readers: list[tuple[str, int]] = []
    for k in range(draw(st.integers(0, 3))):
        src = draw(st.sampled_from(sources))
        feeds[src].append(f"x{k}-writer")
        readers.append((f"x{k}", draw(st.integers(1, 4))))
    joins: list[tuple[str, int]] = []
    for k in range(draw(st.integers(0, 2))):
        left, right = draw(st.sampled_from(sources)), draw(st.sampled_from(sources))
        feeds[left].append(f"j{k}-left-writer")
        feeds[right].append(f"j{k}-right-writer")
        joins.append((f"j{k}", draw(st.integers(1, 4))))
    for s in sources:
        units += [[(s, i), *((w, i) for w in feeds[s])] for i in range(par[s])]
    for r, n in readers:
        units += [[(r, q), (f"{r}-op", q)] for q in range(n)]
    for j, n in joins:
        units += [[(f"{j}-left", q), (f"{j}-right", q), (j, q)] for q in range(n)]
    return dict(enumerate(units)), set(sources)


@settings(max_examples=200, deadline=None)
@given(_graphs())
def test_every_unit_has_its_own_name_and_every_name_resolves_to_its_unit(
    graph: tuple[dict[int, list[tuple[str, int]]], set[str]],
) -> None:
    units, sources = graph
    names = unit_names(units, sources=sources)
    assert len(set(names.labels.values())) == len(units)
    for unit, label in names.labels.items():
        assert names.resolve(label) == unit
        assert names.resolve(unit) == unit
    reads = ("-left", "-right")  # a join side's reader; a key_by's reader is x<k>
    for unit, members in units.items():
        for vertex, index in members:
            if vertex in sources or vertex.endswith(reads) or vertex[1:].isdigit():
                assert names.resolve(f"{vertex}[{index}]") == unit


def _orders_job(tmp_path: Path, faults: Faults) -> tuple[str, list[CheckpointEvent]]:
    import orders_job

    from regional.runtime.driver import JobDriver
    from regional.runtime.task import TaskEnv

    orders_job.write_orders(str(tmp_path / "orders"))
    p = orders_job.pipeline(str(tmp_path / "orders"), str(tmp_path / "table"))
    root = str(tmp_path / "ckpt")
    env = TaskEnv(root, "orders", p, unit_timeout=30, faults=faults.unit_faults(p))
    events: list[CheckpointEvent] = []
    driver = JobDriver(
        p, orders_job.InProcessDispatcher(env), storage=JobStorage(root, "orders"), faults=faults
    )
    driver.progress = events.append
    assert driver.run().finished
    assert orders_job.rows(str(tmp_path / "table")) == orders_job.expected_rows()
    return root, events


def test_faults_by_name_fail_the_unit_that_name_shows(tmp_path: Path) -> None:
    _, by_name = _orders_job(tmp_path / "a", Faults(units={(2, "by-customer[1]"): "fail"}))
    _, by_id = _orders_job(tmp_path / "b", Faults(units={(2, 4): "fail"}))
    assert [e.fallback_units for e in by_name] == [e.fallback_units for e in by_id]
    assert by_name[1].fallback_units == (4,)


def test_inspect_names_units_and_exchange_partitions_by_what_they_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = _orders_job(tmp_path, Faults())
    capsys.readouterr()
    assert main(["inspect", root, "lag"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  fresh")[0].rstrip() for line in lines[2:9]] == [
        "      0  files[0]        orders-03.jsonl (finished)               0  0 ms",
        "      1  files[1]        orders-04.jsonl (finished)               0  0 ms",
        "      2  files[2]        orders-05.jsonl (finished)               0  0 ms",
        "      3  by-customer[0]  by-customer partition 0                  -  -",
        "      4  by-customer[1]  by-customer partition 1                  -  -",
        "      5  by-customer[2]  by-customer partition 2                  -  -",
        "      6  by-customer[3]  by-customer partition 3                  -  -",
    ]
    assert main(["inspect", root, "lag", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["unit_name"], r["reads"]) for r in rows][3] == ("by-customer[0]", "n4-p0")
    assert main(["inspect", root, "watermarks"]) == 0
    first = capsys.readouterr().out.splitlines()[2]
    assert "by-customer[0]  by-customer partition 0" in first
    assert "writer 0 (files[0]): no watermark committed yet" in first


def test_a_progress_line_names_failed_and_stuck_units() -> None:
    names = unit_names({1: [("events", 1)], 2: [("events", 2)]}, sources={"events"})
    stuck = StuckUnit(
        unit_id=1, splits=("events:1",), since_ms=0, owner_checkpoint_id=0, fallbacks=3,
        cause="declined: ValueError: boom",
    )  # fmt: skip
    event = CheckpointEvent(
        job_id="j", checkpoint_id=5, kind=Outcome.REGIONAL, trigger_time_ms=180_000,
        time_ms=180_500, fresh_units=1, fallback_units=(1,),
        causes={1: "declined: ValueError: boom"}, unit_reads={1: ("events:1",)},
        stuck=(stuck,), watermark_ms=1_000, watermark_unit=2,
    )  # fmt: skip
    lines = checkpoint_line(event, names=names).splitlines()
    assert lines[0].endswith("watermark 1970-01-01T00:00:01.000Z (events[2] (unit 2))")
    assert lines[1:] == [
        "    events[1] (unit 1): declined: ValueError: boom",
        "    stuck: events[1] (unit 1) for 3 min (on its initial state; 3 fallbacks in a row)",
    ]
