"""End-to-end: live data on the diagram (issue 20, items 2 and 5) in headless Chromium — a run of the shipped model
on Inspect paints the Architecture page (values checked against the run's downloaded trace), one token repaints it,
a painted MoE box opens Inspect's Experts panel at that layer and the panel links back with the overlay still on, a
saved trace loads on the page; and the Compare page paints the diff of two runs on run A's diagram."""
from __future__ import annotations

import re
import shutil

import numpy as np
import pytest
from playwright.sync_api import expect

from engine.trace import load_trace
from tests.browser_helpers import FINISHED, WAIT_PAGE, open_inspect, pick, settled

# live data painted on the diagram in a browser: a run, a token, a loaded trace, a run diff [51 s]
pytestmark = pytest.mark.slow

LAYER = 5          # a layer of the default model whose MoE box the test follows to Inspect and back
WAIT_RERUN = 60_000


def shot(page, name: str, screenshots, locator: str = "") -> str:
    path = f"/tmp/overlay_{name}.png"
    (page.locator(locator).first if locator else page).screenshot(path=path)
    shutil.copy(path, screenshots / f"overlay_{name}.png")
    return path


def values(page, root: str = "") -> dict[str, str]:
    """Painted box id → the value written on it, as the browser shows them."""
    return page.evaluate("""root => Object.fromEntries([...document.querySelectorAll(root + ' .v41-box.v41-painted')]
        .map(g => [g.dataset.node, (g.querySelector('text.v41-value') || {}).textContent]))""", root)


def test_a_run_paints_the_diagram_and_a_box_opens_inspect_and_back(server, browser, screenshots, tmp_path):
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1600)
    page.get_by_label("Prompt").fill("ROMEO:")
    box = page.get_by_label("max new tokens")
    box.fill("24")
    box.press("Tab")
    page.locator(".st-key-inspect_dspark label").click()
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(FINISHED).wait_for(timeout=180_000)
    settled(page)
    button = page.get_by_role("button", name=re.compile(r"^Download \S+\.json \("))
    with page.expect_download() as dl:
        button.click()
    trace_file = tmp_path / "trace.json"
    dl.value.save_as(trace_file)
    trace = load_trace(trace_file)
    # the Architecture page paints the new run by itself: it draws the run's config and paints it
    page.get_by_role("link", name="architecture").first.click()
    page.locator(".st-key-arch_live").get_by_text("Live data").first.wait_for(timeout=WAIT_PAGE)
    page.locator(".v41-diagram").first.wait_for(timeout=WAIT_PAGE)
    settled(page)
    # Live data is on by itself after a new run (issue 45)
    page.locator(".v41-painted").first.wait_for(timeout=WAIT_RERUN)
    settled(page)
    main = page.locator("[data-testid='stMain']")
    expect(main).to_contain_text("The diagram now shows default-small-3k, the config of the run it paints")
    assert page.locator("h1").first.inner_text() == "default-small-3k"
    shown = values(page)
    for layer in range(8):
        load = trace.expert_load(f"layers.{layer}.ffn", 16)
        assert shown[f"layers.{layer}"] == f"{load.max() / load.mean() - 1:.2f}", (layer, shown)
    for stage in range(3):
        load = trace.expert_load(f"mtp.{stage}.ffn", 4)
        assert shown[f"mtp.{stage}"] == f"{load.max() / load.mean() - 1:.2f}"
    legend = page.locator(".v41-paint-legend").inner_text()
    assert "expert load (max/mean − 1) · all tokens" in legend and "0.00 (even)" in legend
    assert "overlay=load" in page.url
    page.locator(".v41-root").scroll_into_view_if_needed()
    shot(page, "load", screenshots, ".v41-root")
    # other metrics: Engram gates on the Engram boxes, DSpark acceptance on the drafter
    pick(page, "arch_overlay_metric", "Engram gate")
    page.wait_for_function("() => document.querySelector('.v41-paint-legend').textContent.includes('Engram gate')")
    gates = values(page)
    assert set(gates) == {"layers.1.engram", "layers.4.engram"}
    for path, text in gates.items():
        recorded = [float(np.mean(v[2])) for p, _, r, _, v in trace.facts("engram") if p == path and r == 0]
        assert text == f"{np.mean(recorded):.2f}"
    pick(page, "arch_overlay_metric", "DSpark acceptance")
    page.wait_for_function("() => document.querySelector('.v41-paint-legend').textContent.includes('DSpark')")
    dspark = values(page)
    steps = trace.dspark_steps
    rate = sum(s.accepted for s in steps) / sum(s.verify_len for s in steps)
    assert dspark["mtp.0"] == f"{rate * 100:.0f}%" and dspark["mtp.2.markov_head"].endswith("%")
    shot(page, "dspark", screenshots, ".v41-root")
    # one token repaints: the experts it chose, on every MoE layer
    pick(page, "arch_overlay_metric", "expert load")
    pick(page, "arch_overlay_token", re.compile(r"^position 9 · "))
    page.wait_for_function("() => document.querySelector('.v41-paint-legend').textContent.includes('position 9')")
    one = values(page)
    for layer in range(8):
        ids = trace.fact("moe", f"layers.{layer}.ffn", 0, 9)["ids"]
        assert one[f"layers.{layer}"] == " ".join(f"e{e}" for e in ids)
    assert one != shown and "otoken=9" in page.url
    # a painted MoE box: its live value, and its Inspect panel at that layer and token
    page.locator(f".v41-box[data-node='layers.{LAYER}']").first.click()
    page.locator(f".v41-box.v41-painted[data-node='layers.{LAYER}.ffn']").first.wait_for(timeout=WAIT_RERUN)
    settled(page)
    page.locator(f".v41-box.v41-painted[data-node='layers.{LAYER}.ffn']").first.click()
    page.wait_for_function(f"() => location.search.includes('node=layers.{LAYER}.ffn')", timeout=WAIT_RERUN)
    settled(page)
    opened = values(page)                                   # the detail column now shows the clicked layer's modules
    assert opened[f"layers.{LAYER}.ffn"] == one[f"layers.{LAYER}"]
    value_box = page.locator(".st-key-arch_live_value")
    expect(value_box).to_contain_text(one[f"layers.{LAYER}"])
    expect(value_box).to_contain_text("the token chose experts")
    shot(page, "details", screenshots)
    page.locator(".st-key-overlay_to_inspect button").click()
    page.wait_for_function("() => location.pathname.endsWith('/inspect')", timeout=WAIT_RERUN)
    page.get_by_text("MoE routing").first.wait_for(timeout=WAIT_PAGE)
    settled(page)
    expect(page.get_by_role("radiogroup", name="Panel").get_by_role("radio", name="Experts")).to_be_checked()
    page.wait_for_function(f"() => location.search.includes('node=layers.{LAYER}.ffn') && "
                           "location.search.includes('token=9')", timeout=WAIT_RERUN)
    expect(page.locator(".st-key-inspect_token_detail")).to_contain_text(re.compile(r"^9:"))   # position 9
    shot(page, "inspect", screenshots)
    page.locator(".st-key-back_experts button").click()
    page.wait_for_function("() => location.pathname.endsWith('/architecture')", timeout=WAIT_RERUN)
    page.locator(".v41-painted").first.wait_for(timeout=WAIT_PAGE)
    settled(page)
    assert values(page) == opened and "overlay=load" in page.url and "otoken=9" in page.url
    expect(page.locator(".st-key-arch_live_value")).to_contain_text(f"layers.{LAYER}.ffn")
    # a saved trace loads on the page and paints the same values
    page.get_by_text("Load a saved trace here").click()
    page.locator(".st-key-arch_live [data-testid='stFileUploaderDropzoneInput']").set_input_files(str(trace_file))
    page.get_by_text("loaded here: trace.json").first.wait_for(timeout=WAIT_RERUN)
    settled(page)
    assert values(page) == opened
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()


