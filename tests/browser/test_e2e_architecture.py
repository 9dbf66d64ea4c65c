"""End-to-end: the real app in headless Debian Chromium (Playwright) — diagram, click, details, shared URL."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.browser_helpers import open_architecture
from v41viz.arch.source import engine_source

pytestmark = pytest.mark.slow  # browser tests [52 s]

ROOT = Path(__file__).resolve().parents[2]
SHARED = "/architecture?config=deepseek-v4.1-flash&node=layers.14.engram&expand=layers.3-7"
TALL = 2200   # the whole V4.1 diagram fits in the viewport


def _details(page):
    return page.locator(".st-key-details_panel")


def test_shared_url_restores_the_view(server, browser, screenshots):
    # The very first request of a fresh server is a deep link: config, node and expansion all come back.
    base, _ = server
    page = open_architecture(browser, base + SHARED, height=TALL)
    panel = _details(page)
    panel.get_by_text("layers.14.engram", exact=False).first.wait_for(timeout=30_000)
    assert "Engram" in panel.inner_text()
    assert "99,092" in panel.inner_text()          # the config's compressed vocabulary, in the explanation
    svg_text = page.locator(".v41-root").first.inner_text()
    assert "layer 5" in svg_text and "layers 3–7" not in svg_text   # the group is expanded layer by layer
    assert "layers 9–13" in svg_text and "×5" in svg_text            # other groups stay folded
    assert "inside layers.14" in svg_text
    page.screenshot(path=str(screenshots / "architecture_shared_url.png"), full_page=True)
    page.locator(".v41-root").first.screenshot(path=str(screenshots / "architecture_diagram_v41.png"))
    page.close()


def test_click_a_box_opens_its_details(server, browser, screenshots):
    base, _ = server
    page = open_architecture(browser, base + "/architecture?config=deepseek-v4.1-flash", height=TALL)
    diagram = page.locator(".v41-diagram").first
    diagram.locator(".v41-box").filter(has_text="LM head").first.click()
    panel = _details(page)
    panel.get_by_text("Scores all 129,280 tokens").first.wait_for(timeout=30_000)
    panel.get_by_text("[129280, 5120]").first.wait_for(timeout=15_000)   # the head's checkpoint tensor shape
    text = panel.inner_text()
    assert "LM head" in text and "661.91M" in text and "BF16" in text
    page.wait_for_function("() => window.location.search.includes('node=head')", timeout=10_000)
    selected = diagram.locator(".v41-box.v41-selected")
    selected.filter(has_text="LM head").wait_for(timeout=10_000)      # the drawing marks the clicked box
    assert selected.count() == 1
    diagram.locator(".v41-box").filter(has_text="Router").first.hover()
    hover = page.locator(".v41-tip").first
    hover.wait_for(timeout=10_000)
    assert "layers.2.ffn.gate" in hover.text_content() and "params" in hover.text_content()
    page.screenshot(path=str(screenshots / "architecture_clicked_head.png"), full_page=True)
    page.close()


def test_selecting_attention_shows_engine_source_or_says_missing(server, browser, screenshots):
    base, _ = server
    page = open_architecture(browser, base + "/architecture?config=deepseek-v4.1-flash&node=layers.20.attn.indexer",
                             height=TALL)
    panel = _details(page)
    panel.get_by_text("Lightning indexer").first.wait_for(timeout=30_000)
    text = panel.inner_text()
    assert "top-512" in text and "candidate" in text
    assert "Engine source" in text
    src = panel.get_by_text("Engine source: engine.model.indexer.Indexer")
    if src.count():
        src.first.click()
        panel.get_by_text("class Indexer").first.wait_for(timeout=10_000)
    else:
        assert "not implemented in the engine yet" in text
    page.screenshot(path=str(screenshots / "architecture_indexer.png"), full_page=True)
    page.close()


def test_v4_dspark_pairs_fold_and_expand(server, browser, screenshots):
    base, _ = server
    page = open_architecture(browser, base + "/architecture?config=deepseek-v4-flash-dspark&node=layers.0.ffn.gate",
                             height=TALL)
    svg = page.locator(".v41-root").first.inner_text()
    assert "layers 3–38" in svg and "×18 pairs" in svg and "mHC head" in svg
    panel = _details(page)
    assert "Hash router" in panel.inner_text()
    if engine_source("hash_gate").found:     # the details show V4's hash routing from the engine when it has it
        assert "Engine source: engine.model.moe.HashGate" in panel.inner_text()
    else:
        assert "not implemented in the engine yet" in panel.inner_text()
    page.locator(".v41-root").first.screenshot(path=str(screenshots / "architecture_diagram_v4_dspark.png"))
    page.close()


def test_broken_upload_is_reported_and_the_app_keeps_running(server, browser, tmp_path):
    base, _ = server
    page = open_architecture(browser, base + "/architecture?config=tiny-v4", height=TALL)
    bad = tmp_path / "config.json"
    bad.write_text('{"dim": 64, "n_layers": 2')
    page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(str(bad))
    page.get_by_text("Upload rejected").wait_for(timeout=30_000)
    assert "invalid JSON" in page.locator("[data-testid='stMain']").inner_text()   # in the main area
    assert "tiny-v4" in page.locator("h1").first.inner_text()   # still showing the previous config
    good = tmp_path / "my-model.json"
    good.write_text((ROOT / "configs" / "tiny-v4.1.json").read_text())
    page.locator("[data-testid='stFileUploaderDropzoneInput']").set_input_files(str(good))
    page.get_by_role("heading", name="my-model").wait_for(timeout=60_000)
    page.wait_for_function("() => window.location.search.includes('config=upload%3Amy-model%40')"
                           " || window.location.search.includes('config=upload:my-model@')", timeout=15_000)
    assert "inside layers.2" in page.locator(".v41-root").first.inner_text()
    page.close()


def test_compare_page(server, browser, screenshots):
    base, log_path = server
    page = browser.new_page(viewport={"width": 1600, "height": 1300})
    page.goto(base + "/compare")
    page.get_by_text("sizes and mechanisms differ").wait_for(timeout=60_000)
    page.get_by_text("learned hc_head").wait_for(timeout=60_000)     # the side-by-side table has rendered
    text = page.inner_text("body")
    assert "Engram" in text and "learned hc_head" in text and "shared: sources [2, 8, 14, 20]" in text
    page.screenshot(path=str(screenshots / "compare.png"), full_page=True)
    page.close()
    log = log_path.read_text()
    assert "Traceback" not in log and "WARNING" not in log.upper().replace("WARNINGS", ""), log
