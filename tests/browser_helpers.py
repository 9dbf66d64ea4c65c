"""Opening the app's pages in the test browser and waiting as a person would (shared by the e2e test files)."""
from __future__ import annotations

import re

WAIT_PAGE = 90_000   # a fresh server builds the V4.1 view once
# A run's status sentence once it has finished by itself (max new tokens, or the model's end-of-text token).
FINISHED = re.compile(r"status: (stopped at max new tokens|reached end of text)")
STOPPED_BY_USER = re.compile(r"status: stopped by you after \d+ tokens?")


def open_architecture(browser, url: str, width: int = 1600, height: int = 1400):
    """A new page on the Architecture page at `url`, returned once its script run is over."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    page.get_by_text("Reading this diagram").wait_for(timeout=WAIT_PAGE)
    page.locator(".v41-diagram").first.wait_for(timeout=WAIT_PAGE)
    # the page's last element: the script run is over, so the diagram is not redrawn under the test
    page.get_by_text("How the plan is made").wait_for(timeout=WAIT_PAGE)
    page.wait_for_timeout(800)
    return page


def open_inspect(browser, url: str, height: int = 1800):
    """A new page on the Inspect page at `url`, returned once the engine has loaded (Generate is drawn)."""
    page = browser.new_page(viewport={"width": 1500, "height": height})
    page.set_default_timeout(60_000)   # the CI machine has 2 cores shared with other suites
    page.goto(url)
    page.get_by_role("button", name="Generate").wait_for(timeout=120_000)
    return page


def settled(page) -> None:
    """Wait until the script run has finished and no element is still a loading skeleton or stale."""
    page.wait_for_function("() => !document.querySelector('[data-testid=stSkeleton]') && "
                           "!document.querySelector('[data-stale=true]') && "
                           "!document.querySelector('[data-testid=stStatusWidget] button')", timeout=60_000)
    page.wait_for_timeout(300)


# Pairs of x/y tick labels whose boxes overlap, per chart on the page (a rotated label's box is its upright bounding
# box, so this over- rather than under-reports; labels turned exactly upright or level are measured exactly).
TICK_OVERLAPS_JS = """() => [...document.querySelectorAll('.js-plotly-plot')].map(plot => {
    const title = (plot.querySelector('.gtitle') || {}).textContent || '(untitled)';
    const out = [];
    for (const axis of ['.xtick text', '.ytick text']) {
        const boxes = [...plot.querySelectorAll(axis)].filter(t => t.textContent)
            .map(t => [t.textContent, t.getBoundingClientRect()]);
        for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
            const [a, b] = [boxes[i][1], boxes[j][1]];
            if (a.left < b.right - 0.5 && b.left < a.right - 0.5 && a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5)
                out.push(boxes[i][0] + ' / ' + boxes[j][0]);
        }
    }
    return [title, out];
})"""


# Text cut with an ellipsis: elements whose text is wider than their box while they hide the rest.
CUT_JS = """(selector) => [...document.querySelectorAll(selector)].filter(e => {
    const s = getComputedStyle(e);
    return e.scrollWidth > e.clientWidth + 1 && (s.textOverflow === 'ellipsis' || s.overflow === 'hidden');
}).map(e => e.textContent)"""


def tick_overlaps(page) -> dict[str, list[str]]:
    """{chart title: overlapping tick label pairs} for every chart that has any."""
    return {title: pairs for title, pairs in page.evaluate(TICK_OVERLAPS_JS) if pairs}


def pick(page, key: str, option: re.Pattern | str) -> None:
    """Choose an option of the selectbox under `key`, until the box shows it (a click that lands while a rerun
    redraws the list is lost, so it is tried again)."""
    box = page.locator(f".st-key-{key} input")
    for _ in range(5):
        box.click()
        try:
            page.get_by_role("option", name=option).first.click(timeout=5_000)
        except Exception:
            page.keyboard.press("Escape")
        settled(page)
        shown = box.input_value()   # the chosen option's text
        if option.search(shown) if isinstance(option, re.Pattern) else option in shown:
            return
    raise AssertionError(f"{key}: could not choose {option!r} (the box shows {shown!r})")
