"""Packaging: pyproject.toml and requirements.txt agree, the packages import from anywhere, one helper import style."""
from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent


def test_requirements_txt_holds_every_dependency_and_extra():
    """requirements.txt is what set-up installs (then the project with --no-deps): it must cover pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements.txt").read_text().splitlines()]
    listed = {canonicalize_name(Requirement(line).name) for line in lines if line}
    missing, unmet = [], []
    for req in wanted:
        name = canonicalize_name(req.name)
        if name == canonicalize_name(project["name"]) or (req.marker and not req.marker.evaluate()):
            continue
        if name not in listed:
            missing.append(req.name)
        elif not req.specifier.contains(metadata.version(req.name), prereleases=True):
            unmet.append(f"{req} (installed {metadata.version(req.name)})")
    assert not missing, f"in pyproject.toml but not in requirements.txt: {missing}"
    assert not unmet, f"the set-up installs versions pyproject.toml excludes: {unmet}"


def test_packages_import_from_another_directory(tmp_path):
    """The editable install (scripts/setup.sh) puts engine and v41viz on the path, not the working directory."""
    run = subprocess.run([sys.executable, "-c", "import engine, v41viz; print(engine.__file__, v41viz.__file__)"],
                         cwd=tmp_path, capture_output=True, text=True, check=False, timeout=120)
    assert run.returncode == 0, run.stderr + "\n(run scripts/setup.sh: it installs the project editable)"
    assert run.stdout.split() == [str(ROOT / "engine" / "__init__.py"), str(ROOT / "v41viz" / "__init__.py")]


def test_tests_import_their_helpers_one_way():
    """As modules of the tests folder (`from tests.model_helpers import ...`), so each helper is loaded once."""
    helpers = {path.stem for path in (ROOT / "tests").glob("*_helpers.py")}
    found = []
    for path in sorted((ROOT / "tests").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            found += [f"{path.name}:{node.lineno} imports {n}" for n in names if n.split(".")[0] in helpers]
    assert not found, "\n".join(found)
