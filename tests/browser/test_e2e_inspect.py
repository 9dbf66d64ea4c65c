"""End-to-end: the Inspect page in headless Chromium — stream a generation, every panel, export and replay,
two concurrent sessions, the diagram-as-index links, and bad input (issue 16): malformed links, another model's
trace, damaged and oversized uploads."""
from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from playwright.sync_api import expect

from engine.request import GenerationRequest
from tests.browser_helpers import FINISHED, STOPPED_BY_USER, open_inspect, settled

pytestmark = pytest.mark.slow  # browser tests [~4 min under load]

PANELS = ("Experts", "mHC", "Engram", "DSpark", "Attention")
DEFAULT = Path(__file__).resolve().parents[2] / "checkpoints" / "default"    # the model the page opens with
LAST_FFN = f"layers.{json.loads((DEFAULT / 'config.json').read_text())['n_layers'] - 1}.ffn"


def _generate(page, prompt: str, max_new: int = 12, dspark: bool = False) -> float:
    """Fill the form, press Generate; returns seconds from the click to the first sign of the run on screen."""
    page.get_by_label("Prompt").fill(prompt)
    box = page.get_by_label("max new tokens")
    box.fill(str(max_new))
    box.press("Tab")
    if dspark:
        page.locator(".st-key-inspect_dspark label").click()
    t0 = time.perf_counter()
    page.get_by_role("button", name="Generate").click()
    # the progress bar, or this run's text when a short run ends before the bar is drawn
    progress = page.locator("[data-testid='stProgress']").get_by_text(re.compile(r"^\d+/\d+ tokens"))
    this_run = page.locator(".st-key-inspect_output b").filter(has_text=re.compile(f"^{re.escape(prompt)}$"))
    progress.or_(this_run).first.wait_for(timeout=60_000)
    first = time.perf_counter() - t0
    expect(page.locator(".st-key-inspect_output b")).to_have_text(prompt, timeout=120_000)
    page.get_by_text(FINISHED).wait_for(timeout=120_000)
    settled(page)
    return first


def _panel(page, name: str):
    page.locator("[data-testid='stButtonGroup'] button").filter(has_text=re.compile(f"^{name}$")).first.click()
    expect(page.get_by_role("radiogroup", name="Panel").get_by_role("radio", name=name)).to_be_checked()
    settled(page)                              # the panel's script run is over: its text is on the page
    page.locator(".js-plotly-plot").first.wait_for(timeout=30_000)
    page.wait_for_timeout(600)


def _output(page) -> str:
    return page.locator(".st-key-inspect_output").inner_text()


def test_generate_streams_and_every_panel_has_data(server, browser, screenshots):
    base, log_path = server
    page = open_inspect(browser, base + "/inspect")
    body = page.inner_text("body")
    assert "the text is noise" not in body and "held-out loss" in body   # the shipped trained model
    first = _generate(page, "ROMEO:", max_new=16, dspark=True)
    print(f"\nclick → first token: {first:.2f} s")
    assert first < 30
    settled(page)
    page.screenshot(path=str(screenshots / "inspect_generated.png"), full_page=True)
    body = page.inner_text("[data-testid='stMain']")
    assert "live" in body and "tokens/s" in body, body[:3000]
    checks = {"Experts": LAST_FFN, "mHC": "s3", "Engram": "stream 3", "DSpark": "step 1",
              "Attention": "compressed"}
    for name in PANELS:
        _panel(page, name)
        expect(page.locator("[data-testid='stMain']")).to_contain_text(checks[name], timeout=30_000)  # drawn
        text = page.inner_text("[data-testid='stMain']")
        assert checks[name] in text, (name, text[:2000])
        assert "live data from this session's generation" in text
        assert page.locator(".js-plotly-plot").count() >= 1
        assert page.locator("[data-testid='stException']").count() == 0
        settled(page)
        page.screenshot(path=str(screenshots / f"inspect_{name.lower()}.png"), full_page=True)
    page.close()
    assert "Traceback" not in log_path.read_text()


