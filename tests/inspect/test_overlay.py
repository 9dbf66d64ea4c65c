"""Live overlays on the diagram (issue 20, items 2 and 5): every metric's values against ones computed by hand from the
records of real runs (tiny-v4.1 with DSpark and attention, tiny-v4 with hash-routed layers and no attention), one
token against all tokens, the run diff painted on run A's diagram, colour scales, and the painted drawing."""
from __future__ import annotations

import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pytest

from engine.spec.config import load_config
from engine.spec.presets import list_presets
from tests.run_helpers import traced_run
from v41viz.arch.diagram import diagram_html
from v41viz.arch.layout import build_layout
from v41viz.arch.model_view import build_view
from v41viz.arch.paint import paint_svg
from v41viz.inspect.overlay import METRICS, RunShape, overlay, token_label
from v41viz.inspect.overlay_diff import DIFF_METRICS, aligned_positions, diff_overlay
from v41viz.inspect.overlay_scale import DIVERGING, NOT_RECORDED, SEQUENTIAL, Scale
from v41viz.inspect.run_diff import diff_traces
from v41viz.ui import engine_session

SVG = "{http://www.w3.org/2000/svg}"
PROMPT, NEW = "The quick brown fox", 8


@pytest.fixture(scope="module")
def slots():
    choices = engine_session.model_choices()
    return {key: engine_session.load_slot(choices[key]) for key in ("tiny-v4", "tiny-v4.1")}


def _run(slot, prompt: str = PROMPT, **kw):
    return traced_run(slot, prompt, NEW, **kw)


@pytest.fixture(scope="module")
def v41(slots):
    """tiny-v4.1 with DSpark and attention facts."""
    return _run(slots["tiny-v4.1"], dspark=True, attention=True)


@pytest.fixture(scope="module")
def v4(slots):
    """tiny-v4 (its first two MoE layers route by token id), DSpark, no attention facts."""
    return _run(slots["tiny-v4"], dspark=True, attention=False)


def _records(trace, kind, path):
    """pos → fields of a module's records, read straight from the trace."""
    return {pos: v for p, _, r, pos, v in trace.facts(kind) if p == path and r == 0}


def _positions(trace):
    return sorted({pos for p, _, r, pos, _ in trace.facts("moe") if r == 0})


def test_expert_load_and_routing_entropy_per_moe_layer(v41, slots):
    args = slots["tiny-v4.1"].args
    o = overlay(v41, "load", None, args)
    for path in v41.paths("moe"):
        n = args.draft_n_routed_experts if path.startswith("mtp.") else args.n_routed_experts
        counts = np.zeros(n)
        for ids, *_ in _records(v41, "moe", path).values():
            for e in ids:
                counts[e] += 1
        want = counts.max() / counts.mean() - 1
        assert o.cells[path].value == pytest.approx(want) and o.cells[path].text == f"{want:.2f}"
        assert o.cells[".".join(path.split(".")[:2])] == o.cells[path]      # the layer's (stage's) box too
        p = counts[counts > 0] / counts.sum()
        assert overlay(v41, "entropy", None, args).cells[path].value == pytest.approx(-(p * np.log2(p)).sum())
    assert set(o.cells) == set(v41.paths("moe")) | {".".join(p.split(".")[:2]) for p in v41.paths("moe")}
    assert o.title == "expert load (max/mean − 1) · all tokens" and 0 < o.scale.hi
    # one token: the experts it chose, coloured by how busy they were over the run
    pos = _positions(v41)[6]
    one = overlay(v41, "load", pos, args)
    ids, weights = _records(v41, "moe", "layers.3.ffn")[pos][:2]
    counts = np.bincount(np.concatenate([v[0] for v in _records(v41, "moe", "layers.3.ffn").values()]),
                         minlength=args.n_routed_experts)
    cell = one.cells["layers.3.ffn"]
    assert cell.text == " ".join(f"e{e}" for e in ids)
    assert cell.value == pytest.approx((counts[ids] / counts.mean()).mean() - 1)
    assert one.scale.centre == 0 and one.title.endswith(token_label(v41, pos))
    w = weights / weights.sum()
    assert overlay(v41, "entropy", pos, args).cells["layers.3.ffn"].value == pytest.approx(-(w * np.log2(w)).sum())
    assert one.cells != o.cells                                             # the token repaints


