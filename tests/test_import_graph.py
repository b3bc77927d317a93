"""The module import graph of `dsh` has no cycle, except through the `dsh.services` hub, and points down.

Every import counts: module level, inside `if TYPE_CHECKING:` blocks, inside functions and the
module tables of lazy loads (`importlib.import_module` behind a PEP 562 `__getattr__`). The one
allowed hub is `dsh.services`, which names the services it holds for typing only
(docs/architecture.md#import-rules).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

_SOURCE = Path(__file__).resolve().parents[1] / "src"
_HUB = "dsh.services"
_FACADE = "dsh"  # the package root: re-exports the public names lazily; the adapters read its `__version__`

# The layers of docs/architecture.md#layers, top first; a module may import its own layer and the
# layers after it. A new top-level module or package must be placed here.
_LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("adapters", ("dsh.__main__", "dsh.cli", "dsh.demo")),
    ("test support", ("dsh.testing",)),
    ("diagnostics", ("dsh.doctor",)),
    ("server", ("dsh.server",)),
    ("composition root", ("dsh.runtime",)),
    ("tools", ("dsh.tools",)),
    ("subagent", ("dsh.subagent",)),
    ("agent", ("dsh.agent",)),
    ("query", ("dsh.query",)),
    ("projection", ("dsh.projection",)),
    ("persistence", ("dsh.persistence",)),
    ("session", ("dsh.session",)),
    (
        "base",
        (
            "dsh._lazy_json",
            "dsh.abort",
            "dsh.config",
            "dsh.config_files",
            "dsh.errors",
            "dsh.json",
            "dsh.services",
            "dsh.timer",
        ),
    ),
)


def _modules(root: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name → (file, is a package `__init__`) for every module under `root/package`,
    compiled ones (known by their stubs) included."""
    found: dict[str, tuple[Path, bool]] = {}
    # A compiled module is known by its stub (`.pyi` with no `.py` beside it).
    stubs = [path for path in (root / package).rglob("*.pyi") if not path.with_suffix(".py").exists()]
    for path in sorted([*(root / package).rglob("*.py"), *stubs]):
        parts = list(path.relative_to(root).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _resolve(name: str, modules: Mapping[str, object]) -> str | None:
    """The module an imported dotted name lands in: the longest prefix that is a module of ours."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def _imported(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> Iterator[str]:
    """The dotted name of every alias of one import statement (`from a import b` gives `a.b`).

    `_resolve` maps `a.b` to module `a.b` when it is one and to `a` when `b` is a name inside it,
    so each alias counts on its own: `from pkg import b, c` imports both submodules.
    """
    if isinstance(node, ast.Import):
        for alias in node.names:
            yield alias.name
        return
    base = node.module or ""
    if node.level:
        package = module.split(".") if is_package else module.split(".")[:-1]
        anchor = package[: len(package) - (node.level - 1)]
        base = ".".join([*anchor, *([node.module] if node.module else [])])
    for alias in node.names:
        yield f"{base}.{alias.name}"


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    """Module → the modules of `package` it imports anywhere in its source (type-only and local too)."""
    modules = _modules(root, package)
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, (path, is_package) in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Dict):
                graph[name].update(_lazy_table(node, modules) - {name})
                continue
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            for dotted in _imported(node, name, is_package):
                target = _resolve(dotted, modules)
                if target is not None and target != name:
                    graph[name].add(target)
    return graph


def _lazy_table(node: ast.Dict, modules: Mapping[str, object]) -> set[str]:
    """The modules a lazy-load table names: a dict whose every value is the dotted name of one of ours.

    `__getattr__` loaders and the CLI's command table hand these strings to `importlib.import_module`,
    an import no import statement shows.
    """
    values = [value.value for value in node.values if isinstance(value, ast.Constant)]
    if not values or len(values) != len(node.values) or not all(value in modules for value in values):
        return set()
    return set(values)


@functools.cache
def _dsh_graph() -> Mapping[str, set[str]]:
    """The import graph of the `dsh` source tree, built once per test session."""
    return import_graph(_SOURCE, "dsh")


def cycles(graph: Mapping[str, set[str]], *, skip: str | None = None) -> list[list[str]]:
    """One cycle path (first node repeated at the end) per strongly connected part, ignoring `skip`."""
    nodes = sorted(node for node in graph if node != skip)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    parts: list[list[str]] = []

    def connect(node: str) -> None:  # Tarjan's algorithm; the graph is a few hundred nodes deep at most
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt == skip:
                continue
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                parts.append(part)

    for node in nodes:
        if node not in index:
            connect(node)
    return [_path_within(graph, set(part)) for part in parts]


def _path_within(graph: Mapping[str, set[str]], part: set[str]) -> list[str]:
    """A concrete cycle through the strongly connected `part`, found by breadth-first search."""
    start = min(part)
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph[node] & part):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [*reversed(path), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"no cycle found in {sorted(part)}")


@pytest.mark.slow
def test_no_import_cycle_outside_the_services_hub() -> None:
    """No chain of imports leads from a `dsh` module back to itself unless it passes through `dsh.services`."""
    graph = _dsh_graph()
    assert _HUB in graph
    found = [" -> ".join(path) for path in cycles(graph, skip=_HUB)]
    assert found == [], "import cycles:\n" + "\n".join(found)


def _layer_of(module: str) -> int | None:
    """The index in `_LAYERS` of the layer `module` belongs to, or None."""
    for index, (_name, prefixes) in enumerate(_LAYERS):
        if any(module == prefix or module.startswith(f"{prefix}.") for prefix in prefixes):
            return index
    return None


def test_every_module_belongs_to_a_layer() -> None:
    """Each `dsh` module but the package root is placed in exactly one layer of the documented stack."""
    graph = _dsh_graph()
    assert sorted(module for module in graph if _layer_of(module) is None) == [_FACADE]


def test_layers_import_only_downwards() -> None:
    """No module imports a layer above its own (type-only imports included); only the `dsh.services` hub may."""
    graph = _dsh_graph()
    upward = [
        f"{module} ({_LAYERS[_layer_of(module) or 0][0]}) -> {target} ({_LAYERS[_layer_of(target) or 0][0]})"
        for module, targets in sorted(graph.items())
        if module not in {_HUB, _FACADE}
        for target in sorted(targets - {_FACADE})
        if (_layer_of(target) or 0) < (_layer_of(module) or 0)
    ]
    assert upward == [], "imports of a higher layer:\n" + "\n".join(upward)


def test_services_imports_the_layers_for_typing_only() -> None:
    """`dsh.services` imports other `dsh` modules only inside `if TYPE_CHECKING:`, so at run time it is a leaf."""
    path = _SOURCE / "dsh" / "services.py"
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            typing_only |= {id(inner) for inner in ast.walk(node)}
    at_run_time = [
        ast.unparse(node)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dsh") and id(node) not in typing_only
    ]
    assert at_run_time == []


def test_the_checker_sees_type_only_and_local_imports(tmp_path: Path) -> None:
    """The graph sees type-only, local, relative, multi-name and lazy-table imports, and prints cycle paths."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import B\n")
    (package / "b.py").write_text("def f():\n    from . import c\n")
    (package / "c.py").write_text("import pkg.a\n")
    (package / "hub.py").write_text("from pkg import a\n")
    (package / "d.py").write_text("from pkg.hub import X\n")
    (package / "hub2.py").write_text("from pkg.d import Y\n")
    (package / "e.py").write_text("from pkg import a, c\nimport pkg.hub, pkg.d\n")
    (package / "f.py").write_text("_LAZY = {'B': 'pkg.b', 'E': 'pkg.e'}\nNAMES = {'x': 'pkg.b', 'y': 'other'}\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.e"] == {"pkg.a", "pkg.c", "pkg.hub", "pkg.d"}
    assert graph["pkg.f"] == {"pkg.b", "pkg.e"}
    assert graph["pkg.a"] == {"pkg.b"}
    assert graph["pkg.b"] == {"pkg.c"}
    assert graph["pkg.c"] == {"pkg.a"}
    assert graph["pkg.hub"] == {"pkg.a"}
    assert cycles(graph) == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]
    (package / "hub.py").write_text("from pkg.d import Y\n")
    graph = import_graph(tmp_path, "pkg")
    assert sorted(map(tuple, cycles(graph))) == [("pkg.a", "pkg.b", "pkg.c", "pkg.a"), ("pkg.d", "pkg.hub", "pkg.d")]
    assert cycles(graph, skip="pkg.hub") == [["pkg.a", "pkg.b", "pkg.c", "pkg.a"]]


def test_the_jsonl_scanner_and_its_records_stay_inside_the_jsonl_package() -> None:
    """No module outside `dsh.persistence.jsonl` imports its private modules: the scanner and what it keeps
    (`_scan`, `_format`, ...) sit behind the stored-log contract, which hands over plain records."""
    graph = _dsh_graph()
    inside = "dsh.persistence.jsonl"
    offending = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        if module != inside and not module.startswith(f"{inside}.")
        for target in targets
        if target.startswith(f"{inside}._")
    )
    assert offending == []
    assert f"{inside}._scan" in graph
