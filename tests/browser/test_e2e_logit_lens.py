"""End-to-end: the logit lens (issue 20, item 3) in headless Chromium — a run of the shipped model on Inspect, the
Logit lens panel checked against the run's downloaded trace (each layer's top token and probability, the rank and
probability of the token that came next, at two tokens), its charts drawn, and the same table from the saved trace
replayed on the page."""
from __future__ import annotations

import re
import shutil

import pytest
from playwright.sync_api import expect

from engine.trace import Trace, load_trace
from tests.browser_helpers import FINISHED, open_inspect, settled
from v41viz.inspect.tokens import probability_text, visible
from v41viz.inspect.trace_model import shown_text, text_lookup

# the logit-lens panel in a browser against the downloaded trace, and the trace replayed [27-47 s]
pytestmark = pytest.mark.slow

CHARTS = ("Logit lens at", "Residual-stream RMS per layer", "Probability each layer gives the token that came next",
          "Log-probability of each token under the model")


def shot(page, name: str, screenshots) -> str:
    path = f"/tmp/lens_{name}.png"
    page.screenshot(path=path, full_page=True)
    shutil.copy(path, screenshots / f"lens_{name}.png")
    return path


def shown_table(page) -> tuple[list[str], list[list[str]]]:
    """The lens table as the browser shows it: (header cells, body rows of cells)."""
    table = page.locator(".st-key-lens_table table").first
    table.wait_for(timeout=30_000)
    head = [c.strip() for c in table.locator("thead th").all_inner_texts()]
    rows = [[c.strip() for c in row.locator("td").all_inner_texts()] for row in table.locator("tbody tr").all()]
    return head, rows


def check_against_trace(page, trace: Trace, pos: int) -> list[list[str]]:
    """Every layer's line of the shown table equals the trace's lens record at `pos`; returns the rows."""
    text = shown_text(text_lookup(trace))
    head, rows = shown_table(page)
    paths = trace.paths("lens")
    assert [r[0] for r in rows] == paths, rows
    nxt = trace.fact("lens", paths[-1], 0, pos)["next_id"]
    assert head[-2:] == [f"rank of '{visible(text(nxt))}'", f"p of '{visible(text(nxt))}'"], head
    for row, path in zip(rows, paths):
        rec = trace.fact("lens", path, 0, pos)
        assert row[1] == f"'{visible(text(rec['top_ids'][0]))}'", (path, row)
        assert row[2] == probability_text(float(rec["top_probs"][0])), (path, row)
        runners_up = " · ".join(f"'{visible(text(i))}' {probability_text(p)}"
                                for i, p in zip(rec["top_ids"][1:].tolist(), rec["top_probs"][1:].tolist()))
        assert row[3] == runners_up and row[4] == f"{int(rec['next_rank']):,}", (path, row)
        assert row[5] == probability_text(float(rec["next_prob"])), (path, row)
    return rows


def test_the_lens_panel_shows_what_the_trace_recorded(server, browser, screenshots, tmp_path):
    base, log_path = server
    page = open_inspect(browser, base + "/inspect?panel=Logit%20lens", height=2600)
    page.get_by_label("Prompt").fill("ROMEO:")
    box = page.get_by_label("max new tokens")
    box.fill("12")
    box.press("Tab")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(FINISHED).wait_for(timeout=180_000)
    settled(page)
    expect(page.get_by_role("radiogroup", name="Panel").get_by_role("radio", name="Logit lens")).to_be_checked()
    button = page.get_by_role("button", name=re.compile(r"^Download \S+\.json \("))
    with page.expect_download() as dl:
        button.click()
    trace_file = tmp_path / "trace.json"
    dl.value.save_as(trace_file)
    trace = load_trace(trace_file)
    assert trace.budget.lens and trace.paths("lens") == [f"layers.{i}" for i in range(8)]
    # the page opens a new run at its last traced token: the lens there predicts the last generated token
    positions = sorted({pos for _, _, r, pos, _ in trace.facts("lens") if r == 0})
    last = positions[-1]
    page.wait_for_function(f"() => location.search.includes('token={last}')")
    main = page.locator("[data-testid='stMain']")
    for title in CHARTS:
        expect(main).to_contain_text(title)
    assert "live data from this session's generation" in main.inner_text()
    rows = check_against_trace(page, trace, last)
    assert rows[-1][4] == "1"   # greedy: the token chosen is the last layer's top token
    shot(page, "last_token", screenshots)
    # another token: the first of the prompt (BOS), whose lens predicts the prompt's first word
    page.locator(".st-key-inspect_token input[type=range]").press("Home")
    page.wait_for_function("() => location.search.includes('token=0')")
    settled(page)
    first = check_against_trace(page, trace, 0)
    assert first != rows
    shot(page, "first_token", screenshots)
    # the saved trace, replayed, draws the same table
    page.get_by_text("Replay a saved trace").first.click()
    page.locator(".st-key-inspect_upload [data-testid='stFileUploaderDropzoneInput']").set_input_files(str(trace_file))
    page.get_by_text("loaded: trace.json").first.wait_for(timeout=60_000)
    settled(page)
    expect(page.get_by_role("radiogroup", name="Panel").get_by_role("radio", name="Logit lens")).to_be_checked()
    assert "a saved trace, not a live run" in main.inner_text()
    page.locator(".st-key-inspect_token input[type=range]").press("End")
    page.wait_for_function(f"() => location.search.includes('token={last}')")
    settled(page)
    assert check_against_trace(page, trace, last) == rows
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()
    assert "Traceback" not in log_path.read_text()
