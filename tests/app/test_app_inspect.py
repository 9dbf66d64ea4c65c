"""AppTest of the Inspect page: load, generate, every panel, DSpark, URL state, bad input, links with the diagram."""
import gc
import json
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.app_helpers import APP, TIMEOUT, inspect_page

PANELS = ("Experts", "mHC", "Engram", "DSpark", "Logit lens", "Attention")


def generate(at: AppTest, prompt: str = "The quick brown fox", **settings) -> AppTest:
    at.text_area(key="inspect_prompt").input(prompt)
    at.number_input(key="inspect_max_new").set_value(settings.pop("max_new", 6))
    for key, value in settings.items():
        at.toggle(key=f"inspect_{key}").set_value(value) if isinstance(value, bool) else \
            at.selectbox(key=f"inspect_{key}").set_value(value)
    at.button(key="inspect_generate").click()
    return at.run()


def text_of(at: AppTest) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_page_loads_the_shipped_trained_model_by_default():
    at = inspect_page()
    assert not at.exception, at.exception
    assert at.title[0].value == "Inspect a generation"
    assert at.selectbox(key="inspect_model").value == "checkpoint:default"
    assert not any("the text is noise" in w.value for w in at.warning)
    card = json.loads((Path(APP).parent / "checkpoints" / "default" / "card.json").read_text())
    assert any(f"held-out loss {card['heldout']['loss']:.2f}" in c.value and "MODEL_CARD.md" in c.value
               for c in at.caption)
    assert any("press Generate" in i.value for i in at.info)


def test_a_random_weight_preset_says_its_text_is_noise():
    at = inspect_page(model="tiny-v4.1")
    assert not at.exception, at.exception
    assert at.selectbox(key="inspect_model").value == "tiny-v4.1"
    assert any("the text is noise; the machinery is real" in w.value and "trained `default` checkpoint" in w.value
               for w in at.warning)


def test_a_full_width_preset_says_why_it_is_not_run_and_how_to_run_it():
    """The rehearsal preset's random weights (6B parameters, 24 GiB in float32) are not offered; the page says so
    and names the synthetic official folder that runs it."""
    at = inspect_page(model="v4.1-flash-rehearsal")
    assert not at.exception, at.exception
    assert at.selectbox(key="inspect_model").value == "checkpoint:default"
    warning = next(w.value for w in at.warning if "v4.1-flash-rehearsal" in w.value)
    assert "beyond the 1B-parameter limit for random weights" in warning
    assert "engine quantize --synthetic v4.1-flash-rehearsal --out checkpoints/v4.1-flash-rehearsal" in warning


@pytest.mark.full_width
@pytest.mark.slow  # loads the full-width rehearsal (9.5 GiB) from its synthetic official folder, generates 2 tokens
def test_the_full_width_rehearsal_folder_runs_in_the_page(monkeypatch):   # [145 s on 2 cores]
    from tests.official_helpers import rehearsal_folder
    from v41viz.ui import engine_session
    folder = rehearsal_folder()
    choices = {k: c for k, c in engine_session.model_choices(folder.parent).items() if k.endswith(folder.name)}
    monkeypatch.setattr(engine_session, "model_choices", lambda: choices)
    at = None
    try:
        at = generate(inspect_page(model=f"checkpoint:{folder.name}"), prompt="The king", max_new=2)
        assert not at.exception, at.exception
        assert "status: **stopped at max new tokens (2 tokens)**" in text_of(at)
        assert any(m.value.startswith(f"**checkpoint:{folder.name}** · 7 layers") for m in at.markdown)
    finally:   # the page's engine (9.5 GiB) lives in this process's st.cache_resource: the next full-width test
        at = None                                      # runs in this process too, and needs the memory back
        engine_session._cached_slot.clear()
        gc.collect()


def test_generate_then_every_panel_renders_with_data():
    at = generate(inspect_page())
    assert not at.exception, at.exception
    assert "status: **stopped at max new tokens (6 tokens)**" in text_of(at)
    assert {m.label: m.value for m in at.metric}["new tokens"] == "6"
    charts = {}
    for panel in PANELS:
        at.segmented_control(key="inspect_panel").set_value(panel)
        at.run()
        assert not at.exception, (panel, at.exception)
        charts[panel] = len(at.get("plotly_chart"))
        if panel == "DSpark":
            assert any("No DSpark steps" in i.value for i in at.info)       # DSpark was off
    assert charts["Experts"] == 3 and charts["mHC"] == 4 and charts["Engram"] == 1 and charts["Attention"] == 2
    assert charts["Logit lens"] == 4   # layers' predictions, RMS per layer, next-token heatmap, token log-probs
    assert at.query_params["panel"] == "Attention" and at.query_params["model"] == "checkpoint:default"


