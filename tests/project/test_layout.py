"""What the import contracts (pyproject.toml, lint-imports) cannot check: no private names across modules, and the
torch- and Streamlit-free layers importing in a fresh process without them."""
from __future__ import annotations

import ast
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "v41viz")
ENTRY_SCRIPTS = ("app.py", "pages/*.py")  # Streamlit's entry files: they import the packages, nothing imports them


@dataclass(frozen=True)
class Import:
    """One imported name: `from module import name` (name set) or `import module` (name None)."""
    importer: str
    module: str
    name: str | None
    line: int


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


def statement_imports(importer: str, node: ast.Import | ast.ImportFrom) -> list[Import]:
    """The names one import statement brings in, in the order of node.names; relative imports made absolute."""
    if isinstance(node, ast.Import):
        return [Import(importer, alias.name, None, node.lineno) for alias in node.names]
    module = node.module
    if node.level:
        package = importer if MODULES[importer].name == "__init__.py" else importer.rpartition(".")[0]
        base = package.split(".")[: len(package.split(".")) - node.level + 1]
        module = ".".join(base + ([node.module] if node.module else []))
    return [Import(importer, module, alias.name, node.lineno) for alias in node.names]


def import_statements(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of a module, wherever it stands (in a function, under `if TYPE_CHECKING:`)."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


IMPORTS = {name: [imp for node in import_statements(TREES[name]) for imp in statement_imports(name, node)]
           for name in MODULES}


def imported_module(imp: Import) -> str | None:
    """The project module an import loads: `from a import b` loads a.b when that is a module, else a."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in MODULES:
        return f"{imp.module}.{imp.name}"
    return imp.module if imp.module in MODULES else None


def test_imports_resolve_as_python_does():
    """The check below can fail: relative names resolve as Python does, and imports inside functions count."""
    for importer, source in (("engine.cli", "from .spec import config"), ("engine.model", "from ..spec import config")):
        (imp,) = statement_imports(importer, ast.parse(source).body[0])
        assert (imp.module, imp.name, imported_module(imp)) == ("engine.spec", "config", "engine.spec.config")
    source = "import typing\nif typing.TYPE_CHECKING:\n    import a\ndef f():\n    import c"
    assert sorted(n.names[0].name for n in import_statements(ast.parse(source))) == ["a", "c", "typing"]


def module_aliases(importer: str) -> dict[str, str]:
    """Local names bound to project modules: `import a.b as m`, `from a import b` where a.b is a module."""
    aliases = {}
    for node in import_statements(TREES[importer]):
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


@pytest.mark.slow  # fresh processes with a module blocked [6 s + 2 s]
@pytest.mark.parametrize("layer, forbidden", [("engine.spec", "torch"), ("engine.accounting", "torch"),
                                              ("engine.plan", "torch"), ("engine.text", "torch"),
                                              ("engine.request", "torch"),
                                              ("v41viz.arch", "streamlit"), ("v41viz.inspect", "streamlit")])
def test_layer_loads_without(layer, forbidden):
    names = [m for m in MODULES if m == layer or m.startswith(layer + ".")]
    assert len(names) > 1, f"{layer} has no modules"
    run = subprocess.run([sys.executable, "-c", PROBE, forbidden, *names], cwd=ROOT, capture_output=True, text=True,
                         check=False, timeout=120)
    assert run.returncode == 0, run.stderr
    culprit = run.stdout.strip()
    assert not culprit, f"importing {culprit} loads {forbidden!r}: {layer} must run without it"
