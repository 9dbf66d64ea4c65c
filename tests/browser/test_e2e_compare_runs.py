"""End-to-end: the Compare page's Runs tab in headless Chromium — tiny-v4 against tiny-v4.1 on one prompt (both
outputs, the per-layer table with V4's hash-routed layers, a routing agreement), the same two traces downloaded and
compared again from files, and a run opened in Inspect."""
from __future__ import annotations

import re
import time

import pytest
from playwright.sync_api import expect

from tests.browser_helpers import WAIT_PAGE, settled

# browser tests of Compare's Runs tab: two tiny models run, downloaded, uploaded, handed to Inspect [33-55 s]
pytestmark = pytest.mark.slow

SHOT = "/tmp/compare_runs.png"


def _open_runs(browser, base: str, height: int = 1400):
    page = browser.new_page(viewport={"width": 1500, "height": height})
    page.set_default_timeout(60_000)
    page.goto(base + "/compare?view=Runs")
    page.get_by_role("button", name="Run both").wait_for(timeout=WAIT_PAGE)
    settled(page)
    return page


def _metric(page, label: str) -> str:
    return page.locator("[data-testid='stMetric']").filter(has_text=label).locator(
        "[data-testid='stMetricValue']").inner_text()


def test_tiny_v4_against_tiny_v41_side_by_side(server, browser, screenshots, tmp_path):
    base, log_path = server
    page = _open_runs(browser, base, height=3600)   # the whole comparison in one screenshot
    main = page.locator("[data-testid='stMain']")
    expect(main).to_contain_text("have random weights")
    page.get_by_label("Prompt").fill("The quick brown fox")
    box = page.get_by_label("max new tokens")
    box.fill("12")
    box.press("Tab")
    page.locator(".st-key-compare_runs_dspark label").click()
    t0 = time.perf_counter()
    page.get_by_role("button", name="Run both").click()
    page.get_by_text("The two runs side by side").wait_for(timeout=180_000)
    settled(page)
    print(f"\nclick → both runs shown: {time.perf_counter() - t0:.2f} s")
    for side, model in (("a", "tiny-v4"), ("b", "tiny-v4.1")):
        out = page.locator(f".st-key-compare_output_{side}").inner_text()
        assert model in out and "5 prompt + 12 new tokens" in out and "The quick brown fox" in out, out
    assert page.locator(".st-key-compare_output_a span[style*='background']").count() >= 1   # divergences marked
    text = main.inner_text()
    assert text.count("stopped at max new tokens (12 tokens)") == 2, text[:3000]
    table = page.locator("table").filter(has_text="A router")
    expect(table).to_contain_text("hash-routed (token id)")
    rows = table.locator("tbody tr")
    assert rows.count() == 10
    for i in range(10):
        router = rows.nth(i).locator("td").nth(1).inner_text()
        assert router == ("hash-routed (token id)" if i < 2 else "learned" if i < 7 else "not in this run"), router
    agreement = _metric(page, "routing agreement")
    assert 0 < float(agreement) <= 1, agreement
    assert re.fullmatch(r"A \d\.\d\d · B \d\.\d\d", _metric(page, "DSpark accepted length"))
    assert page.locator(".st-key-compare_routing_chart .js-plotly-plot").count() == 1
    chart = page.locator(".st-key-compare_routing_chart").inner_text()
    assert "layers.1.ffn (hash-routed in A)" in chart and "layers.2.ffn (hash" not in chart
    assert page.locator("[data-testid='stException']").count() == 0
    page.screenshot(path=SHOT, full_page=True)
    page.screenshot(path=str(screenshots / "compare_runs.png"), full_page=True)
    files = []
    for side in ("a", "b"):
        with page.expect_download() as dl:
            page.locator(f".st-key-compare_download_{side} button").click()
        files.append(tmp_path / f"{side}_{dl.value.suggested_filename}")
        dl.value.save_as(files[-1])
    # the same two runs from their files: the same figures
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text="Compare two saved traces").click()
    for side, path in zip(("a", "b"), files):
        page.locator(f".st-key-compare_upload_{side} [data-testid='stFileUploaderDropzoneInput']").set_input_files(
            str(path))
        settled(page)
    page.get_by_text("The two runs side by side").wait_for(timeout=60_000)
    settled(page)
    assert _metric(page, "routing agreement") == agreement
    assert "from a_trace_a.json" in page.locator(".st-key-compare_output_a").inner_text()
    page.close()
    assert "Traceback" not in log_path.read_text()


def test_a_run_opens_in_inspect(server, browser):
    base, _ = server
    page = _open_runs(browser, base)
    box = page.get_by_label("max new tokens")
    box.fill("4")
    box.press("Tab")
    page.get_by_role("button", name="Run both").click()
    page.get_by_text("The two runs side by side").wait_for(timeout=180_000)
    settled(page)
    page.locator(".st-key-compare_open_a button").click()
    page.wait_for_function("() => location.pathname.endsWith('/inspect')", timeout=60_000)
    page.get_by_text("loaded: run A of the Compare page").first.wait_for(timeout=120_000)
    settled(page)
    text = page.inner_text("[data-testid='stMain']")
    assert "model tiny-v4" in text and "layers.0.ffn (hash-routed)" in page.content()
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()
