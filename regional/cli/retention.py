"""`--num-retained N` and `--policy FILE` for `regional clean` and `regional inspect`: which
`num-retained` applies, and where it came from.

Precedence: `--num-retained N` > `--policy FILE` (its effective `checkpointing.num-retained`:
the file with the `REGIONAL_CHECKPOINTING…` environment applied, as `regional policy check`
shows it) > the value recorded in the job's newest checkpoint that records one > the policy
default (3), which the note then says. So a job that ran with `num-retained` 10 is cleaned
down to 10, not to the default.

>>> from metadata.retention import NumRetained
>>> note(NumRetained(10, "recorded", "recorded in checkpoint 42", 42))
'num-retained 10 (recorded in checkpoint 42)'
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator

from metadata.errors import MetadataError, StorageError
from metadata.model import CheckpointMetadata
from metadata.retention import NumRetained, recorded_num_retained
from metadata.storage import JobStorage
from regional.errors import UsageError
from regional.policy import MAX_COUNT, load_policy

__all__ = ["add_arguments", "check_option", "in_force", "note", "recorded_in", "retention_row"]

_KEY = "checkpointing.num-retained"


def add_arguments(parser: argparse.ArgumentParser, *, suppress: bool = False) -> None:
    """Add `--num-retained N` and `--policy FILE` (both default None; `suppress` leaves them
    unset, for options that may come before and after a subcommand)."""
    default = argparse.SUPPRESS if suppress else None
    parser.add_argument(
        "--num-retained",
        type=int,
        metavar="N",
        default=default,
        help=f"newest completed checkpoints to retain, 1 to {MAX_COUNT} (default: the number "
        "the job recorded in its latest checkpoint, else 3)",
    )
    parser.add_argument(
        "--policy",
        metavar="FILE",
        default=default,
        help=f"take {_KEY} from this policy file (--num-retained wins over it)",
    )


def check_option(args: argparse.Namespace) -> None:
    """Refuse `--num-retained` outside the range of `checkpointing.num-retained` (1 to
    `regional.policy.MAX_COUNT`): a `UsageError` (exit 2), before anything is read.

    >>> check_option(argparse.Namespace(num_retained=10**22))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    regional.errors.UsageError: --num-retained 10000000000000000000000 is out of range; give ...
    """
    value = args.num_retained
    if value is not None and not 1 <= value <= MAX_COUNT:
        raise UsageError(
            f"--num-retained {value} is out of range; give a whole number from 1 to "
            f"{MAX_COUNT}, the range of {_KEY}"
        )


def in_force(args: argparse.Namespace, recorded: Callable[[], NumRetained]) -> NumRetained:
    """The `num-retained` that applies for `args` (see the module docstring; `--num-retained`
    passed `check_option`); `recorded` is called only when neither option is given. A bad
    policy file raises `PolicyError` (exit 2) naming the file, the key and the value, even when
    `--num-retained` overrides it."""
    from_policy: NumRetained | None = None
    if args.policy is not None:
        resolved = load_policy(args.policy)
        value = resolved.policy.checkpointing.num_retained
        source = resolved.sources[_KEY]
        if source.startswith("file "):
            detail = f"policy {source}"
        elif source.startswith("env "):
            detail = f"environment variable {source[4:]}, applied over policy file {args.policy}"
        else:
            detail = f"policy default: {args.policy} does not set {_KEY}"
        from_policy = NumRetained(value, "policy", detail)
    if args.num_retained is not None:
        detail = "--num-retained"
        if from_policy is not None:
            detail += f", over {from_policy.value} from {from_policy.detail}"
        return NumRetained(args.num_retained, "option", detail)
    return from_policy if from_policy is not None else recorded()


def note(setting: NumRetained) -> str:
    """The line that tells people which `num-retained` applies and where it came from."""
    if setting.source == "default":
        return (
            f"num-retained {setting.value} ({setting.detail}; pass --num-retained N or "
            "--policy FILE if the job kept another number)"
        )
    return str(setting)


def _newest_first(storage: JobStorage) -> Iterator[CheckpointMetadata]:
    for cid in reversed(storage.list_checkpoint_ids()):
        try:
            yield storage.read_metadata(cid)
        except (MetadataError, StorageError):
            continue  # damaged metadata is reported by the view or plan that reads it


def recorded_in(storage: JobStorage) -> NumRetained:
    """The `num-retained` recorded in the job's newest checkpoint that records one (reading
    metadata newest first, usually one file), else the default."""
    return recorded_num_retained(_newest_first(storage))


def retention_row(setting: NumRetained) -> dict[str, object]:
    """The first row of `clean --json` and `inspect retention --json` (`row` =
    ``num-retained``): `checkpoint_id` that recorded it (or null), `reason` the source
    (recorded, default, policy, option), `detail` the note."""
    return {
        "row": "num-retained",
        "checkpoint_id": setting.checkpoint_id,
        "path": None,
        "action": "report",
        "reason": setting.source,
        "kept_by": [],
        "units": [],
        "kept_bytes": 0,
        "deleted_bytes": 0,
        "detail": note(setting),
    }
