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

ROOT = Path(__file__).resolve().parents[2]


def requirement_lines(file: Path) -> list[str]:
    """The requirement lines of a requirements file, `-r` includes followed."""
    out = []
    for line in file.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line.startswith("-r "):
            out += requirement_lines(file.parent / line[3:].strip())
        elif line:
            out.append(line)
    return out


def test_requirements_txt_holds_every_dependency_and_extra():
    """requirements-test.txt (requirements.txt and the test-only packages) is what the test set-up installs (then the
    project with --no-deps): it must cover pyproject.toml. The app's requirements.txt leaves transformers out."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [Requirement(r) for r in project["dependencies"]]
    wanted += [Requirement(r) for extra in project["optional-dependencies"].values() for r in extra]
    lines = requirement_lines(ROOT / "requirements-test.txt")
    listed = {canonicalize_name(Requirement(line).name) for line in lines if line}
    app = {canonicalize_name(Requirement(line).name) for line in requirement_lines(ROOT / "requirements.txt")}
    assert "transformers" in listed and "transformers" not in app
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
