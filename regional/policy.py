"""The checkpoint policy (DESIGN §4 rule 5, §7).

This file currently holds the policy's *shape* (frozen msgspec Structs with defaults) that the
coordinator and runtime code against. Loading from TOML, environment overrides, precedence and
validation are added next to it.

Durations are float seconds. `max_consecutive_regional` is None for "unlimited".
"""

from __future__ import annotations

from typing import Literal

import msgspec

__all__ = ["CheckpointingPolicy", "Policy", "RegionPolicy", "RestorePolicy"]


class RegionPolicy(
    msgspec.Struct, frozen=True, kw_only=True, rename="kebab", forbid_unknown_fields=True
):
    """`[checkpointing.region]`: regional checkpoints and their staleness limits."""

    enabled: bool = True
    max_failure_ratio: float = 0.3
    max_consecutive_regional: int | None = 10
    max_unit_fallbacks: int = 3
    timeout: float = 120.0


class CheckpointingPolicy(
    msgspec.Struct, frozen=True, kw_only=True, rename="kebab", forbid_unknown_fields=True
):
    """`[checkpointing]`: how often, how long, how many to keep, where."""

    interval: float = 10.0
    timeout: float = 600.0
    num_retained: int = 3
    tolerable_failed_checkpoints: int = 10
    dir: str | None = None
    region: RegionPolicy = RegionPolicy()


class RestorePolicy(
    msgspec.Struct, frozen=True, kw_only=True, rename="kebab", forbid_unknown_fields=True
):
    """`[restore]`: whether a restored checkpoint becomes ours (`claim`) or stays the user's."""

    mode: Literal["claim", "no-claim"] = "claim"


class Policy(msgspec.Struct, frozen=True, kw_only=True, rename="kebab", forbid_unknown_fields=True):
    """The whole policy. `Policy()` is the default policy."""

    checkpointing: CheckpointingPolicy = CheckpointingPolicy()
    restore: RestorePolicy = RestorePolicy()
