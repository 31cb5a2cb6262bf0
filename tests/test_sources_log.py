"""The partitioned append-only log source: partial lines, segments, new partitions."""

from __future__ import annotations

from regional.sources.log import LogSource


def test_reads_across_segments_and_waits_for_complete_lines(tmp_path):
    (tmp_path / "p1").mkdir()
    (tmp_path / "p1" / "000.jsonl").write_text('{"v": 0}\n{"v": 1}\n')
    (tmp_path / "p1" / "001.jsonl").write_text('{"v": 2}\n{"v"')
    log = LogSource(str(tmp_path))
    first = log.read("p1", b"", 2)
    assert first.batches[0].to_pylist() == [{"v": 0}, {"v": 1}]
    second = log.read("p1", first.position, 10)
    assert second.batches[0].to_pylist() == [{"v": 2}]
    assert second.position == b"001.jsonl:9" and not second.finished
    assert log.read("p1", second.position, 10).batches == []
    with open(tmp_path / "p1" / "001.jsonl", "a") as f:
        f.write(": 3}\n")
    assert log.read("p1", second.position, 10).batches[0].to_pylist() == [{"v": 3}]


def test_new_partitions_are_discovered(tmp_path):
    log = LogSource(str(tmp_path / "missing"))
    assert log.discover() == [] and not log.bounded
    log = LogSource(str(tmp_path))
    (tmp_path / "b").mkdir()
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.txt").write_text("ignored")
    assert log.discover() == ["a", "b"]
    assert log.read("a", b"", 5).batches == []
