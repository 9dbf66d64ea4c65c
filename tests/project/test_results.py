"""docs/results/: every results file well-formed and rendered somewhere, and every results block in README.md and
docs/*.md exactly what scripts/render_results.py makes from its file (no figure typed by hand)."""
from __future__ import annotations

from pathlib import Path

import pytest

from engine.bench.results_file import check, load
from tests.script_helpers import script_module

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results"


RENDER = script_module("render_results.py")
FILES = sorted(RESULTS.glob("*.json"))
DOCUMENTS = RENDER.documents()


def test_there_are_results_files_and_a_benchmarks_page():
    assert FILES and ROOT / "docs" / "benchmarks.md" in DOCUMENTS


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_a_results_file_is_well_formed_and_of_a_kind_the_renderer_knows(path):
    results = load(path)                             # raises on a missing key, a bad format, a number not finite
    assert results["kind"] in RENDER.RENDERERS
    assert results["command"].startswith("python ") and f"--results docs/results/{path.name}" in results["command"]
    assert results["machine"]["cores"] >= 1 and results["wall_s"] >= 0


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_results_block_is_what_its_file_renders_to(path):
    text = path.read_text(encoding="utf-8")
    assert RENDER.rendered(text) == text, f"run: .venv/bin/python scripts/render_results.py ({path.name} is stale)"


def test_every_results_file_is_rendered_somewhere():
    shown = {name.partition("/")[0] for path in DOCUMENTS for name in RENDER.blocks(path.read_text(encoding="utf-8"))}
    assert {path.stem for path in FILES} <= shown


def test_a_block_is_replaced_by_its_table_and_the_line_naming_where_and_how_it_was_measured():
    stem = FILES[0].stem
    results = load(FILES[0])
    text = f"before\n<!-- results:{stem} -->\nhand-typed 9.99x\n<!-- /results -->\nafter\n"
    out = RENDER.rendered(text)
    assert out.startswith(f"before\n<!-- results:{stem} -->\n| ") and out.endswith("<!-- /results -->\nafter\n")
    assert "9.99x" not in out
    for fact in (results["machine"]["cpu"], results["date"], results["commit"], results["command"],
                 f"torch {results['torch']}"):
        assert fact in out
    assert RENDER.rendered(out) == out                # rendering twice changes nothing


def test_the_check_option_reports_a_stale_block_and_changes_nothing(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(f"<!-- results:{FILES[0].stem} -->\nstale\n<!-- /results -->\n", encoding="utf-8")
    assert RENDER.main(["--check", str(page)]) == 1 and "stale" in page.read_text(encoding="utf-8")
    assert RENDER.main([str(page)]) == 0 and RENDER.main(["--check", str(page)]) == 0


def test_malformed_results_are_named():
    good = load(FILES[0])
    assert check(good) == []
    assert "no 'machine'" in check({k: v for k, v in good.items() if k != "machine"})
    assert any("not finite" in p for p in check({**good, "rows": [{"x": float("nan")}]}))
    assert any("non-empty list" in p for p in check({**good, "rows": []}))
    assert any("format" in p for p in check({**good, "format": "other"}))
