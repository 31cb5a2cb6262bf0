"""Every module imports on its own in a fresh interpreter (an import cycle shows only there),
the pure core loads no file system, and the public names type and resolve as documented."""

from __future__ import annotations

import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

import cleaner
import metadata
import regional


def _modules() -> list[str]:
    names = []
    for package in (regional, metadata, cleaner):
        names.append(package.__name__)
        prefix = package.__name__ + "."
        names += [
            m.name
            for m in pkgutil.walk_packages(package.__path__, prefix)
            if not m.name.endswith(".__main__")  # runs the CLI when imported
        ]
    return sorted(names)


def _fresh(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )


def test_every_module_imports_first_in_a_fresh_interpreter() -> None:
    modules = _modules()
    assert "regional.coordinator.messages" in modules and "regional.graph.regions" in modules
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("imports_first.py"))],
        input="\n".join(modules),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    failures = dict(line.split("\t", 1) for line in result.stdout.splitlines())
    assert failures == {}


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the import check forks")
def test_the_import_check_reports_a_cycle(tmp_path: Path) -> None:
    """The forking check sees what a fresh interpreter sees: a cycle between two modules
    fails when one of them is imported first, whichever order the check runs them in."""
    package = tmp_path / "regional_cycle"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from regional_cycle.b import B\nA = 1\n")
    (package / "b.py").write_text("from regional_cycle.a import A\nB = 2\n")
    result = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("imports_first.py")), "regional_cycle"],
        input="regional_cycle.a\nregional_cycle.b",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    failures = dict(line.split("\t", 1) for line in result.stdout.splitlines())
    assert sorted(failures) == ["regional_cycle.a", "regional_cycle.b"], result
    assert "partially initialized module" in failures["regional_cycle.a"]


def test_the_pure_core_loads_no_file_system_at_import() -> None:
    result = _fresh(
        "import sys, regional.coordinator, cleaner.plan, metadata.format\n"
        "print(sorted(m for m in sys.modules if m.startswith(('pyarrow.fs', 'pyspark'))))"
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "name",
    ["Pipeline", "SparkRuntime", "Faults", "ParquetSink", "PaimonSink", "read_table", "Policy"],
)
def test_public_names_resolve_to_their_classes(name: str) -> None:
    value = getattr(regional, name)
    assert value.__name__ == name
    assert name in regional.__all__


def test_sinks_package_exports_its_sinks() -> None:
    import regional.sinks

    assert set(regional.sinks.__all__) >= {
        "ParquetSink", "PaimonSink", "DeltaSink", "IcebergSink", "KafkaSink"
    }  # fmt: skip
    assert regional.sinks.PaimonSink is regional.PaimonSink
    assert regional.sinks.DeltaSink is regional.DeltaSink
    assert regional.sinks.IcebergSink is regional.IcebergSink
    assert regional.sinks.KafkaSink is regional.KafkaSink


def test_version_on_the_package_and_the_command(capsys: pytest.CaptureFixture[str]) -> None:
    from regional.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"regional {regional.__version__}\n"
    assert regional.__version__.count(".") == 2


def test_lazy_names_are_all_exported() -> None:
    for package in (regional, metadata, cleaner):
        lazy = set(package._LAZY)  # type: ignore[attr-defined]
        assert lazy <= set(package.__all__), package.__name__
        for name in lazy:
            assert getattr(package, name).__name__ == name
