"""Cleaner benchmarks: planning time at scale, and bytes kept by file-level retention.

1. Planning time (`cleaner.plan.plan_retention`, pure, metadata already decoded) for 100
   retained checkpoints x 10,000 subtasks (1,000 units of 10 subtasks, one packed file per
   unit attempt), with 5% of the units falling back in each checkpoint. Target: under 0.5 s.
   Wall and CPU time are both shown: CPU time is the steadier one on a busy machine.
2. A job of 256 units where unit 0 stays on fallback state for 50 checkpoints (every other
   unit fresh each time), 1 MB of state per unit: bytes kept by
   - Flink's branch: refs to the previous checkpoint (chains), referenced checkpoints kept whole;
   - owner refs, but referenced checkpoints kept whole;
   - regional: owner refs, only referenced files kept.

Run: `.venv/bin/python -m benchmarks.bench_cleaner [--json benchmarks/results/cleaner.json]
[--quick]`.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import time

from cleaner.plan import ListedFile, RetentionPlan, plan_retention
from metadata.model import CheckpointKind, CheckpointMetadata, StateHandle, SubtaskState, UnitState

MB = 1_000_000


def build(
    n_checkpoints: int,
    n_units: int,
    subtasks_per_unit: int,
    fallback: dict[int, set[int]],
    *,
    unit_bytes: int,
    chain: bool = False,
) -> tuple[list[CheckpointMetadata], list[ListedFile]]:
    """Checkpoints 1..n: unit u of checkpoint c falls back when u in fallback.get(c); each unit
    attempt writes one packed file with one segment per subtask. `chain` records the previous
    checkpoint as the reference (Flink's branch) instead of the owner."""
    owner = dict.fromkeys(range(n_units), 0)
    seg = unit_bytes // subtasks_per_unit
    completed: list[CheckpointMetadata] = []
    files: list[ListedFile] = []
    for cid in range(1, n_checkpoints + 1):
        failed = fallback.get(cid, set()) if cid > 1 else set()
        subtasks = []
        units = []
        for u in range(n_units):
            ref: int | None = None
            if u in failed:
                ref = cid - 1 if chain else owner[u]
                units.append(UnitState(u, ref, "timeout"))
            else:
                owner[u] = cid
                files.append(ListedFile(f"chk-{cid}/u{u}-a0.state", unit_bytes))
            path = f"chk-{owner[u]}/u{u}-a0.state"
            for i in range(subtasks_per_unit):
                h = StateHandle(path, i * seg, seg, unit_bytes, b"")
                subtasks.append(SubtaskState("op", u * subtasks_per_unit + i, u, ref, handles=(h,)))
        files.append(ListedFile(f"chk-{cid}/_metadata", 1000))
        completed.append(
            CheckpointMetadata(
                checkpoint_id=cid,
                job_id="bench",
                kind=CheckpointKind.REGIONAL if failed else CheckpointKind.GLOBAL,
                trigger_time_ms=cid,
                completion_time_ms=cid,
                units=tuple(units),
                subtasks=tuple(subtasks),
            )
        )
    return completed, files


def planning_time(n_checkpoints: int = 100, repeats: int = 5) -> dict[str, float]:
    n_units, per_unit = 1000, 10
    # 5% of units fall back in each checkpoint, rotating.
    fallback = {c: {(c * 50 + k) % n_units for k in range(50)} for c in range(1, n_checkpoints + 1)}
    completed, files = build(n_checkpoints, n_units, per_unit, fallback, unit_bytes=10 * MB)
    wall, cpu = [], []
    plan: RetentionPlan | None = None
    for _ in range(repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        plan = plan_retention(completed, files, num_retained=n_checkpoints)
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    assert plan is not None and len(plan.retained_ids) == n_checkpoints
    return {
        "checkpoints": len(completed),
        "subtasks_per_checkpoint": n_units * per_unit,
        "listed_files": len(files),
        "median_s": statistics.median(wall),
        "min_s": min(wall),
        "median_cpu_s": statistics.median(cpu),
    }


def fallback_bytes(num_retained: int) -> dict[str, float]:
    n_units, n_fallback = 256, 50
    fallback = {c: {0} for c in range(2, 2 + n_fallback)}
    n = 1 + n_fallback
    owner_md, files = build(n, n_units, 4, fallback, unit_bytes=MB)
    chain_md, _ = build(n, n_units, 4, fallback, unit_bytes=MB, chain=True)
    ours = plan_retention(owner_md, files, num_retained=num_retained)
    chain = plan_retention(chain_md, files, num_retained=num_retained)
    return {
        "num_retained": num_retained,
        "stored_mb": sum(f.size for f in files) / MB,
        "flink_chain_whole_mb": chain.whole_checkpoint_bytes / MB,
        "owner_whole_mb": ours.whole_checkpoint_bytes / MB,
        "regional_files_mb": ours.kept_bytes / MB,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=pathlib.Path, help="also write the results as JSON here")
    ap.add_argument("--quick", action="store_true", help="plan 10 checkpoints, once")
    args = ap.parse_args()
    t = planning_time(10, repeats=1) if args.quick else planning_time()
    print("planning time (plan_retention, decoded metadata in memory)")
    print("checkpoints  subtasks/checkpoint  listed files  median s  min s  median cpu s  target s")
    print(
        f"{t['checkpoints']:>11}  {t['subtasks_per_checkpoint']:>19}  {t['listed_files']:>12}"
        f"  {t['median_s']:>8.3f}  {t['min_s']:>5.3f}  {t['median_cpu_s']:>12.3f}  {0.5:>8.1f}"
    )
    print()
    print("256 units, unit 0 on fallback for 50 checkpoints, 1 MB per unit: MB kept")
    print("num_retained  stored  flink chain, whole  owner refs, whole  regional (files)  ratio")
    rows = [fallback_bytes(r) for r in (1, 3)]
    for r in rows:
        ratio = r["flink_chain_whole_mb"] / r["regional_files_mb"]
        print(
            f"{r['num_retained']:>12}  {r['stored_mb']:>6.0f}  {r['flink_chain_whole_mb']:>18.0f}"
            f"  {r['owner_whole_mb']:>17.0f}  {r['regional_files_mb']:>16.0f}  {ratio:>5.1f}x"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"planning": t, "fallback_bytes": rows}, indent=2))


if __name__ == "__main__":
    main()
