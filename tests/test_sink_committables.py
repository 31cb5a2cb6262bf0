"""Committables are typed and versioned (`regional.sinks.table`): every committable an earlier
regional stored in checkpoints still decodes and commits (the bytes in
tests/fixtures/committables/before-versioning.json were written by the encoders before
versions, and by older ones from git history); one written by a newer regional is refused with
an error naming the sink and the version, nothing committed or deleted; bytes that are not the
sink's committable are a `CommitError` naming the sink, not a decoder's exception. The sink
contract and the template are exported by `regional.sinks`, the source contract by
`regional.sources`."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import msgspec
import pyarrow as pa
import pytest

from regional.errors import CommitError
from regional.sinks import delta, iceberg, paimon, staging
from regional.sinks.base import WriteContext
from regional.sinks.parquet import ParquetSink, read_table
from regional.sinks.table import part_of

FIXTURES = Path(__file__).parent / "fixtures" / "committables" / "before-versioning.json"
SCHEMA = pa.schema([("user", pa.string()), ("n", pa.int64())])
A = [{"user": "a", "n": 1}, {"user": "b", "n": 2}]
B = [{"user": "c", "n": 3}]

STRUCTS: dict[str, Any] = {
    "delta": delta._Committable,
    "iceberg": iceberg._Committable,
    "paimon": paimon._Committable,
    "parquet": staging.StagedFile,
}
#: where a layout's fields start in its msgpack array (Delta's are tagged "delta")
TAGS = {"delta": ["delta"], "iceberg": [], "paimon": [], "parquet": []}
#: the field holding bytes (hex in the fixture)
BYTES = {"paimon": 3}


def _fixtures() -> list[tuple[str, dict]]:
    with open(FIXTURES) as f:
        return [(sink, entry) for sink, entries in json.load(f).items() for entry in entries]


def _fields(sink: str, entry: dict) -> list[Any]:
    fields = list(entry["fields"])
    if (at := BYTES.get(sink)) is not None:
        fields[at] = bytes.fromhex(fields[at])
    return fields


def _ids(x: Any) -> str:
    return x["label"] if isinstance(x, dict) else str(x)


@pytest.mark.parametrize(("sink", "entry"), _fixtures(), ids=_ids)
def test_committables_written_before_versions_decode_as_version_1(sink, entry):
    data, fields, tag = bytes.fromhex(entry["hex"]), _fields(sink, entry), TAGS[sink]
    # what the old encoder wrote is a plain array of its fields (and their defaults): `_old`
    # below re-makes such bytes from a committable of today
    wire = msgspec.msgpack.decode(data)
    assert wire[: len(tag) + len(fields)] == [*tag, *fields]
    assert msgspec.msgpack.encode(wire) == data
    decoded = msgspec.msgpack.decode(data, type=STRUCTS[sink])
    values = list(msgspec.structs.astuple(decoded))
    assert values[: len(wire) - len(tag)] == wire[len(tag) :]
    assert "version" not in STRUCTS[sink].__struct_fields__[: len(wire) - len(tag)]
    assert decoded.version == 1 and values[-1] == 1
    if "part" in entry["label"]:
        assert part_of(decoded) is not None and (decoded.first_row, decoded.file_rows) == (3, 5)
    else:
        assert part_of(decoded) is None


def _context(cid: int, unit: int) -> WriteContext:
    return WriteContext(
        job_id="job", run_id="r1", checkpoint_id=cid, attempt=0, unit_id=unit, vertex_id="out",
        index=0,
    )  # fmt: skip


def _old(committable: bytes, fields: int) -> bytes:
    """`committable` as an earlier regional wrote it: its first `fields` array elements (the
    fixture test above shows the old encoders wrote exactly those)."""
    return msgspec.msgpack.encode(msgspec.msgpack.decode(committable)[:fields])


def _sinks(tmp_path: Path) -> dict[str, Any]:
    return {
        "delta": delta.DeltaSink(str(tmp_path / "delta"), schema=SCHEMA),
        "iceberg": iceberg.IcebergSink(str(tmp_path / "ice"), "db.t", schema=SCHEMA),
        "paimon": paimon.PaimonSink(str(tmp_path / "paimon"), "db.t", schema=SCHEMA),
        "parquet": ParquetSink(str(tmp_path / "parquet")),
    }


def _rows(sink: Any) -> list[tuple[str, int]]:
    table = read_table(sink.path) if isinstance(sink, ParquetSink) else sink.read()
    if not table.num_rows:
        return []
    return sorted(zip(table.column("user").to_pylist(), table.column("n").to_pylist(), strict=True))


def _described(sink: Any) -> str:
    """How errors name the sink's table."""
    if isinstance(sink, delta.DeltaSink):
        return f"Delta table {sink.path}"
    if isinstance(sink, ParquetSink):
        return f"table {sink.path}"
    return f"{'Iceberg' if isinstance(sink, iceberg.IcebergSink) else 'Paimon'} table 'db.t'"


USER = "job-0123456789ab-out"  # as the driver makes them (the Iceberg sink reads the job from it)