def test_export_then_replay_the_trace(server, browser, tmp_path, screenshots):
    base, _ = server
    page = open_inspect(browser, base + "/inspect?panel=Engram")
    _generate(page, "The sea was calm", max_new=8)
    live_text = _output(page)
    saved = {}
    for fmt, label in (("parquet", "Parquet tables (zip)"), ("safetensors", "safetensors")):
        option = page.get_by_role("option", name=label)
        for _ in range(3):  # a click that lands during a rerun can be swallowed: open the list again
            page.locator(".st-key-export_format").click()
            try:
                option.wait_for(timeout=10_000)
                break
            except Exception:
                settled(page)
        option.click()
        wanted = {"parquet": ".parquet.zip", "safetensors": ".safetensors"}[fmt]
        button = page.get_by_role("button", name=re.compile(r"^Download \S+" + re.escape(wanted) + " "))
        button.wait_for(timeout=30_000)                    # the button of the chosen format has rendered
        with page.expect_download() as dl:
            button.click()
        path = tmp_path / dl.value.suggested_filename
        dl.value.save_as(path)
        # named by model, prompt and time (issue 45), not trace.<suffix> for every run
        assert path.stat().st_size > 1000 and re.fullmatch(r"[\w.-]+_\d{8}-\d{6}" + re.escape(wanted), path.name)
        saved[fmt] = path
    import zipfile

    import pandas as pd  # the Parquet zip is readable by pandas
    with zipfile.ZipFile(saved["parquet"]) as z:
        z.extract("moe.parquet", tmp_path)
    assert len(pd.read_parquet(tmp_path / "moe.parquet")) > 0
    page.get_by_text("Replay a saved trace").first.click()
    page.locator(".st-key-inspect_upload [data-testid='stFileUploaderDropzoneInput']").set_input_files(
        str(saved["safetensors"]))
    page.get_by_text(f"loaded: {saved['safetensors'].name}").first.wait_for(timeout=60_000)
    _panel(page, "Engram")
    text = page.inner_text("[data-testid='stMain']")
    assert f"loaded: {saved['safetensors'].name} (a saved trace" in text and "stream 3" in text
    assert _output(page) == live_text          # the replayed trace carries the same prompt and text
    token = page.locator(".st-key-inspect_token input[type=range]")
    token.focus()
    token.press("Home")
    token.press("ArrowRight")                  # a prompt token: its teacher-forced probability came with the trace
    expect(page.locator(".st-key-inspect_token_detail")).to_contain_text(
        re.compile(r"\(prompt, id \d+\) · p under the model [\d.e-]+ \(teacher-forced.* alternatives: ✓? ?'"))
    page.screenshot(path=str(screenshots / "inspect_replay_loaded.png"), full_page=True)
    page.close()


def test_two_sessions_at_once_get_what_they_get_alone(server, browser, screenshots):
    base, _ = server
    a, b = open_inspect(browser, base + "/inspect", 1000), open_inspect(browser, base + "/inspect", 1000)
    for page, prompt in ((a, "Alpha beta gamma"), (b, "Red green blue")):
        page.get_by_label("Prompt").fill(prompt)
        page.get_by_label("max new tokens").fill("16")
        page.get_by_label("max new tokens").press("Tab")
    a.get_by_role("button", name="Generate").click()
    b.get_by_role("button", name="Generate").click()
    for page in (a, b):
        page.get_by_text(FINISHED).wait_for(timeout=120_000)
    together = [_output(a), _output(b)]
    b.screenshot(path=str(screenshots / "inspect_second_session.png"), full_page=True)
    a.close()
    b.close()
    alone = open_inspect(browser, base + "/inspect", 1000)
    _generate(alone, "Red green blue", max_new=16)
    assert _output(alone) == together[1] and together[0] != together[1]
    alone.close()


def test_diagram_box_opens_its_panel_and_back(server, browser, screenshots):
    base, _ = server
    page = browser.new_page(viewport={"width": 1500, "height": 1800})
    page.goto(base + "/architecture?config=tiny-v4.1&node=layers.1.engram")
    button = page.get_by_role("button", name=re.compile("Inspect .*layers.1.engram.* live"))
    button.wait_for(timeout=90_000)
    button.click()
    page.get_by_role("button", name="Generate").wait_for(timeout=120_000)
    page.wait_for_function("() => location.pathname.endsWith('/inspect')", timeout=15_000)
    _generate(page, "Memory of words", max_new=8)
    text = page.inner_text("[data-testid='stMain']")
    assert "Engram memory" in text and "layers.1.engram" in text
    page.wait_for_function("() => location.search.includes('node=layers.1.engram')", timeout=15_000)
    page.screenshot(path=str(screenshots / "inspect_from_diagram.png"), full_page=True)
    page.locator(".st-key-back_engram button").click()
    page.wait_for_function("() => location.pathname.endsWith('/architecture')", timeout=30_000)
    page.locator(".st-key-details_panel").get_by_text("layers.1.engram").first.wait_for(timeout=60_000)
    assert "node=layers.1.engram" in page.url and "config=tiny-v4.1" in page.url
    page.close()


