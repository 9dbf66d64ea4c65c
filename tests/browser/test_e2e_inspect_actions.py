"""End-to-end: the Inspect page under ordinary user actions (issue 15) — Stop, a model switch, literal text,
the token slider, a page change and back, a replayed trace's settings, readable charts, a node the model lacks,
the auto schedule's profiling, links, leaving mid-run, and tokens with their text and probability."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from playwright.sync_api import expect

from engine.request.decoding import SUGGESTED_REPETITION_PENALTY
from tests.browser_helpers import FINISHED, STOPPED_BY_USER, open_architecture, open_inspect, settled, tick_overlaps

pytestmark = pytest.mark.slow  # browser tests of user actions on the Inspect page [~4 min under load]

MAIN = "[data-testid='stMain']"
P = r"(0\.\d{4}|1\.0000|\d\.\d\de-\d+)"   # a probability as the page writes it
ROOT = Path(__file__).resolve().parents[2]


def _fill(page, prompt: str, max_new: int) -> None:
    page.get_by_label("Prompt").fill(prompt)
    box = page.get_by_label("max new tokens")
    box.fill(str(max_new))
    box.press("Tab")


def _own_settings(page) -> None:
    """What a user changes from the defaults: temperature 0.70, seed 5, DSpark on."""
    for name, value in (("temperature", "0.70"), ("seed", "5")):
        page.get_by_role("spinbutton", name=name).fill(value)
        page.get_by_role("spinbutton", name=name).press("Tab")
    page.locator(".st-key-inspect_dspark label").click()


def _generate(page, prompt: str, max_new: int = 8) -> None:
    """Generate and wait for this run's result (prompts differ from the previous run's, so that an old
    "stopped at max new tokens" still on screen is not taken for the new one)."""
    _fill(page, prompt, max_new)
    page.get_by_role("button", name="Generate").click()
    expect(page.locator(".st-key-inspect_output b")).to_have_text(prompt, timeout=120_000)
    page.get_by_text(FINISHED).wait_for(timeout=120_000)
    settled(page)


def _output(page) -> str:
    return page.locator(".st-key-inspect_output").inner_text()


def test_stop_ends_the_run_within_a_step(server, browser, screenshots):
    """Defect 1: while a 512-token run streams the user presses Stop: there is one Stop to press (Streamlit's own
    top-bar Stop halts the script mid-stream and leaves the page frozen at "Generating…"), and the partial run
    shows as stopped at once, by the user, on this page (not as a run that ended while they were elsewhere)."""
    base, log_path = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _fill(page, "ROMEO:", 512)   # the most the page allows: seconds of decoding even on a fast idle machine
    page.get_by_role("button", name="Generate").click()
    # the user watches the tokens stream, then presses Stop: at once, as soon as two tokens have streamed, so that
    # Stop lands early in the run on any machine (a state to wait for, not a window of counts that the browser
    # could skip: the page polls the run every 0.2 s, and a busy browser coalesces updates)
    progress = page.locator("[data-testid='stProgress']")
    progress.get_by_text(re.compile(r"^([2-9]|[1-9]\d+)/512 tokens")).wait_for(timeout=120_000)
    seen = int(progress.inner_text().split("/")[0])
    stop = page.get_by_role("button", name="Stop", exact=True)
    expect(stop).to_have_count(1)
    stop.click()
    expect(page.get_by_text(STOPPED_BY_USER)).to_be_visible(timeout=5_000)   # at once, not at the run's end
    expect(page.locator(".st-key-inspect_status")).not_to_contain_text("while you were on another page")
    settled(page)
    expect(page.get_by_role("button", name="Stop", exact=True)).to_have_count(0)   # nothing left to stop
    n = int(page.locator("[data-testid='stMetric']").filter(has_text="new tokens").locator(
        "[data-testid='stMetricValue']").inner_text())
    assert 2 <= seen <= n < 512, (seen, n)          # ended early, where the run had got to when Stop landed
    status = page.locator(".st-key-inspect_status").inner_text()
    assert re.search(r"stopped by you after (\d+) tokens?", status).group(1) == str(n), status   # one count
    page.screenshot(path=str(screenshots / "inspect_stop_at_once.png"), full_page=True)
    page.close()
    assert "Traceback" not in log_path.read_text()


def test_switching_the_model_does_not_show_the_previous_models_run(server, browser, screenshots):
    """Defect 2: after a run on the default model the user picks the tiny random-weight preset: the old run is
    not shown (nor decoded, nor drawn) as this model's live run; switching back shows it again."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _generate(page, "ROMEO:", 8)
    before = _output(page)
    page.get_by_label("Model to run").click()
    page.get_by_role("option", name=re.compile(r"^tiny-v4\.1 ")).click()
    expect(page.get_by_text(re.compile(r"tiny-v4\.1 · \d+ layers"))).to_be_visible(timeout=120_000)
    settled(page)
    main = page.locator(MAIN)
    expect(main.get_by_text(FINISHED)).to_have_count(0)
    expect(page.locator(".st-key-inspect_output")).to_have_count(0)
    expect(main.get_by_text(re.compile(r"run of checkpoint:default"))).to_be_visible()
    page.screenshot(path=str(screenshots / "inspect_model_switched.png"), full_page=True)
    page.get_by_label("Model to run").click()
    page.get_by_role("option", name=re.compile(r"^default ")).click()
    expect(page.get_by_text(FINISHED)).to_be_visible(timeout=120_000)
    assert _output(page) == before
    page.close()


