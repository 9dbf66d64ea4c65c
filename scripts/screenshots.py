"""Take the README's screenshots from a fresh `streamlit run app.py` in headless Chromium (writes docs/*.png).

Usage: .venv/bin/python scripts/screenshots.py [PAGE ...]   (pages: architecture, inspect, overlay, what_if; default
all)
One function per page; each opens its page in a fresh browser context and saves one picture.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

from bench_first_view import CHROMIUM, CHROMIUM_ARGS, start_server
from playwright.sync_api import sync_playwright

DOCS = Path(__file__).resolve().parent.parent / "docs"
WIDTH = 1700   # px: the diagram takes the page's width, the drawing at its largest width fit (125 %)


def architecture(browser, base: str) -> Path:
    """The V4.1-Flash diagram with layer 20's attention opened into its steps and its lightning indexer selected."""
    # tall enough for the whole drawing: Streamlit scrolls its main area, not the document, so a page
    # screenshot ends at the viewport
    page = browser.new_context(viewport={"width": WIDTH, "height": 2500}, device_scale_factor=1).new_page()
    page.goto(base + "/architecture?config=deepseek-v4.1-flash&node=layers.20.attn.indexer&open=attn")
    page.locator(".v41-diagram").wait_for(timeout=120_000)
    page.locator(".v41-box[data-node='layers.20.attn.rope']").wait_for(timeout=120_000)
    page.get_by_text("How the plan is made").wait_for(timeout=120_000)   # the script run is over
    page.locator(".st-key-details_panel").get_by_text("Lightning indexer").first.wait_for(timeout=30_000)
    page.wait_for_timeout(1000)
    top = page.get_by_role("heading", name="deepseek-v4.1-flash").bounding_box()
    diagram = page.locator(".v41-root").bounding_box()
    return shoot(page, top, diagram, DOCS / "architecture.png")


def shoot(page, top: dict, bottom: dict, out: Path) -> Path:
    """Screenshot from 16 px above the `top` box to 16 px below the `bottom` one, page width less the margins."""
    page.screenshot(path=str(out), clip={"x": top["x"] - 16, "y": top["y"] - 16,
                                         "width": WIDTH - (top["x"] - 16) - 24,
                                         "height": bottom["y"] + bottom["height"] - top["y"] + 32})
    page.context.close()
    return out


def inspect(browser, base: str) -> Path:
    """The Inspect page after a 40-token run of the shipped default model with DSpark: the run, its settings and
    the Experts panel (chosen experts per token and layer, load against uniform, experts touched)."""
    page = browser.new_context(viewport={"width": WIDTH, "height": 2300}, device_scale_factor=1).new_page()
    page.set_default_timeout(120_000)
    page.goto(base + "/inspect?prompt=ROMEO%3A&max_new=40&dspark=1&schedule=threshold&threshold=0.3&panel=Experts")
    page.get_by_role("button", name="Run the linked generation").click()
    page.get_by_text(re.compile(r"status: (stopped at max new tokens|reached end of text)")).wait_for()
    page.locator(".st-key-experts_touched .js-plotly-plot").wait_for()
    page.wait_for_function("() => !document.querySelector('[data-stale=true]') && "
                           "!document.querySelector('[data-testid=stSkeleton]')")
    page.wait_for_timeout(1500)
    top = page.get_by_role("heading", name="Inspect a generation").bounding_box()
    bottom = page.locator(".st-key-experts_touched").bounding_box()
    return shoot(page, top, bottom, DOCS / "inspect.png")


def overlay(browser, base: str) -> Path:
    """The Architecture page painted with a 40-token DSpark run of the shipped model made on Inspect: expert load per
    MoE layer (the default metric), all tokens."""
    page = browser.new_context(viewport={"width": WIDTH, "height": 2300}, device_scale_factor=1).new_page()
    page.set_default_timeout(120_000)
    page.goto(base + "/inspect?prompt=ROMEO%3A&max_new=40&dspark=1&panel=Experts")
    page.get_by_role("button", name="Run the linked generation").click()
    page.get_by_text(re.compile(r"status: (stopped at max new tokens|reached end of text)")).wait_for()
    page.get_by_role("link", name="architecture").first.click()
    page.locator(".st-key-arch_live").get_by_text("Live data").first.wait_for()
    page.locator(".st-key-arch_live label").first.click()
    page.locator(".v41-painted").first.wait_for()
    page.wait_for_function("() => !document.querySelector('[data-stale=true]') && "
                           "!document.querySelector('[data-testid=stSkeleton]')")
    page.wait_for_timeout(1500)
    top = page.locator("h1").first.bounding_box()
    bottom = page.locator(".v41-root").first.bounding_box()
    return shoot(page, top, bottom, DOCS / "overlay.png")


def what_if(browser, base: str) -> Path:
    """The Inspect page's "What if…" after a 24-token run of the shipped model: the expert the prompt's 'O' chose
    at layer 5 banned from that token on, the rerun beside the baseline, log-probabilities and routing changes."""
    # tall enough for the whole page: the section is under the panels, and a screenshot clip ends at the viewport
    page = browser.new_context(viewport={"width": WIDTH, "height": 5200}, device_scale_factor=1).new_page()
    page.set_default_timeout(120_000)
    page.goto(base + "/inspect?prompt=ROMEO%3A&max_new=24&panel=Experts&node=layers.5.ffn&token=4")
    page.get_by_role("button", name="Run the linked generation").click()
    page.get_by_text(re.compile(r"status: (stopped at max new tokens|reached end of text)")).wait_for()
    page.get_by_role("button", name="Rerun with this change").click()
    page.locator(".st-key-what_if_applied").get_by_text(re.compile(r"rerun status: stopped at max new")).wait_for()
    page.locator(".st-key-what_if_routing_chart .js-plotly-plot").wait_for()
    page.wait_for_function("() => !document.querySelector('[data-stale=true]') && "
                           "!document.querySelector('[data-testid=stSkeleton]')")
    page.wait_for_timeout(1500)
    top = page.get_by_role("heading", name="What if…").bounding_box()
    bottom = page.locator(".st-key-what_if_routing_changes").bounding_box()
    return shoot(page, top, bottom, DOCS / "what_if.png")


def main() -> None:
    pages = {"architecture": architecture, "inspect": inspect, "overlay": overlay, "what_if": what_if}
    unknown = [a for a in sys.argv[1:] if a not in pages]
    if unknown:
        raise SystemExit(f"unknown page(s) {', '.join(unknown)}; choose from {', '.join(pages)}")
    chosen = [pages[a] for a in sys.argv[1:]] or list(pages.values())
    DOCS.mkdir(exist_ok=True)
    proc, base = start_server()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            for take in chosen:
                print(take(browser, base))
            browser.close()
    finally:
        proc.terminate()
        proc.wait(timeout=10)


if __name__ == "__main__":
    main()
