"""AppTest of the app shell and the architecture page: load, URL restore, selection, expansion, every preset."""
import json
import re

import numpy as np
import pandas as pd
import pytest
from streamlit.testing.v1 import AppTest

from engine.spec.config import ConfigError
from engine.spec.presets import list_presets
from tests.app_helpers import APP, open_page
from v41viz.ui.sidebar import parse_upload

TIMEOUT = 120



def app(**query) -> AppTest:
    return open_page("pages/architecture.py", timeout=TIMEOUT, **query)


def query(at, key: str) -> str:
    v = at.query_params[key]
    return v[-1] if isinstance(v, list) else v


def shown(markdown: str) -> str:
    """The text a markdown source shows, for sources whose untrusted parts are backslash-escaped."""
    return re.sub(r"\\(.)", r"\1", markdown)


def table(at, first_column: str) -> pd.DataFrame:
    """The last markdown table on the page whose first column is `first_column`, as shown (cells unescaped)."""
    for m in reversed(at.markdown):
        lines = m.value.splitlines()
        cells = [[shown(c.strip()) for c in re.split(r"(?<!\\)\|", line)[1:-1]] for line in lines]
        if len(cells) > 2 and cells[0] and cells[0][0] == first_column:
            return pd.DataFrame(cells[2:], columns=cells[0])
    raise AssertionError(f"no table starting with {first_column!r}")


def details_text(at) -> str:
    return "\n".join(m.value for m in at.markdown)


def test_default_view_shows_v41_with_details_and_accounting():
    at = app()
    assert not at.exception, at.exception
    assert at.title[0].value == "deepseek-v4.1-flash"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["parameters (total)"] == "762.72B" and metrics["layers + draft stages"] == "40 + 3"
    assert at.selectbox(key="arch_node").value == "layers.2.attn"     # the first KV source's attention
    text = details_text(at)
    assert "#### Attention" in text and "rank-1280 bottleneck" in text
    assert query(at, "config") == "deepseek-v4.1-flash" and query(at, "node") == "layers.2.attn"
    assert [t.label for t in at.tabs] == ["Parameters", "Bytes", "KV cache per token", "Layer roles", "Experts touched"]
    assert any("Engine source: engine.model.attention.Attention" in e.label for e in at.expander)


def test_url_restores_config_node_and_expansion():
    at = app(config="tiny-v4.1", node="layers.4.engram", expand="layers.9")  # layers.9 is not a folded group
    assert not at.exception
    assert at.sidebar.selectbox(key="config_widget").value == "tiny-v4.1"
    assert at.selectbox(key="arch_node").value == "layers.4.engram"
    assert "#### Engram" in details_text(at)
    assert any("unknown group(s): layers.9" in w.value for w in at.warning)
    at = app(config="deepseek-v4.1-flash", node="layers.20.attn.indexer", expand="layers.3-7,layers.21-23")
    assert at.multiselect(key="arch_expand").value == ["layers.21-23", "layers.3-7"]
    assert "#### Lightning indexer" in details_text(at)


def test_selection_and_expansion_write_the_url():
    at = app()
    at.selectbox(key="arch_node").set_value("mtp.2.markov_head").run()
    assert query(at, "node") == "mtp.2.markov_head"
    assert "#### Markov head" in details_text(at)
    at.multiselect(key="arch_expand").set_value(["layers.9-13"]).run()
    assert query(at, "expand") == "layers.9-13"


def test_a_diagram_click_selects_the_clicked_node():
    at = app()
    at.session_state["arch_pick"] = "head"      # what the diagram component's click callback stores
    at.run()
    assert not at.exception
    assert at.selectbox(key="arch_node").value == "head"
    assert query(at, "node") == "head"


@pytest.mark.parametrize("name", sorted(list_presets()))
def test_every_preset_renders(name):
    at = app(config=name)
    assert not at.exception, at.exception
    assert at.title[0].value == name
    assert not at.error


def test_the_full_width_rehearsal_opens_with_its_release_widths():
    """configs/v4.1-flash-rehearsal.json: the release's widths at 7 layers + 3 draft stages, 8 experts."""
    at = app(config="v4.1-flash-rehearsal")
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["layers + draft stages"] == "7 + 3"
    assert at.selectbox(key="arch_node").value == "layers.2.attn"     # its first KV source's attention
    assert not at.error