def test_prompt_and_output_are_shown_verbatim(server, browser, screenshots):
    """Defect 4: markdown characters and spaces in the prompt come out as typed (no `**ROMEO: **`), and the
    output says how many characters and how much whitespace it holds."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    for prompt in ("ROMEO: ", "  *ROMEO*"):
        _generate(page, prompt, 4)
        shown = _output(page)
        assert shown.startswith(prompt) and "**" not in shown.replace("*ROMEO*", ""), repr(shown)
        prompt_box = page.locator(".st-key-inspect_output [data-testid='stHtml'] b").first
        assert prompt_box.inner_text() == prompt                     # the prompt, whitespace kept, in bold
        expect(page.locator(MAIN).get_by_text(re.compile(r"\d+ characters generated"))).to_be_visible()
    page.screenshot(path=str(screenshots / "inspect_verbatim_text.png"), full_page=True)
    page.close()


def _token_views(page) -> tuple[str, str, str]:
    """The selected token as the slider shows it, as the URL carries it, and as the Experts panel reads it."""
    settled(page)
    slider = page.locator(".st-key-inspect_token [data-testid='stSliderThumbValue']").inner_text()
    url = re.search(r"[?&]token=(\d+)", page.url)
    panel = re.search(r"Top-\d+ per layer for token (\d+):", page.inner_text(MAIN))
    return slider.split(":")[0], url.group(1) if url else "", panel.group(1) if panel else ""


def test_token_slider_url_and_panels_agree_after_a_new_run(server, browser, screenshots):
    """Defect 3: the user moves the token slider, then generates again (shorter, then longer): the slider, the
    URL and the panel show the same token, reset to the new run's last token."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _generate(page, "The king said", 16)
    thumb = page.locator(".st-key-inspect_token input[type=range]")
    thumb.focus()
    thumb.press("Home")
    for _ in range(10):
        thumb.press("ArrowRight")
    expect(page.locator(".st-key-inspect_token [data-testid='stSliderThumbValue']")).to_have_text(
        re.compile(r"^10:"), timeout=10_000)
    page.wait_for_function("() => location.search.includes('token=10')", timeout=30_000)
    assert _token_views(page) == ("10", "10", "10")
    for prompt, max_new in (("The king says", 16), ("Hi", 3), ("Once upon a time there was", 12)):
        _generate(page, prompt, max_new)
        views = _token_views(page)
        last = page.locator(".st-key-inspect_token [data-testid='stSliderTickBar'] p").last.inner_text()
        assert views == (last.split(":")[0],) * 3, (prompt, views, last)
    page.screenshot(path=str(screenshots / "inspect_token_after_new_run.png"), full_page=True)
    page.close()