@pytest.mark.parametrize("sink_name", ["delta", "iceberg", "paimon", "parquet"])
def test_committables_of_every_earlier_layout_still_commit(tmp_path, sink_name):
    sink = _sinks(tmp_path)[sink_name]
    writer = pickle.loads(pickle.dumps(sink))  # as a Spark task gets it
    layouts = {  # label -> how many array elements the layout has
        e["label"]: len(msgspec.msgpack.decode(bytes.fromhex(e["hex"])))
        for s, e in _fixtures()
        if s == sink_name
    }
    for checkpoint, (label, fields) in enumerate(layouts.items(), start=1):
        if "part" in label:  # two units' rows in one file, each part in the old layout
            a, b = writer.write_merged(
                [(_context(checkpoint, 0), [pa.RecordBatch.from_pylist(A)]),
                 (_context(checkpoint, 1), [pa.RecordBatch.from_pylist(B)])]
            )  # fmt: skip
            old = [_old(c, fields) for c in (*a, *b)]
        else:
            [c] = writer.write([pa.RecordBatch.from_pylist(A)], _context(checkpoint, 0))
            old = [_old(c, fields)]
            if sink_name == "parquet" and label == "before checksums":
                assert len(msgspec.msgpack.decode(old[0])) == 2
        assert sink.rows_of(old) == (3 if "part" in label else 2), label
        assert sink.missing_files(old) == [], label
        sink.commit(USER, checkpoint, old)
    expected = [row for label in layouts for row in (A + B if "part" in label else A)]
    assert _rows(sink) == sorted((r["user"], r["n"]) for r in expected)


@pytest.mark.parametrize("sink_name", ["delta", "iceberg", "paimon", "parquet"])
def test_a_committable_of_a_newer_version_is_refused_naming_the_sink_and_the_version(
    tmp_path, sink_name
):
    sink = _sinks(tmp_path)[sink_name]
    [c] = pickle.loads(pickle.dumps(sink)).write([pa.RecordBatch.from_pylist(A)], _context(1, 0))
    fields = msgspec.msgpack.decode(c)
    assert fields[-1] == 1  # the version is the last field
    newer = msgspec.msgpack.encode([*fields[:-1], 2, "a field of version 2"])
    expected = (
        f"{_described(sink)}: a committable was written by a newer regional (committable "
        "version 2; this one reads versions up to 1); upgrade regional to commit it"
    )
    for call in (lambda: sink.commit(USER, 1, [c, newer]), lambda: sink.missing_files([newer])):
        with pytest.raises(CommitError) as err:
            call()
        assert str(err.value) == expected
    if isinstance(sink, ParquetSink):
        sink.discard([newer])  # skipped, as another format's
    else:
        with pytest.raises(CommitError, match="upgrade regional"):
            sink.discard([newer])
    assert sink.missing_files([c]) == []  # nothing deleted: what it names is not known here
    assert sink.latest_committed(USER) is None and _rows(sink) == []


@pytest.mark.parametrize("sink_name", ["paimon", "parquet"])
def test_cleaning_staged_files_refuses_a_newer_committable_and_deletes_nothing(tmp_path, sink_name):
    sink = _sinks(tmp_path)[sink_name]
    [c] = pickle.loads(pickle.dumps(sink)).write([pa.RecordBatch.from_pylist(A)], _context(1, 0))
    newer = msgspec.msgpack.encode([*msgspec.msgpack.decode(c)[:-1], 2])
    with pytest.raises(CommitError, match=r"committable version 2; .* upgrade regional"):
        sink.clean_staged("job", [newer])  # the driver refuses to start (runtime/restore.py)
    assert sink.missing_files([c]) == []


@pytest.mark.parametrize("sink_name", ["delta", "iceberg", "paimon"])
def test_another_sinks_committables_are_refused_naming_the_sink(tmp_path, sink_name):
    sinks = _sinks(tmp_path)
    sink = sinks[sink_name]
    other = sinks["parquet"]
    theirs = other.write([pa.RecordBatch.from_pylist(A)], _context(1, 0))
    with pytest.raises(CommitError) as err:
        sink.commit(USER, 1, theirs)
    assert str(err.value).startswith(
        f"{_described(sink)}: a committable does not decode as a {sink_name} committable ("
    )
    assert str(err.value).endswith(
        "); was the sink of this vertex changed since the checkpoint was taken?"
    )
    sink.discard(theirs)  # skipped: another sink's
    assert other.missing_files(theirs) == [] and sink.latest_committed(USER) is None


def test_the_sink_and_source_contracts_are_exported():
    import regional.sinks as sinks
    import regional.sources as sources
    from regional.sinks import base, table
    from regional.sources import base as source_base

    for name in [*base.__all__, "TableSink", "TableCommittable", "COMMITTABLE_VERSION"]:
        assert name in sinks.__all__, name
        assert getattr(sinks, name) is getattr(base if name in base.__all__ else table, name)
    for name in ("Batch", "PoisonRecord", "ReadResult", "Source"):
        assert name in sources.__all__ and getattr(sources, name) is getattr(source_base, name)
