"""Streamlit entry point and home page. Pages are auto-discovered from pages/ (no st.navigation: mixing the two
makes the first request of a fresh server run a page without this shell); each page calls page_setup()."""
import streamlit as st

from v41viz.ui import start_page
from v41viz.ui.sidebar import page_setup

page_setup("Home")
st.title("v41viz")
st.markdown("An inspector for DeepSeek-V4.1-Flash and its predecessor V4-Flash, drawn from their `config.json` "
            "and backed by the project's PyTorch engine.")
start_page.intro()
st.page_link("pages/architecture.py", label="Architecture — the diagram, module details and accounting",
             icon=":material/account_tree:")
st.page_link("pages/compare.py", label="Compare — two configs, or two runs of one prompt, side by side",
             icon=":material/compare_arrows:")
st.page_link("pages/inspect.py", label="Inspect — generate from a prompt and watch experts, mHC, Engram and DSpark",
             icon=":material/monitoring:")
st.caption("The config chosen in the sidebar is shared by every page; each page's URL keeps its view.")
start_page.tour()
start_page.glossary()
