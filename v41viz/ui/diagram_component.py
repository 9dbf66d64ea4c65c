"""The architecture diagram in the browser: a Streamlit v2 component that shows the server's SVG in a viewport with
zoom (Ctrl + wheel, buttons, keys), pan (drag, wheel, arrow keys) and fit, tooltips, export to SVG and PNG, and sends
back the node of a clicked (or Enter-pressed) box and the open / close controls of attention and MoE boxes. A few
lines of script instead of plotly.js, so a fresh browser shows the diagram at once and a click redraws it at once.
The view (zoom and position) is reported to the server once it rests ("percent,x,y", the state value `view`), which
keeps it per model and in the URL (`zoom`), and hands it back when the page is drawn anew (a shared link, a return
from another page)."""
from __future__ import annotations

from collections.abc import Callable

import streamlit as st

JS = """
const NS = 'http://www.w3.org/2000/svg';
const MAX_SCALE = 1.25;            // the width fit never enlarges the drawing more than this
const SMALL = 0.8;                 // below this scale (screen px per design px) the shape labels hide
const READABLE = 0.85;             // a phone opens the drawing at this scale at least (the width fit was 51%)
const REPORT_MS = 600;             // a zoom or pan is reported once the view has rested this long
const TOUCH = window.matchMedia && window.matchMedia('(pointer: coarse)').matches;

function svgOf(root) { return root.querySelector('svg.v41-diagram'); }
function full(svg) { return { w: +svg.getAttribute('width'), h: +svg.getAttribute('height') }; }
function size(svg) { return { W: svg.clientWidth || 1, H: svg.clientHeight || 1 }; }

function widthView(svg) {          // the whole width, top first, at most MAX_SCALE
  const { w: fw } = full(svg), { W } = size(svg);
  const w = W / Math.min(MAX_SCALE, W / fw);
  return { x: (fw - w) / 2, y: 0, w };
}
function fitView(svg) {            // the whole drawing
  const { w: fw, h: fh } = full(svg), { W, H } = size(svg);
  const w = Math.max(fw, fh * W / H);
  return { x: (fw - w) / 2, y: (fh - w * H / W) / 2, w };
}
function clamp(svg, v) {           // keep the drawing in view: centred along an axis it does not fill
  const { w: fw, h: fh } = full(svg), { W, H } = size(svg);
  v.w = Math.min(Math.max(v.w, fw / 60, 40), Math.max(fw, fh * W / H) * 3);
  const h = v.w * H / W;
  v.x = v.w >= fw ? (fw - v.w) / 2 : Math.min(Math.max(v.x, 0), fw - v.w);
  v.y = h >= fh ? (fh - h) / 2 : Math.min(Math.max(v.y, 0), fh - h);
  return v;
}
function apply(root, report = true) {   // report: a change the user made, sent to the server once it rests
  const svg = svgOf(root), v = clamp(svg, root.view), { W, H } = size(svg);
  svg.setAttribute('viewBox', `${v.x.toFixed(1)} ${v.y.toFixed(1)} ${v.w.toFixed(1)} ${(v.w * H / W).toFixed(1)}`);
  const scale = W / v.w;
  root.querySelector('.v41-zoom').textContent = Math.round(scale * 100) + '%';
  root.classList.toggle('v41-small', scale < SMALL);
  if (report) {
    clearTimeout(root.reportTimer);
    root.reportTimer = setTimeout(() => {
      const text = zoomText(root);
      if (text !== root.reported && root.keepView) { root.reported = text; root.setState('view', text); }
    }, REPORT_MS);
  }
}
function zoomText(root) {          // "percent,x,y": the scale, and the view's middle in drawing units
  const svg = svgOf(root), v = root.view, { W, H } = size(svg);
  return [Math.round(W / v.w * 100), Math.round(v.x + v.w / 2), Math.round(v.y + v.w * H / W / 2)].join(',');
}
function fromZoom(svg, text) {     // the view a "percent,x,y" names on this screen, or null
  const p = String(text || '').split(',').map(Number), { W, H } = size(svg);
  if (p.length !== 3 || !p.every(Number.isFinite) || p[0] <= 0) return null;
  const w = W / (p[0] / 100);
  return { x: p[1] - w / 2, y: p[2] - w * H / W / 2, w };
}
function setHeight(root) {         // as tall as the width fit needs, within 320 px .. 80% of the window
  const svg = svgOf(root), { w: fw, h: fh } = full(svg), W = svg.clientWidth || fw;
  const want = fh * Math.min(MAX_SCALE, W / fw);
  svg.style.height = Math.round(Math.max(320, Math.min(want, 0.8 * window.innerHeight))) + 'px';
}
function zoomAt(root, factor, px, py) {   // px, py: the screen point that stays put, in element pixels
  const svg = svgOf(root), v = root.view, { W, H } = size(svg);
  if (px === undefined) { px = W / 2; py = H / 2; }
  const s = W / v.w, ux = v.x + px / s, uy = v.y + py / s;
  v.w = v.w / factor;
  clamp(svg, v);
  v.x = ux - px * v.w / W; v.y = uy - py * v.w / W;
  apply(root);
}
function panBy(root, dx, dy) {     // screen pixels; returns whether the view moved
  const svg = svgOf(root), v = root.view, s = size(svg).W / v.w, x = v.x, y = v.y;
  v.x += dx / s; v.y += dy / s;
  apply(root);
  return Math.abs(v.x - x) > 0.01 || Math.abs(v.y - y) > 0.01;
}
function boxFor(svg, node) {       // the drawn box of a node: its own, a folded group covering it, or an ancestor's
  const boxes = [...svg.querySelectorAll('.v41-box')];
  for (let n = node; n; n = n.includes('.') ? n.slice(0, n.lastIndexOf('.')) : '') {
    const own = boxes.filter(g => g.dataset.node === n);
    if (own.length) return own[own.length - 1];
    const group = boxes.find(g => (g.dataset.covers || '').split(' ').includes(n));
    if (group) return group;
  }
  return null;
}
function centreOn(root, node) {
  const svg = svgOf(root), box = boxFor(svg, node);
  if (!box) return;
  const b = box.getBBox(), v = root.view, { W, H } = size(svg);
  v.w = Math.min(v.w, widthView(svg).w);  // zoomed far out: come back to the width fit
  v.x = b.x + b.width / 2 - v.w / 2;
  v.y = b.y + b.height / 2 - v.w * H / W / 2;
  apply(root);
}
function exportText(root) {        // the whole drawing with its legend, self-contained
  const svg = svgOf(root), c = svg.cloneNode(true), { w, h } = full(svg), lh = +svg.dataset.legendH || 0;
  c.setAttribute('viewBox', `0 ${-lh} ${w} ${h + lh}`);
  c.setAttribute('width', w); c.setAttribute('height', h + lh);
  c.removeAttribute('style');
  c.querySelectorAll('.v41-xlegend').forEach(el => el.removeAttribute('display'));
  c.querySelectorAll('.v41-selected .v41-card').forEach(r => {
    r.setAttribute('stroke', '#dc2626'); r.setAttribute('stroke-width', '3');
  });
  const bg = document.createElementNS(NS, 'rect');
  [['x', 0], ['y', -lh], ['width', w], ['height', h + lh], ['fill', 'white']]
    .forEach(([k, val]) => bg.setAttribute(k, val));
  c.insertBefore(bg, c.firstChild);
  return { text: '<?xml version="1.0" encoding="UTF-8"?>\\n' + new XMLSerializer().serializeToString(c), w, h: h + lh };
}
function download(blob, name) {
  const a = document.createElement('a');
  a.href = URL.createObjectURL(blob); a.download = name;
  document.body.appendChild(a); a.click(); a.remove();
  setTimeout(() => URL.revokeObjectURL(a.href), 20000);
}
function fileName(root, ext) {
  return ((svgOf(root).dataset.name || 'model').replace(/[^A-Za-z0-9._-]+/g, '_')) + '-architecture.' + ext;
}
function exportPng(root) {
  const { text, w, h } = exportText(root), img = new Image(), k = 2;
  img.onload = () => {
    const canvas = document.createElement('canvas');
    canvas.width = Math.round(w * k); canvas.height = Math.round(h * k);
    const ctx = canvas.getContext('2d');
    ctx.scale(k, k); ctx.drawImage(img, 0, 0, w, h);
    canvas.toBlob(b => download(b, fileName(root, 'png')), 'image/png');
  };
  img.src = 'data:image/svg+xml;charset=utf-8,' + encodeURIComponent(text);
}
function firstView(svg) {           // the width fit; on a narrow screen no smaller than READABLE, at the top
  const v = widthView(svg), { W } = size(svg);
  if (W / v.w >= READABLE) return v;
  return { x: 0, y: 0, w: W / READABLE };
}
function show(root, data) {
  const old = svgOf(root), oldName = old && old.dataset.name, oldW = old && full(old).w;
  root.querySelector('.v41-drawing').innerHTML = data.html;
  root.drawn = data.html;
  const svg = svgOf(root);
  setHeight(root);
  if (!root.view || oldName !== svg.dataset.name) {   // a new drawing: the server's view of it, else the first one
    root.view = fromZoom(svg, data.zoom) || firstView(svg);
    root.reported = data.zoom || '';
  } else if (oldW && Math.abs(full(svg).w - oldW) > 1 && root.view.w < full(svg).w) {
    // a box opened or closed changed the drawing's width: fit the new width (an opened box ran off the right
    // edge, most in the narrower "details beside" column); a later centring moves to the selected box
    const y = root.view.y;
    root.view = widthView(svg);
    root.view.y = y;
  }
  apply(root, false);
}
function build(parentElement) {
  const root = document.createElement('div');
  root.className = 'v41-root' + (TOUCH ? ' v41-touch' : '');
  root.innerHTML = '<div class="v41-bar" role="toolbar" aria-label="diagram view">'
    + '<button data-act="out" title="Zoom out (−)" aria-label="zoom out">−</button>'
    + '<button data-act="in" title="Zoom in (+)" aria-label="zoom in">+</button>'
    + '<button data-act="fit" title="Show the whole drawing (0)">Fit</button>'
    + '<button data-act="width" title="Fit the width (W)">Fit width</button>'
    + '<span class="v41-zoom" aria-live="polite"></span>'
    + '<span class="v41-hint">' + (TOUCH ? 'pinch zooms · drag sideways pans'
                                    : 'Ctrl + wheel zooms · drag or wheel pans · + − 0 W and arrow keys') + '</span>'
    + '<span class="v41-spacer"></span>'
    + '<button data-act="svg" title="Download the whole drawing as SVG"'
    + ' aria-label="download the drawing as SVG">⤓ SVG</button>'
    + '<button data-act="png" title="Download the whole drawing as PNG (2×)"'
    + ' aria-label="download the drawing as PNG">⤓ PNG</button></div>'
    + '<div class="v41-drawing" tabindex="0" aria-label="architecture diagram: + and − zoom, 0 fits, arrows pan">'
    + '</div><div class="v41-tip" role="tooltip"></div>';
  parentElement.appendChild(root);
  const drawing = root.querySelector('.v41-drawing'), tip = root.querySelector('.v41-tip');
  const acts = {
    out: () => zoomAt(root, 1 / 1.25), in: () => zoomAt(root, 1.25),
    fit: () => { root.view = fitView(svgOf(root)); apply(root); },
    width: () => { root.view = widthView(svgOf(root)); apply(root); },
    svg: () => download(new Blob([exportText(root).text], { type: 'image/svg+xml' }), fileName(root, 'svg')),
    png: () => exportPng(root),
  };
  root.querySelector('.v41-bar').addEventListener('click', e => {
    const b = e.target.closest('button');
    if (b) acts[b.dataset.act]();
  });
  const boxOf = e => e.target.closest && e.target.closest('[data-node]');
  const pick = box => {
    root.querySelectorAll('.v41-selected').forEach(el => el.classList.remove('v41-selected'));
    root.querySelectorAll('.v41-box').forEach(el => {
      if (el.dataset.node === box.dataset.node) el.classList.add('v41-selected');
    });
    clearTimeout(root.reportTimer);  // a view report due now would start a rerun that drops this click's
    root.trigger('pick', box.dataset.node);
  };
  const activate = e => {
    const toggle = e.target.closest && e.target.closest('[data-toggle]');
    if (toggle) { clearTimeout(root.reportTimer); root.trigger('toggle', toggle.dataset.toggle); return true; }
    const box = boxOf(e);
    if (box) { pick(box); return true; }
    return false;
  };
  drawing.addEventListener('click', e => {
    if (root.dragged) { root.dragged = false; return; }
    activate(e);
  });
  drawing.addEventListener('keydown', e => {
    if ((e.key === 'Enter' || e.key === ' ') && activate(e)) { e.preventDefault(); return; }
    const step = 60, keys = {
      ArrowLeft: () => panBy(root, -step, 0), ArrowRight: () => panBy(root, step, 0),
      ArrowUp: () => panBy(root, 0, -step), ArrowDown: () => panBy(root, 0, step),
      '+': acts.in, '=': acts.in, '-': acts.out, '0': acts.fit, w: acts.width, W: acts.width,
    };
    if (keys[e.key] && !e.ctrlKey && !e.metaKey && !e.altKey) { e.preventDefault(); keys[e.key](); }
  });
  drawing.addEventListener('wheel', e => {
    const svg = svgOf(root);
    if (!svg || !svg.contains(e.target)) return;
    if (e.ctrlKey || e.metaKey) {
      e.preventDefault();
      const r = svg.getBoundingClientRect();
      zoomAt(root, Math.exp(-e.deltaY * 0.002), e.clientX - r.left, e.clientY - r.top);
    } else if (panBy(root, e.shiftKey ? e.deltaY : e.deltaX, e.shiftKey ? 0 : e.deltaY)) {
      e.preventDefault();           // the drawing moved; at its edge the page scrolls instead
    }
  }, { passive: false });
  let press = null;
  const touches = new Map();          // pointer id → last position, for a two-finger pinch
  const pinch = () => {
    const [a, b] = [...touches.values()];
    return { d: Math.hypot(a.x - b.x, a.y - b.y), x: (a.x + b.x) / 2, y: (a.y + b.y) / 2 };
  };
  drawing.addEventListener('pointerdown', e => {
    if (e.pointerType === 'touch') touches.set(e.pointerId, { x: e.clientX, y: e.clientY });
    root.dragged = false;
    if (e.button === 0 && svgOf(root) && svgOf(root).contains(e.target)) {
      press = { x: e.clientX, y: e.clientY, moved: false };
    }
  });
  drawing.addEventListener('pointermove', e => {
    if (touches.has(e.pointerId) && touches.size === 2) {
      const before = pinch();
      touches.set(e.pointerId, { x: e.clientX, y: e.clientY });
      const after = pinch(), r = svgOf(root).getBoundingClientRect();
      if (before.d > 0) zoomAt(root, after.d / before.d, after.x - r.left, after.y - r.top);
      press = null; root.dragged = true;
      return;
    }
    if (touches.has(e.pointerId)) touches.set(e.pointerId, { x: e.clientX, y: e.clientY });
    if (press && (e.buttons & 1)) {
      const dx = e.clientX - press.x, dy = e.clientY - press.y;
      if (!press.moved && Math.hypot(dx, dy) < 4) return;
      if (!press.moved) {
        press.moved = true; drawing.setPointerCapture(e.pointerId); root.classList.add('v41-dragging');
      }
      panBy(root, -dx, -dy);
      press.x = e.clientX; press.y = e.clientY;
      tip.style.display = 'none';
      return;
    }
    const box = boxOf(e);
    if (!box) { tip.style.display = 'none'; return; }
    const r = root.getBoundingClientRect();
    tip.textContent = box.dataset.tip;
    tip.style.display = 'block';
    tip.style.left = Math.max(0, Math.min(e.clientX - r.left + 14, r.width - tip.offsetWidth - 4)) + 'px';
    tip.style.top = (e.clientY - r.top + 16) + 'px';
  });
  const release = e => {
    touches.delete(e.pointerId);
    if (press && press.moved) { root.dragged = true; root.classList.remove('v41-dragging'); }
    press = null;
  };
  drawing.addEventListener('pointerup', release);
  drawing.addEventListener('pointercancel', release);
  drawing.addEventListener('pointerleave', () => { tip.style.display = 'none'; });
  new ResizeObserver(() => { if (svgOf(root)) { setHeight(root); apply(root, false); } }).observe(drawing);
  return root;
}

export default function ({ data, parentElement, setTriggerValue, setStateValue }) {
  const root = parentElement.querySelector('.v41-root') || build(parentElement);
  root.trigger = setTriggerValue;
  root.setState = setStateValue;
  root.keepView = !!data.keep_view;   // the page keeps the view (Architecture; not Compare's run diff)
  if (root.drawn !== data.html) show(root, data);
  if (data.centre && data.centre[1] && data.centre[1] !== root.centred) {
    root.centred = data.centre[1];
    centreOn(root, data.centre[0]);
  }
}
"""

