"""End-to-end: the Inspect page under ordinary user actions (issue 15) — Stop, a model switch, literal text,
the token slider, a page change and back, and a replayed trace's settings."""
from __future__ import annotations

import re

from playwright.sync_api import expect

from tests.browser_helpers import open_inspect, settled

MAIN = "[data-testid='stMain']"


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
    "status done" still on screen is not taken for the new one)."""
    _fill(page, prompt, max_new)
    page.get_by_role("button", name="Generate").click()
    expect(page.locator(".st-key-inspect_output b")).to_have_text(prompt, timeout=120_000)
    page.get_by_text(re.compile(r"status done")).wait_for(timeout=120_000)
    settled(page)


def _output(page) -> str:
    return page.locator(".st-key-inspect_output").inner_text()


def test_stop_ends_the_run_within_a_step(server, browser, screenshots):
    """Defect 1: a few seconds into a 512-token run the user presses Stop: there is one Stop to press (Streamlit's
    own top-bar Stop halts the script mid-stream and leaves the page frozen at "Generating…"), and the partial
    run shows as stopped at once."""
    base, log_path = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _fill(page, "ROMEO:", 512)
    page.get_by_role("button", name="Generate").click()
    page.locator("[data-testid='stProgress']").get_by_text(re.compile(r"^\d+/512 tokens")).wait_for(timeout=60_000)
    page.wait_for_timeout(3000)                       # the user watches a few tokens stream, then presses Stop
    stop = page.get_by_role("button", name="Stop", exact=True)
    expect(stop).to_have_count(1)
    stop.click()
    expect(page.get_by_text(re.compile(r"status stopped"))).to_be_visible(timeout=5_000)
    settled(page)
    expect(page.get_by_role("button", name="Stop", exact=True)).to_have_count(0)   # nothing left to stop
    n = int(page.locator("[data-testid='stMetric']").filter(has_text="new tokens").locator(
        "[data-testid='stMetricValue']").inner_text())
    assert 1 <= n < 512
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
    expect(main.get_by_text(re.compile(r"status done"))).to_have_count(0)
    expect(page.locator(".st-key-inspect_output")).to_have_count(0)
    expect(main.get_by_text(re.compile(r"run of checkpoint:default"))).to_be_visible()
    page.screenshot(path=str(screenshots / "inspect_model_switched.png"), full_page=True)
    page.get_by_label("Model to run").click()
    page.get_by_role("option", name=re.compile(r"^default ")).click()
    expect(page.get_by_text(re.compile(r"status done"))).to_be_visible(timeout=120_000)
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
    expect(page.get_by_text(re.compile(r"status done"))).to_be_visible()
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
    button = page.get_by_role("button", name=re.compile(r"^Download trace\.json"))
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
