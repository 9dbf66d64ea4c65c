"""Streamlit entry point: page config and navigation only."""
import streamlit as st

st.set_page_config(page_title="v41viz", layout="wide")
st.title("v41viz")
st.write("DeepSeek-V4.1-Flash architecture visualizer and inspector. The pages are being built.")
