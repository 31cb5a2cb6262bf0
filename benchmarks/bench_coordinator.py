"""Regional versus global checkpoints in the deterministic simulator (no Spark).

10,000 units, per-unit failure probability p per checkpoint (a third of failures hang until the
unit timeout, the rest decline), 200 checkpoints, default policy; "global" is the same policy
with `checkpointing.region.enabled = false`. Per run: completed-checkpoint ratio, mean and max
unit lag (checkpoints between a unit's state in the latest completed checkpoint and now),
work redone (unit-epochs re-processed after restarting from older state), and the coordinator's
CPU time per checkpoint (process time inside coordinator calls only: trigger, each dispatch's
batch of answers, ticks, completion, commits).

    .venv/bin/python -m benchmarks.bench_coordinator [--units N] [--checkpoints N] [--json]
        [--max-consecutive-regional N|unlimited]   # the regional mode's tier-1 limit
        [--quick]                                  # 1,000 units, 20 checkpoints

`--scale` prints the scale table instead (issue 17): 100,000 units (four source→sink chains of
25,000), p = 0.05, regional mode, `--checkpoints` (default 10) per run, `--repeat` runs (default
3); per run the coordinator's ms per checkpoint (mean and median over epochs), the timing floor
(the same number of timed calls to a coordinator that does nothing, through the same per-call
timer: a few per checkpoint, since the driver hands each dispatch's answers over as one batch),
the net, and the target (< 50 ms); per call, a batch's time is split between `on_ack` and
`on_decline` by their numbers. The simulation runs each dispatch's units in tasks of at most
1,024 and packs each task's acks into one `AckBatch` (`Simulation(ack_batch=...)`), as a Spark
task packs its partition's. With `--quick`: 33,000 units (two chains), 3 checkpoints, one run.
Measured numbers: the README, Performance, "The pure core at 100,000 units".

    .venv/bin/python -m benchmarks.bench_coordinator --scale [--units N] [--checkpoints N]
        [--repeat N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import statistics
from pathlib import Path

import msgspec

from regional.policy import CheckpointingPolicy, Policy, RegionPolicy
from regional.runtime.sim import RandomFaults, Simulation, timing_floor

PROBABILITIES = (0.0001, 0.001, 0.01, 0.05)
# tolerable-failed-checkpoints is raised so that every run goes the full length instead of
# failing the job (global mode at p >= 0.001 would fail after 11 aborts).
_TOLERATE_ALL = 1_000_000  # the policy's bound: aborts never fail the job here
MODES = {
    "regional": Policy(
        checkpointing=CheckpointingPolicy(tolerable_failed_checkpoints=_TOLERATE_ALL)
    ),
    "global": Policy(
        checkpointing=CheckpointingPolicy(
            tolerable_failed_checkpoints=_TOLERATE_ALL, region=RegionPolicy(enabled=False)
        )
    ),
}


def measure(args: tuple[str, float, int, int, int | None]) -> dict[str, object]:
    mode, p, units, checkpoints, tier1 = args
    policy = MODES[mode]
    if mode == "regional":
        region = msgspec.structs.replace(
            policy.checkpointing.region, max_consecutive_regional=tier1
        )
        policy = msgspec.structs.replace(
            policy, checkpointing=msgspec.structs.replace(policy.checkpointing, region=region)
        )
    sim = Simulation(
        units,
        policy,
        faults=RandomFaults(p, seed=42),
        bounded=False,
        records_per_epoch=1,
        stage_output=False,
    )
    r = sim.run(checkpoints)
    return {
        "mode": mode,
        "p": p,
        "units": units,
        "checkpoints": r.triggered,
        "completed_ratio": r.completed / r.triggered,
        "regional": sum(m.kind.value == "regional" for m in r.metadata),
        "mean_lag": r.mean_lag,
        "max_lag": r.lag_max,
        "redone_unit_epochs": r.redone_unit_epochs,
        "unit_epochs": r.unit_epochs,
        "cpu_ms_per_checkpoint": 1000 * r.coordinator_seconds / r.triggered,
        "failed": r.failed,
    }


#: Coordinator time per checkpoint at 100,000 units and p = 0.05 (issue 17).
SCALE_TARGET_MS = 50.0


class ScaleRun(msgspec.Struct):
    """One run of the scale table; times in ms per checkpoint."""

    units: int
    checkpoints: int
    completed: int
    mean_ms: float  # coordinator time per checkpoint, over the run
    median_ms: float  # the median epoch's coordinator time
    floor_ms: float  # the same number of timed calls to a coordinator that does nothing
    by_call_ms: dict[str, float]
    failed: str | None

    @property
    def net_ms(self) -> float:
        return self.mean_ms - self.floor_ms


def measure_scale(units: int, checkpoints: int) -> ScaleRun:
    """One regional run at `units` units, p = 0.05."""
    sim = Simulation(
        units,
        MODES["regional"],
        faults=RandomFaults(0.05, seed=42),
        bounded=False,
        records_per_epoch=1,
        stage_output=False,
    )
    r = sim.run(checkpoints)
    n = r.triggered
    return ScaleRun(
        units=units,
        checkpoints=n,
        completed=r.completed,
        mean_ms=1000 * r.coordinator_seconds / n,
        median_ms=1000 * statistics.median(r.coordinator_epoch_seconds),
        floor_ms=1000 * timing_floor(r.coordinator_timed_calls // n),
        by_call_ms={k: 1000 * v / n for k, v in r.coordinator_seconds_by_call.items()},
        failed=r.failed,
    )


def scale_table(units: int, checkpoints: int, repeat: int) -> list[ScaleRun]:
    """Print the scale table: one row per run, then the best and the median run."""
    print(
        f"{units:,} units, p = 0.05, regional (default policy), {checkpoints} checkpoints per "
        f"run; coordinator ms per checkpoint; target < {SCALE_TARGET_MS:g} ms"
    )
    head = (
        f"{'run':>3} | {'completed':>9} | {'mean':>7} | {'median':>7} | {'floor':>7} | "
        f"{'net':>7} | {'target':>6} | per call (mean ms/checkpoint)"
    )
    print(head)
    print("-" * len(head))
    runs = []
    for k in range(1, repeat + 1):
        run = measure_scale(units, checkpoints)
        runs.append(run)
        calls = ", ".join(f"{c} {ms:.1f}" for c, ms in run.by_call_ms.items())
        print(
            f"{k:>3} | {run.completed:>4} / {run.checkpoints:<2} | {run.mean_ms:>7.1f} | "
            f"{run.median_ms:>7.1f} | {run.floor_ms:>7.1f} | {run.net_ms:>7.1f} | "
            f"{'< ' + format(SCALE_TARGET_MS, 'g'):>6} | {calls}"
        )
        if run.failed:
            print(f"note: run {k}: {run.failed[:160]}")
    means = [r.mean_ms for r in runs]
    nets = [r.net_ms for r in runs]
    print(
        f"best / median of {repeat} runs: {min(means):.1f} / {statistics.median(means):.1f} ms "
        f"per checkpoint; net of the timing floor {min(nets):.1f} / {statistics.median(nets):.1f}"
        f" ms (target < {SCALE_TARGET_MS:g} ms)"
    )
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=None, help="default 10,000 (--scale: 100,000)")
    parser.add_argument("--checkpoints", type=int, default=None, help="default 200 (--scale: 10)")
    parser.add_argument("--scale", action="store_true", help="the scale table (issue 17)")
    parser.add_argument("--repeat", type=int, default=3, help="--scale: runs (default 3)")
    parser.add_argument("--json", action="store_true", help="also write benchmarks/results/")
    parser.add_argument(
        "--max-consecutive-regional",
        default="10",
        help='tier-1 limit of the regional mode: a number or "unlimited" (default 10)',
    )
    parser.add_argument("--quick", action="store_true", help="1,000 units, 20 checkpoints")
    args = parser.parse_args()
    if args.scale:
        if args.quick:
            args.units, args.checkpoints, args.repeat = 33_000, 3, 1
        scale_table(args.units or 100_000, args.checkpoints or 10, args.repeat)
        return
    args.units = args.units or 10_000
    args.checkpoints = args.checkpoints or 200
    if args.quick:
        args.units, args.checkpoints = 1_000, 20
    limit = args.max_consecutive_regional
    tier1 = None if limit == "unlimited" else int(limit)
    jobs = [(m, p, args.units, args.checkpoints, tier1) for p in PROBABILITIES for m in MODES]
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        rows = pool.map(measure, jobs)
    by = {(r["mode"], r["p"]): r for r in rows}
    print(
        f"{args.units} units, {args.checkpoints} checkpoints, default policy "
        f"(regional: max-consecutive-regional = {limit}); each measure as regional / global"
    )
    head = (
        f"{'p':>7} | {'completed':^15} | {'mean unit lag':^13} | {'max lag':^11} | "
        f"{'work redone (unit-epochs)':^23} | {'coordinator ms/ckpt':^17}"
    )
    print(head)
    print("-" * len(head))
    for p in PROBABILITIES:
        g, r = by["global", p], by["regional", p]
        print(
            f"{p:>7} | {r['completed_ratio']:>6.1%} / {g['completed_ratio']:<6.1%} | "
            f"{r['mean_lag']:>5.2f} / {g['mean_lag']:<5.1f} | "
            f"{r['max_lag']:>4} / {g['max_lag']:<4} | "
            f"{r['redone_unit_epochs']:>10} / {g['redone_unit_epochs']:<10} | "
            f"{r['cpu_ms_per_checkpoint']:>7.1f} / {g['cpu_ms_per_checkpoint']:<7.1f}"
        )
    for row in rows:
        if row["failed"]:
            print(f"note: {row['mode']} p={row['p']}: {str(row['failed'])[:160]}")
    if args.json:
        suffix = ("" if limit == "10" else f"-tier1-{limit}") + ("-quick" if args.quick else "")
        out = Path(__file__).parent / "results" / f"coordinator{suffix}.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps(rows, indent=2))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
