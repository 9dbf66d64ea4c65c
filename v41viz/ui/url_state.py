"""The shareable part of the view (config, selected node, expanded groups) as URL query parameters."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_CONFIG = "deepseek-v4.1-flash"
UPLOAD_PREFIX = "upload:"


@dataclass(frozen=True)
class ViewState:
    config: str = DEFAULT_CONFIG      # a preset name, or "upload:<file name>"
    node: str = ""                    # a graph node id; "" = the page's default
    expand: tuple[str, ...] = ()      # folded group ids shown layer by layer

    @property
    def is_upload(self) -> bool:
        return self.config.startswith(UPLOAD_PREFIX)


def from_query(params: Mapping[str, str | list[str]]) -> ViewState:
    """Read st.query_params (or any mapping); missing keys fall back to the defaults."""
    def one(key: str) -> str:
        v = params.get(key, "")
        return (v[-1] if v else "") if isinstance(v, list) else (v or "")

    expand = tuple(sorted({e for e in one("expand").split(",") if e}))
    return ViewState(config=one("config") or DEFAULT_CONFIG, node=one("node"), expand=expand)


def to_query(state: ViewState) -> dict[str, str]:
    out = {"config": state.config}
    if state.node:
        out["node"] = state.node
    if state.expand:
        out["expand"] = ",".join(sorted(state.expand))
    return out


def sanitize(state: ViewState, node_ids, group_ids) -> tuple[ViewState, list[str]]:
    """Drop a node or expansion the model does not have; say what was dropped."""
    problems = []
    node = state.node
    if node and node not in node_ids:
        problems.append(f"the shared link selects '{node}', which this model does not have")
        node = ""
    bad = [e for e in state.expand if e not in group_ids]
    if bad:
        problems.append("the shared link expands unknown group(s): " + ", ".join(bad))
    return ViewState(state.config, node, tuple(e for e in state.expand if e in group_ids)), problems