def test_dspark_run_fills_the_dspark_panel():
    at = generate(inspect_page(panel="DSpark"), dspark=True, schedule="threshold")
    assert not at.exception, at.exception
    assert at.segmented_control(key="inspect_panel").value == "DSpark"
    metrics = {m.label: m.value for m in at.metric}
    assert int(metrics["steps"]) >= 1 and float(metrics["mean accepted length"]) >= 1.0
    assert len(at.get("plotly_chart")) == 3


def test_url_selects_panel_module_and_token():
    at = generate(inspect_page(node="layers.4.engram", token="3"))
    assert not at.exception, at.exception
    assert at.segmented_control(key="inspect_panel").value == "Engram"
    assert at.selectbox(key="inspect_node").value == "layers.4.engram"
    assert at.select_slider(key="inspect_token").value == 3
    assert "compressed token id" in "\n".join(c.value for c in at.caption)


def test_a_node_the_model_lacks_gets_a_warning():
    at = generate(inspect_page(node="layers.30.ffn"))
    assert not at.exception, at.exception
    assert any("layers.30.ffn" in w.value and "no recorded data" in w.value and "Experts panel" in w.value
               for w in at.warning)
    assert at.selectbox(key="inspect_node").value == "(all modules)"


def test_empty_prompt_is_refused_with_a_message():
    at = generate(inspect_page(), prompt="   ")
    assert not at.exception, at.exception
    assert any("prompt is empty" in e.value for e in at.error)


def test_diagram_box_opens_its_panel_and_the_panel_links_back():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["config"] = "tiny-v4.1"
    at.query_params["node"] = "layers.4.hc_ffn"
    at.run()
    at.switch_page("pages/architecture.py")
    at.run()
    assert at.button(key="to_inspect").label.startswith("Inspect `layers.4.hc_ffn` live")
    at.button(key="to_inspect").click()
    at.run()                                  # st.switch_page renders the Inspect page in this run
    assert not at.exception, at.exception
    assert at.title[0].value == "Inspect a generation"
    at.switch_page("pages/inspect.py")        # AppTest's own page would come back on the next run
    generate(at)
    assert at.segmented_control(key="inspect_panel").value == "mHC"
    assert at.selectbox(key="inspect_node").value == "layers.4.hc_ffn"
    assert json.loads(at.get("plotly_chart")[0].proto.spec)["layout"]["title"]["text"].startswith("layers.4 · ffn seam")
    at.button(key="back_mhc").click()
    at.run()
    assert not at.exception, at.exception
    assert at.title[0].value == "tiny-v4.1"   # the architecture page of the inspected model's config
    assert at.selectbox(key="arch_node").value == "layers.4.hc_ffn"


def test_inspect_sidebar_shows_the_model_to_run_not_the_diagram_config():
    at = inspect_page()
    assert not at.exception
    keys = {w.key for w in at.sidebar.selectbox}
    assert "inspect_model" in keys and "config_widget" not in keys


@pytest.mark.slow  # loads the shipped model a second time, with its routed experts in host memory, and generates
def test_the_routed_experts_can_live_in_host_memory():   # [64 s, mostly compiling the C++ CPU kernels]
    """The sidebar's engine setting loads the model with --experts host; on this CPU app the text is the same."""
    at = generate(inspect_page(), prompt="ROMEO:")
    assert at.sidebar.radio(key="inspect_experts").value == "device"
    device_text = at.session_state["inspect_live_run"].text
    at.sidebar.radio(key="inspect_experts").set_value("host")
    at = generate(at.run(), prompt="ROMEO:")
    assert not at.exception, at.exception
    assert any(m.value.startswith("**checkpoint:default**") and "routed experts in host memory" in m.value
               for m in at.markdown)
    assert "status: **stopped at max new tokens (6 tokens)**" in text_of(at)
    assert at.session_state["inspect_live_run"].text == device_text


