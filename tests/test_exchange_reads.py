"""The readers of one task share what they read of an exchange (`task_reads`): the commit
records are read once per task, not once per reader unit, and what a reader is given stays
exact: a commit that completes while the task runs is read by a later task, never half."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from metadata.commit_log import CommitRecord
from metadata.exchange import Cursor, SegmentName
from metadata.format import segment_checksum
from regional.dataflow import exchange_reads
from regional.dataflow.exchange import ExchangeReader, ExchangeWriter
from regional.dataflow.exchange_reads import task_reads
from regional.errors import CommitError

PARTITIONS = 3


@pytest.fixture
def ends(tmp_path: Path) -> tuple[ExchangeReader, ExchangeWriter]:
    base = str(tmp_path / "job" / "exchange" / "x")
    reader = ExchangeReader("x", PARTITIONS, bounded=True)
    writer = ExchangeWriter("x", lambda r: r, PARTITIONS)
    reader.bind(base, None)
    writer.bind(base, None)
    return reader, writer


def _commit(writer: ExchangeWriter, checkpoint: int) -> None:
    """Checkpoint `checkpoint`'s commit: a segment of writer 0 in every partition, then the
    record naming them."""
    files, sizes, checksums = [], [], []
    for q in range(PARTITIONS):
        directory = Path(writer.path) / f"n{PARTITIONS}" / f"p{q}"
        directory.mkdir(parents=True, exist_ok=True)
        name = SegmentName(checkpoint, 0).file_name()
        pq.write_table(pa.table({"c": [checkpoint]}), directory / name)
        data = (directory / name).read_bytes()
        files.append(f"n{PARTITIONS}/p{q}/{name}")
        sizes.append(len(data))
        checksums.append(segment_checksum(data).hex())
    writer.area.write_record(
        CommitRecord("user", checkpoint, files, 0, sizes=sizes, checksums=checksums)
    )


def _read(reader: ExchangeReader, partition: int, since: int = 0) -> list[int]:
    return [s.checkpoint_id for s, _, _ in reader.committed(PARTITIONS, partition, Cursor(since))]


@pytest.fixture
def reads_of_records(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The `since` of every time the commit records are read from storage."""
    calls: list[int] = []
    real = exchange_reads._DECODED.records

    def counted(fs: Any, directory: str, since: int = 0) -> Any:
        calls.append(since)
        return real(fs, directory, since=since)

    monkeypatch.setattr(exchange_reads._DECODED, "records", counted)
    return calls


def test_the_readers_of_a_task_read_the_records_once(
    ends: tuple[ExchangeReader, ExchangeWriter], reads_of_records: list[int]
) -> None:
    reader, writer = ends
    _commit(writer, 1)
    _commit(writer, 2)
    with task_reads():
        assert [_read(reader, q) for q in range(PARTITIONS)] == [[1, 2]] * PARTITIONS
        assert _read(reader, 0, since=2) == [2]  # a newer cursor: filtered, not read again
    assert reads_of_records == [0]
    assert [_read(reader, q) for q in range(2)] == [[1, 2]] * 2  # outside: every call reads
    assert reads_of_records == [0, 0, 0]


def test_a_reader_with_an_older_cursor_reads_the_records_again(
    ends: tuple[ExchangeReader, ExchangeWriter], reads_of_records: list[int]
) -> None:
    reader, writer = ends
    _commit(writer, 1)
    _commit(writer, 2)
    with task_reads():
        assert _read(reader, 0, since=2) == [2]
        assert _read(reader, 1, since=0) == [1, 2]
        assert _read(reader, 2, since=1) == [1, 2]
    assert reads_of_records == [2, 0]


def test_a_commit_that_completes_during_a_task_is_read_by_the_next_task(
    ends: tuple[ExchangeReader, ExchangeWriter],
) -> None:
    """The segments of a commit published after the task read the records have no record in
    what it read: they end the list (no "missing" or "no commit record" error) and are read
    in the next task."""
    reader, writer = ends
    _commit(writer, 1)
    with task_reads():
        assert _read(reader, 0) == [1]
        _commit(writer, 2)
        assert _read(reader, 1) == [1]
    with task_reads():
        assert _read(reader, 1) == [1, 2]


def test_a_partition_directory_that_links_out_is_refused_in_a_task(
    ends: tuple[ExchangeReader, ExchangeWriter], tmp_path: Path
) -> None:
    reader, writer = ends
    _commit(writer, 1)
    outside = tmp_path / "elsewhere"
    os.rename(Path(writer.path) / f"n{PARTITIONS}" / "p1", outside)
    os.symlink(outside, Path(writer.path) / f"n{PARTITIONS}" / "p1")
    with pytest.raises(CommitError) as alone:
        _read(reader, 1)
    with task_reads(), pytest.raises(CommitError) as in_task:
        assert _read(reader, 0) == [1]
        _read(reader, 1)
    assert str(in_task.value) == str(alone.value)
    assert "is a symbolic link to" in str(alone.value) and "remove the link" in str(alone.value)


def test_a_passed_segment_the_cleaner_deletes_during_a_listing_is_no_error(
    ends: tuple[ExchangeReader, ExchangeWriter], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The cleaner deletes segments every retained cursor has passed while tasks (and the
    driver's backlog check) list: a reader never looks at the passed ones, and one that goes
    between the listing and its size is left out; one the reader still needs is missing."""
    from regional.dataflow import exchange

    reader, writer = ends
    for checkpoint in (1, 2, 3):
        _commit(writer, checkpoint)
    partition = Path(writer.path) / f"n{PARTITIONS}" / "p0"
    real = exchange.confined_listing
    gone: list[int] = []

    def deleting_meanwhile(*args: Any, **kw: Any) -> Any:
        entries = real(*args, **kw)
        for checkpoint in gone:
            (partition / SegmentName(checkpoint, 0).file_name()).unlink(missing_ok=True)
        return entries

    monkeypatch.setattr(exchange, "confined_listing", deleting_meanwhile)
    gone.append(1)  # passed by a reader at checkpoint 2
    assert _read(reader, 0, since=2) == [2, 3]
    assert reader.backlog("n3-p0", Cursor(2).encode()).records == 2
    gone.append(2)  # still needed by that reader
    with pytest.raises(CommitError, match=r"committed with checkpoint 2, is missing"):
        _read(reader, 0, since=2)
