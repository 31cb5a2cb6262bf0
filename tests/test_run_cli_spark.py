"""`regional run` end to end on Spark: a pipeline file importing a sibling module that defines
its operator and a msgspec Struct kept in state (shipped to the workers as a file, so the Struct
keeps its fields), run twice without `--checkpoint-dir` and with `--json`: the second run
resumes from the default root beside the file and writes nothing twice."""

from __future__ import annotations

import sys
import textwrap

import msgspec
import pytest

from metadata.events import CheckpointEvent, Outcome
from regional.cli import main
from regional.sinks.parquet import read_table

pytestmark = pytest.mark.spark

SIBLING = textwrap.dedent(
    """
    import msgspec


    class RunLast(msgspec.Struct, frozen=True):
        n: int
        user: str


    def order(split, n):
        return {"split": split, "n": n, "user": f"u{(split + n) % 3}"}


    def remember(ctx, o):
        last = ctx.value_state("last")
        before = last.value()
        last.update(RunLast(o["n"], o["user"]))
        yield {"split": o["split"], "n": o["n"], "before": -1 if before is None else before.n}
    """
)

PIPELINE = textwrap.dedent(
    """
    import os

    from regional import GeneratorSource, ParquetSink, Pipeline
    from run_cli_orders import RunLast, order, remember

    pipeline = Pipeline("sibling-job", records_per_epoch=4, state_types=[RunLast])
    src = pipeline.source(GeneratorSource(2, order, records_per_split=10), parallelism=2)
    src.key_by(lambda o: o["user"]).process(remember, name="remember").sink(
        ParquetSink(os.environ["REGIONAL_CHECKPOINT_DIR"] + "-table")
    )
    """
)


def _expected() -> list[tuple[int, int, int]]:
    rows = []
    for split in range(2):
        last: dict[str, int] = {}
        for n in range(10):
            user = f"u{(split + n) % 3}"
            rows.append((split, n, last.get(user, -1)))
            last[user] = n
    return sorted(rows)


def _rows(table: str) -> list[tuple[int, int, int]]:
    t = read_table(table)
    cols = [t.column(c).to_pylist() for c in ("split", "n", "before")]
    return sorted(zip(*cols, strict=True))


def test_a_sibling_module_with_a_struct_runs_and_a_second_run_adds_nothing(
    spark, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.setenv("REGIONAL_CHECKPOINT_DIR", "unset")
    (tmp_path / "run_cli_orders.py").write_text(SIBLING)
    job = tmp_path / "job.py"
    job.write_text(PIPELINE)
    root = tmp_path / ".regional" / "checkpoints"
    try:
        assert main(["run", str(job), "--json", "--interval", "2 s"]) == 0
        first = capsys.readouterr()
        events = [msgspec.json.decode(line, type=CheckpointEvent) for line in
                  first.out.splitlines()]
        assert [e.kind for e in events] == [Outcome.GLOBAL] * len(events)
        assert sum(e.records_in for e in events) == 20
        assert f"checkpoints under {root} (default: the pipeline file's folder" in first.err
        assert first.err.rstrip().endswith("job finished")
        assert _rows(str(root) + "-table") == _expected()
        assert main(["run", str(job)]) == 0
        second = capsys.readouterr().out
    finally:
        sys.modules.pop("run_cli_orders", None)
    assert f"restored from checkpoint {events[-1].checkpoint_id}" in second
    assert _rows(str(root) + "-table") == _expected()  # not doubled
