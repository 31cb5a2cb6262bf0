"""`regional run --stop-with-savepoint` stopped by SIGTERM, then
`regional run --from SAVEPOINT` at another parallelism: every record exactly once."""

from __future__ import annotations

import os
import signal
import textwrap
import threading
import time

import pytest

from regional.cli import main
from regional.sinks.parquet import read_table

PIPELINE = textwrap.dedent(
    """
    import os
    from regional import GeneratorSource, ParquetSink, Pipeline

    def count(ctx, record):
        n = ctx.value_state("n", 0)
        n.update(n.value() + 1)
        yield {**record, "seen": n.value()}

    pipeline = Pipeline("endless", records_per_epoch=3)
    src = pipeline.source(
        GeneratorSource(6, lambda s, n: {"s": s, "n": n}),  # unbounded
        parallelism=int(os.environ.get("PARALLELISM", "3")),
        name="src",
    )
    src.key_by(lambda r: r["s"]).process(count, name="count").sink(
        ParquetSink(os.environ["TABLE"]), name="out"
    )
    """
)


def _check_table(table: str) -> int:
    """Every split's records 0..k-1 exactly once, each counted in order; returns the rows."""
    t = read_table(table)
    rows = sorted(zip(*(t.column(c).to_pylist() for c in ("s", "n", "seen")), strict=True))
    by_split: dict[int, list[tuple[int, int]]] = {}
    for s, n, seen in rows:
        by_split.setdefault(s, []).append((n, seen))
    for s, got in by_split.items():
        assert got == [(n, n + 1) for n in range(len(got))], (s, got)
    return len(rows)


@pytest.mark.spark
def test_sigterm_stops_with_a_savepoint_and_run_from_restores_it(spark, tmp_path, capsys):
    file = tmp_path / "endless.py"
    file.write_text(PIPELINE)
    table, root = str(tmp_path / "table"), str(tmp_path / "ckpt")
    second = tmp_path / "ckpt" / "endless" / "chk-2" / "_metadata"

    def terminate_after_two_checkpoints() -> None:  # `run` handles SIGTERM by then
        while not second.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_after_two_checkpoints, daemon=True)
    killer.start()
    os.environ["TABLE"] = table
    try:
        code = main(["run", str(file), "--checkpoint-dir", root, "--stop-with-savepoint"])
    finally:
        del os.environ["TABLE"]
    killer.join()
    out = capsys.readouterr().out
    assert code == 0
    assert f"got signal {int(signal.SIGTERM)}: stopping with a savepoint after this epoch" in out
    assert "job stopped with a savepoint" in out
    savepoint = next(
        line.split(": ", 1)[1] for line in out.splitlines() if line.startswith("savepoint: ")
    )
    assert savepoint.startswith(f"{root}/endless/savepoints/sp-")
    stopped_rows = _check_table(table)
    assert stopped_rows > 0

    # restore it into another checkpoint root at parallelism 2, for 3 more checkpoints
    os.environ["TABLE"] = table
    os.environ["PARALLELISM"] = "2"
    try:
        code = main(
            [
                "run",
                str(file),
                "--checkpoint-dir",
                str(tmp_path / "ckpt2"),
                "--from",
                savepoint,
                "--mode",
                "no-claim",
                "--max-checkpoints",
                "3",
            ]
        )
    finally:
        del os.environ["TABLE"], os.environ["PARALLELISM"]
    out = capsys.readouterr().out
    assert code == 0
    sp_id = savepoint.rsplit("-", 1)[1]
    assert f"restored from checkpoint {sp_id} ({savepoint})" in out
    assert "restore: src: 3 -> 2" in out
    assert _check_table(table) == stopped_rows + 3 * 2 * 3  # 3 epochs x 2 subtasks x 3 records


def test_restore_usage_errors_are_one_line_exit_2(tmp_path, capsys):
    file = tmp_path / "endless.py"
    file.write_text(PIPELINE)
    assert main(["run", str(file), "--mode", "no-claim"]) == 2
    assert capsys.readouterr().err == (
        "regional run: --mode applies to a restore: give --from PATH too\n"
    )