CSS = """
.v41-root { position: relative; container-type: inline-size; }
.v41-bar { display: flex; flex-wrap: nowrap; align-items: center; gap: 4px; margin: 0 0 4px 0; font-size: 12px;
           color: #374151; white-space: nowrap; }
.v41-bar button { font: inherit; line-height: 1.4; padding: 1px 9px; min-width: 30px; color: #111827;
                  background: white; border: 1px solid #cbd5e1; border-radius: 4px; cursor: pointer; }
.v41-bar button:hover, .v41-bar button:focus-visible { border-color: #3b6ea5; outline: none; }
.v41-zoom { min-width: 3.2em; text-align: right; font-variant-numeric: tabular-nums; }
.v41-hint { color: #6b7280; margin-left: 6px; }
@container (max-width: 720px) { .v41-root:not(.v41-touch) .v41-hint { display: none; } }   /* one line */
.v41-touch .v41-bar { flex-wrap: wrap; }              /* on a touch screen the gesture hint is a line of its own */
.v41-touch .v41-hint { order: 9; flex-basis: 100%; margin: 2px 0 0 0; }
@container (max-width: 420px) { .v41-bar button[data-act="width"], .v41-zoom { display: none; } }
.v41-spacer { flex: 1; }
.v41-legend { display: flex; flex-wrap: wrap; gap: 2px 14px; font-size: 12px; color: #374151; margin: 0 0 6px 4px; }
.v41-legend span { display: inline-flex; align-items: center; gap: 5px; }
.v41-paint-legend span:first-child { font-weight: 600; }
.v41-drawing { outline: none; }
.v41-drawing:focus-visible .v41-diagram { outline: 2px solid #3b6ea5; outline-offset: 1px; }
.v41-diagram { display: block; width: 100%; font-family: inherit; user-select: none; background: white;
               border: 1px solid #e5e7eb; border-radius: 4px; cursor: grab; touch-action: pan-y; }
.v41-dragging .v41-diagram { cursor: grabbing; }
.v41-small .v41-shape { display: none; }
.v41-box { cursor: pointer; outline: none; }
.v41-box:hover > .v41-card, .v41-box:focus-visible > .v41-card { stroke-width: 2.2; }
.v41-box.v41-selected > .v41-card { stroke: #dc2626; stroke-width: 3; }
.v41-toggle { cursor: pointer; outline: none; }
.v41-toggle:hover, .v41-toggle:focus-visible { stroke: #3b6ea5; stroke-width: 1.8; }
.v41-tip { display: none; position: absolute; z-index: 5; max-width: 360px; padding: 5px 8px; font-size: 12px;
           line-height: 1.35; white-space: pre-line; pointer-events: none; background: white;
           border: 1px solid #cbd5e1; border-radius: 4px; box-shadow: 0 2px 6px rgba(0, 0, 0, 0.12); }
.v41-tip::first-line { font-weight: 600; }
"""