def test_engram_gates_mhc_gains_and_attention(v41, slots):
    args = slots["tiny-v4.1"].args
    gates = overlay(v41, "gate", None, args)
    assert set(gates.cells) == {"layers.1.engram", "layers.4.engram"}
    for path in gates.cells:
        recs = _records(v41, "engram", path)
        assert gates.cells[path].value == pytest.approx(np.mean([np.mean(v[2]) for v in recs.values()]))
        pos = sorted(recs)[3]
        assert overlay(v41, "gate", pos, args).cells[path].value == pytest.approx(np.mean(recs[pos][2]))
    # the composite gain after each seam: the product of every backbone seam's matrix up to it, in depth order
    gains = overlay(v41, "gain", None, args)
    per_seam: dict[str, list[float]] = {}
    for pos in _positions(v41):
        product = np.eye(args.hc_mult)
        for layer in range(args.n_layers):
            for site in ("attn", "ffn"):
                product = product @ v41.fact("mhc", f"layers.{layer}", 0, pos, site)["comb"].astype(np.float64)
                gain = max(np.abs(product).sum(0).max(), np.abs(product).sum(1).max())
                per_seam.setdefault(f"layers.{layer}.hc_{site}", []).append(gain)
    for node, values in per_seam.items():
        assert gains.cells[node].value == pytest.approx(np.mean(values), abs=1e-12)
    assert gains.cells["layers.5"] == gains.cells["layers.5.hc_ffn"]       # a layer shows its last seam
    last = _positions(v41)[-1]
    assert overlay(v41, "gain", last, args).cells["layers.9.hc_ffn"].value == pytest.approx(per_seam[
        "layers.9.hc_ffn"][-1], abs=1e-12)
    # attention: the mean window / compressed mass, the compressed share colours the box
    att = overlay(v41, "attention", None, args)
    for layer in (0, 2, 7):
        recs = _records(v41, "attention", f"layers.{layer}.attn")
        win, comp = np.mean([float(v[1]) for v in recs.values()]), np.mean([float(v[2]) for v in recs.values()])
        cell = att.cells[f"layers.{layer}.attn"]
        assert cell.value == pytest.approx(comp) and cell.text == f"w{win * 100:.0f} c{comp * 100:.0f}%"
    assert att.cells["layers.0.attn"].value == 0.0           # a window-only layer has no compressed rows
    assert att.cells["layers.2.attn"].value > 0               # a ratio-2 layer reads some


def test_dspark_acceptance_by_draft_position_and_for_one_token(v41, slots):
    args = slots["tiny-v4.1"].args
    steps = v41.dspark_steps
    assert steps
    o = overlay(v41, "acceptance", None, args)
    gamma = args.dspark_block_size
    reached, kept = np.zeros(gamma), np.zeros(gamma)
    for s in steps:
        for k in range(s.verify_len):
            if s.accepted >= k:
                reached[k] += 1
                kept[k] += s.accepted > k
    by_pos = [kept[k] / reached[k] if reached[k] else math.nan for k in range(gamma)]
    head = o.cells["mtp.2.markov_head"]
    assert head.text == " ".join("–" if math.isnan(a) else f"{a * 100:.0f}" for a in by_pos) + "%"
    rate = sum(s.accepted for s in steps) / sum(s.verify_len for s in steps)
    assert [o.cells[f"mtp.{s}"].value for s in range(3)] == [pytest.approx(rate)] * 3
    # one token: the step that committed it, position by position
    step = next(s for s in steps if s.accepted >= 1)
    pos = step.anchor_pos + 1                                   # its first draft, accepted
    one = overlay(v41, "acceptance", pos, args)
    assert one.cells["mtp.0"].text == f"{step.accepted}/{step.verify_len}"
    marks = one.cells["mtp.2.markov_head"].text
    assert marks[:step.accepted] == "✓" * step.accepted and len(marks) == gamma
    assert "this token is draft 1" in one.cells["mtp.0"].detail
    prompt = overlay(v41, "acceptance", 1, args)                # a prompt token: no step committed it
    assert all(math.isnan(c.value) for c in prompt.cells.values()) and "No DSpark step" in prompt.note


def test_tiny_v4_hash_layers_no_attention_and_no_args(v4, slots):
    args = slots["tiny-v4"].args
    load = overlay(v4, "load", None, args)
    assert "hash-routed" in load.cells["layers.0.ffn"].detail and "hash-routed" in load.cells["layers.1.ffn"].detail
    assert "hash-routed" not in load.cells["layers.2.ffn"].detail
    att = overlay(v4, "attention", None, args)                  # attention is opt-in: every layer says so
    assert {n for n in att.cells if n.endswith(".attn")} == {f"layers.{i}.attn" for i in range(args.n_layers)}
    assert all(math.isnan(c.value) and c.text == "n/r" for c in att.cells.values())
    assert att.note.startswith("Attention not recorded") and (NOT_RECORDED, "not recorded") in att.legend()
    assert overlay(v4, "gate", None, args).note == "This model has no Engram layers."
    # without the ModelArgs (a trace of a model this server does not know) the sizes come from the trace
    shape = RunShape.of(v4)
    assert (shape.n_layers, shape.n_draft_stages, shape.n_hash_layers) == (args.n_layers, args.n_draft_stages, 2)
    assert overlay(v4, "load", None).cells["layers.3.ffn"].value == pytest.approx(load.cells["layers.3.ffn"].value)
    with pytest.raises(ValueError, match="unknown overlay metric 'speed'"):
        overlay(v4, "speed")