def test_settings_survive_a_visit_to_another_page(server, browser, screenshots):
    """Defect 5: the user generates with their own settings, visits Compare and comes back: the form still holds
    the settings of the run shown next to it."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _own_settings(page)
    _generate(page, "Call me Ishmael", 6)
    page.get_by_role("link", name="compare").click()
    page.wait_for_function("() => location.pathname.endsWith('/compare')", timeout=30_000)
    settled(page)
    page.get_by_role("link", name="inspect").click()
    page.get_by_role("button", name="Generate").wait_for(timeout=60_000)
    settled(page)
    expect(page.get_by_label("Prompt")).to_have_value("Call me Ishmael")
    expect(page.get_by_label("max new tokens")).to_have_value("6")
    expect(page.get_by_role("spinbutton", name="temperature")).to_have_value("0.70")
    expect(page.get_by_role("spinbutton", name="seed")).to_have_value("5")
    expect(page.get_by_role("switch", name="DSpark")).to_be_checked()
    expect(page.get_by_text(FINISHED)).to_be_visible()
    page.screenshot(path=str(screenshots / "inspect_settings_kept.png"), full_page=True)
    page.close()


def test_a_replayed_trace_shows_and_restores_its_settings(server, browser, tmp_path, screenshots):
    """Defect 13: the user saves a run made with their own settings, changes the form, then replays the saved
    trace: the page says which model and settings made it, and the form holds them again."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _own_settings(page)
    page.locator(".st-key-inspect_schedule").click()
    page.get_by_role("option", name=re.compile(r"^threshold")).click()
    _generate(page, "Now is the winter", 6)
    button = page.get_by_role("button", name=re.compile(r"^Download \S+\.json \("))
    with page.expect_download() as dl:
        button.click()
    path = tmp_path / "trace.json"
    dl.value.save_as(path)
    for label, value in (("temperature", "0.00"), ("seed", "0")):      # the user moves on to other settings
        page.get_by_role("spinbutton", name=label).fill(value)
        page.get_by_role("spinbutton", name=label).press("Tab")
    page.locator(".st-key-inspect_dspark label").click()
    _generate(page, "Something else", 4)
    page.get_by_text("Replay a saved trace").first.click()
    page.locator(".st-key-inspect_upload [data-testid='stFileUploaderDropzoneInput']").set_input_files(str(path))
    summary = page.locator(".st-key-inspect_run_settings")
    expect(summary).to_contain_text("checkpoint:default", timeout=60_000)
    settled(page)
    for fact in ("temperature 0.7", "seed 5", "DSpark schedule threshold"):
        expect(summary).to_contain_text(fact)
    expect(page.get_by_label("Prompt")).to_have_value("Now is the winter")
    expect(page.get_by_role("spinbutton", name="temperature")).to_have_value("0.70")
    expect(page.get_by_role("spinbutton", name="seed")).to_have_value("5")
    expect(page.get_by_role("switch", name="DSpark")).to_be_checked()
    page.screenshot(path=str(screenshots / "inspect_replay_settings.png"), full_page=True)
    page.close()


def _colorbar_ticks(page, chart_key: str) -> list[str]:
    ticks = f".st-key-{chart_key} .colorbar .cbaxis text, .st-key-{chart_key} .colorbar text"
    return page.locator(ticks).all_text_contents()


