"""A unit's snapshot on its way to checkpoint storage: the task's spool, the upload, the ack.

The sync phase of a unit's snapshot (`regional.runtime.task`) leaves a `UnitSnapshot`: its
subtask states without handles, and its operator state's segments either appended to the
task's `Spool` (merged uploads) or written to a local file of the unit's own. The async phase
(FLINK-37375) is here:

* **merged** (`upload_merged`, DESIGN §4 rule 16, FLIP-306): the task's spool goes to checkpoint
  storage as **one physical state file per task**, named after the first unit attempt with
  state (`chk-<id>/u<unit>-a<attempt>-<run>.state`: every unit attempt runs in exactly one task,
  so the name is unique); it is read back and checked before any ack naming one of its
  segments is built (DESIGN §4 rule 10);
* **per unit** (`upload`): the unit's local file goes up as a file of its own, every segment
  read back and checked.

Either way the ack's subtask states hold the uploaded segments (`ack`). `UploadLatency` injects
slow storage for the slow-storage benchmark (off unless set on `TaskEnv`).
"""

from __future__ import annotations

import contextlib
import os
import random
import tempfile
import time
from collections.abc import Sequence

import msgspec

from metadata.layout import state_file_path
from metadata.model import StateHandle, SubtaskState
from metadata.storage import JobStorage
from regional.coordinator.messages import Ack, UnitWork
from regional.runtime.hot_state import HotState
from regional.sinks.base import WriteContext
from regional.sources.base import Batch

__all__ = ["Spool", "UnitSnapshot", "UploadLatency", "ack", "upload", "upload_merged"]


class UploadLatency(msgspec.Struct, frozen=True):
    """Injected checkpoint-storage latency (benchmarks; off unless set on `TaskEnv`): every
    state upload first waits `base` seconds, a `tail_probability` share of them `tail_factor`
    times longer. Which uploads are slow depends only on (seed, checkpoint, unit, attempt), so
    runs that differ in anything else see the same delays."""

    base: float
    tail_probability: float = 0.05
    tail_factor: float = 10.0
    seed: int = 0

    def seconds(self, checkpoint_id: int, unit_id: int, attempt: int) -> float:
        """The delay of one unit attempt's upload."""
        rng = random.Random(f"{self.seed}/{checkpoint_id}/{unit_id}/{attempt}")
        slow = rng.random() < self.tail_probability
        return self.base * (self.tail_factor if slow else 1.0)


class UnitSnapshot(msgspec.Struct):
    """The sync phase's result, waiting for its upload."""

    work: UnitWork
    local_file: str | None  # the unit's own local file (per-unit uploads only)
    seg_keys: list[tuple[str, int]]  # the subtasks with a segment, in file order
    lengths: list[int]
    states: list[SubtaskState]  # in layout order, without handles yet
    records_in: int
    records_out: int
    records_late: int = 0
    watermark: int | None = None  # the unit's subtask watermark after the epoch (event time)
    serialise_s: float = 0.0  # writing the local state file (the sync part of the snapshot)
    records_dead_lettered: int = 0
    restore_s: float = 0.0  # reading and decoding operator state
    process_s: float = 0.0  # sources, operators, sink staging
    encode_s: float = 0.0  # encoding operator state (to_bytes)
    spool_offset: int = 0  # where its segments start in the task's spool file (merged uploads)
    #: what the unit's merging sinks stage after the task's last unit: (vertex, context, rows)
    sink_parts: list[tuple[str, WriteContext, list[Batch]]] = msgspec.field(default_factory=list)
    #: the operator states its segments encode, by vertex id: kept hot once the unit acks
    #: (`regional.runtime.hot_state`); empty when the task keeps no state hot
    decoded: dict[str, HotState] = msgspec.field(default_factory=dict)
    state_hits: int = 0  # operator subtasks restored from hot state
    state_misses: int = 0  # operator subtasks restored by decoding their bytes
    records_exchanged: int = 0  # of records_in, those read from a keyed exchange
    #: per operator vertex: (records in, out, judged late); dead letters by error type
    operators: dict[str, tuple[int, int, int]] = msgspec.field(default_factory=dict)
    dead_letter_types: dict[str, int] = msgspec.field(default_factory=dict)
    behind: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)  # consumer lag
    unread_since: dict[str, dict[str, int]] = msgspec.field(default_factory=dict)  # its time