def test_unknown_config_in_url_falls_back_with_a_notice():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["config"] = "no-such-model"
    at.run()                       # the home page: the shared sidebar reads the link on any page
    assert not at.exception
    assert at.sidebar.selectbox(key="config_widget").value == "deepseek-v4.1-flash"
    assert any("Unknown config 'no-such-model'" in shown(w.value) for w in at.warning)
    at.switch_page("pages/architecture.py").run()
    assert at.title[0].value == "deepseek-v4.1-flash"


def test_the_view_survives_a_visit_to_another_page():
    at = app(config="tiny-v4.1", node="layers.6.attn.indexer")
    at.switch_page("pages/compare.py").run()
    at.switch_page("pages/architecture.py").run()
    assert not at.exception
    assert at.sidebar.selectbox(key="config_widget").value == "tiny-v4.1"
    assert at.selectbox(key="arch_node").value == "layers.6.attn.indexer"


def test_upload_parsing_names_the_problem():
    with pytest.raises(ConfigError, match=r"bad\.json: invalid JSON at line 1"):
        parse_upload("bad.json", b'{"dim": 64,')
    with pytest.raises(ConfigError, match="missing required key"):
        parse_upload("partial.json", b'{"dim": 64}')
    with open(list_presets()["tiny-v4.1"], "rb") as f:
        assert parse_upload("mine.json", f.read()).n_layers == 10


def test_memory_plan_panel_follows_the_hardware_inputs():
    at = app()
    assert not at.exception, at.exception
    assert at.subheader[-1].value == "Memory plan"
    summary = at.success[0].value
    assert (summary.startswith("deepseek-v4.1-flash at 128k context × batch 1 on 8 × 141 GiB needs")
            and summary.endswith(": fits"))
    placement = table(at, "part").set_index("part")
    assert placement.loc["total weights", "checkpoint bytes"] == "509,315,486,040"   # = the accounting layer's
    assert placement.loc["Engram tables", "where"] == "host (shard files)"
    at.number_input(key="plan_gpus").set_value(1).run()
    at.number_input(key="plan_gpu_mem").set_value(80.0).run()
    assert not at.exception
    plan_warning = [w.value for w in at.warning if "on 1 × 80 GiB needs" in w.value]
    assert plan_warning and plan_warning[0].endswith(": does not fit")
    devices = table(at, "device")
    assert devices["device"].tolist() == ["GPU 0", "host"] and devices["verdict"][0].startswith("does not fit: needs")


def test_memory_plan_offers_the_expert_placement_and_what_fits():
    at = app()
    fits = table(at, "GPUs")       # 8 × 141 GiB + 512 GiB host by default: the same rows as `engine plan --fit`
    assert fits[["GPUs", "routed experts"]].values.tolist() == [["1", "on the GPUs"], ["1", "host RAM"],
                                                                ["2", "on the GPUs"], ["4", "on the GPUs"],
                                                                ["8", "on the GPUs"]]
    assert fits["verdict"][0].startswith("does not fit even at context 4k: needs 292.4 GiB per GPU")
    assert fits["verdict"][3] == "fits at context 1M (the longest tried)"
    assert any("Not tried: 3, 5, 6, 7 GPUs" in c.value for c in at.caption)
    at.radio(key="plan_experts").set_value("in host RAM (one GPU)").run()
    at.number_input(key="plan_gpu_mem").set_value(80.0).run()
    assert not at.exception, at.exception
    assert at.number_input(key="plan_gpus").disabled
    summary = [s.value for s in at.success if "routed experts in host RAM" in s.value]
    assert summary and summary[0].startswith("deepseek-v4.1-flash at 128k context × batch 1 on 1 × 80 GiB, routed "
                                             "experts in host RAM, needs") and summary[0].endswith(": fits")
    placement = table(at, "part").set_index("part")
    assert placement.loc["routed experts", "where"] == "host RAM" and placement.loc["routed experts",
                                                                                    "per GPU (max)"] == "–"
    assert placement.loc["DSpark / MTP drafter", "where"] == "GPUs + host RAM"
    assert placement.loc["total weights", "checkpoint bytes"] == "509,315,486,040"
    fits = table(at, "GPUs")
    assert fits["verdict"][1] == "fits at context 1M (the longest tried)"
    assert fits["verdict"][3] == "fits at context 256k (the longest that fits)"     # 4 × 80 GiB