def test_charts_read_right(server, browser, screenshots):
    """Defect 8: the load ÷ uniform colour bar starts at 0 (a ratio), expert ids get one flat colour each (a
    categorical palette, not a rainbow), and no chart's axis labels collide, on every panel, wide or narrow."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    page.locator(".st-key-inspect_dspark label").click()
    _generate(page, "Now is the winter", 40)
    bar = [t.replace("−", "-") for t in _colorbar_ticks(page, "experts_load") if t and t != "÷ uniform"]
    assert bar and all(float(t) >= 0 for t in bar), bar
    scale = page.evaluate("() => document.querySelector('.st-key-experts_heatmap .js-plotly-plot').data[0].colorscale")
    colours = [c for _, c in scale]
    assert colours[0::2] == colours[1::2], scale             # stepped: each id's band is one flat colour
    assert len(set(colours)) == len(colours) // 2 >= 8       # a distinct colour per expert id
    assert "e0" in _colorbar_ticks(page, "experts_heatmap")
    for width in (1500, 1000):
        page.set_viewport_size({"width": width, "height": 1400})
        for name, chart in (("Experts", "experts_heatmap"), ("mHC", "mhc_matrix"), ("Engram", "engram_gates"),
                            ("DSpark", "dspark_trace"), ("Attention", "attn_share")):
            page.locator("[data-testid='stButtonGroup'] button").filter(has_text=re.compile(f"^{name}$")).first.click()
            page.locator(f".st-key-{chart} .js-plotly-plot").wait_for(timeout=30_000)    # this panel is drawn
            settled(page)
            page.wait_for_timeout(500)
            assert tick_overlaps(page) == {}, (width, name, tick_overlaps(page))
    page.set_viewport_size({"width": 1500, "height": 1400})
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text=re.compile("^Experts$")).first.click()
    settled(page)
    page.screenshot(path=str(screenshots / "inspect_charts.png"), full_page=True)
    page.close()


def test_a_diagram_node_the_model_lacks_offers_the_nearest_one(server, browser, screenshots):
    """Defect 11: "Inspect layers.14.engram live" from the V4.1-Flash diagram opens the 8-layer model to run: the
    page says it has no layer 14 and offers its nearest Engram layer; taking it filters the run to that layer."""
    base, _ = server
    page = open_architecture(browser, base + "/architecture?config=deepseek-v4.1-flash&node=layers.14.engram",
                             height=1400)
    page.get_by_role("button", name=re.compile("Inspect .*layers.14.engram.* live")).click()
    page.get_by_role("button", name="Generate").wait_for(timeout=120_000)
    settled(page)
    notice = page.locator(".st-key-inspect_node_request")
    expect(notice).to_contain_text("deepseek-v4.1-flash diagram", timeout=60_000)
    expect(notice).to_contain_text("has no layer 14")
    expect(notice).to_contain_text("nearest Engram layer in checkpoint:default is layers.4.engram")
    page.screenshot(path=str(screenshots / "inspect_nearest_layer.png"), full_page=True)
    notice.get_by_role("button", name=re.compile(r"Inspect .*layers\.4\.engram.* instead")).click()
    settled(page)
    _generate(page, "Memory of words", 8)
    expect(page.locator(".st-key-inspect_node")).to_match_aria_snapshot('- combobox "Module filter": layers.4.engram')
    expect(page.locator(MAIN)).to_contain_text("Engram memory")
    expect(page.locator(".st-key-inspect_node_request")).to_have_count(0)
    page.wait_for_function("() => location.search.includes('node=layers.4.engram')", timeout=15_000)
    page.close()


def test_the_auto_schedule_says_it_profiles_the_machine(server, browser, screenshots):
    """Defect 12: the first `auto` DSpark run profiles the machine before its first token: the page says so, with
    progress, instead of "prefill"; the run then finishes and says how much of the wait was profiling."""
    from engine.dspark.profile import CACHE_DIR, device_label
    base, _ = server
    (ROOT / CACHE_DIR / f"sps-{device_label('cpu')}-default.json").unlink(missing_ok=True)  # profiled on the next run
    page = open_inspect(browser, base + "/inspect", height=1400)
    page.locator(".st-key-inspect_dspark label").click()
    page.locator(".st-key-inspect_schedule").click()
    page.get_by_role("option", name=re.compile(r"^auto")).click()
    _fill(page, "Wherefore art thou", 8)
    page.get_by_role("button", name="Generate").click()
    progress = page.locator("[data-testid='stProgress']")
    expect(progress).to_contain_text(re.compile(r"Profiling this machine for the auto DSpark schedule: \d+/\d+ verify "
                                                r"shapes timed.*once per machine and model"), timeout=60_000)
    page.screenshot(path=str(screenshots / "inspect_profiling.png"))
    page.get_by_text(FINISHED).wait_for(timeout=180_000)
    settled(page)
    expect(page.locator(MAIN)).to_contain_text(re.compile(r"The first token came after [\d.]+ s, of which [\d.]+ s "
                                                          r"profiling this machine for the auto schedule"))
    page.close()


def test_a_link_reopens_the_same_generation_and_view(server, browser, screenshots):
    """An Inspect link carries the model, prompt, settings, panel, layer, seam, token and the run's id in the run
    store: a fresh browser session opening it is shown the stored run itself (nothing to run again) on the same view
    with the same text. A link whose run the store does not have (dropped, or made by another server) is offered
    the same generation instead, and running it lands on the same view with the same text."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _own_settings(page)
    _generate(page, "Good morrow, cousin", 12)
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text=re.compile("^mHC$")).first.click()
    settled(page)
    layer = page.locator(".st-key-mhc_layer input[type=range]")
    layer.focus()
    for _ in range(3):
        layer.press("ArrowRight")
    page.locator(".st-key-mhc_site").get_by_text("ffn").click()
    token = page.locator(".st-key-inspect_token input[type=range]")
    token.focus()
    token.press("Home")
    for _ in range(6):
        token.press("ArrowRight")
    page.wait_for_function("() => ['token=6', 'seam=ffn', 'layer=layers.3'].every(k => location.search.includes(k))",
                           timeout=30_000)
    settled(page)
    link, text = page.url, _output(page)
    for key in ("model=checkpoint", "prompt=Good+morrow", "temperature=0.7", "seed=5", "dspark=1", "panel=mHC"):
        assert key in link, (key, link)
    run_id = re.search(r"[?&]run=([0-9a-f]{16})(&|$)", link)
    assert run_id, link
    page.close()

    def same_view(other) -> None:
        assert _output(other) == text
        expect(other.get_by_role("radiogroup", name="Panel").get_by_role("radio", name="mHC")).to_be_checked()
        expect(other.locator(".st-key-mhc_layer [data-testid='stSliderThumbValue']")).to_have_text("layers.3")
        expect(other.locator(".st-key-mhc_site").get_by_role("radio", name="ffn")).to_be_checked()
        expect(other.locator(".st-key-inspect_token [data-testid='stSliderThumbValue']")).to_have_text(
            re.compile("^6:"))
        expect(other.get_by_text("layers.3 · ffn seam · position 6")).to_be_visible()
        expect(other.get_by_label("Prompt")).to_have_value("Good morrow, cousin")
        expect(other.get_by_role("spinbutton", name="seed")).to_have_value("5")

    stored = open_inspect(browser, link, height=1400)   # a page in a new browser context: a fresh session
    stored.get_by_text(f"stored run {run_id[1]}").first.wait_for(timeout=60_000)
    stored.get_by_text(FINISHED).wait_for(timeout=60_000)
    settled(stored)
    expect(stored.locator(".st-key-inspect_offer")).to_have_count(0)   # the run itself: nothing to run again
    same_view(stored)
    stored.screenshot(path=str(screenshots / "inspect_link_reopened.png"), full_page=True)
    stored.close()

    gone = link.replace(f"run={run_id[1]}", "run=0123456789abcdef")   # a run this server's store does not have
    other = open_inspect(browser, gone, height=1400)
    expect(other.locator(MAIN)).to_contain_text("0123456789abcdef is not in the run store")
    offer = other.locator(".st-key-inspect_offer")
    expect(offer).to_contain_text("This link shares a generation")
    expect(offer).to_contain_text("temperature 0.7")
    offer.get_by_role("button", name="Run the linked generation").click()
    other.get_by_text(FINISHED).wait_for(timeout=120_000)
    settled(other)
    same_view(other)
    other.screenshot(path=str(screenshots / "inspect_link_rerun.png"), full_page=True)
    other.close()


