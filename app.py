"""Streamlit entry point: page config, navigation (st.navigation, pages/ listed explicitly) and the shared sidebar."""
import streamlit as st

from v41viz.sidebar import config_sidebar

st.set_page_config(page_title="v41viz", page_icon="🧭", layout="wide")
page = st.navigation([
    st.Page("pages/architecture.py", title="Architecture", icon=":material/account_tree:", default=True),
    st.Page("pages/compare.py", title="Compare configs", icon=":material/compare_arrows:"),
])
config_sidebar()
if notice := st.session_state.pop("config_notice", None):
    st.warning(notice)
page.run()
