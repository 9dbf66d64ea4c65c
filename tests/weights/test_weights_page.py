"""The Architecture page's Learned weights section, run headless (AppTest): a folder with a shard missing, the
selected box's view, the bytes read, the expert norms only after the button, a comparison, a broken path."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from tests.weights.folders import copy_of, without_shard
from tests.weights.test_damaged import poke_float
from v41viz.ui import weights_view

# starts the app and renders the architecture page eight times [6 s]
pytestmark = pytest.mark.slow

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params.update(query)
    at.run()
    at.switch_page("pages/architecture.py")
    return at.run()


def text(at) -> str:
    """Everything the page wrote, as shown (untrusted text is backslash-escaped in the markdown source)."""
    return re.sub(r"\\(.)", r"\1", "\n".join(m.value for m in [*at.markdown, *at.caption, *at.info, *at.warning,
                                                                 *at.error]))


def test_a_partial_folder_shows_the_selected_box_and_compares(official, tmp_path):
    folder, gone = without_shard(official, tmp_path / "partial")
    changed = copy_of(official, tmp_path / "changed")
    poke_float(changed, "layers.3.ffn.gate.bias", 0.5)
    at = page(config="default-small-3k", node="layers.3.ffn.gate")
    assert "Give a checkpoint folder" in text(at)
    at.text_input(key="weights_folder").input(str(folder)).run()
    assert not at.exception, at.exception
    shown = text(at)
    assert "3 of 4 shard(s) here" in shown and gone in shown
    assert "layers.3.ffn.gate: its tensors are not in this folder" in shown.replace("`", "")   # the selected box
    assert at.segmented_control(key="weights_view").value == "router"
    assert len(at.get("plotly_chart")) >= 1
    assert "Read so far from" in shown and " of " in shown
    reader = weights_view._reader(str(folder), weights_view._fingerprint(str(folder)))   # the page's (this process)
    assert reader.read_names and not [n for n in reader.read_names if ".ffn.experts." in n]
    at.text_input(key="weights_other").input(str(changed)).run()
    assert "Comparison" in text(at) and not at.exception
    at.segmented_control(key="weights_view").set_value("experts").run()
    assert "Compute expert norms" in [b.label for b in at.button]   # opt-in: still nothing of the experts read
    assert not [n for n in reader.read_names if ".ffn.experts." in n]
    at.button(key="weights_experts_go_a").click().run()
    assert not at.exception and [n for n in reader.read_names if ".ffn.experts." in n]
    (folder / "model-00004-of-00004.safetensors").unlink()   # the folder changed: the page reads it afresh
    at.run()
    assert "2 of 4 shard(s) here" in text(at) and not at.exception
    assert "norm_w1" in "".join(str(c.proto) for c in at.get("plotly_chart"))


def test_a_wrong_path_is_said_and_the_page_keeps_running(tmp_path):
    at = page(config="default-small-3k")
    at.text_input(key="weights_folder").input(str(tmp_path / "nowhere")).run()
    assert not at.exception and "Cannot open" in text(at)
    assert any("Accounting" in s.value for s in at.subheader)
