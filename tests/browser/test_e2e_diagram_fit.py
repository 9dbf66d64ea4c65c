"""End-to-end: the architecture diagram's fit of issue 45 on the rendered page — box text inside its box, the
toolbar on one line, an opened box refitted in "details beside" mode, and a phone that opens the drawing readable
with touch gestures named."""
from __future__ import annotations

import pytest
from playwright.sync_api import expect

from tests.browser_helpers import WAIT_PAGE, open_architecture, settled

# fresh server, V4.1's diagram at two sizes, a box opened [~60 s]
pytestmark = pytest.mark.slow

V41 = "/architecture?config=deepseek-v4.1-flash"

# Text of a box that passes its card (screen pixels, 1 px of slack), and cards that pass the drawing's right edge.
SPILLS_JS = """() => {
    const out = [];
    for (const g of document.querySelectorAll('.v41-box:not(.v41-open)')) {
        const card = g.querySelector('.v41-card').getBoundingClientRect();
        for (const t of g.querySelectorAll(':scope > text:not(.v41-badge)')) {
            const r = t.getBoundingClientRect();
            if (r.bottom > card.bottom + 1 || r.top < card.top - 1 || r.right > card.right + 1)
                out.push(g.dataset.node + ': ' + t.textContent);
        }
    }
    return out;
}"""
OFF_RIGHT_JS = """() => {
    const edge = document.querySelector('svg.v41-diagram').getBoundingClientRect().right + 1;
    return [...document.querySelectorAll('.v41-card')].filter(c => c.getBoundingClientRect().right > edge)
        .map(c => c.closest('.v41-box').dataset.node);
}"""


def _one_line(page) -> None:
    bar = page.locator(".v41-bar").bounding_box()
    button = page.get_by_role("button", name="zoom in").bounding_box()
    assert bar["height"] < 1.8 * button["height"], (bar, button)   # the toolbar wrapped onto a second line


def test_box_text_stays_in_its_box_and_an_opened_box_is_refitted_beside_the_details(server, browser, screenshots):
    base, _ = server
    page = open_architecture(browser, base + V41, width=1400, height=900)
    assert page.evaluate(SPILLS_JS) == []
    _one_line(page)
    page.get_by_text("Details beside the diagram").click()
    settled(page)
    expect(page.locator(".st-key-details_panel")).to_be_visible()
    _one_line(page)
    page.locator("rect.v41-toggle[data-toggle='attn']").click()      # open the attention box into its steps
    page.wait_for_function("() => location.search.includes('open=')", timeout=WAIT_PAGE)
    page.locator(".v41-box.v41-open").first.wait_for(timeout=WAIT_PAGE)
    settled(page)
    page.wait_for_timeout(500)
    page.locator(".v41-root").screenshot(path=str(screenshots / "diagram_fit_beside_open.png"))
    assert page.evaluate(OFF_RIGHT_JS) == []
    assert page.evaluate(SPILLS_JS) == []
    page.close()


def test_a_phone_opens_the_drawing_readable_and_names_touch_gestures(server, browser, screenshots):
    base, _ = server
    page = browser.new_page(viewport={"width": 390, "height": 844}, has_touch=True, is_mobile=True)
    page.goto(base + V41)
    page.locator(".v41-diagram").first.wait_for(timeout=WAIT_PAGE)
    page.get_by_text("How the plan is made").wait_for(timeout=WAIT_PAGE)
    settled(page)
    page.locator(".v41-root").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "diagram_fit_phone.png"))
    assert int(page.locator(".v41-zoom").inner_text().rstrip("%")) >= 85      # it opened at 51%
    hint = page.locator(".v41-hint")
    expect(hint).to_be_visible()
    assert "pinch" in hint.inner_text() and "wheel" not in hint.inner_text()
    bar = page.locator(".v41-bar").bounding_box()
    assert bar["x"] + bar["width"] <= 390
    doc = page.evaluate("() => [document.documentElement.scrollWidth, document.documentElement.clientWidth]")
    assert doc[0] <= doc[1], doc
    page.close()
