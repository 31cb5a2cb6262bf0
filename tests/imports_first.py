"""Import each module named on stdin as the first of our modules an interpreter loads, and
print ``module<TAB>error`` for each that fails (an import cycle shows only this way).

A fresh interpreter per module costs half a second, almost all of it third-party imports
(pyarrow, pyspark, msgspec...). So this script loads those once, then forks a child per
module: the child starts with no module of ours loaded, exactly like a fresh interpreter as
far as our import order goes, and imports the module. What counts as third-party is found by a
throwaway child that imports every module and reports what else it loaded.

Run by `tests/test_imports.py` in a fresh interpreter (pytest has loaded our modules):
``python tests/imports_first.py [PACKAGE ...] < modules`` (default: regional, metadata,
cleaner).
"""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import traceback
from collections.abc import Callable

#: The packages whose modules are checked (the command's arguments name others).
OURS = ["regional", "metadata", "cleaner"]


def _ours(name: str) -> bool:
    return name.split(".")[0] in OURS


def _in_child(work: Callable[[], str], send: Callable[[int, int], None]) -> int:
    """Fork; the child runs `work()` and sends the text it returns; returns the child's pid
    and the parent's end of the pipe."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        os.close(read)
        code = 0
        try:
            text = work()
        except BaseException as exc:  # the import's own error, reported as its last line
            text = traceback.format_exception_only(exc)[-1].strip()
            code = 1
        os.write(write, text.encode())
        os._exit(code)
    os.close(write)
    send(pid, read)
    return pid


def _read(fd: int) -> str:
    with os.fdopen(fd) as pipe:
        return pipe.read()


def _import(name: str) -> str:
    importlib.import_module(name)
    return ""


def _import_all(modules: list[str]) -> str:
    for name in modules:
        with contextlib.suppress(BaseException):  # reported by that module's own child
            importlib.import_module(name)
    return "\n".join(n for n in list(sys.modules) if not _ours(n))


def main() -> int:
    OURS[:] = sys.argv[1:] or OURS
    modules = sys.stdin.read().split()
    pipes: dict[int, int] = {}

    pid = _in_child(lambda: _import_all(modules), pipes.__setitem__)
    outside = _read(pipes.pop(pid)).split()
    os.waitpid(pid, 0)
    for name in outside:
        with contextlib.suppress(BaseException):  # one only its parent loads, a platform's
            importlib.import_module(name)
    loaded = sorted(n for n in sys.modules if _ours(n))
    if loaded:
        print(f"<preload>\ta third-party import loaded our modules: {loaded}")
        return 1

    failures: dict[str, str] = {}
    running: dict[int, str] = {}
    pending = list(modules)
    width = os.cpu_count() or 2
    while pending or running:
        while pending and len(running) < width:
            name = pending.pop()
            pid = _in_child(lambda name=name: _import(name), pipes.__setitem__)
            running[pid] = name
        pid, status = os.wait()
        text = _read(pipes.pop(pid))
        name = running.pop(pid)
        if status != 0:
            failures[name] = text or f"exit status {status}"
    for name, text in sorted(failures.items()):
        print(f"{name}\t{text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