@pytest.mark.slow  # quantizes the shipped model, then loads and generates from it in the page [10 s]
def test_an_official_fp8_folder_is_picked_and_generates(tmp_path, monkeypatch):
    """The shipped model converted by `engine quantize` (FP8 / MXFP4 shards), offered by the picker and run."""
    from engine.checkpoint.official_writer import write_official
    from v41viz.ui import engine_session
    shelf = tmp_path / "checkpoints"
    write_official(Path(APP).parent / "checkpoints" / "default", shelf / "default-fp8", shards=2)
    choices = engine_session.model_choices(shelf)
    monkeypatch.setattr(engine_session, "model_choices", lambda: choices)
    at = generate(inspect_page(model="checkpoint:default-fp8"), prompt="ROMEO:", max_new=8)
    assert not at.exception, at.exception
    assert at.selectbox(key="inspect_model").value == "checkpoint:default-fp8"
    assert "status: **stopped at max new tokens (8 tokens)**" in text_of(at)
    assert {m.label: m.value for m in at.metric}["new tokens"] == "8"
    assert "default-fp8 (official FP8/FP4 checkpoint)" in at.selectbox(key="inspect_model").options
    assert any(m.value.startswith("**checkpoint:default-fp8** · 8 layers") for m in at.markdown)


def test_a_link_offers_its_generation_and_lands_on_its_view():
    """A link with a prompt, settings and a view: the form holds its settings, one click runs it, and the page
    lands on its panel, layer, seam and token; the URL then describes the run (and keeps the old keys)."""
    at = inspect_page(prompt="The quick brown fox", max_new="6", temperature="0.5", seed="3", panel="mHC",
                      layer="layers.3", seam="ffn", token="4")
    assert not at.exception, at.exception
    assert at.text_area(key="inspect_prompt").value == "The quick brown fox"
    assert at.number_input(key="inspect_temperature").value == 0.5 and at.number_input(key="inspect_seed").value == 3
    assert any("This link shares a generation" in m.value for m in at.markdown)
    at.button(key="inspect_offer_run").click()
    at.run()
    assert not at.exception, at.exception
    assert "status: **stopped at max new tokens (6 tokens)**" in text_of(at)
    assert at.segmented_control(key="inspect_panel").value == "mHC"
    assert at.select_slider(key="mhc_layer").value == "layers.3" and at.radio(key="mhc_site").value == "ffn"
    assert at.select_slider(key="inspect_token").value == 4
    q = at.query_params
    assert (q["model"], q["prompt"], q["temperature"], q["seed"], q["max_new"]) == \
        ("checkpoint:default", "The quick brown fox", "0.5", "3", "6")
    assert (q["panel"], q["layer"], q["seam"], q["token"]) == ("mHC", "layers.3", "ffn", "4")
    assert not any(b.key == "inspect_offer_run" for b in at.button)     # the offer is spent


def test_bad_url_values_become_notes_and_the_page_works():
    at = inspect_page(token="²", panel="Nope", temperature="nan", model="no-such-model")
    assert not at.exception, at.exception
    notes = "\n".join(w.value for w in at.warning)
    for key in ("`token=²` was ignored", "`panel=Nope` was ignored", "`temperature=nan` was ignored",
                "model 'no-such-model'"):
        assert key in notes, (key, notes)
    generate(at)
    assert not at.exception, at.exception
    assert at.segmented_control(key="inspect_panel").value == "Experts"



def test_a_long_prompt_travels_as_a_short_id():
    """A prompt over the URL's inline length is written as `pid`; a new session on the same server resolves it, and
    an id it does not know is a note."""
    prompt = "Now is the winter of our discontent. " * 30           # 1110 characters
    at = generate(inspect_page(), prompt=prompt, max_new=2)
    assert not at.exception, at.exception
    assert "prompt" not in at.query_params and len(at.query_params["pid"]) == 12
    again = inspect_page(pid=at.query_params["pid"])
    assert again.text_area(key="inspect_prompt").value == prompt
    assert any("This link shares a generation" in m.value for m in again.markdown)
    unknown = inspect_page(pid="0123456789ab")
    assert any("`0123456789ab`, which this server does not know" in w.value for w in unknown.warning)


def test_the_decoding_options_are_on_by_default_and_said_so_next_to_them():
    from engine.request.decoding import SUGGESTED_NO_REPEAT_NGRAM, SUGGESTED_REPETITION_PENALTY
    at = inspect_page()
    assert at.number_input(key="inspect_repetition_penalty").value == SUGGESTED_REPETITION_PENALTY != 1
    assert at.number_input(key="inspect_no_repeat_ngram").value == SUGGESTED_NO_REPEAT_NGRAM
    assert any(c.value.startswith(f"On by default here: repetition penalty {SUGGESTED_REPETITION_PENALTY:g}")
               and "leaves both off" in c.value for c in at.caption)
    at = generate(at)
    assert not at.exception, at.exception
    made = [c.value for c in at.caption if c.value.startswith("Made with")]
    assert made and f"repetition penalty {SUGGESTED_REPETITION_PENALTY:g}" in made[0], made
