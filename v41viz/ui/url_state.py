"""The shareable part of the view (config, selected node, expanded groups, opened boxes, the diagram's zoom) as URL
query parameters."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..arch.substeps import OPENABLE

DEFAULT_CONFIG = "deepseek-v4.1-flash"
UPLOAD_PREFIX = "upload:"


@dataclass(frozen=True)
class ViewState:
    config: str = DEFAULT_CONFIG      # a preset name, or "upload:<file name>"
    node: str = ""                    # a module path (graph node or step); "" = the page's default
    expand: tuple[str, ...] = ()      # folded group ids shown layer by layer
    open: tuple[str, ...] = ()        # "attn" / "ffn": the focused layer's attention / MoE drawn opened
    zoom: str = ""                    # the diagram's view: "percent,x,y" (scale, and the centre in drawing units)


def zoom_text(text: object) -> str | None:
    """A diagram view as the URL keeps it, "percent,x,y": the scale in percent of the drawing's own size (1 … 2000)
    and the point in the middle of the view, in drawing units (whole numbers); None when `text` is not one."""
    parts = str(text).split(",") if text else []
    try:
        percent, x, y = (round(float(p)) for p in parts)
    except (ValueError, OverflowError):   # not three numbers; nan, inf
        return None
    if len(parts) != 3 or not 1 <= percent <= 2000 or max(abs(x), abs(y)) > 10**6:
        return None
    return f"{percent},{x},{y}"


def from_query(params: Mapping[str, str | list[str]]) -> ViewState:
    """Read st.query_params (or any mapping); missing keys fall back to the defaults."""
    def one(key: str) -> str:
        v = params.get(key, "")
        return (v[-1] if v else "") if isinstance(v, list) else (v or "")

    expand = tuple(sorted({e for e in one("expand").split(",") if e}))
    opened = tuple(sorted({o for o in one("open").split(",") if o}))
    return ViewState(config=one("config") or DEFAULT_CONFIG, node=one("node"), expand=expand, open=opened,
                     zoom=one("zoom"))


def to_query(state: ViewState) -> dict[str, str]:
    out = {"config": state.config}
    if state.node:
        out["node"] = state.node
    if state.expand:
        out["expand"] = ",".join(sorted(state.expand))
    if state.open:
        out["open"] = ",".join(sorted(state.open))
    if state.zoom:
        out["zoom"] = state.zoom
    return out


def sanitize(state: ViewState, node_ids, group_ids) -> tuple[ViewState, list[str]]:
    """Drop a node, expansion or opened box the model does not have, or a zoom that is not one; say what was
    dropped."""
    problems = []
    node = state.node
    if node and node not in node_ids:
        problems.append(f"the shared link selects '{node}', which this model does not have")
        node = ""
    bad = [e for e in state.expand if e not in group_ids]
    if bad:
        problems.append("the shared link expands unknown group(s): " + ", ".join(bad))
    odd = [o for o in state.open if o not in OPENABLE.values()]
    if odd:
        problems.append("the shared link opens unknown box(es): " + ", ".join(odd) + " (attn and ffn open)")
    zoom = zoom_text(state.zoom) or ""
    if state.zoom and not zoom:
        problems.append(f"the shared link's zoom '{state.zoom}' is not percent,x,y (such as 150,800,1200)")
    return ViewState(state.config, node, tuple(e for e in state.expand if e in group_ids),
                     tuple(o for o in state.open if o in OPENABLE.values()), zoom), problems
