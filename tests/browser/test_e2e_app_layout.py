"""End-to-end: the app's layout defects of issue 45 on the rendered page, at a desktop (1400×900) and a phone
(390×844) size — the memory plan's chart is drawn, nothing widens the page sideways, labels are not cut, the
navigation names the pages, the plan's context starts at what the model can hold."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser_helpers import CUT_JS, WAIT_PAGE, settled

# fresh server, V4.1's view built once, six pages opened at two sizes [~60 s]
pytestmark = pytest.mark.slow

DESKTOP, PHONE = {"width": 1400, "height": 900}, {"width": 390, "height": 844}

# Elements (and how far) whose right edge passes the main area's, and the page's and main area's sideways scroll.
OVERFLOW_JS = """() => {
    const main = document.querySelector('[data-testid=stMain]');
    const edge = main.getBoundingClientRect().right + 0.5;
    const wide = [...main.querySelectorAll('table, .js-plotly-plot, [data-testid=stElementContainer]')]
        .filter(e => e.getBoundingClientRect().width > 0 && e.getBoundingClientRect().right > edge)
        .map(e => e.tagName + ' ' + (e.className.baseVal ?? e.className) + ' → ' + e.getBoundingClientRect().right);
    const doc = document.documentElement;
    return {doc: [doc.scrollWidth, doc.clientWidth], main: [main.scrollWidth, main.clientWidth], wide};
}"""



def _open(browser, base: str, path: str, viewport: dict, wait_for: str):
    page = browser.new_page(viewport=viewport)
    page.goto(base + path)
    page.get_by_text(wait_for).first.wait_for(timeout=WAIT_PAGE)
    settled(page)
    return page


def _no_sideways_overflow(page) -> None:
    seen = page.evaluate(OVERFLOW_JS)
    assert seen["doc"][0] <= seen["doc"][1] and seen["main"][0] <= seen["main"][1], seen
    assert not seen["wide"], seen


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["1400", "390"])
def test_accounting_tables_stay_inside_the_page(server, browser, screenshots, viewport):
    base, _ = server
    page = _open(browser, base, "/architecture?config=deepseek-v4.1-flash", viewport, "Against the published figures")
    published = page.locator("table").filter(has_text="why").first
    published.scroll_into_view_if_needed()
    page.wait_for_timeout(300)
    page.screenshot(path=str(screenshots / f"layout_published_{viewport['width']}.png"))
    box, main = published.bounding_box(), page.locator("[data-testid=stMain]").bounding_box()
    assert box["x"] >= main["x"] and box["x"] + box["width"] <= main["x"] + main["width"] + 0.5, (box, main)
    _no_sideways_overflow(page)
    page.close()


def test_the_memory_plan_draws_its_per_gpu_bars(server, browser, screenshots):
    base, _ = server
    page = _open(browser, base, "/architecture?config=deepseek-v4.1-flash", DESKTOP, "How the plan is made")
    chart = page.locator(".v41-plan-bars").filter(has_text="GiB per GPU by part")
    chart.scroll_into_view_if_needed()
    expect(chart).to_be_visible()
    bars = chart.locator(".v41-plan-bar > div")
    assert bars.count() >= 4      # routed experts, dense weights, drafter, KV caches, working buffers of GPU 0–7
    boxes = [bars.nth(i).bounding_box() for i in range(bars.count())]
    assert max(b["width"] for b in boxes) > 50 and min(b["height"] for b in boxes) > 10, boxes
    expect(chart.get_by_text("141 GiB per GPU")).to_be_visible()
    assert page.locator(".js-plotly-plot").count() == 0   # no plotly.js for a fresh browser to load on this view
    page.screenshot(path=str(screenshots / "layout_memory_plan_chart.png"))
    page.close()


def test_the_plan_context_starts_at_the_models_maximum(server, browser):
    base, _ = server
    page = _open(browser, base, "/architecture?config=tiny-v4.1", DESKTOP, "How the plan is made")
    box = page.get_by_role("spinbutton", name="context (tokens)")
    expect(box).to_have_value("512")        # tiny-v4.1's max_seq_len, not the 128k default
    expect(box).to_have_attribute("max", "512")
    expect(page.get_by_text(re.compile(r"tiny-v4.1 at 512 context"))).to_be_visible()
    box.fill("100000")
    box.press("Enter")
    settled(page)
    expect(box).to_have_attribute("aria-invalid", "true")    # refused: more than the model can hold
    expect(page.get_by_text(re.compile(r"tiny-v4.1 at 512 context"))).to_be_visible()
    page.close()


def test_navigation_names_the_pages_and_compare_has_no_config_picker(server, browser, screenshots):
    base, _ = server
    page = _open(browser, base, "/compare", DESKTOP, "sizes and mechanisms differ")
    nav = page.locator("[data-testid=stSidebar] [data-testid=stPageLink]")
    assert [t.split()[-1] for t in nav.all_inner_texts()] == ["Home", "Architecture", "Compare", "Inspect"]
    sidebar = page.locator("[data-testid=stSidebar]")
    expect(sidebar.get_by_text("Model config")).to_have_count(0)   # A and B choose on this page
    expect(sidebar.get_by_role("combobox")).to_have_count(0)
    nav.filter(has_text="Architecture").click()
    page.get_by_text("Reading this diagram").wait_for(timeout=WAIT_PAGE)
    expect(page.locator("[data-testid=stSidebar]").get_by_text("Model config")).to_be_visible()
    page.close()


def test_labels_and_figures_are_not_cut_at_1400(server, browser, screenshots):
    base, _ = server
    page = _open(browser, base, "/architecture?config=deepseek-v4.1-flash", DESKTOP, "How the plan is made")
    page.screenshot(path=str(screenshots / "layout_header_1400.png"))
    cut = page.evaluate(CUT_JS, "[data-testid=stMetricValue] *, [data-testid=stMetricLabel] *, "
                                "[data-testid=stWidgetLabel] *, [data-testid=stSidebar] [data-baseweb=select] *")
    assert not cut, cut
    expect(page.get_by_text("Details beside the diagram")).to_be_visible()
    page.close()


def test_icon_buttons_have_names_a_screen_reader_can_say(server, browser):
    base, _ = server
    page = _open(browser, base, "/architecture?config=tiny-v4.1", DESKTOP, "How the plan is made")
    search = page.get_by_role("textbox", name="Find a module")
    search.fill("attn")
    search.press("Enter")
    settled(page)
    for name in ("Previous match", "Next match", "zoom in", "zoom out", "download the drawing as SVG"):
        button = page.get_by_role("button", name=name, exact=True)
        expect(button).to_be_visible()
        assert button.bounding_box()["width"] < 60 or "download" in name   # still drawn as an icon
    said = page.locator("[data-testid=stMain]").aria_snapshot()    # what assistive technology is told
    assert "chevron" not in said and not re.search(r'button ""|- button$', said, re.M), said
    page.close()
