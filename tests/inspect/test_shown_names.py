"""Names the app shows or saves (issue 45): a saved trace named by model, prompt and time; a checkpoint named
without the server's path; a failed load that names its file once."""
from __future__ import annotations

import re

from v41viz.inspect.export import FORMATS, download_name
from v41viz.ui.engine_session import ROOT, shown_source
from v41viz.ui.plain_text import load_failure


def test_a_saved_trace_is_named_by_model_prompt_and_time_in_safe_characters():
    names = {fmt: download_name("checkpoint:default", "Hello 世界 / ..\\ <x>", 1_700_000_000, fmt) for fmt in FORMATS}
    assert names["json"] == "checkpoint-default_Hello-x_20231114-221320.json"
    assert names["parquet"].endswith(".parquet.zip") and names["safetensors"].endswith(".safetensors")
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names.values())
    assert download_name("tiny-v4.1", "世界", 0, "json") == "tiny-v4.1_prompt_19700101-000000.json"
    assert len(download_name("m", "x" * 500, 0, "json")) < 80


def test_a_checkpoint_is_shown_without_the_servers_path():
    assert shown_source(f"checkpoint {ROOT}/checkpoints/default") == "checkpoint checkpoints/default"
    assert shown_source("checkpoint /srv/models/v41, split over 2 ranks") == "checkpoint v41, split over 2 ranks"
    assert shown_source("random init (seed 0)") == "random init (seed 0)"


def test_a_failed_load_names_the_file_once():
    error = ValueError("bad_trace.json: not a readable v41viz trace (JSONDecodeError)")
    assert load_failure("bad_trace.json", error) == \
        "Could not load bad_trace.json: not a readable v41viz trace (JSONDecodeError)"
    assert load_failure("x.json", ValueError("unknown format")) == "Could not load x.json: unknown format"


def test_special_tokens_read_as_short_names_in_any_font():
    from v41viz.inspect.tokens import token_label, visible
    assert visible("<｜begin▁of▁sentence｜>") == "‹bos›" and visible("<｜end▁of▁sentence｜>") == "‹eos›"
    assert visible("<｜User｜>hi") == "‹User›hi" and token_label("<｜begin▁of▁sentence｜>", 0, 6) == "0:‹bos›"


def test_the_selected_token_is_outlined_on_a_heatmap():
    import plotly.graph_objects as go

    from v41viz.inspect.panel_style import mark_token
    fig = mark_token(go.Figure(go.Heatmap(z=[[1, 2, 3]], x=["4:a", "5:b", "7:c"])), [4, 5, 7], 7)
    (shape,) = fig.layout.shapes
    assert (shape.x0, shape.x1, shape.yref) == (1.5, 2.5, "paper")
    assert not mark_token(go.Figure(), [4, 5], 9).layout.shapes   # a token the chart lacks: nothing drawn


def test_a_special_token_in_shaded_text_is_a_chip():
    from v41viz.inspect.tokens import coloured_text_html
    page = coloured_text_html(["<｜begin▁of▁sentence｜>", "a<b"], [0.5, float("nan")], "gate")
    assert '<span class="v41-special">‹bos›</span>' in page and "a&lt;b" in page and "｜" not in page


def test_routing_agreement_has_one_calm_scale_on_the_diagram_and_the_heatmap():
    from v41viz.inspect.overlay_scale import AGREEMENT, Scale
    scale = Scale.agreement()
    assert scale.colour(0.0) == AGREEMENT[0] and scale.colour(1.0) == AGREEMENT[-1] and scale.centre is None
    assert [c for _, c in scale.plotly_scale()] == list(AGREEMENT)
    assert all(int(c[1:3], 16) <= max(int(c[3:5], 16), int(c[5:7], 16)) for c in AGREEMENT)   # no red end


def test_the_expert_colour_bar_thins_its_labels_on_a_short_chart():
    from v41viz.inspect.experts_panel import TICK_PX, _height, _id_colorbar
    for n, layers in ((16, 1), (16, 8), (256, 40)):
        ticks = _id_colorbar(n, layers)["tickvals"]
        assert ticks[0] == 0 and len(ticks) * TICK_PX <= _height(layers) - 150, (n, layers, ticks)