def test_search_selects_the_first_match_and_steps_through_the_others():
    at = app()
    centred = at.session_state["arch_centre"] if "arch_centre" in at.session_state else 0
    at.text_input(key="arch_search").set_value("layers.12.attn").run()
    assert not at.exception, at.exception
    assert at.selectbox(key="arch_node").value == "layers.12.attn" and query(at, "node") == "layers.12.attn"
    assert at.session_state["arch_centre"] > centred                  # the drawing is asked to centre it
    assert "#### Attention" in details_text(at)
    at.text_input(key="arch_search").set_value("indexer").run()
    assert at.selectbox(key="arch_node").value == "layers.2.attn.indexer"
    assert any(c.value == "1 of 8" for c in at.caption)
    at.button(key="arch_next").click().run()
    assert at.selectbox(key="arch_node").value == "layers.8.attn.indexer"
    assert any(c.value == "2 of 8" for c in at.caption)
    at.button(key="arch_prev").click().run()
    at.button(key="arch_prev").click().run()
    assert at.selectbox(key="arch_node").value == "layers.36.attn.indexer"    # wraps around
    at.text_input(key="arch_search").set_value("no such thing").run()
    assert any(c.value == "no match" for c in at.caption)
    assert at.selectbox(key="arch_node").value == "layers.36.attn.indexer"    # the selection stays


def test_a_click_on_attention_opens_its_steps_and_a_step_has_its_own_details():
    at = app(config="tiny-v4.1")
    at.session_state["arch_pick"] = "layers.2.attn"   # a click on the attention box of the opened layer
    at.run()
    assert not at.exception, at.exception
    assert query(at, "open") == "attn" and query(at, "node") == "layers.2.attn"
    at.selectbox(key="arch_node").set_value("layers.2.attn.rope").run()
    text = details_text(at)
    assert "#### Rotary position embedding with YaRN" in text
    assert "| out | q rotated | `[B, S, 4, 32]` |" in text                # the step's shapes, from the config
    assert any("Engine source: engine.model.rope.apply_rope" in e.label for e in at.expander)
    at.selectbox(key="arch_node").set_value("layers.2.attn.q_lora").run()
    tensors = table(at, "tensor")
    assert set(tensors["tensor"]) == {"wq_a.weight", "q_norm.weight", "wq_b.weight"}
    at.session_state["arch_toggle"] = "attn"           # the close control: the selection moves to the box
    at.run()
    assert "open" not in at.query_params and at.selectbox(key="arch_node").value == "layers.2.attn"


def test_a_reuse_step_says_which_layer_it_reads_and_a_link_opens_it():
    at = app(node="layers.3.attn.index_reuse", open="ffn")
    assert not at.exception, at.exception
    assert query(at, "open") == "attn,ffn"             # a linked step opens its box
    text = details_text(at)
    assert "#### Index list reused from layer 2" in text and "`layers.2.attn.indexer`" in text
    at = app(node="layers.3.attn", open="attn,bogus")
    assert any("unknown box(es): bogus" in w.value for w in at.warning)
    assert query(at, "open") == "attn"


def test_details_beside_the_diagram_on_request():
    def beside(at) -> bool:   # the page splits into the diagram's and the details' columns
        weights = [round(c.weight, 2) for c in at.columns]
        return any(weights[i:i + 2] == [0.68, 0.32] for i in range(len(weights)))

    at = app()
    assert not beside(at)            # by default the diagram takes the page's width, the details follow below
    at.toggle(key="arch_beside").set_value(True).run()
    assert not at.exception, at.exception
    assert beside(at) and "#### Attention" in details_text(at)
    at.switch_page("pages/compare.py").run()
    at.switch_page("pages/architecture.py").run()
    assert beside(at)                # the choice survives a visit to another page


