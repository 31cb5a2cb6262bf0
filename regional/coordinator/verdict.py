"""The decision of DESIGN §4 rule 3 for a checkpoint with failed units, in exactly this order:

(a) a failed unit must be fresh, (b) the job has one fallback unit only, (c) failed / all units
> `max-failure-ratio` (exact rational comparison; equal passes), (d) a failed unit has no usable
earlier state, (e) an operator coordinator cannot produce a fallback snapshot. Pure: the state
checks come in as functions.

>>> from fractions import Fraction
>>> v = evaluate(7, {3: "timeout"}, num_units=10, max_failure_ratio=Fraction("0.3"),
...     must_be_fresh=lambda u: None, unusable=lambda us: None, fallback_snapshots=lambda: {})
>>> v.rule is None, v.snapshots
(True, {})
>>> evaluate(7, {1: "x", 2: "y", 3: "z", 4: "w"}, num_units=10,
...     max_failure_ratio=Fraction("0.3"), must_be_fresh=lambda u: None,
...     unusable=lambda us: None, fallback_snapshots=lambda: {}).rule
<Rule.FAILURE_RATIO: '3c-failure-ratio'>
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from fractions import Fraction

from regional.coordinator.decisions import Rule

__all__ = ["Verdict", "evaluate", "failure_ratio", "name_units"]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """`rule` None: complete as regional with these coordinator `snapshots`; else abort."""

    rule: Rule | None
    message: str = ""
    snapshots: Mapping[str, bytes] = dataclasses.field(default_factory=dict)


def failure_ratio(ratio: float) -> Fraction:
    """The policy's ratio as the exact fraction the user wrote (0.3 is 3/10, not a binary float).

    >>> failure_ratio(0.3)
    Fraction(3, 10)
    """
    return Fraction(str(ratio))


def name_units(units: Iterable[int], limit: int = 10) -> str:
    """`"units 1, 2, 3"`, `"unit 4"`, or the first `limit` and how many more.

    >>> name_units([5]), name_units(range(12), limit=3)
    ('unit 5', 'units 0, 1, 2 (+9 more)')
    """
    us = sorted(units)
    head = ", ".join(map(str, us[:limit]))
    more = f" (+{len(us) - limit} more)" if len(us) > limit else ""
    return f"{'unit' if len(us) == 1 else 'units'} {head}{more}"


def evaluate(
    checkpoint_id: int,
    failed: Mapping[int, str],
    *,
    num_units: int,
    max_failure_ratio: Fraction,
    must_be_fresh: Callable[[int], str | None],
    unusable: Callable[[Sequence[int]], tuple[int, str] | None],
    fallback_snapshots: Callable[[], Mapping[str, bytes] | str],
) -> Verdict:
    """Rule 3 for checkpoint `checkpoint_id` whose `failed` units (unit -> cause) did not ack.

    `must_be_fresh(u)` says why unit u had to be fresh (or None); `unusable(units)` returns the
    first of `units` (ascending) whose earlier state cannot be used, with why (or None);
    `fallback_snapshots()` returns the coordinators' snapshots or a message saying which
    coordinator could not produce one.
    """
    prefix = f"checkpoint {checkpoint_id} aborted"
    units = sorted(failed)
    for unit in units:
        if (why := must_be_fresh(unit)) is not None:
            return Verdict(
                Rule.MUST_BE_FRESH,
                f"{prefix} (rule 3a): unit {unit} had to be fresh ({why}) but failed: "
                f"{failed[unit]}",
            )
    if num_units <= 1:
        return Verdict(
            Rule.SINGLE_UNIT,
            f"{prefix} (rule 3b): the job has a single fallback unit, so it cannot fall back "
            f"while others commit; unit failures: {_causes(failed)}",
        )
    ratio = Fraction(len(failed), num_units)
    if ratio > max_failure_ratio:
        return Verdict(
            Rule.FAILURE_RATIO,
            f"{prefix} (rule 3c): {len(failed)} of {num_units} units failed "
            f"({float(ratio):.4g} > max-failure-ratio {float(max_failure_ratio):g}): "
            f"{_causes(failed)}; fix what the causes name (a unit failing on a record or in "
            "user code fails the same way on every retry), or, for failures that pass on "
            "their own, raise checkpointing.region.max-failure-ratio",
        )
    if (found := unusable(units)) is not None:
        unit, why = found
        return Verdict(
            Rule.NO_USABLE_STATE,
            f"{prefix} (rule 3d): unit {unit} failed ({failed[unit]}) and has no usable "
            f"earlier state: {why}",
        )
    snapshots = fallback_snapshots()
    if isinstance(snapshots, str):
        return Verdict(Rule.COORDINATOR_FALLBACK, f"{prefix} (rule 3e): {snapshots}")
    return Verdict(None, snapshots=snapshots)


def _causes(failed: Mapping[int, str], limit: int = 5) -> str:
    units = sorted(failed)
    text = "; ".join(f"unit {u}: {failed[u]}" for u in units[:limit])
    return text + (f"; +{len(units) - limit} more" if len(units) > limit else "")
