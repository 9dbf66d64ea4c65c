"""End-to-end: the Inspect page's "What if…" (issue 20 item 4) in headless Chromium on the shipped default model — a
run, the expert the selected token chose at a layer banned from that token on, the rerun, and what the page says
checked against the two downloaded traces (the change, the routing change at that layer and token and none before,
both texts and their first divergence); the rerun opened as the main run has a link that runs it again with the
change; a layer without Engram gets the engine's sentence; Stop ends a rerun."""
from __future__ import annotations

import re
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from playwright.sync_api import expect

from engine.request.interventions import Intervention
from engine.trace import load_trace
from tests.browser_helpers import FINISHED, open_inspect, pick, settled

# browser tests of Inspect's What if: an expert banned, reruns checked against traces, one stopped [86-98 s]
pytestmark = pytest.mark.slow

LAYER, POS, NEW = 5, 4, 24     # the Experts panel at layers.5.ffn and the prompt's 'O' (BOS RO M E O :)
RERUN_DONE = re.compile(r"rerun status: (stopped at max new tokens|reached end of text)")


def experts(trace, layer: int, pos: int) -> list[int] | None:
    rec = trace.fact("moe", f"layers.{layer}.ffn", 0, pos)
    return None if rec is None else sorted(int(e) for e in rec["ids"])


def download(page, button, path):
    with page.expect_download() as dl:
        button.click()
    dl.value.save_as(path)
    return load_trace(path)


def plain(text: str) -> str:
    """Text as the page shows a run's tokens, without the marks for line breaks and empty tokens, or any space."""
    return re.sub(r"[\s⏎∅]", "", text)


