"""The package layout: one-way imports, no circles, no private names across modules, torch-/Streamlit-free layers."""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "v41viz")
ENTRY_SCRIPTS = ("app.py", "pages/*.py")  # Streamlit's entry files: they import the packages, nothing imports them

# Top-level names a layer may never import, not even inside a function: the app builds on the engine, never the
# reverse; the spec, text and request layers run without torch; the diagram and the inspect panels run without
# Streamlit.
FORBIDDEN = {
    "engine": {"v41viz", "streamlit", "plotly"},
    "engine.spec": {"torch"},
    "engine.text": {"torch"},
    "engine.request": {"torch"},
    "v41viz.arch": {"streamlit"},
    "v41viz.inspect": {"streamlit"},
}


@dataclass(frozen=True)
class Import:
    """One imported name: `from module import name` (name set) or `import module` (name None)."""
    importer: str
    module: str
    name: str | None
    line: int
    type_only: bool = False     # under `if TYPE_CHECKING:`: names a type for annotations, never runs

    @property
    def top(self) -> str:
        return self.module.split(".")[0]


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_files() -> dict[str, Path]:
    """Every module of the packages and the entry scripts, by dotted name."""
    paths = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    paths += [p for pattern in ENTRY_SCRIPTS for p in ROOT.glob(pattern)]
    return {module_name(p): p for p in sorted(paths)}


MODULES = project_files()
TREES = {name: ast.parse(path.read_text(), str(path)) for name, path in MODULES.items()}


def statement_imports(importer: str, node: ast.Import | ast.ImportFrom, type_only: bool = False) -> list[Import]:
    """The names one import statement brings in, in the order of node.names; relative imports made absolute."""
    if isinstance(node, ast.Import):
        return [Import(importer, alias.name, None, node.lineno, type_only) for alias in node.names]
    module = node.module
    if node.level:
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    return [Import(importer, module, alias.name, node.lineno, type_only) for alias in node.names]


def is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def import_statements(nodes: list[ast.AST], type_only: bool = False) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement in nodes, wherever it stands (a lazy import hides a circle from the interpreter, not
    from the reader), each with whether it sits under `if TYPE_CHECKING:`."""
    found = []
    for node in nodes:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, type_only))
        elif isinstance(node, ast.If) and is_type_checking(node.test):
            found += import_statements(node.body, True) + import_statements(node.orelse, type_only)
        else:
            found += import_statements(list(ast.iter_child_nodes(node)), type_only)
    return found


IMPORTS = {name: [imp for node, type_only in import_statements([TREES[name]])
                  for imp in statement_imports(name, node, type_only)] for name in MODULES}


def imported_module(imp: Import) -> str | None:
    """The project module an import loads: `from a import b` loads a.b when that is a module, else a."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in MODULES:
        return f"{imp.module}.{imp.name}"
    return imp.module if imp.module in MODULES else None


def sub_package(module: str) -> str:
    """engine.model.moe -> engine.model; engine.cli and engine itself -> engine; pages.inspect -> pages."""
    parts = module.split(".")
    if len(parts) >= 2 and (ROOT / parts[0] / parts[1]).is_dir():
        return ".".join(parts[:2])
    return parts[0] if len(parts) > 1 or module in PACKAGES else module


def module_graph() -> nx.DiGraph:
    """Who loads whom when the code runs: type-only imports are left out, lazy imports inside functions are not."""
    g = nx.DiGraph()
    g.add_nodes_from(MODULES)
    for importer, imports in IMPORTS.items():
        for imp in imports:
            target = None if imp.type_only else imported_module(imp)
            if target and target != importer and not g.has_edge(importer, target):
                g.add_edge(importer, target, line=imp.line)
    return g


def package_graph(modules: nx.DiGraph) -> nx.DiGraph:
    g = nx.DiGraph()
    for a, b, data in modules.edges(data=True):
        pa, pb = sub_package(a), sub_package(b)
        if pa != pb:
            g.add_edge(pa, pb)
            g.edges[pa, pb].setdefault("via", []).append(f"{a}:{data['line']} -> {b}")
    return g