def test_every_metric_paints_the_drawn_boxes_with_a_legend(v41, slots):
    args = slots["tiny-v4.1"].args
    v = build_view(load_config(list_presets()["tiny-v4.1"]))
    lay = build_layout(args, v.graph, v.groups, {g.id for g in v.foldable}, 3, v.size_text)
    html = diagram_html(lay, "", name="tiny-v4.1")
    for metric in METRICS:
        o = overlay(v41, metric, None, args)
        painted, missing = paint_svg(html, o.fills(), o.legend(), o.title)
        root = ET.fromstring(f"<div>{painted}</div>")
        boxes = {g.get("data-node"): g for g in root.iter(f"{SVG}g") if "v41-painted" in g.get("class")}
        assert set(boxes) == set(o.cells) - set(missing) and boxes, metric
        for node, g in boxes.items():
            card = next(r for r in g.iter(f"{SVG}rect") if r.get("class") == "v41-card")
            assert card.get("fill") == o.scale.colour(o.cells[node].value)
            assert o.cells[node].text in [t.text for t in g.iter(f"{SVG}text")]
        legend = painted.split('<svg class="v41-diagram"', 1)[0]
        assert o.title in legend and all(label in legend for _, label in o.legend())
    # the detail column shows layer 3 only: the other layers' modules are reported as not drawn
    load = overlay(v41, "load", None, args)
    assert paint_svg(html, load.fills())[1] == sorted(f"layers.{i}.ffn" for i in range(10) if i != 3) + \
        [f"mtp.{s}.ffn" for s in range(3)]


def test_the_value_clears_the_open_control_and_the_title():
    v = build_view(load_config(list_presets()["tiny-v4.1"]))
    lay = build_layout(v.args, v.graph, v.groups, set(), 2, v.size_text)
    html = diagram_html(lay, "", name="tiny-v4.1")
    painted, _ = paint_svg(html, {"layers.2.ffn": ("#fde68a", "1.86"), "mtp.0": ("#fde68a", "15%"),
                                  "mtp.2.markov_head": ("#fde68a", "36 50 50 100 0%")})
    root = ET.fromstring(f"<div>{painted}</div>")
    g = {b.get("data-node"): b for b in root.iter(f"{SVG}g")}
    pill = next(r for r in g["layers.2.ffn"].iter(f"{SVG}rect") if r.get("class") == "v41-value")
    toggle = next(r for r in g["layers.2.ffn"].iter(f"{SVG}rect") if r.get("class") == "v41-toggle")
    assert float(pill.get("x")) + float(pill.get("width")) < float(toggle.get("x"))
    stage = g["mtp.0"]
    pill = next(r for r in stage.iter(f"{SVG}rect") if r.get("class") == "v41-value")
    title = next(t for t in stage.iter(f"{SVG}text") if t.text == "DSpark stage 0")
    assert float(title.get("x")) + len(title.text) * 11 * 0.5 / 2 <= float(pill.get("x"))   # moved out of its way
    head = g["mtp.2.markov_head"]                               # a wide value takes the subtitle's place
    assert "rank 8" not in [t.text for t in head.iter(f"{SVG}text")]
    assert "36 50 50 100 0%" in [t.text for t in head.iter(f"{SVG}text")]
    assert 'data-painting="1"' in painted and "fill-opacity: 0.35" in painted   # unpainted boxes fade


def test_colour_scales():
    s = Scale.sequential(0.0, 2.0)
    assert s.colour(0.0) == SEQUENTIAL[0] and s.colour(2.0) == SEQUENTIAL[-1] and s.colour(9.0) == SEQUENTIAL[-1]
    assert s.colour(math.nan) == NOT_RECORDED and s.colour(0.5) == SEQUENTIAL[1]
    assert [label for _, label in s.legend(low="even")] == ["0.00 (even)", "0.50", "1.00", "1.50", "2.00"]
    d = Scale.diverging(0.0, 0.5)
    assert d.colour(0.0) == DIVERGING[2] and d.colour(-0.5) == DIVERGING[0] and d.colour(0.5) == DIVERGING[-1]
    assert [label for _, label in d.legend()] == ["-0.50", "-0.25", "+0.00", "+0.25", "+0.50"]
    chance = Scale.around(0.0, 0.2, 1.0)                        # an agreement against its chance level
    assert chance.colour(0.2) == DIVERGING[2] and chance.colour(0.1) == DIVERGING[1] and chance.colour(0.6) == \
        DIVERGING[3]
    assert [label for _, label in chance.legend()] == ["0.00", "0.10", "0.20", "0.60", "1.00"]
    assert Scale.diverging(0.0, 1e-6, style="sci").label(5e-7) == "+5.0e-07"
    assert Scale.sequential(0.0, 1.0, style="percent").label(0.25) == "25%"
    assert re.fullmatch(r"#[0-9a-f]{6}", Scale.sequential(1.0, 1.0).colour(1.0))   # an empty range still colours