def test_ban_the_chosen_expert_from_the_selected_token_on(server, browser, screenshots, tmp_path):
    base, log_path = server
    page = open_inspect(browser, base + f"/inspect?panel=Experts&node=layers.{LAYER}.ffn&token={POS}", height=1600)
    page.get_by_label("Prompt").fill("ROMEO:")
    box = page.get_by_label("max new tokens")
    box.fill(str(NEW))
    box.press("Tab")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(FINISHED).wait_for(timeout=180_000)
    settled(page)
    baseline = download(page, page.get_by_role("button", name=re.compile(r"^Download \S+\.json \(")),
                        tmp_path / "baseline.json")
    rec = baseline.fact("moe", f"layers.{LAYER}.ffn", 0, POS)
    top = int(rec["ids"][int(rec["weights"].argmax())])
    change = Intervention("ban-expert", LAYER, top, first=POS)
    # the section offers the change for what is looked at: this layer, this token, its heaviest expert
    expect(page.locator(".st-key-what_if_change")).to_contain_text(f"{change.describe()} · {change.text}")
    assert change.describe() == f"ban expert {top} at layer {LAYER}, from token {POS} on"
    # a bad choice: the engine's sentence, nothing to run
    pick(page, "what_if_kind", "switch off Engram")
    pick(page, "what_if_layer", re.compile(rf"^layer {LAYER} "))
    expect(page.locator(".st-key-what_if_problem")).to_contain_text(
        f"intervention 'engram-off:{LAYER}@{POS}-': layer {LAYER} has no Engram (Engram layers: 1, 4)")
    expect(page.get_by_role("button", name="Rerun with this change")).to_be_disabled()
    pick(page, "what_if_kind", "ban an expert")       # back: the defaults for what is looked at again
    expect(page.locator(".st-key-what_if_change")).to_contain_text(change.text)
    t0 = time.perf_counter()
    page.get_by_role("button", name="Rerun with this change").click()
    page.locator(".st-key-what_if_applied").get_by_text(RERUN_DONE).wait_for(timeout=180_000)
    settled(page)
    print(f"\nRerun click → comparison shown: {time.perf_counter() - t0:.2f} s")
    rerun = download(page, page.locator(".st-key-what_if_download button"), tmp_path / "rerun.json")
    # the traces: the change recorded, nothing different before the token, the banned expert gone from it on
    assert rerun.meta["interventions"] == [change.text] and baseline.meta["interventions"] == []
    assert rerun.meta["prompt"] == baseline.meta["prompt"] and rerun.meta["seed"] == baseline.meta["seed"]
    a, b = baseline.tokens(), rerun.tokens()
    shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x.token_id != y.token_id), min(len(a), len(b)))
    for layer in range(8):
        for pos in range(POS):
            assert experts(rerun, layer, pos) == experts(baseline, layer, pos), (layer, pos)
    before, after = experts(baseline, LAYER, POS), experts(rerun, LAYER, POS)
    assert top in before and top not in after
    # what the page says
    expect(page.locator(".st-key-what_if_applied")).to_contain_text(f"The change: {change.describe()}")
    expect(page.locator(".st-key-what_if_settings")).to_contain_text(f"changed: {change.describe()}")
    expect(page.locator(".st-key-what_if_routing_summary")).to_contain_text(
        f"No expert choice changed before position {POS} (the first position the change applies at); compared "
        f"over positions 0–{shared - 1}")
    rows = [[td.strip() for td in row.split("\t")] for row in
            page.locator(".st-key-what_if_routing_changes tbody tr").all_inner_texts()]
    expected = [[f"layers.{layer}.ffn", str(pos), str(experts(baseline, layer, pos)), str(experts(rerun, layer, pos))]
                for layer in range(8) for pos in range(shared)
                if experts(baseline, layer, pos) not in (None, experts(rerun, layer, pos))]
    assert [[r[0], r[1], r[3], r[4]] for r in rows] == expected, rows
    mine = next(r for r in rows if r[:2] == [f"layers.{LAYER}.ffn", str(POS)])
    assert mine[3] == str(before) and mine[4] == str(after) and str(top) in mine[5] and str(top) not in mine[4]
    assert min(int(r[1]) for r in rows) == POS
    # both texts, side by side, and where they part
    for key, trace in (("baseline", baseline), ("rerun", rerun)):
        shown = page.locator(f".st-key-what_if_output_{key}").inner_text()
        assert plain("".join(t.text for t in trace.tokens())) in plain(shown), (key, shown)
    divergence = None if shared == len(a) == len(b) else shared
    metric = page.locator("[data-testid='stMetric']").filter(has_text="first divergence")
    expect(metric.locator("[data-testid='stMetricValue']")).to_have_text(
        "none" if divergence is None else f"position {divergence}")
    if divergence is not None:
        outlined = page.locator(".st-key-what_if_output_rerun [style*='outline']")
        expect(outlined).to_have_count(1)
        assert plain(outlined.inner_text()) == plain(b[divergence].text)
    assert page.locator(".st-key-what_if_logprob_chart .js-plotly-plot").count() == 1
    assert page.locator("[data-testid='stException']").count() == 0
    page.locator(".st-key-what_if_applied").scroll_into_view_if_needed()
    page.screenshot(path=str(screenshots / "what_if.png"))
    # opened as the main run, its link carries the change; the link offers the same what-if run, which reruns it
    page.get_by_role("button", name="Open the rerun as the main run").click()
    expect(page).to_have_url(re.compile(r"[?&]intervene="), timeout=30_000)
    settled(page)
    status = page.locator(".st-key-inspect_status")            # the rerun was watched to its end on this page
    expect(status).to_contain_text(FINISHED)
    assert "in the background" not in status.inner_text(), status.inner_text()
    shared_link = page.url
    assert parse_qs(urlsplit(shared_link).query)["intervene"] == [change.text], shared_link
    page.close()
    page = open_inspect(browser, shared_link, height=1600)
    expect(page.locator(".st-key-inspect_offer")).to_contain_text(f"It is a what-if run, with {change.describe()}")
    page.get_by_role("button", name="Run the linked generation").click()
    page.get_by_text(FINISHED).wait_for(timeout=180_000)
    settled(page)
    again = download(page, page.get_by_role("button", name=re.compile(r"^Download \S+\.json \(")),
                     tmp_path / "link.json")
    assert again.meta["interventions"] == [change.text]
    assert [t.token_id for t in again.tokens()] == [t.token_id for t in b]      # the same run again
    page.close()
    assert "Traceback" not in log_path.read_text()


def test_stop_ends_a_rerun_within_seconds(server, browser):
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    page.get_by_label("Prompt").fill("JULIET:")
    box = page.get_by_label("max new tokens")
    box.fill("512")   # the most the page allows: the rerun's Stop lands mid-run on any machine
    box.press("Tab")
    page.locator(".st-key-inspect_attention label").click()     # attention off: a quicker baseline
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(FINISHED).wait_for(timeout=180_000)
    settled(page)
    page.get_by_role("button", name="Rerun with this change").click()
    page.locator(".st-key-what_if_stream").wait_for(timeout=60_000)
    page.get_by_text(re.compile(r"Rerun with the change: generating \(\d+ tokens? so far\)")).wait_for(timeout=60_000)
    t0 = time.perf_counter()
    page.get_by_role("button", name="Stop", exact=True).click()
    applied = page.locator(".st-key-what_if_applied")
    expect(applied).to_contain_text(re.compile(r"rerun status: stopped by you after \d+ tokens?"), timeout=8_000)
    print(f"\nStop → rerun shown as stopped: {time.perf_counter() - t0:.2f} s")
    n = int(re.search(r"stopped by you after (\d+)", applied.inner_text()).group(1))
    assert 0 <= n < 512
    settled(page)
    assert page.get_by_role("button", name="Stop", exact=True).count() == 0
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()
