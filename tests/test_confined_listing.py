"""The cheaper confinement checks of the exchange's hot paths (`ConfinedPaths` for a commit's
many files, `confined_entries` for a reader's listing) refuse exactly what `check_confined`
refuses, with the same error: a link out of the root, anywhere on a path, is never followed."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from metadata.confine import ConfinedPaths, check_confined, confined_entries
from metadata.errors import OutsideRootError

PATHS = [
    "a/b/f",
    "a/out/x",
    "a/out/x/y",
    "a/inside/f",
    "a/inside/new",
    "a/b/file-out",
    "a/b/file-in",
    "a/out",
    "",
    "a/b/../../..",
    "new/dir/f",
    "a/out2/../b",
    "a//b/f",
]


@pytest.fixture
def root(tmp_path: Path) -> str:
    """A root with links out of it and links inside it, to directories and to files."""
    root, out = tmp_path / "root", tmp_path / "out"
    (root / "a" / "b").mkdir(parents=True)
    (out / "x").mkdir(parents=True)
    (out / "f").write_text("not ours")
    (root / "a" / "b" / "f").write_text("ours")
    os.symlink(out, root / "a" / "out")
    os.symlink(out, root / "a" / "out2")
    os.symlink(root / "a" / "b", root / "a" / "inside")
    os.symlink(out / "f", root / "a" / "b" / "file-out")
    os.symlink(root / "a" / "b" / "f", root / "a" / "b" / "file-in")
    return str(root)


def _outcome(check: object, rel: str) -> str:
    try:
        check(rel)  # type: ignore[operator]
    except OutsideRootError as exc:
        return str(exc)
    return "confined"


@pytest.mark.parametrize("rel", PATHS)
def test_confined_paths_refuses_what_check_confined_refuses(root: str, rel: str) -> None:
    expected = _outcome(lambda r: check_confined(root, r), rel)
    assert _outcome(ConfinedPaths(root).check, rel) == expected
    warmed = ConfinedPaths(root)  # directories of other paths already known
    for other in PATHS:
        _outcome(warmed.check, other)
    assert _outcome(warmed.check, rel) == expected


def test_confined_entries_check_only_the_links_they_keep(root: str) -> None:
    """A listing keeps its entries; a kept link out is refused as `check_confined` refuses it,
    one it does not keep is not looked at."""
    names = sorted(e.name for e in confined_entries(root, "a/b", lambda e: e.name == "f"))
    assert names == ["f"]
    with pytest.raises(OutsideRootError) as refused:
        confined_entries(root, "a/b", lambda e: True)
    assert str(refused.value) == _outcome(lambda r: check_confined(root, r), "a/b/file-out")
    with pytest.raises(OutsideRootError) as through:
        confined_entries(root, "a/out", lambda e: True)
    assert str(through.value) == _outcome(lambda r: check_confined(root, r), "a/out")
    assert confined_entries(root, "a/missing", lambda e: True) == []


@pytest.mark.parametrize("rel", PATHS)
def test_a_directory_proven_from_its_parent_is_refused_as_check_confined_refuses(
    root: str, rel: str
) -> None:
    """`ConfinedPaths.check_directory` (an exchange reader's partition directory within a
    task) refuses exactly what `check_confined` does, whichever directories it knew before."""
    expected = _outcome(lambda r: check_confined(root, r), rel)
    assert _outcome(ConfinedPaths(root).check_directory, rel) == expected
    warmed = ConfinedPaths(root)
    for other in PATHS:
        _outcome(warmed.check_directory, other)
    assert _outcome(warmed.check_directory, rel) == expected