def upload(
    storage: JobStorage,
    snap: UnitSnapshot,
    *,
    latency: UploadLatency | None = None,
    run_id: str | None = None,
) -> Ack:
    """Async phase of one unit (per-unit uploads): upload its local snapshot file as a state
    file of its own (named after the unit attempt and the driver `run_id`), read every segment
    back, verify, build the ack."""
    work = snap.work
    started = time.perf_counter()
    handles: dict[tuple[str, int], StateHandle] = {}
    if snap.local_file is not None:
        try:
            if latency is not None:
                time.sleep(latency.seconds(work.checkpoint_id, work.unit_id, work.attempt))
            with open(snap.local_file, "rb") as f:
                data = f.read()
        finally:
            os.unlink(snap.local_file)
        segments, offset = [], 0
        for n in snap.lengths:
            segments.append(data[offset : offset + n])
            offset += n
        rel = state_file_path(work.checkpoint_id, work.unit_id, work.attempt, run_id)
        written = storage.write_segments(rel, segments)
        for key, handle, seg in zip(snap.seg_keys, written, segments, strict=True):
            if storage.read_segment(handle) != seg:  # verifies size and checksum too
                raise OSError(f"upload of {rel} does not read back as written")
            handles[key] = handle
    return ack(snap, handles, time.perf_counter() - started)


class Spool:
    """The task's local spool file (merged uploads): each unit's sync phase appends its
    segments; a unit that declines is cut off again (`truncate`), so it contributes nothing."""

    def __init__(self) -> None:
        fd, self.path = tempfile.mkstemp(prefix="regional-task-", suffix=".state")
        self._file = os.fdopen(fd, "w+b")
        self.size = 0
        self._at_end = True  # the file's position is `size` (a seek would flush the buffer)

    def append(self, blobs: Sequence[bytes]) -> int:
        """Append `blobs` back to back; returns the offset of the first."""
        offset = self.size
        if not self._at_end:
            self._file.seek(offset)
        self._at_end = False  # until every blob is written
        for blob in blobs:
            self._file.write(blob)
        self.size = offset + sum(len(b) for b in blobs)
        self._at_end = True
        return offset

    def truncate(self, size: int) -> None:
        """Cut the spool back to `size` bytes (a unit that declined after, or while, appending)."""
        self._file.truncate(size)
        self.size = size
        self._at_end = False

    def read(self) -> bytes:
        self._at_end = False
        self._file.flush()
        self._file.seek(0)
        return self._file.read(self.size)

    def close(self) -> None:
        self._file.close()
        with contextlib.suppress(OSError):
            os.unlink(self.path)


def upload_merged(
    storage: JobStorage,
    snaps: Sequence[UnitSnapshot],
    spool: Spool,
    *,
    latency: UploadLatency | None = None,
    run_id: str | None = None,
) -> list[Ack]:
    """Async phase of a task with merged uploads: upload the spool as one physical state file
    (`snaps` are the units with segments in it, in spool order), read it back, verify, and
    build one ack per unit whose handles are segments of that file. Each ack's `upload_s` is
    its share of the one upload (the shares add up to the upload's seconds)."""
    started = time.perf_counter()
    first = snaps[0].work
    if latency is not None:
        time.sleep(latency.seconds(first.checkpoint_id, first.unit_id, first.attempt))
    data = spool.read()
    segments: list[bytes] = []
    for snap in snaps:
        offset = snap.spool_offset
        for n in snap.lengths:
            segments.append(data[offset : offset + n])
            offset += n
    rel = state_file_path(first.checkpoint_id, first.unit_id, first.attempt, run_id)
    written = iter(storage.write_segments(rel, segments))
    if storage.read_file(rel) != b"".join(segments):  # one read for every unit's segments
        raise OSError(f"upload of {rel} does not read back as written")
    share = (time.perf_counter() - started) / len(snaps)
    return [ack(snap, {key: next(written) for key in snap.seg_keys}, share) for snap in snaps]


def ack(snap: UnitSnapshot, handles: dict[tuple[str, int], StateHandle], upload_s: float) -> Ack:
    """The ack of `snap`, its subtasks holding `handles` (their uploaded segments)."""
    work = snap.work
    states = [
        msgspec.structs.replace(s, handles=(handles[s.vertex_id, s.index],))
        if (s.vertex_id, s.index) in handles
        else s
        for s in snap.states
    ]
    return Ack(
        work.checkpoint_id,
        work.unit_id,
        work.attempt,
        tuple(states),
        records_in=snap.records_in,
        records_out=snap.records_out,
        records_exchanged=snap.records_exchanged,
        operators=snap.operators,
        dead_letter_types=snap.dead_letter_types,
        behind=snap.behind,
        unread_since=snap.unread_since,
        snapshot_blocked_s=snap.serialise_s,
        records_dead_lettered=snap.records_dead_lettered,
        restore_s=snap.restore_s,
        process_s=snap.process_s,
        snapshot_s=snap.encode_s + snap.serialise_s,
        upload_s=upload_s,
        records_late=snap.records_late,
        watermark=snap.watermark,
        state_hits=snap.state_hits,
        state_misses=snap.state_misses,
    )
