"""End-to-end (issue 45 part 2): the start page's tour and glossary, linked from the pages; what a user typed or
picked survives a visit to another page in a real browser (a Streamlit form would have dropped an edit not yet
submitted); the URL names the model picked."""
from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from tests.browser_helpers import WAIT_PAGE, open_architecture, open_inspect, settled

pytestmark = pytest.mark.slow  # browser tests [~2 min under load]

NAV = "[data-testid=stSidebar] [data-testid=stPageLink]"   # the app's own links (page_style.navigation)


def test_start_page_tour_and_glossary_and_the_pages_link_to_it(server, browser, screenshots):
    base, _ = server
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(base + "/")
    page.get_by_role("heading", name="A three-step tour").wait_for(timeout=WAIT_PAGE)
    for step in ("1 · Generate", "2 · Live data on the diagram", "3 · Click a painted box"):
        expect(page.get_by_text(step)).to_be_visible()
    page.screenshot(path=str(screenshots / "start_page.png"), full_page=True)
    page.close()
    page = open_architecture(browser, base + "/architecture?config=deepseek-v4.1-flash")
    terms = page.locator("[data-testid='stCaptionContainer']").filter(has_text="Terms:").first
    for term, anchor in (("mHC", "mhc"), ("KV←n / idx←n", "kv-idx"), ("Reindex / Reuse", "reindex-reuse")):
        expect(terms.get_by_role("link", name=term)).to_have_attribute("href", f"./#{anchor}")
    href = terms.get_by_role("link", name="Reindex / Reuse").get_attribute("href")
    page.close()
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(base + "/architecture")
    page.goto(base + "/" + href.removeprefix("./"))   # where the link leads: the glossary entry, in view
    heading = page.get_by_role("heading", name="Reindex / Reuse")
    heading.wait_for(timeout=WAIT_PAGE)
    expect(heading).to_be_in_viewport(timeout=15_000)
    expect(page.get_by_text("scores the rows again with its own query weights")).to_be_visible()
    page.screenshot(path=str(screenshots / "start_page_glossary_entry.png"))
    page.close()


def test_inspect_edits_not_yet_generated_survive_another_page_and_the_url_names_the_model(server, browser,
                                                                                          screenshots):
    base, _ = server
    page = open_inspect(browser, base + "/inspect?model=tiny-v4.1", height=1200)
    box = page.get_by_label("max new tokens")
    box.fill("9")
    box.press("Tab")
    page.get_by_label("seed").fill("5")
    page.get_by_label("seed").press("Enter")
    page.get_by_label("Prompt").fill("Typed, not generated")
    # The link is clicked with the prompt still focused, as a user does: the box commits the prompt after the click
    # has asked for the new page, as a rerun of the form's fragment naming Inspect. Streamlit ran it after the new
    # page and the browser then cleared that page: it came up and went blank ("Couldn't find fragment" in the log).
    expect(page.get_by_label("Prompt")).to_be_focused()
    page.locator(NAV).filter(has_text=re.compile(r"Architecture$")).click()
    page.get_by_text("How the plan is made").wait_for(timeout=WAIT_PAGE)   # the page's last element
    settled(page)
    page.wait_for_timeout(1500)   # the late commit arrived within a few ms; its run is over by now
    page.screenshot(path=str(screenshots / "inspect_focused_prompt_then_link.png"))
    expect(page.get_by_text("Reading this diagram")).to_be_visible()
    expect(page.locator(NAV)).to_have_count(4)
    page.locator(NAV).filter(has_text=re.compile(r"Inspect$")).click()
    page.get_by_role("button", name="Generate").wait_for(timeout=WAIT_PAGE)
    settled(page)
    expect(page.get_by_label("Prompt")).to_have_value("Typed, not generated")
    expect(page.get_by_label("max new tokens")).to_have_value("9")
    expect(page.get_by_label("seed")).to_have_value("5")
    page.screenshot(path=str(screenshots / "inspect_kept_form.png"))
    # another model picked: the URL names it (a shared link opens it)
    page.locator(".st-key-inspect_model").click()
    page.get_by_role("option", name=re.compile(r"^tiny-v4 ")).first.click()
    page.wait_for_function("() => new URLSearchParams(location.search).get('model') === 'tiny-v4'", timeout=60_000)
    page.close()
