"""The architecture diagram in the browser: a Streamlit v2 component that shows the server's SVG, a tooltip on
hover, and sends the node of a clicked (or Enter-pressed) box back as a selection. A few lines of script instead
of plotly.js, so a fresh browser shows the diagram at once and a click redraws it at once."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

JS = """
export default function ({ data, parentElement, setTriggerValue }) {
  let root = parentElement.querySelector('.v41-root');
  if (!root) {
    root = document.createElement('div');
    root.className = 'v41-root';
    root.innerHTML = '<div class="v41-drawing"></div><div class="v41-tip" role="tooltip"></div>';
    parentElement.appendChild(root);
    const tip = root.querySelector('.v41-tip');
    const boxOf = e => e.target.closest && e.target.closest('[data-node]');
    const pick = box => {
      root.querySelectorAll('.v41-selected').forEach(el => el.classList.remove('v41-selected'));
      box.classList.add('v41-selected');
      root.send(box.dataset.node);
    };
    root.addEventListener('click', e => { const box = boxOf(e); if (box) pick(box); });
    root.addEventListener('keydown', e => {
      const box = boxOf(e);
      if (box && (e.key === 'Enter' || e.key === ' ')) { e.preventDefault(); pick(box); }
    });
    root.addEventListener('pointermove', e => {
      const box = boxOf(e);
      if (!box) { tip.style.display = 'none'; return; }
      const r = root.getBoundingClientRect();
      tip.textContent = box.dataset.tip;
      tip.style.display = 'block';
      tip.style.left = Math.min(e.clientX - r.left + 14, r.width - tip.offsetWidth - 4) + 'px';
      tip.style.top = (e.clientY - r.top + 16) + 'px';
    });
    root.addEventListener('pointerleave', () => { tip.style.display = 'none'; });
  }
  root.send = node => setTriggerValue('pick', node);
  if (root.drawn !== data) {
    root.querySelector('.v41-drawing').innerHTML = data;
    root.drawn = data;
  }
}
"""

CSS = """
.v41-root { position: relative; }
.v41-legend { display: flex; flex-wrap: wrap; gap: 2px 14px; font-size: 12px; color: #374151; margin: 0 0 6px 4px; }
.v41-legend span { display: inline-flex; align-items: center; gap: 5px; }
.v41-diagram { display: block; width: 100%; height: auto; font-family: inherit; user-select: none; }
.v41-box { cursor: pointer; outline: none; }
.v41-box:hover .v41-card, .v41-box:focus-visible .v41-card { stroke-width: 2.2; }
.v41-box.v41-selected .v41-card { stroke: #dc2626; stroke-width: 3; }
.v41-tip { display: none; position: absolute; z-index: 5; max-width: 360px; padding: 5px 8px; font-size: 12px;
           line-height: 1.35; white-space: pre-line; pointer-events: none; background: white;
           border: 1px solid #cbd5e1; border-radius: 4px; box-shadow: 0 2px 6px rgba(0, 0, 0, 0.12); }
.v41-tip::first-line { font-weight: 600; }
"""

# Styles are not isolated (no shadow root): the SVG inherits the app's font, and tests read the DOM directly;
# every class name carries the v41- prefix.
_component = st.components.v2.component("v41viz.diagram", js=JS, css=CSS, isolate_styles=False)


def diagram(html: str, key: str, on_pick: Callable[[], None]) -> None:
    """Draw the diagram (legend + SVG from v41viz.arch.diagram); on_pick runs before the rerun a click starts and
    finds the clicked node with picked(key)."""
    _component(key=key, data=html, on_pick_change=on_pick)


def picked(key: str) -> str | None:
    """The node a click on the diagram under `key` just selected (None outside its callback)."""
    value = st.session_state.get(key)
    return value.get("pick") if hasattr(value, "get") else None