def test_leaving_mid_run_keeps_the_run_going(server, browser, screenshots):
    """A user who visits Compare during a generation comes back to the whole run: it went on in the background
    (still streaming on return, from where it had got to, or finished and saying it finished while away),
    instead of being lost or cut short."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _fill(page, "The quality of mercy", 512)  # the most the page allows: seconds of decoding left after leaving
    page.get_by_role("button", name="Generate").click()
    progress = page.locator("[data-testid='stProgress']")
    # mid-run: the user leaves as soon as two tokens have streamed (a state to wait for, not a window of counts
    # that the browser could skip: the page polls the run every 0.2 s, and a busy browser coalesces updates)
    progress.get_by_text(re.compile(r"^([2-9]|[1-9]\d+)/512 tokens")).wait_for(timeout=120_000)
    left_at = int(progress.inner_text().split("/")[0])
    page.get_by_role("link", name="compare").click()
    page.wait_for_function("() => location.pathname.endsWith('/compare')", timeout=30_000)
    page.wait_for_timeout(20_000)                                  # the run goes on meanwhile
    page.get_by_role("link", name="inspect").click()
    status = page.locator(".st-key-inspect_status")
    progress.or_(status).first.wait_for(timeout=60_000)
    if status.count():                                             # it finished while the user was away
        expect(status).to_contain_text("finished in the background while you were on another page")
    else:                                                          # still going: streaming from where it had got
        assert int(progress.inner_text().split("/")[0]) > left_at, progress.inner_text()
    expect(status).to_contain_text(FINISHED, timeout=180_000)
    settled(page)
    n = int(page.locator("[data-testid='stMetric']").filter(has_text="new tokens").locator(
        "[data-testid='stMetricValue']").inner_text())
    assert left_at < n and (n == 512 or "reached end of text" in status.inner_text()), (left_at, n)
    page.screenshot(path=str(screenshots / "inspect_left_and_back.png"), full_page=True)
    page.close()


def test_tokens_show_their_text_and_probability(server, browser, screenshots):
    """Top-k alternatives name their token text (escaped, whitespace visible) next to the ids, and a prompt token
    has its teacher-forced probability under the model instead of "None"; statuses read as sentences."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _generate(page, "To be, or not to be", 6)
    expect(page.locator(".st-key-inspect_status")).to_contain_text("status: stopped at max new tokens (6 tokens)")
    detail = page.locator(".st-key-inspect_token_detail")
    expect(detail).to_contain_text(re.compile(rf"\(generated, id \d+\) · p under the model {P}"))
    # how the page's default settings chose it (greedy, with the suggested repetition penalty)
    expect(detail).to_contain_text(f"(chosen greedily with repetition penalty {SUGGESTED_REPETITION_PENALTY:g})")
    expect(detail).to_contain_text(re.compile(r"alternatives: ✓ '[^']+' 0\.\d{3} \(#\d+\)"))
    token = page.locator(".st-key-inspect_token input[type=range]")
    token.focus()
    token.press("Home")
    token.press("ArrowRight")
    token.press("ArrowRight")                                       # position 2: a prompt token after BOS
    expect(detail).to_contain_text(re.compile(rf"\(prompt, id \d+\) · p under the model {P} \(teacher-forced"))
    assert "None" not in detail.inner_text()
    expect(detail).to_contain_text(re.compile(r"'[^']*·[^']*'|'[^']+'"))
    token.press("Home")                                             # BOS: nothing predicts it, and it says so
    expect(detail).to_contain_text("nothing comes before the first token")
    page.screenshot(path=str(screenshots / "inspect_token_probabilities.png"), full_page=True)
    page.close()
