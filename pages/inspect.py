"""Inspect page: type a prompt, watch tokens stream, and see routing, mHC, Engram, DSpark and attention facts."""
import streamlit as st

from v41viz.ui import engine_session, inspect_page, inspect_panels
from v41viz.ui.page_links import diagram_config
from v41viz.ui.sidebar import page_setup

page_setup("Inspect", config_picker=False)
choice = inspect_page.model_sidebar()
st.title("Inspect a generation")
slot = engine_session.engine_slot(choice)
inspect_page.weights_note(slot)
settings = inspect_page.settings_form(slot.args)
if settings is not None:
    inspect_page.generate(slot, settings)
with st.expander("Replay a saved trace", expanded=False):
    inspect_page.replay_upload()
run = inspect_page.current_run(choice.key)
if run is None:
    st.info("Type a prompt and press Generate; the panels below fill with what the model recorded on every token.")
    st.stop()
inspect_page.run_summary(run)
config_key = diagram_config(choice.key, choice.config, slot.args)
panel, node, pos = inspect_panels.selection(run)
st.query_params.from_dict({k: v for k, v in {"model": choice.key, "panel": panel, "node": node or "",
                                             "token": str(pos)}.items() if v})
token_text = slot.engine.tokenizer.token_text
if panel == "Experts":
    inspect_panels.experts(run, slot.args, config_key, node, pos)
elif panel == "mHC":
    inspect_panels.mhc(run, config_key, node, pos)
elif panel == "Engram":
    inspect_panels.engram(run, slot.args, config_key, node, pos)
elif panel == "DSpark":
    inspect_panels.dspark(run, config_key, token_text)
else:
    inspect_panels.attention(run, config_key, node, pos)
inspect_panels.tokens(run)
inspect_panels.export(run)