def test_stop_keeps_the_tokens_so_far(server, browser, screenshots):
    base, _ = server
    page = open_inspect(browser, base + "/inspect", 1000)
    page.get_by_label("Prompt").fill("A long story")
    page.get_by_label("max new tokens").fill("512")   # the most the page allows: Stop lands mid-run on any machine
    page.get_by_label("max new tokens").press("Tab")
    page.get_by_role("button", name="Generate").click()
    # Stop as soon as three tokens have streamed (a state, not a window of counts that a busy browser could skip)
    progress = page.locator("[data-testid='stProgress']")
    progress.get_by_text(re.compile(r"^([3-9]|[1-9]\d+)/512 tokens")).wait_for(timeout=120_000)
    seen = int(progress.inner_text().split("/")[0])
    page.locator(".st-key-inspect_stop button").first.click()
    page.get_by_text(STOPPED_BY_USER).wait_for(timeout=30_000)
    settled(page)
    n = int(page.locator("[data-testid='stMetric']").filter(has_text="new tokens").locator(
        "[data-testid='stMetricValue']").inner_text())
    assert 3 <= seen <= n < 512 and len(_output(page)) > len("A long story"), (seen, n)
    _panel(page, "Experts")                    # the partial run's trace still fills the panels
    assert LAST_FFN in page.inner_text("[data-testid='stMain']")
    page.screenshot(path=str(screenshots / "inspect_stopped.png"), full_page=True)
    page.close()


def test_url_parameters_parse_strictly(server, browser, screenshots):
    """Issue 16: a link with malformed values (a superscript digit, a negative or huge token, an unknown panel or
    layer, out-of-range settings) gets a note naming each key; the page keeps working and runs."""
    base, log_path = server
    bad = ("token=%C2%B2&panel=Nope&layer=zzz&seam=up&temperature=1e9&seed=-1&max_new=9999&dspark=maybe"
           "&node=layers.1.engram%3Cscript%3E")
    page = open_inspect(browser, f"{base}/inspect?{bad}", height=1400)
    settled(page)
    main = page.locator("[data-testid='stMain']")
    for key in ("token=²", "panel=Nope", "layer=zzz", "seam=up", "temperature=1e9", "seed=-1", "max_new=9999",
                "dspark=maybe", "node=layers.1.engram<script>"):
        expect(main.get_by_text(f"{key} was ignored", exact=False)).to_be_visible()
    page.screenshot(path=str(screenshots / "inspect_bad_link.png"), full_page=True)
    _generate(page, "Still working", max_new=4)
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()
    for token, why in (("-1", "was ignored"), ("1e9", "was ignored"), ("999999", "not a position of this run")):
        page = open_inspect(browser, f"{base}/inspect?prompt=Hi&max_new=3&token={token}", height=1200)
        if why == "was ignored":
            expect(page.locator("[data-testid='stMain']").get_by_text(f"token={token} was ignored",
                                                                      exact=False)).to_be_visible()
        page.get_by_role("button", name="Run the linked generation").click()
        page.get_by_text(FINISHED).wait_for(timeout=120_000)
        settled(page)
        if why != "was ignored":
            expect(page.get_by_text(f"The link's token {token} is {why}", exact=False)).to_be_visible()
        assert page.locator("[data-testid='stException']").count() == 0
        page.close()
    assert "Traceback" not in log_path.read_text()


def _foreign_trace(path: Path) -> Path:
    """A DSpark trace recorded on tiny-v4.1 (random weights, 8 experts, the full vocabulary) and named after a
    model this server does not have, as another installation's CLI would write it."""
    from engine.dspark.config import DSparkConfig
    from engine.generation import Engine
    from engine.trace import Trace, TraceBudget
    engine = Engine.load("tiny-v4.1", seed=3)
    trace = Trace(TraceBudget(attention=True), meta={"config": "tiny-v4.1-elsewhere", "prompt": "Elsewhere"})
    engine.generate_text("Elsewhere", GenerationRequest.of(10, trace=trace, dspark=DSparkConfig("threshold", 0.2)))
    assert trace.dspark_steps and max(int(v[0].max()) for *_, v in trace.facts("moe")) < 8
    trace.save(path)
    return path


