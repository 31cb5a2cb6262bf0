"""Regional versus global checkpoints in the deterministic simulator (no Spark).

10,000 units, per-unit failure probability p per checkpoint (a third of failures hang until the
unit timeout, the rest decline), 200 checkpoints, default policy; "global" is the same policy
with `checkpointing.region.enabled = false`. Per run: completed-checkpoint ratio, mean and max
unit lag (checkpoints between a unit's state in the latest completed checkpoint and now),
work redone (unit-epochs re-processed after restarting from older state), and the coordinator's
CPU time per checkpoint (process time inside coordinator calls only: trigger, every ack and
decline, ticks, completion, commits).

    .venv/bin/python -m benchmarks.bench_coordinator [--units N] [--checkpoints N] [--json]
        [--max-consecutive-regional N|unlimited]   # the regional mode's tier-1 limit
        [--quick]                                  # 1,000 units, 20 checkpoints
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
from pathlib import Path

import msgspec

from regional.policy import CheckpointingPolicy, Policy, RegionPolicy
from regional.sim import RandomFaults, Simulation

PROBABILITIES = (0.0001, 0.001, 0.01, 0.05)
# tolerable-failed-checkpoints is raised so that every run goes the full length instead of
# failing the job (global mode at p >= 0.001 would fail after 11 aborts).
_TOLERATE_ALL = 10**9
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--checkpoints", type=int, default=200)
    parser.add_argument("--json", action="store_true", help="also write benchmarks/results/")
    parser.add_argument(
        "--max-consecutive-regional",
        default="10",
        help='tier-1 limit of the regional mode: a number or "unlimited" (default 10)',
    )
    parser.add_argument("--quick", action="store_true", help="1,000 units, 20 checkpoints")
    args = parser.parse_args()
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
