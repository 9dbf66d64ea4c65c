"""The diagram's SVG (every box clickable by its node id, text escaped and fitted) and the engine source read from
files without importing the engine (the same code `inspect` finds on the imported modules)."""
from __future__ import annotations

import importlib
import inspect
import re
import xml.etree.ElementTree as ET

import pytest

from engine.spec.config import load_config
from engine.spec.presets import list_presets
from v41viz.arch.box_text import PX_X, PX_Y, fit_box_text, lines_height, text_px
from v41viz.arch.diagram import diagram_html
from v41viz.arch.layout import Box, Layout, build_layout
from v41viz.arch.model_view import build_view
from v41viz.arch.source import ENGINE_CODE, engine_source


def parse(html: str) -> ET.Element:
    """The legend and the SVG as one XML tree: it parses only if every text and attribute is escaped."""
    return ET.fromstring(f"<root>{html}</root>")


@pytest.mark.parametrize("name", ["tiny-v4.1", "deepseek-v4-flash-dspark"])
def test_every_box_is_one_clickable_group_and_the_selection_is_marked(name):
    view = build_view(load_config(list_presets()[name]))
    lay = build_layout(view.args, view.graph, view.groups, set(), view.default_focus(), view.size_text)
    selected = next(b.node for b in lay.boxes.values() if b.key.startswith("detail:"))
    root = parse(diagram_html(lay, selected, {n: f"summary of {n}" for n in view.graph}))
    groups = root.findall(".//{http://www.w3.org/2000/svg}g")
    assert len(groups) == len(lay.boxes)
    assert {g.get("data-node") for g in groups} == {b.node for b in lay.boxes.values()} <= set(view.graph)
    marked = [g.get("data-node") for g in groups if "v41-selected" in g.get("class").split()]
    assert marked and set(marked) == {selected}
    assert all(g.get("data-tip").startswith(g.get("data-node") + "\nsummary of ") for g in groups)


def test_hostile_text_is_escaped():
    evil = "<script>alert('x')</script> & \"quotes\""
    lay = Layout(boxes={"stack:a": Box("stack:a", evil, 0, 0, 3.8, 0.74, "norm", evil, evil, badge="×2<b>",
                                       stacked=True)}, detail_title=evil)
    html = diagram_html(lay, "", {evil: evil})
    assert "<script>" not in html and "<b>" not in html
    root = parse(html)
    assert root.find(".//{http://www.w3.org/2000/svg}g").get("data-node") == evil
    texts = "".join(t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text"))
    assert "<script>" in texts      # shown as the characters, not run


def test_box_text_is_wrapped_and_shrunk_to_fit_its_box():
    lines = fit_box_text("layers 37–39", "ratio-1 · KV←20 · idx←36 · DSpark tap · and a much longer tail", 3.8, 0.74,
                         11, 9.5, True)
    width = 3.8 * PX_X
    assert len(lines) >= 2 and all(text_px(line.text, line.size, line.bold) <= width for line in lines)
    assert lines_height(lines) <= 0.74 * PX_Y
    assert lines[0].bold and lines[-1].muted and lines[-1].size < 9.5     # the subtitle gave way first


@pytest.mark.parametrize("module_type", sorted(ENGINE_CODE))
def test_engine_source_read_from_files_equals_what_inspect_finds(module_type):
    src = engine_source(module_type)
    expected = []
    for qualname in ENGINE_CODE[module_type]:
        module_name, name = qualname.rsplit(".", 1)
        obj = getattr(importlib.import_module(module_name), name, None)
        if obj is not None:
            lines, first = inspect.getsourcelines(obj)
            expected.append((qualname, first, "".join(lines)))
    assert [(p.qualname, p.first_line, p.code) for p in src.pieces] == expected
    assert ("not implemented in the engine yet" in src.message) == (len(expected) < len(ENGINE_CODE[module_type]))


def test_the_memory_plan_chart_stacks_each_gpu_and_groups_equal_ones():
    from engine.plan.memory_plan import Hardware, memory_plan
    from v41viz.arch.plan_panels import SEGMENTS, device_bars, device_bars_html
    plan = memory_plan(load_config(list_presets()["deepseek-v4.1-flash"]), Hardware(gpus=8, gpu_mem_gib=141))
    assert [label for label, _ in device_bars(plan)] == ["GPU 0–7"]       # eight equal GPUs share one bar
    html = device_bars_html(plan)
    assert html.count('class="v41-plan-bar"') == 1 and "141 GiB per GPU" in html   # one bar; the capacity line
    segments = re.findall(r'title="GPU 0–7 · ([^:]+): ([\d,.]+) GiB"', html)
    assert {name for name, _ in segments} == {s[0] for s in SEGMENTS}
    gib = sum(float(x.replace(",", "")) for _, x in segments)
    assert abs(gib - plan.gpus[0].need / 2**30) < 0.05, (gib, plan.gpus[0])   # the bar adds up to the need
    assert "<svg" not in html   # st.html strips SVG (the chart once showed as an empty element)


def test_every_boxs_text_stays_inside_its_box_even_when_cut():
    """Issue 45: a three-line subtitle ran past its box into the arrow label below; what fits no font step keeps
    the subtitle lines that fit and ends the last with '…'."""
    long = "ratio-1 · KV source · candidate source · Engram · DSpark tap · " * 3
    lines = fit_box_text("layer 20", long, 3.4, 0.8, 11, 9.5, True)
    assert lines_height(lines) <= 0.8 * PX_Y and lines[-1].text.endswith("…") and lines[0].text == "layer 20"
    assert all(text_px(line.text, line.size, line.bold) <= 3.4 * PX_X - 6 for line in lines)
    view = build_view(load_config(list_presets()["tiny-v4.1"]))
    lay = build_layout(view.args, view.graph, view.groups, set(), view.default_focus(), view.size_text)
    for b in lay.boxes.values():
        if not b.container:
            fitted = fit_box_text(b.title, b.subtitle, b.w, b.h, 11, 9.5, True)
            assert lines_height(fitted) <= b.h * PX_Y - 6, (b.node, fitted)
