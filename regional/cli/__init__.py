"""The `regional` command line: `run`, `regions`, `inspect`, `dead-letters`, `clean`, `policy
check`.

Each command lives in its own module of this package and exposes
`register(subparsers) -> None`, which adds its parser and sets `handler(args) -> int` as the
parser default. Exit codes everywhere: 0 success, 1 the operation failed, 2 bad usage or bad
input; errors print one line on stderr, with the traceback only under `--verbose`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import traceback
from collections.abc import Sequence

from metadata.errors import RegionalError
from regional import __version__

__all__ = ["main", "one_line"]

#: Command modules, in the order `regional --help` lists them.
COMMANDS: tuple[str, ...] = ("run", "regions", "inspect", "dead-letters", "policy", "clean")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with every command registered."""
    parser = argparse.ArgumentParser(
        prog="regional",
        description="Regional checkpoints for PySpark pipelines.",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="show tracebacks and Spark's own log lines"
    )
    parser.add_argument("--version", action="version", version=f"regional {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in COMMANDS:
        importlib.import_module(f"regional.cli.{name.replace('-', '_')}").register(sub)
    _accept_verbose_after(parser)
    return parser


def _accept_verbose_after(parser: argparse.ArgumentParser) -> None:
    """Accept `--verbose` after every (sub)command too: `regional run --verbose FILE` as well as
    `regional --verbose run FILE`. SUPPRESS keeps a subcommand from resetting the flag given
    before it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in set(action.choices.values()):
                command.add_argument(
                    "--verbose",
                    action="store_true",
                    default=argparse.SUPPRESS,
                    help="show tracebacks and Spark's own log lines",
                )
                _accept_verbose_after(command)


def one_line(exc: BaseException) -> str:
    """The error's message on one line (a message can carry a user's multi-line text, e.g. an
    exception raised by a pipeline file), so stderr gets exactly one line per error.

    >>> one_line(ValueError("two\\n  lines"))
    'two lines'
    """
    return " ".join(part.strip() for part in str(exc).splitlines() if part.strip())


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `regional` console script; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except RegionalError as exc:
        if args.verbose:
            traceback.print_exc()
        from regional.cli.render import terminal_text  # a message can carry stored text

        print(f"regional {args.command}: {terminal_text(one_line(exc))}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"regional {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
