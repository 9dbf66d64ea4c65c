"""The diagram as index: which Inspect panel shows a diagram node, and the links between the two pages."""
from __future__ import annotations

from engine.trace import layer_path

PANELS = ("Experts", "mHC", "Engram", "DSpark", "Attention", "Logit lens")


def related(path: str, only: str | None) -> bool:
    """Whether a traced module path lies under (or contains) the selected node; None selects everything.
    'layers.3' relates to 'layers.3.ffn' but not to 'layers.30.ffn'."""
    if not only:
        return True
    return path == only or path.startswith(only + ".") or only.startswith(path + ".")


def panel_for(node: str) -> str | None:
    """The Inspect panel that shows a diagram node's recorded data, or None (embeddings, norms, the head)."""
    parts = node.split(".")
    if parts[0] == "mtp":
        return "DSpark"
    if parts[0] != "layers" or len(parts) < 3:
        return "Experts" if parts[0] == "layers" else None
    leaf = parts[2]
    return {"ffn": "Experts", "hc_attn": "mHC", "hc_ffn": "mHC", "engram": "Engram", "attn": "Attention"}.get(leaf)


def filter_path(node: str) -> str:
    """The trace path a node filters to: traces key mHC seams by layer, the rest by module."""
    parts = node.split(".")
    if len(parts) >= 3 and parts[2] in ("hc_attn", "hc_ffn"):
        return layer_path(node)
    if len(parts) >= 3 and parts[2] in ("ffn", "attn", "engram"):
        return ".".join(parts[:3])
    return layer_path(node) if parts[0] in ("layers", "mtp") else node


def mhc_site(node: str) -> str | None:
    parts = node.split(".")
    return {"hc_attn": "attn", "hc_ffn": "ffn"}.get(parts[2]) if len(parts) >= 3 else None


def diagram_node(panel: str, path: str, site: str = "") -> str:
    """The diagram box a panel's selection belongs to ('layers.3' + mHC 'ffn' → 'layers.3.hc_ffn')."""
    if panel == "mHC" and site:
        return f"{layer_path(path)}.hc_{site}"
    return path


def architecture_query(config: str, node: str) -> dict[str, str]:
    return {"config": config, "node": node}