# Styles are not isolated (no shadow root): the SVG inherits the app's font, and tests read the DOM directly;
# every class name carries the v41- prefix.
_component = st.components.v2.component("v41viz.diagram", js=JS, css=CSS, isolate_styles=False)


def diagram(html: str, key: str, on_pick: Callable[[], None], on_toggle: Callable[[], None],
            centre: tuple[str, int] = ("", 0), zoom: str = "", on_view: Callable[[], None] | None = None) -> None:
    """Draw the diagram (legend + SVG from v41viz.arch.diagram). on_pick / on_toggle run before the rerun a click on
    a box / on an open-close control starts; picked(key) / toggled(key) read what was clicked. centre: (node, n) —
    the view centres on node whenever n changes (a search, a selection made outside the drawing). zoom: the view a
    new drawing opens at ("percent,x,y"; "" = the width fit); on_view runs when the user's zoom or pan has rested,
    and viewed(key) reads it."""
    keeps = {"on_view_change": on_view} if on_view is not None else {}   # else a zoom reruns nothing
    _component(key=key, data={"html": html, "centre": list(centre), "zoom": zoom, "keep_view": on_view is not None},
               on_pick_change=on_pick, on_toggle_change=on_toggle, **keeps)


def picked(key: str) -> str | None:
    """The node a click on the diagram under `key` just selected (None outside its callback)."""
    value = st.session_state.get(key)
    return value.get("pick") if hasattr(value, "get") else None


def toggled(key: str) -> str | None:
    """'attn' or 'ffn': the box whose open / close control was just clicked (None outside its callback)."""
    value = st.session_state.get(key)
    return value.get("toggle") if hasattr(value, "get") else None


def viewed(key: str) -> str | None:
    """The view ("percent,x,y") the diagram under `key` last reported."""
    value = st.session_state.get(key)
    return value.get("view") if hasattr(value, "get") else None
