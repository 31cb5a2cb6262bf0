"""Imports point down the layers of DESIGN §3, never up or sideways.

`metadata` imports nothing of ours; `cleaner` only `metadata`; inside `regional`, each package
imports only packages of a lower layer (the coordinator nothing from the runtime, the dataflow or
the sinks; a sink nothing from the dataflow or the runtime). Read from the source with `ast`, so
an import inside a function or under `TYPE_CHECKING` counts too.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent

#: Every package's layer; a package may import only packages of a strictly lower layer.
LAYERS: dict[str, int] = {
    "metadata": 0,
    "cleaner": 1,
    "regional.errors": 1,
    "regional.policy": 2,
    "regional.graph": 2,
    "regional.sources": 2,
    "regional.sinks": 2,
    "regional.coordinator": 3,
    "regional.dataflow": 3,
    "regional.report": 3,
    "regional.runtime": 4,
    "regional.cli": 5,
    "regional": 6,  # the facade: `regional.Pipeline`, `regional.SparkRuntime`, ...
}


def package_of(module: str) -> str:
    """The layered package a dotted module name belongs to."""
    parts = module.split(".")
    if parts[0] == "regional" and len(parts) > 1:
        return f"regional.{parts[1]}"
    return parts[0]


def imports() -> list[tuple[str, str, int]]:
    """(importing file, imported module, line) for every import of our own packages."""
    out = []
    for top in ("regional", "metadata", "cleaner"):
        for path in sorted((ROOT / top).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                    names = [node.module]
                elif isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                else:
                    continue
                for name in names:
                    if name.split(".")[0] in ("regional", "metadata", "cleaner"):
                        out.append((str(path.relative_to(ROOT)), name, node.lineno))
    return out


def module_of(file: str) -> str:
    parts = pathlib.PurePosixPath(file).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_every_package_has_a_layer() -> None:
    packages = {package_of(module_of(f)) for f, _, _ in imports()}
    packages |= {package_of(m) for _, m, _ in imports()}
    assert packages - LAYERS.keys() == set()


def test_imports_point_down_the_layers() -> None:
    upward = []
    for file, name, line in imports():
        source, target = package_of(module_of(file)), package_of(name)
        # `regional` itself is imported before any of its packages anyway (e.g. `__version__`)
        if source != target and name != "regional" and LAYERS[target] >= LAYERS[source]:
            upward.append(f"{file}:{line} imports {name} ({source} -> {target})")
    assert upward == []


@pytest.mark.parametrize(
    ("source", "forbidden"),
    [
        ("metadata", ("regional", "cleaner")),
        ("cleaner", ("regional",)),
        ("regional.coordinator", ("regional.runtime", "regional.dataflow", "regional.cli")),
    ],
)
def test_the_design_cards_rules(source: str, forbidden: tuple[str, ...]) -> None:
    found = [
        (file, name)
        for file, name, _ in imports()
        if module_of(file).startswith(source)
        and any(name == f or name.startswith(f + ".") for f in forbidden)
        and not (source == "regional.coordinator" and name.startswith(source))
    ]
    assert found == []


def test_a_package_per_layer_and_no_flat_modules() -> None:
    """`regional/` holds packages, and only the facade, its errors and its policy beside them."""
    flat = sorted(p.name for p in (ROOT / "regional").glob("*.py"))
    assert flat == ["__init__.py", "errors.py", "policy.py"]


def import_graph(package: str) -> dict[str, set[str]]:
    """Module -> the modules of `package` it imports, for the modules of `package` (every import
    counts, also one inside a function or under `TYPE_CHECKING`)."""
    graph: dict[str, set[str]] = {}
    for file, name, _ in imports():
        source = module_of(file)
        if source.startswith(package + ".") and name.startswith(package + "."):
            graph.setdefault(source, set()).add(name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The cycles of `graph` a depth-first walk meets, each as the modules along it, its first
    module again last."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            found.append([*path[path.index(module) :], module])
            return
        if module in done:
            return
        for target in sorted(graph.get(module, ())):
            visit(target, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])
    return found


def test_cycles_are_found() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b", "c"}, "b": {"c"}}) == []


def test_no_import_cycle_in_the_runtime() -> None:
    """The runtime's shells import each other one way: the driver serves the metrics endpoint,
    which reads the snapshot the driver publishes (`runtime.metrics`), never the driver."""
    assert cycles(import_graph("regional.runtime")) == []