@pytest.fixture(scope="module")
def pair(v4, v41):
    return diff_traces(v4, v41), v4, v41


def test_the_run_diff_painted_on_run_a(pair, slots):
    diff, a, b = pair
    o = diff_overlay(diff, a, b, "agreement")
    r = diff.routing
    for layer in range(7):                                      # tiny-v4's backbone layers, both runs have them
        path = f"layers.{layer}.ffn"
        same = r[(r["layer"] == path) & r["same input"]]
        assert o.cells[path].value == pytest.approx(same["jaccard"].mean()) and o.cells[f"layers.{layer}"] == \
            o.cells[path]
    assert o.scale == Scale.agreement() and (o.scale.lo, o.scale.hi) == (0.0, 1.0)   # as the Compare heatmap
    # one aligned token: the Jaccard of the experts each run chose for it
    index = 7                                                  # the third new token: line 5 prompt + 2
    pa, pb, name = aligned_positions(diff, index)
    assert (pa, pb) == (7, 7) and name.startswith("new token 2 · ")
    one = diff_overlay(diff, a, b, "agreement", index)
    x = set(a.fact("moe", "layers.4.ffn", 0, pa)["ids"].tolist())
    y = set(b.fact("moe", "layers.4.ffn", 0, pb)["ids"].tolist())
    assert one.cells["layers.4.ffn"].value == pytest.approx(len(x & y) / len(x | y)) and one.title.endswith(name)
    # tiny-v4 has no Engram: B's gates have nothing to be compared with
    gate = diff_overlay(diff, a, b, "gate")
    assert {n: c.text for n, c in gate.cells.items()} == {"layers.1.engram": "B only", "layers.4.engram": "B only"}
    # gains: B − A after each seam, on the seams both have
    gain = diff_overlay(diff, a, b, "gain")
    want = _mean_gain(b, 2, "attn") - _mean_gain(a, 2, "attn")
    assert gain.cells["layers.2.hc_attn"].value == pytest.approx(want, abs=1e-12)
    assert gain.cells["layers.8.hc_ffn"].text == "B only" and gain.scale.centre == 0
    # acceptance by draft position, B − A
    acc = diff_overlay(diff, a, b, "acceptance")
    want = [y - x for x, y in zip(diff.dspark["A acceptance"], diff.dspark["B acceptance"])]
    head = acc.cells["mtp.2.markov_head"].text.split()
    assert head == ["–" if math.isnan(d) else f"{d * 100:+.0f}" for d in want]
    assert set(DIFF_METRICS) == {"agreement", "gate", "gain", "acceptance"}


def test_a_diff_of_two_prompts_on_one_model(slots, v41):
    other = _run(slots["tiny-v4.1"], "The quick red fox", dspark=True, attention=True)
    diff = diff_traces(v41, other)
    gate = diff_overlay(diff, v41, other, "gate")
    for path in ("layers.1.engram", "layers.4.engram"):
        ga = np.mean([np.mean(v[2]) for v in _records(v41, "engram", path).values()])
        gb = np.mean([np.mean(v[2]) for v in _records(other, "engram", path).values()])
        assert gate.cells[path].value == pytest.approx(gb - ga, abs=1e-6)   # float32 gates
    same = diff_overlay(diff, v41, other, "agreement", 1)       # prompt token 1: the same input in both
    assert all(c.value == 1.0 for n, c in same.cells.items() if n.endswith(".ffn"))
    one = diff_overlay(diff, v41, other, "gate", 3)             # ' brown' against ' red'
    recs_a, recs_b = _records(v41, "engram", "layers.1.engram"), _records(other, "engram", "layers.1.engram")
    assert one.cells["layers.1.engram"].value == pytest.approx(np.mean(recs_b[3][2]) - np.mean(recs_a[3][2]))
    assert "A '·brown' / B '·red'" in one.title


def _mean_gain(trace, layer: int, site: str) -> float:
    """The composite gain after one backbone seam, averaged over the positions, computed from the recorded matrices."""
    gains = []
    for pos in _positions(trace):
        product = np.eye(4)
        for n in range(layer + 1):
            for s in ("attn", "ffn"):
                rec = trace.fact("mhc", f"layers.{n}", 0, pos, s)
                if rec is None:
                    continue
                product = product @ rec["comb"].astype(np.float64)
                if (n, s) == (layer, site):
                    gains.append(max(np.abs(product).sum(0).max(), np.abs(product).sum(1).max()))
    return float(np.mean(gains))
