"""Metadata benchmark: encode/decode time and size per subtask; inspector time over 100 retained
checkpoints. Run: `.venv/bin/python -m benchmarks.bench_metadata [--repeat N] [--quick]` (prints
a table; not a test).

Targets (issue 3): 10,000 subtasks encode+decode under 100 ms and under 300 bytes per subtask
excluding user payloads (splits positions, committables, coordinator snapshots: none here).
Issue 17: 100,000 subtasks decode under 40 ms and at most 70 bytes per subtask. Each time is
printed as best / median of `--repeat` runs, with the target next to it.

Format 1.5 keeps the subtasks as columns: decode checks them and builds no `SubtaskState`;
`+ rows` is decode plus building every one (what iterating `md.subtasks` costs once, e.g. a
restore). Encode starts from `SubtaskState`s each run, as the coordinator hands them over.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable

import msgspec
import pyarrow as pa

from metadata.format import decode_metadata, encode_metadata
from metadata.inspect import Inspector
from metadata.model import (
    CheckpointKind,
    CheckpointMetadata,
    StateHandle,
    SubtaskState,
    UnitState,
    VertexInfo,
)
from metadata.storage import JobStorage
from metadata.store import CompletedCheckpointStore
from metadata.validate import validate_job

VERTICES = ("source", "parse", "enrich", "aggregate", "sink")


def checkpoint(cid: int, n_subtasks: int, fallback_every: int = 4) -> CheckpointMetadata:
    """A regional checkpoint: 5 chained vertices, one unit per parallel pipeline (5 subtasks,
    one state file with 5 segments); a rotating quarter of the units fell back to the previous
    checkpoint."""
    parallelism = n_subtasks // len(VERTICES)
    subtasks, units = [], []
    for unit in range(parallelism):
        fallback = (unit + cid) % fallback_every == 0 and cid > 1
        owner = cid - 1 if fallback else cid
        path = f"chk-{owner}/u{unit}-a0.state"
        units.append(UnitState(unit, owner if fallback else None, "timeout" if fallback else None))
        for k, vertex in enumerate(VERTICES):
            h = StateHandle(path, 1024 * k, 1024, 5 * 1024, bytes(range(16)))
            subtasks.append(
                SubtaskState(vertex, unit, unit, owner if fallback else None, handles=(h,))
            )
    return CheckpointMetadata(
        checkpoint_id=cid,
        job_id="bench",
        kind=CheckpointKind.REGIONAL if cid > 1 else CheckpointKind.GLOBAL,
        trigger_time_ms=1_763_800_000_000 + cid * 10_000,
        completion_time_ms=1_763_800_000_000 + cid * 10_000 + 250,
        policy_fingerprint="p" * 16,
        graph_fingerprint="g" * 16,
        vertices=tuple(VertexInfo(v, parallelism, 32768) for v in VERTICES),
        units=tuple(units),
        subtasks=tuple(subtasks),
    )


#: subtasks -> (encode + decode ms, decode ms, bytes per subtask) targets, None: no target
TARGETS: dict[int, tuple[float | None, float | None, float]] = {
    10_000: (100.0, None, 300.0),
    100_000: (None, 40.0, 70.0),
}


def times_ms(fn: Callable[[], object], repeat: int) -> list[float]:
    """`repeat` runs of `fn`, in milliseconds."""
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t) * 1000)
    return times


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    """The fastest of `repeat` runs, in milliseconds (the least disturbed by other load)."""
    return min(times_ms(fn, repeat))


def bench_format(n: int, repeat: int) -> dict[str, float]:
    md = checkpoint(2, n)
    rows = tuple(md.subtasks)
    data = encode_metadata(md)
    assert decode_metadata(data, source="bench") == md

    def encode() -> bytes:  # from rows, not the columns the last encode kept
        return encode_metadata(msgspec.structs.replace(md, subtasks=rows))

    def rows_built() -> object:
        return tuple(decode_metadata(data, source="bench").subtasks)

    enc = times_ms(encode, repeat)
    dec = times_ms(lambda: decode_metadata(data, source="bench"), repeat)
    return {
        "subtasks": n,
        "encode_ms": min(enc),
        "decode_ms": min(dec),
        "encode_median_ms": statistics.median(enc),
        "decode_median_ms": statistics.median(dec),
        "rows_ms": best_ms(rows_built, repeat),
        "bytes_per_subtask": len(data) / n,
    }


def bench_inspector(n_checkpoints: int, n_subtasks: int, repeat: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as root:
        storage = JobStorage(root, "bench")
        for cid in range(1, n_checkpoints + 1):
            md = checkpoint(cid, n_subtasks)
            for u in md.units:
                if u.ref_checkpoint_id is None:
                    segments = [bytes(1024)] * len(VERTICES)
                    handles = storage.write_segments(f"chk-{cid}/u{u.unit_id}-a0.state", segments)
                    checksum = handles[0].checksum
            # every segment holds the same bytes: one checksum fits all handles
            md = _with_checksum(md, checksum)
            storage.write_metadata(md)

        def checkpoints() -> pa.Table:
            return Inspector(CompletedCheckpointStore.load(storage)).checkpoints()

        assert checkpoints().num_rows == n_checkpoints
        report = validate_job(storage)
        assert not report.problems and report.restore_checkpoint_id == n_checkpoints
        return {
            "checkpoints": n_checkpoints,
            "subtasks": n_subtasks,
            "checkpoints_ms": best_ms(checkpoints, repeat),
            "validate_ms": best_ms(lambda: validate_job(storage), repeat),
            "validate_sizes_only_ms": best_ms(
                lambda: validate_job(storage, verify_checksums=False), repeat
            ),
        }


def _with_checksum(md: CheckpointMetadata, checksum: bytes) -> CheckpointMetadata:
    subtasks = tuple(
        msgspec.structs.replace(
            s, handles=tuple(msgspec.structs.replace(h, checksum=checksum) for h in s.handles)
        )
        for s in md.subtasks
    )
    return msgspec.structs.replace(md, subtasks=subtasks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--quick", action="store_true", help="1 run each; the inspector over 10 checkpoints"
    )
    args = parser.parse_args()
    retained = 100
    if args.quick:
        args.repeat, retained = 1, 10
    print(f"format (best / median of {args.repeat} runs; target after the measure)")
    print(
        f"{'subtasks':>9}  {'encode ms':>13}  {'decode ms':>13}{'':7}  {'enc+dec ms':>13}{'':8}  "
        f"{'B/subtask':>6}{'':9}  {'+ rows ms':>9}"
    )
    for n in (1_000, 10_000, 100_000):
        r = bench_format(n, args.repeat)
        enc_dec, decode, size = TARGETS.get(n, (None, None, None))

        def target(limit: float | None, sign: str = "<") -> str:
            return f"({sign} {limit:g})" if limit is not None else ""

        both = r["encode_ms"] + r["decode_ms"]
        both_median = r["encode_median_ms"] + r["decode_median_ms"]
        print(
            f"{n:>9,}  {r['encode_ms']:>6.1f} / {r['encode_median_ms']:<6.1f}"
            f"{r['decode_ms']:>6.1f} / {r['decode_median_ms']:<6.1f}{target(decode):>7}  "
            f"{both:>6.1f} / {both_median:<6.1f}{target(enc_dec):>8}  "
            f"{r['bytes_per_subtask']:>6.1f}{target(size, '≤'):>9}  {r['rows_ms']:>9.1f}"
        )
    repeat = max(1, args.repeat // 2)
    r = bench_inspector(retained, 100, repeat)
    print(
        f"\ninspector over {r['checkpoints']} retained checkpoints of {r['subtasks']} subtasks "
        f"(local disk, best of {repeat})"
    )
    print(f"  checkpoints (load + view)        {r['checkpoints_ms']:8.1f} ms")
    print(f"  validate (sizes and checksums)   {r['validate_ms']:8.1f} ms")
    print(f"  validate --no-checksums          {r['validate_sizes_only_ms']:8.1f} ms")


if __name__ == "__main__":
    main()