def describe_circles(g: nx.DiGraph, what: str) -> list[str]:
    """One line per strongly connected component, with one concrete circle through it."""
    lines = []
    for component in sorted((c for c in nx.strongly_connected_components(g) if len(c) > 1), key=sorted):
        cycle = nx.find_cycle(g.subgraph(component))
        steps = [f"{a} -> {b} ({g.edges[a, b].get('line') or '; '.join(g.edges[a, b]['via'][:2])})"
                 for a, b in cycle]
        lines.append(f"{what} circle {sorted(component)}: " + " | ".join(steps))
    return lines


def test_the_graph_resolves_relative_imports_and_finds_circles():
    """The checks below can fail: relative names resolve as Python does, lazy imports count, type-only ones are
    told apart, and a planted circle is found."""
    for importer, source in (("engine.cli", "from .spec import config"), ("engine.model", "from ..spec import config")):
        (imp,) = statement_imports(importer, ast.parse(source).body[0])
        assert (imp.module, imp.name, imported_module(imp)) == ("engine.spec", "config", "engine.spec.config")
    source = "import typing\nif typing.TYPE_CHECKING:\n    import a\nelse:\n    import b\ndef f():\n    import c"
    assert [(n.names[0].name, type_only) for n, type_only in import_statements([ast.parse(source)])] == \
        [("typing", False), ("a", True), ("b", False), ("c", False)]
    planted = nx.DiGraph()
    planted.add_edge("a", "b", line=1)
    planted.add_edge("b", "a", line=2)
    assert describe_circles(planted, "module") == ["module circle ['a', 'b']: a -> b (1) | b -> a (2)"]


def test_no_module_import_circles():
    circles = describe_circles(module_graph(), "module")
    assert not circles, "\n".join(circles)


def test_no_sub_package_import_circles():
    circles = describe_circles(package_graph(module_graph()), "sub-package")
    assert not circles, "\n".join(circles)


def module_aliases(importer: str) -> dict[str, str]:
    """Local names bound to project modules: `import a.b as m`, `from a import b` where a.b is a module."""
    aliases = {}
    for node, _ in import_statements([TREES[importer]]):
        for imp, alias in zip(statement_imports(importer, node), node.names):
            target = imported_module(imp)
            bound = alias.asname or (alias.name if imp.name else None)
            if target and bound and (imp.name is None or target == f"{imp.module}.{imp.name}"):
                aliases[bound] = target
    return aliases


def is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def test_no_private_names_across_modules():
    found = []
    for importer, imports in IMPORTS.items():
        for imp in imports:
            if imp.name and is_private(imp.name) and imp.module in MODULES and imported_module(imp) == imp.module:
                found.append(f"{importer}:{imp.line} imports {imp.name} from {imp.module}")
        aliases = module_aliases(importer)
        for node in ast.walk(TREES[importer]):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in aliases
                    and is_private(node.attr) and aliases[node.value.id] != importer):
                found.append(f"{importer}:{node.lineno} reads {node.attr} of {aliases[node.value.id]}")
    assert not found, "\n".join(found)


def test_imports_go_one_way():
    found = []
    for layer, banned in FORBIDDEN.items():
        for importer, imports in IMPORTS.items():
            if importer == layer or importer.startswith(layer + "."):
                found += [f"{importer}:{imp.line} imports {imp.module} ({layer} must not import {imp.top})"
                          for imp in imports if imp.top in banned]
    assert not found, "\n".join(found)


# Imports each named module in turn; prints the first one after which the forbidden package is loaded.
PROBE = """
import importlib, sys
forbidden, names = sys.argv[1], sys.argv[2:]
for name in names:
    importlib.import_module(name)
    if forbidden in sys.modules:
        print(name)
        break
"""


@pytest.mark.parametrize("layer, forbidden", [("engine.spec", "torch"), ("engine.text", "torch"),
                                              ("engine.request", "torch"), ("v41viz.arch", "streamlit"),
                                              ("v41viz.inspect", "streamlit")])
def test_layer_loads_without(layer, forbidden):
    names = [m for m in MODULES if m == layer or m.startswith(layer + ".")]
    assert len(names) > 1, f"{layer} has no modules"
    run = subprocess.run([sys.executable, "-c", PROBE, forbidden, *names], cwd=ROOT, capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    culprit = run.stdout.strip()
    assert not culprit, f"importing {culprit} loads {forbidden!r}: {layer} must run without it"
