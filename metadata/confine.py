"""One confinement rule for every path regional reads, writes or deletes on a local disk.

A directory regional owns (a job root, a table, an exchange) may hold symbolic links put there
by someone else. Following one out of the directory would read, overwrite or delete files that
are not ours. `check_confined` resolves a path (through every link on its way, also a link to a
file) and refuses it when it leaves the directory, naming the link and where it points. Object
stores have no links: callers skip the check there.

>>> import os, tempfile
>>> root, outside = tempfile.mkdtemp(), tempfile.mkdtemp()
>>> os.symlink(outside, f"{root}/_staging")
>>> check_confined(root, "data/part-1.parquet")
>>> check_confined(root, "_staging/job/x.staged", what="table")  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
metadata.errors.OutsideRootError: .../_staging/job/x.staged is under _staging, which is a ...
"""

from __future__ import annotations

import os
from collections.abc import Callable

from metadata.errors import OutsideRootError

__all__ = ["ConfinedPaths", "check_confined", "confined_entries", "is_confined"]


def is_confined(root: str, full: str) -> bool:
    """Whether the local path `full` resolves (through links) to `root` or inside it."""
    real, real_root = os.path.realpath(full), os.path.realpath(root)
    return real == real_root or real.startswith(real_root.rstrip(os.sep) + os.sep)


def check_confined(
    root: str,
    rel: str,
    *,
    what: str = "job root",
    describe: Callable[[str], str] | None = None,
) -> None:
    """Raise `OutsideRootError` when `root/rel` (a local path) resolves outside `root`; the
    message names the link on the way out and its target. `what` names the directory kind
    (job root, table, exchange); `describe(rel)` names the path (default: the full path)."""
    full = f"{root.rstrip('/')}/{rel}" if rel else root
    if is_confined(root, full):
        return
    real_root = os.path.realpath(root)
    parts = rel.split("/") if rel else []
    for i in range(1, len(parts) + 1):
        link = "/".join(parts[:i])
        path = f"{root.rstrip('/')}/{link}"
        if os.path.islink(path) and not is_confined(root, path):
            target = os.path.realpath(path)
            break
    else:  # the directory itself resolves elsewhere than before (moved): name it
        link, target = "", os.path.realpath(full)
    name = describe(rel) if describe is not None else full
    under = "" if link == rel else f" is under {link}, which"
    raise OutsideRootError(
        f"{name}{under} is a symbolic link to {target}, outside the {what} {real_root}; "
        f"regional never reads, writes or deletes through a link out of the {what}: remove "
        "the link"
    )


def confined_entries(
    root: str,
    rel: str,
    keep: Callable[[os.DirEntry[str]], bool],
    *,
    what: str = "job root",
    describe: Callable[[str], str] | None = None,
    checked: bool = False,
) -> list[os.DirEntry[str]]:
    """The entries of the local directory `root/rel` that `keep` keeps ([] when the directory
    does not exist), none of them leading out of `root`: the directory is checked once
    (`check_confined`; not when `checked`: an entry of an earlier such listing), then only the
    kept entries that are symbolic links (their type from the listing itself, no `lstat`
    each), each as `check_confined` would (`OutsideRootError` naming the link). An entry that
    is no link sits in a confined directory, so resolving each listed path would find nothing
    more: a listing costs one resolution, not one per entry."""
    if not checked:
        check_confined(root, rel, what=what, describe=describe)
    directory = f"{root.rstrip('/')}/{rel}" if rel else root
    try:
        with os.scandir(directory) as listing:
            entries = [e for e in listing if keep(e)]
    except (FileNotFoundError, NotADirectoryError):
        return []
    prefix = f"{rel}/" if rel else ""
    for entry in entries:
        if entry.is_symlink():
            check_confined(root, prefix + entry.name, what=what, describe=describe)
    return entries


class ConfinedPaths:
    """`check_confined` for the many paths of one operation under `root` (a commit's staged
    and published files), without resolving each: a directory is confined when its parent is
    and it is no link out (one `lstat` per directory, kept), and a path in a confined
    directory when it is no link out itself (one `lstat`). A path that is a link out, or
    whose directory is not confined, gets `check_confined`, so what is refused and the error
    naming the link are exactly its. Kept for one operation only: a directory checked now may
    be replaced by a link later."""

    def __init__(self, root: str, *, what: str = "job root") -> None:
        self.root = root.rstrip("/")
        self.what = what
        self._inside: set[str] = {""}

    def _confined(self, rel: str) -> bool:
        """Whether directory `root/rel` resolves inside `root` (known, or proven from its
        parent's)."""
        if rel in self._inside:
            return True
        parent, _, name = rel.rpartition("/")
        if name in ("", ".", "..") or not self._confined(parent):
            return False
        full = f"{self.root}/{rel}"
        if os.path.islink(full) and not is_confined(self.root, full):
            return False
        self._inside.add(rel)
        return True

    def check_directory(self, rel: str, *, describe: Callable[[str], str] | None = None) -> None:
        """Raise `OutsideRootError` when directory `root/rel` resolves outside `root`
        (proven from its parent's proof: one `lstat` for a directory not seen before)."""
        if not self._confined(rel):
            check_confined(self.root, rel, what=self.what, describe=describe)

    def check(self, rel: str, *, describe: Callable[[str], str] | None = None) -> None:
        """Raise `OutsideRootError` when `root/rel` resolves outside `root`."""
        parent, _, name = rel.rpartition("/")
        if (
            not rel
            or name in (".", "..")
            or not self._confined(parent)
            or os.path.islink(f"{self.root}/{rel}")
        ):
            check_confined(self.root, rel, what=self.what, describe=describe)
