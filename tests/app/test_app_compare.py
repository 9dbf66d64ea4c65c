"""AppTest of the compare page: two configs side by side with the differences counted and highlighted."""
import json
import re
from pathlib import Path

from streamlit.testing.v1 import AppTest

from v41viz.inspect.run_diff import diff_traces

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_compare_v4_and_v41():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Compare"
    assert [t.label for t in at.tabs] == ["Configs", "Runs"]
    assert at.selectbox(key="compare_a").value == "deepseek-v4-flash"
    assert at.selectbox(key="compare_b").value == "deepseek-v4.1-flash"
    summary = next(m.value for m in at.markdown if "sizes and mechanisms differ" in m.value)
    assert summary.startswith("**") and not summary.startswith("**0 of")
    assert any("44 of 44 positions differ" in m.value for m in at.markdown)


def test_compare_a_config_with_itself_finds_no_difference():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("pages/compare.py").run()
    at.selectbox(key="compare_a").set_value("tiny-v4.1").run()
    at.selectbox(key="compare_b").set_value("tiny-v4.1").run()
    assert any(m.value.startswith("**0 of") for m in at.markdown)
    assert any("0 of 13 positions differ" in m.value for m in at.markdown)


def test_compare_pair_comes_from_and_goes_to_the_url():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.query_params["a"], at.query_params["b"] = "tiny-v4", "tiny-v4.1"
    at.switch_page("pages/compare.py").run()
    assert (at.selectbox(key="compare_a").value, at.selectbox(key="compare_b").value) == ("tiny-v4", "tiny-v4.1")
    at.selectbox(key="compare_b").set_value("deepseek-v4-flash-dspark").run()
    b = at.query_params["b"]
    assert (b[-1] if isinstance(b, list) else b) == "deepseek-v4-flash-dspark"


def test_runs_tab_runs_tiny_v4_against_tiny_v41_and_hands_a_run_to_inspect():
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["view"] = "Runs"
    at.run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert (at.selectbox(key="compare_runs_a").value, at.selectbox(key="compare_runs_b").value) == \
        ("tiny-v4", "tiny-v4.1")
    assert any("have random weights" in c.value for c in at.caption)
    at.number_input(key="compare_runs_max_new").set_value(4)
    at.button(key="compare_runs_go").click().run()
    assert not at.exception, at.exception
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["new tokens that agree"].endswith(" of 4") and metrics["first divergence"].startswith("position ")
    assert float(metrics["routing agreement"]) > 0
    table = next(m.value for m in at.markdown if m.value.startswith("| layer |"))
    assert table.count("hash\\-routed \\(token id\\)") == 2 and table.count("not in this run") == 3
    assert sum("stopped at max new tokens (4 tokens)" in c.value for c in at.caption) == 2
    # the diff painted on A's (tiny-v4's) diagram: routing agreement per layer, then one aligned token
    pair = at.session_state["compare_runs_pair"]
    diff = diff_traces(pair.a.trace, pair.b.trace)
    agreement = painted(drawing(at))
    for layer in range(7):
        r = diff.routing[(diff.routing["layer"] == f"layers.{layer}.ffn") & diff.routing["same input"]]
        assert agreement[f"layers.{layer}"] == f"{r['jaccard'].mean():.2f}"
    assert "routing agreement (Jaccard of the chosen experts) · all tokens" in drawing(at)
    at.selectbox(key="compare_paint_token").set_value(2).run()         # prompt token 2: both read the same text
    token = painted(drawing(at))
    for layer in range(7):
        x = set(pair.a.trace.fact("moe", f"layers.{layer}.ffn", 0, 2)["ids"].tolist())
        y = set(pair.b.trace.fact("moe", f"layers.{layer}.ffn", 0, 2)["ids"].tolist())
        assert token[f"layers.{layer}"] == f"{len(x & y) / len(x | y):.2f}"
    assert token != agreement and "prompt token 2 · " in drawing(at)
    at.selectbox(key="compare_paint_metric").set_value("gain").run()
    gains = painted(drawing(at))
    assert {"layers.0.hc_attn", "layers.0.hc_ffn", "layers.0"} <= set(gains) and not at.exception
    at.button(key="compare_open_b").click().run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Inspect a generation"
    assert any("run B of the Compare page" in m.value for m in at.markdown)


def drawing(at, key: str = "compare_diagram") -> str:
    """The HTML the diagram component under `key` was given (legend + SVG)."""
    return next(json.loads(el.proto.json)["html"] for el in at.get("bidi_component") if el.proto.id.endswith(key))


def painted(html: str) -> dict[str, str]:
    """Painted box id → the value written on it."""
    return {m[1]: re.findall(r'<text class="v41-value"[^>]*>([^<]*)</text>', m[0])[0] for m in
            re.finditer(r'<g class="v41-box v41-painted[^"]*" data-node="([^"]+)".*?</g>', html, re.S)}
