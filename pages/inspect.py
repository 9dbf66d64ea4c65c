"""Inspect page: type a prompt, watch tokens stream, and see routing, mHC, Engram, DSpark and attention facts."""
import streamlit as st

from engine.spec.presets import list_presets
from v41viz.inspect.trace_model import text_lookup
from v41viz.ui import engine_session, inspect_link, inspect_page, inspect_panels, inspect_stream, what_if
from v41viz.ui.page_links import diagram_config
from v41viz.ui.sidebar import page_setup

page_setup("Inspect", config_picker=False)
link = inspect_link.read_link()
if inspect_page.open_stored_run(link.run_id):
    inspect_link.run_started()   # the run itself is shown: the link's offer to run it again is not needed
choice = inspect_page.model_sidebar(link.model)
inspect_link.take_jump()
st.title("Inspect a generation")
inspect_link.show_notes()
slot = engine_session.engine_slot(choice, inspect_page.experts_setting())
inspect_page.weights_note(slot)
offered = inspect_link.offer_run(choice.key)
settings = inspect_page.settings_form(slot.args, inspect_link.form_values(link)) or offered
if settings is not None and inspect_stream.start(slot, settings):
    inspect_link.run_started()
    what_if.forget()   # a new main run: the last what-if rerun is over
inspect_stream.watch(choice.key)
with st.expander("Replay a saved trace", expanded=False):
    inspect_page.replay_upload()
    inspect_page.store_caption()
inspect_page.upload_error()
run = inspect_page.current_run(choice.key)
if run is None:
    inspect_link.write_model(choice.key)
    inspect_link.node_request(slot.args, choice.key, None)
    st.info("Type a prompt and press Generate; the panels below fill with what the model recorded on every token.")
    st.stop()
inspect_page.run_summary(run)
same_model = run.model == choice.key
if same_model:
    config_key = diagram_config(choice.key, choice.config, slot.args)
else:   # a replayed trace of a model this server does not run: its diagram when it is a preset, else none
    config_key = run.model if run.model in list_presets() else None
panel, node, pos = inspect_panels.selection(run, slot.args, choice.key)
token_text = text_lookup(run.trace, slot.engine.tokenizer.token_text if same_model else None)
inspect_panels.token_detail(run, pos, token_text)
view: dict[str, object] = {"panel": panel, "node": node or "", "token": pos, "run": run.store_id}
if panel == "Experts":
    inspect_panels.experts(run, config_key, node, pos)
elif panel == "mHC":
    view |= inspect_panels.mhc(run, config_key, node, pos)
elif panel == "Engram":
    view |= inspect_panels.engram(run, config_key, node, pos)
elif panel == "DSpark":
    inspect_panels.dspark(run, config_key, token_text)
elif panel == "Logit lens":
    inspect_panels.lens(run, config_key, node, pos, token_text)
else:
    inspect_panels.attention(run, config_key, node, pos)
inspect_link.write_link(run.model or choice.key, run, view)
inspect_panels.tokens(run, token_text)
inspect_panels.export(run)
what_if.section(slot, run, view, pos)
