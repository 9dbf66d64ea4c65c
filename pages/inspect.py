"""Inspect page: type a prompt, watch tokens stream, and see routing, mHC, Engram, DSpark and attention facts."""
import streamlit as st

from v41viz.ui import engine_session, inspect_page as ui, inspect_panels as views
from v41viz.ui.page_links import diagram_config
from v41viz.ui.sidebar import page_setup

page_setup("Inspect", config_picker=False)
choice = ui.model_sidebar()
st.title("Inspect a generation")
slot = engine_session.engine_slot(choice)
ui.weights_note(slot)
settings = ui.settings_form(slot.args)
if settings is not None:
    ui.generate(slot, settings)
with st.expander("Replay a saved trace", expanded=False):
    ui.replay_upload()
run = ui.current_run()
if run is None:
    st.info("Type a prompt and press Generate; the panels below fill with what the model recorded on every token.")
    st.stop()
ui.run_summary(run)
config_key = diagram_config(choice.key, choice.config, slot.args)
panel, node, pos = views.selection(run)
st.query_params.from_dict({k: v for k, v in {"model": choice.key, "panel": panel, "node": node or "",
                                             "token": str(pos)}.items() if v})
token_text = slot.engine.tokenizer.token_text
if panel == "Experts":
    views.experts(run, slot.args, config_key, node, pos)
elif panel == "mHC":
    views.mhc(run, config_key, node, pos)
elif panel == "Engram":
    views.engram(run, slot.args, config_key, node, pos)
elif panel == "DSpark":
    views.dspark(run, config_key, token_text)
else:
    views.attention(run, config_key, node, pos)
views.tokens(run)
views.export(run)
