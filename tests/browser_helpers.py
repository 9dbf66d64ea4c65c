"""Opening the app's pages in the test browser and waiting as a person would (shared by the e2e test files)."""
from __future__ import annotations

WAIT_PAGE = 90_000   # a fresh server builds the V4.1 view once


def open_architecture(browser, url: str, width: int = 1600, height: int = 1400):
    """A new page on the Architecture page at `url`, returned once its script run is over."""
    page = browser.new_page(viewport={"width": width, "height": height})
    page.goto(url)
    page.get_by_text("Reading this diagram").wait_for(timeout=WAIT_PAGE)
    page.locator(".js-plotly-plot").first.wait_for(timeout=WAIT_PAGE)
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
