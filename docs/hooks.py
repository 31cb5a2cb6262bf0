"""MkDocs hooks: the reference sections generated from the code, so they cannot drift from it.

A page asks for a section with an HTML comment on a line of its own, e.g.
``<!-- reference: cli -->``; `on_page_markdown` replaces it with the generated Markdown:

- ``cli``: the help of every `regional` command and subcommand, from the argparse parsers;
- ``policy-keys``: every policy key (type, default, allowed values, environment variable and what
  it does), from the policy Structs and `regional.policy.KEY_DOCS`;
- ``views``: the columns of every inspector view, from the `*_SCHEMA` Arrow schemas;
- ``errors``: the exception hierarchy under `RegionalError`, with exit codes.

An unknown section name fails the build (`--strict` turns the warning into an error).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import io
import logging
import os
import pkgutil
import re
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("mkdocs.plugins.regional")

_MARKER = re.compile(r"^<!-- reference: ([a-z-]+) -->$", re.M)


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Replace every reference marker of the page with its generated section."""

    def sub(m: re.Match[str]) -> str:
        make = SECTIONS.get(m.group(1))
        if make is None:
            log.warning("%s: unknown reference section %r", page.file.src_path, m.group(1))
            return m.group(0)
        return make()

    return _MARKER.sub(sub, markdown)


# --- CLI ---------------------------------------------------------------------------------------


def _parsers(parser: argparse.ArgumentParser, name: str) -> Iterator[tuple[str, str]]:
    yield name, parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen = set()
            for sub_name, sub in action.choices.items():
                if id(sub) not in seen:  # aliases share a parser
                    seen.add(id(sub))
                    yield from _parsers(sub, f"{name} {sub_name}")


def cli_reference() -> str:
    from regional.cli import build_parser

    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps help at the terminal's width
    try:
        out = []
        for name, text in _parsers(build_parser(), "regional"):
            level = "#" * min(2 + name.count(" "), 4)
            out.append(f"{level} `{name}`\n\n```text\n{text.rstrip()}\n```\n")
        return "\n".join(out)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


# --- policy keys -------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def policy_reference() -> str:
    from regional.policy import KEY_DOCS, policy_keys

    rows = [
        "| key | default | allowed | environment variable |",
        "|---|---|---|---|",
    ]
    details = []
    for key in policy_keys():
        rows.append(
            f"| [`{key.path}`](#{key.path.replace('.', '').replace('-', '')}) "
            f"| `{key.default}` | {_cell(key.allowed)} | `{key.env}` |"
        )
        details.append(
            f"### `{key.path}` {{#{key.path.replace('.', '').replace('-', '')}}}\n\n"
            f"Default `{key.default}`; {key.allowed}.\n\n{KEY_DOCS[key.path]}\n"
        )
    return "\n".join(rows) + "\n\n" + "\n".join(details)


# --- inspector views ---------------------------------------------------------------------------

_VIEW_MODULES = (
    "metadata.inspect",
    "metadata.events",
    "metadata.exchange",
    "cleaner.views",
    "regional.report.state",
)


def _producers(module: Any, name: str) -> list[Callable[..., Any]]:
    """The module's public functions whose docstring names the schema `name`."""
    return [
        f
        for n, f in vars(module).items()
        if inspect.isfunction(f)
        and not n.startswith("_")
        and f.__module__ == module.__name__
        and f"`{name}`" in (f.__doc__ or "")
    ]


def views_reference() -> str:
    out = []
    for module_name in _VIEW_MODULES:
        module = importlib.import_module(module_name)
        for name in sorted(n for n in getattr(module, "__all__", ()) if n.endswith("_SCHEMA")):
            schema = getattr(module, name)
            out.append(f"### `{module_name}.{name}`\n")
            for f in _producers(module, name):
                doc = inspect.cleandoc(f.__doc__ or "")
                out.append(f"`{f.__name__}`: {doc}\n")
            out.append("| column | Arrow type |\n|---|---|")
            out += [f"| `{field.name}` | `{field.type}` |" for field in schema]
            out.append("")
    return "\n".join(out)


# --- errors ------------------------------------------------------------------------------------


def _import_all() -> None:
    """Import every module of ours, so every exception class is defined."""
    for package_name in ("metadata", "cleaner", "regional"):
        package = importlib.import_module(package_name)
        for m in pkgutil.walk_packages(package.__path__, package_name + "."):
            if m.name.endswith("__main__"):
                continue
            with contextlib.suppress(ImportError):  # an optional extra that is not installed
                importlib.import_module(m.name)


def errors_reference() -> str:
    from regional.errors import RegionalError

    _import_all()
    out = io.StringIO()

    def walk(cls: type[BaseException], depth: int) -> None:
        doc = inspect.cleandoc(cls.__doc__ or "").split("\n\n")[0].replace("\n", " ")
        code = getattr(cls, "exit_code", None)
        exit_text = f" (exit code {code})" if code is not None else ""
        out.write(f"{'    ' * depth}- `{cls.__module__}.{cls.__qualname__}`{exit_text}: {doc}\n")
        for sub in sorted(cls.__subclasses__(), key=lambda c: (c.__module__, c.__qualname__)):
            if sub.__module__.split(".")[0] in ("regional", "metadata", "cleaner"):
                walk(sub, depth + 1)

    walk(RegionalError, 0)
    return out.getvalue()


SECTIONS: dict[str, Callable[[], str]] = {
    "cli": cli_reference,
    "policy-keys": policy_reference,
    "views": views_reference,
    "errors": errors_reference,
}