def drawing(at, key: str) -> str:
    """The HTML the diagram component under `key` was given (legend + SVG)."""
    for el in at.get("bidi_component"):
        if el.proto.id.endswith(key):
            return json.loads(el.proto.json)["html"]
    raise AssertionError(f"no diagram component {key!r}")


def painted(html: str) -> dict[str, str]:
    """Painted box id → the value written on it."""
    out = {}
    for m in re.finditer(r'<g class="v41-box v41-painted[^"]*" data-node="([^"]+)".*?</g>', html, re.S):
        out[m[1]] = re.findall(r'<text class="v41-value"[^>]*>([^<]*)</text>', m[0])[0]
    return out


def test_live_data_says_how_to_get_a_run_before_there_is_one():
    at = app(config="tiny-v4.1")
    assert not at.exception, at.exception
    assert any("no run yet" in m.value and "Inspect" in m.value for m in at.markdown)
    assert "arch_overlay" not in [t.key for t in at.toggle] and not painted(drawing(at, "diagram:tiny-v4.1"))


def test_live_data_paints_a_run_repaints_a_token_and_links_to_inspect_and_back():
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params["model"] = "tiny-v4.1"
    at.run()
    at.switch_page("pages/inspect.py").run()
    at.text_area(key="inspect_prompt").input("The quick brown fox")
    at.number_input(key="inspect_max_new").set_value(6)
    at.toggle(key="inspect_dspark").set_value(True)
    at.button(key="inspect_generate").click().run()
    assert not at.exception, at.exception
    trace = at.session_state["inspect_live_run"].trace
    at.switch_page("pages/architecture.py").run()   # Live data turns on by itself after a new run
    assert not at.exception, at.exception
    assert at.toggle(key="arch_overlay").value is True
    assert at.title[0].value == "tiny-v4.1"             # the run's config is drawn, and the page says so
    assert any("now shows tiny\\-v4\\.1" in i.value for i in at.info)
    values = painted(drawing(at, "diagram:tiny-v4.1"))
    load = trace.expert_load("layers.3.ffn", 8)
    assert values["layers.3"] == f"{load.max() / load.mean() - 1:.2f}"           # max/mean − 1 of the layer's load
    assert set(values) >= {f"layers.{i}" for i in range(10)} | {"mtp.0", "mtp.1", "mtp.2"}
    legend = drawing(at, "diagram:tiny-v4.1").split('<svg class="v41-diagram"', 1)[0]
    assert "expert load (max/mean − 1) · all tokens" in legend
    assert query(at, "overlay") == "load" and at.multiselect(key="arch_expand").disabled
    at.selectbox(key="arch_overlay_metric").set_value("gate").run()
    gates = painted(drawing(at, "diagram:tiny-v4.1"))
    assert set(gates) == {"layers.1.engram", "layers.4.engram"}
    at.selectbox(key="arch_overlay_token").set_value(7).run()
    one = painted(drawing(at, "diagram:tiny-v4.1"))
    gate_7 = float(np.mean(trace.fact("engram", "layers.1.engram", 0, 7)["gates"]))
    assert one["layers.1.engram"] == f"{gate_7:.2f}" and query(at, "otoken") == "7"
    assert "Engram gate · position 7 · " in drawing(at, "diagram:tiny-v4.1")
    at.selectbox(key="arch_node").set_value("layers.1.engram").run()
    assert any("Live data" in m.value and f"**{gate_7:.2f}**" in shown(m.value) for m in at.markdown)
    at.button(key="overlay_to_inspect").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Inspect a generation"
    at.switch_page("pages/inspect.py").run()
    assert at.segmented_control(key="inspect_panel").value == "Engram"
    assert at.selectbox(key="inspect_node").value == "layers.1.engram"
    assert at.select_slider(key="inspect_token").value == 7 and at.selectbox(key="inspect_model").value == "tiny-v4.1"
    at.button(key="back_engram").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "tiny-v4.1" and at.toggle(key="arch_overlay").value is True   # the overlay stays on
    assert at.selectbox(key="arch_node").value == "layers.1.engram"
    assert painted(drawing(at, "diagram:tiny-v4.1")) == one
