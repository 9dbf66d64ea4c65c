"""The app's own navigation and page-wide CSS, drawn by page_setup on every page.

Navigation: pages/ auto-discovery labels pages by file name ("app / architecture / …"), and st.navigation cannot be
mixed with it (a fresh server's first request would run a page without the shell), so the sidebar's default list is
hidden (client.showSidebarNavigation in .streamlit/config.toml) and drawn here with st.page_link and real titles.

CSS: markdown tables scroll inside their column instead of widening the page, and long words break where they must;
labels and metric values wrap instead of being cut with "…"; special tokens (⟨bos⟩) get a chip of their own. (Font
fallbacks for CJK text are the theme's: theme.font in .streamlit/config.toml.)"""
from __future__ import annotations

import streamlit as st

PAGES = (("app.py", "Home", ":material/home:"), ("pages/architecture.py", "Architecture", ":material/account_tree:"),
         ("pages/compare.py", "Compare", ":material/compare_arrows:"), ("pages/inspect.py", "Inspect",
                                                                         ":material/monitoring:"))

# Buttons drawn as an icon alone: their label stays in the page for screen readers, out of sight.
ICON_ONLY = (".st-key-arch_prev", ".st-key-arch_next")

VISUALLY_HIDDEN = ("{position: absolute; width: 1px; height: 1px; overflow: hidden; clip-path: inset(50%); "
                   "white-space: nowrap;}")

CSS = """<style>
[data-testid="stMarkdownContainer"] table {display: block; max-width: 100%; overflow-x: auto;}
[data-testid="stMarkdownContainer"] td {overflow-wrap: break-word;}
[data-testid="stMetricLabel"] p, [data-testid="stMetricValue"] > div {white-space: normal; overflow: visible;
  text-overflow: clip;}
[data-testid="stMetricValue"] > div {font-size: clamp(1.4rem, 2.4vw, 2.25rem);}
[data-testid="stWidgetLabel"] p, [data-testid="stWidgetLabel"] label {white-space: normal; overflow: visible;
  text-overflow: clip;}
[data-testid="stSidebar"] [data-baseweb="select"] div {white-space: normal; overflow-wrap: anywhere;
  text-overflow: clip;}
@media (max-width: 640px) {   /* a phone: heatmap cells too narrow for their numbers (hover and tap show them) */
  .js-plotly-plot .heatmaplayer text {display: none;}
}
.v41-special {font-family: inherit; font-size: 0.85em; padding: 0 0.25em; border-radius: 0.3em;
  background: #e0e7ff; color: #3730a3; white-space: nowrap;}
</style>"""


def navigation() -> None:
    """Home / Architecture / Compare / Inspect at the top of the sidebar (the current page is marked by Streamlit)."""
    with st.sidebar:
        for path, title, icon in PAGES:
            st.page_link(path, label=title, icon=icon)
        st.divider()


def page_css() -> None:
    hidden = ", ".join(f"{key} button [data-testid=stMarkdownContainer]" for key in ICON_ONLY)
    st.html(CSS.replace("</style>", f"{hidden} {VISUALLY_HIDDEN}\n</style>"))
