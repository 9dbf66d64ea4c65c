"""The import order of pyproject.toml's [tool.importlinter] contracts holds, and the contracts see lazy imports."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# lint-imports, run by the interpreter running the tests (the console script may not be on PATH).
LINT_IMPORTS = "import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())"


def lint_imports(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", LINT_IMPORTS, "--no-cache", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False, timeout=120)


def test_every_import_contract_is_kept():
    run = lint_imports()
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert "0 broken" in run.stdout, run.stdout[-6000:]


def test_a_contract_breaks_on_an_import_inside_a_function(tmp_path):
    """`engine train` loads the training loop only when it runs (torch stays out of `--help`): a contract that
    forbids that edge breaks, so the contracts above are checked against every import, lazy ones included."""
    line = next(n for n, text in enumerate((ROOT / "engine/commands/train.py").read_text().splitlines(), 1)
                if text.startswith("    from ..training.train import"))
    config = tmp_path / "contract.toml"
    config.write_text('[tool.importlinter]\nroot_packages = ["engine"]\n\n[[tool.importlinter.contracts]]\n'
                      'name = "planted"\ntype = "forbidden"\nsource_modules = ["engine.commands.train"]\n'
                      'forbidden_modules = ["engine.training.train"]\n')
    run = lint_imports("--config", str(config))
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    edges = [text for text in run.stdout.splitlines() if "engine.commands.train -> engine.training.train" in text]
    edge = edges[0] if edges else ""
    assert f"l.{line}" in edge, run.stdout[-3000:]
