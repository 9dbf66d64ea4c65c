"""The shareable part of the view (config, selected node, expanded groups, opened boxes) as URL query parameters."""
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


def from_query(params: Mapping[str, str | list[str]]) -> ViewState:
    """Read st.query_params (or any mapping); missing keys fall back to the defaults."""
    def one(key: str) -> str:
        v = params.get(key, "")
        return (v[-1] if v else "") if isinstance(v, list) else (v or "")

    expand = tuple(sorted({e for e in one("expand").split(",") if e}))
    opened = tuple(sorted({o for o in one("open").split(",") if o}))
    return ViewState(config=one("config") or DEFAULT_CONFIG, node=one("node"), expand=expand, open=opened)


def to_query(state: ViewState) -> dict[str, str]:
    out = {"config": state.config}
    if state.node:
        out["node"] = state.node
    if state.expand:
        out["expand"] = ",".join(sorted(state.expand))
    if state.open:
        out["open"] = ",".join(sorted(state.open))
    return out


def sanitize(state: ViewState, node_ids, group_ids) -> tuple[ViewState, list[str]]:
    """Drop a node, expansion or opened box the model does not have; say what was dropped."""
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
    return ViewState(state.config, node, tuple(e for e in state.expand if e in group_ids),
                     tuple(o for o in state.open if o in OPENABLE.values())), problems