def test_a_trace_of_another_model_replays_in_every_panel(server, browser, tmp_path, screenshots):
    """Issue 16: a valid trace of a model other than the one selected (here one this server cannot run) is drawn
    from the trace alone in every panel, DSpark included, with no exception."""
    base, log_path = server
    path = _foreign_trace(tmp_path / "elsewhere.json")
    page = open_inspect(browser, base + "/inspect", height=1600)
    page.get_by_text("Replay a saved trace").first.click()
    page.locator(".st-key-inspect_upload [data-testid='stFileUploaderDropzoneInput']").set_input_files(str(path))
    page.get_by_text("loaded: elsewhere.json").first.wait_for(timeout=60_000)
    settled(page)
    checks = {"Experts": "layers.9.ffn", "mHC": "s3", "Engram": "stream 3", "DSpark": "step 1",
              "Attention": "compressed"}
    for name in PANELS:
        _panel(page, name)
        expect(page.locator("[data-testid='stMain']")).to_contain_text(checks[name], timeout=30_000)  # drawn
        settled(page)
        text = page.inner_text("[data-testid='stMain']")
        assert page.locator("[data-testid='stException']").count() == 0, (name, text[:1500])
        assert checks[name] in text and "drawn from the trace of tiny-v4.1-elsewhere" in text, (name, text[:1500])
    page.screenshot(path=str(screenshots / "inspect_foreign_trace_dspark.png"), full_page=True)
    _panel(page, "Experts")
    colours = page.evaluate("() => document.querySelector('.st-key-experts_heatmap .js-plotly-plot')"
                            ".data[0].colorscale")
    assert len(colours) == 2 * 8                                   # tiny-v4.1's 8 experts, not the default's 16
    page.close()
    assert "Traceback" not in log_path.read_text()


def test_bad_trace_uploads_get_a_clear_error_and_the_page_keeps_working(server, browser, tmp_path, screenshots):
    """Issue 16: a damaged trace and one over the size limit each get an error in the main area naming the file
    and the problem; the run on screen stays, and the page still generates."""
    base, _ = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    _generate(page, "Before the upload", max_new=4)
    before = _output(page)
    whole = (tmp_path / "whole.json")
    import zipfile
    _foreign_trace(whole)
    damaged = tmp_path / "damaged.json"
    damaged.write_bytes(whole.read_bytes()[: whole.stat().st_size // 2])
    big = tmp_path / "big.parquet.zip"
    with zipfile.ZipFile(big, "w") as z:                           # a zip over the 16 MiB Parquet limit
        z.writestr("filler.bin", b"\0" * (17 * 2**20))
    assert big.stat().st_size > 16 * 2**20
    body = json.loads(whole.read_text())
    body["header"]["meta"]["prompt"] = "Else\ud800where"             # a lone surrogate, as a JSON escape can carry it
    surrogate = tmp_path / "surrogate.json"
    surrogate.write_text(json.dumps(body))
    page.get_by_text("Replay a saved trace").first.click()
    uploader = page.locator(".st-key-inspect_upload [data-testid='stFileUploaderDropzoneInput']")
    for file, problem in ((damaged, "invalid JSON"), (big, "may have at most 16 MiB"),
                          (surrogate, "meta 'prompt' is not valid text: character 5 is a lone UTF-16 surrogate")):
        uploader.set_input_files(str(file))
        error = page.locator("[data-testid='stMain'] [data-testid='stAlertContentError']").filter(
            has_text=f"Could not load {file.name}")
        expect(error).to_contain_text(problem, timeout=60_000)
        settled(page)
        assert _output(page) == before                              # the shown run is still there
        page.screenshot(path=str(screenshots / f"inspect_bad_upload_{file.stem.split('.')[0]}.png"), full_page=True)
    _generate(page, "After the upload", max_new=4)
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()


def test_a_prompt_with_invalid_text_says_so(server, browser):
    """Issue 16: a lone surrogate typed or pasted into the prompt reaches the server as U+FFFD (the browser replaces
    it); the page runs the prompt and says which character was replaced and why."""
    base, log_path = server
    page = open_inspect(browser, base + "/inspect", height=1400)
    page.get_by_label("Prompt").fill("ROMEO\ud800:")
    page.get_by_role("button", name="Generate").click()
    page.get_by_text(FINISHED).wait_for(timeout=120_000)
    settled(page)
    expect(page.get_by_text("Character 6 of the prompt is U+FFFD, the replacement character")).to_be_visible()
    assert page.locator("[data-testid='stException']").count() == 0
    page.close()
    assert "Traceback" not in log_path.read_text()
