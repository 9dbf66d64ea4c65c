"""Place an opened attention or MoE box: a frame in the detail column holding the steps in lanes and rows, with
the arrows between them (the shapes they carry as labels)."""
from __future__ import annotations

from engine.spec.config import ModelArgs
from engine.spec.roles import LayerRole

from .boxes import Box, Edge, Layout
from .substeps import steps_of

STEP_W, STEP_H = 2.8, 0.9        # a step box, in diagram units
LANE_W, ROW_PITCH = 3.15, 1.55   # lane centre to centre; row centre to centre (the gap holds two label rows)
HEAD = 0.95                      # frame top → first row's top: the title, then the input bus
PAD = 0.22                       # frame edge → the outermost box
BYPASS_ROOM = 2.6                # right of the last lane: the bypass line and its label


def place_opened(lay: Layout, args: ModelArgs, role: LayerRole, which: str, node: str, title: str,
                 flow_x: float, top: float, size) -> tuple[str, str, float]:
    """Add the opened box (key 'open:<node>') and its steps ('step:<id>') to lay; flow_x is the x of lane 0 (the
    layer's flow column), top the frame's top. Returns (frame key, key of the step whose output leaves, bottom)."""
    steps, edges = steps_of(args, role, which)
    frame_key = f"open:{node}"
    key = {st.name: f"step:{st.id}" for st in steps}
    n_rows = max(st.row for st in steps) + 1
    bottom = top + HEAD + n_rows * ROW_PITCH - (ROW_PITCH - STEP_H) + 0.35
    boxes = []
    for st in steps:
        x = flow_x + (st.lane + (st.span - 1) / 2) * LANE_W
        y = top + HEAD + STEP_H / 2 + st.row * ROW_PITCH
        boxes.append(Box(key[st.name], st.id, x, y, STEP_W + (st.span - 1) * LANE_W, STEP_H, st.kind, st.title,
                         st.subtitle, dashed=bool(st.reads)))
    right = max(b.right for b in boxes) + (BYPASS_ROOM if any(e.route == "bypass" for e in edges) else 0.0)
    left = flow_x - STEP_W / 2 - PAD
    lay.add(Box(frame_key, node, (left + right + PAD) / 2, (top + bottom) / 2, right + PAD - left, bottom - top,
                "attention" if which == "attn" else "ffn", title, size(node), toggle=which, container=True,
                flow_x=flow_x))
    for b in boxes:
        lay.add(b)
    exit_key = frame_key
    for e in edges:
        if e.a == "in":
            lay.edges.append(Edge(frame_key, key[e.b], "flow", "", "bus"))
        elif e.b == "out":
            exit_key = key[e.a]
        else:
            lay.edges.append(Edge(key[e.a], key[e.b], "flow", e.label, e.route))
    return frame_key, exit_key, bottom
