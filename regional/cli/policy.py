"""`regional policy check FILE [--json]`: validate a policy file and show the effective policy.

The effective policy is the file with the `REGIONAL_CHECKPOINTING...` / `REGIONAL_RESTORE...`
environment variables of this shell applied over it (the same precedence as at run time), one
row per key with the value's source. A bad file or variable exits with 2 and one line on stderr.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from regional.cli.render import print_table, say
from regional.policy import load_policy

__all__ = ["register"]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add `policy` with its `check` subcommand."""
    parser = subparsers.add_parser(
        "policy", help="check a policy file", description="Work with policy files."
    )
    commands = parser.add_subparsers(dest="policy_command", metavar="SUBCOMMAND", required=True)
    check = commands.add_parser(
        "check",
        help="validate a policy file and print the effective policy",
        description="Validate FILE and print every policy key with its effective value and "
        "where it came from (default, file, or a REGIONAL_ environment variable).",
    )
    check.add_argument("file", metavar="FILE", type=Path, help="TOML policy file")
    check.add_argument(
        "--json", action="store_true", help="print a JSON array of {key, value, source}"
    )
    check.set_defaults(handler=check_policy)


#: What the table cannot say about the interval (printed under it, not with --json).
INTERVAL_NOTE = (
    "checkpointing.interval: the wait from one trigger to the next after an epoch that read "
    "no records; epochs that read records follow at once (regional run --interval overrides it)"
)


def check_policy(args: argparse.Namespace) -> int:
    """Load `args.file` with this process's environment and print the effective policy."""
    resolved = load_policy(args.file, env=os.environ)
    print_table(resolved.table(readable=not args.json), as_json=args.json)
    if not args.json:
        say(f"\n{INTERVAL_NOTE}")
    return 0