def test_compare_paints_the_diff_of_two_runs(server, browser, screenshots):
    base, _ = server
    page = browser.new_page(viewport={"width": 1500, "height": 1500})
    page.set_default_timeout(60_000)
    page.goto(base + "/compare?view=Runs")
    page.get_by_role("button", name="Run both").wait_for(timeout=WAIT_PAGE)
    settled(page)
    box = page.get_by_label("max new tokens")
    box.fill("10")
    box.press("Tab")
    page.locator(".st-key-compare_runs_dspark label").click()
    page.get_by_role("button", name="Run both").click()
    page.get_by_text("The two runs side by side").wait_for(timeout=180_000)
    settled(page)
    page.locator(".v41-painted").first.wait_for(timeout=WAIT_RERUN)
    legend = page.locator(".v41-paint-legend").inner_text()
    assert "routing agreement (Jaccard of the chosen experts) · all tokens" in legend and "(identical)" in legend
    everything = values(page)
    assert all(re.fullmatch(r"[01]\.\d\d", everything[f"layers.{i}"]) for i in range(7)), everything
    page.locator(".v41-root").scroll_into_view_if_needed()
    shot(page, "compare", screenshots, ".v41-root")
    pick(page, "compare_paint_token", re.compile(r"^new token 0 · "))
    page.wait_for_function("() => document.querySelector('.v41-paint-legend').textContent.includes('new token 0')")
    one = values(page)
    assert one != everything and all(re.fullmatch(r"[01]\.\d\d", one[f"layers.{i}"]) for i in range(7))
    pick(page, "compare_paint_metric", "DSpark acceptance")
    page.wait_for_function("() => document.querySelector('.v41-paint-legend').textContent.includes('B − A')")
    assert re.fullmatch(r"[+-]\d+%|–", values(page)["mtp.0"])
    page.locator(".v41-box.v41-painted[data-node='mtp.0']").first.click()
    expect(page.locator(".st-key-compare_paint_value")).to_contain_text("mtp.0")
    shot(page, "compare_dspark", screenshots, ".v41-root")
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()
