"""Architecture page: the diagram drawn from config.json, module details and accounting."""
import streamlit as st

from v41viz.ui import architecture_page as ui
from v41viz.ui.sidebar import current_view, page_setup

page_setup("Architecture")
config_key, view = current_view()
state = ui.sync_state(config_key, view)
ui.header(view)
ui.reading_guide()
ui.controls(view)
ui.write_url(state)
left, right = st.columns([0.63, 0.37], gap="small")
with left:
    ui.diagram(config_key, view, state)
with right:
    with st.container(border=True, key="details_panel"):
        ui.details(view, state.node)
ui.accounting_tabs(view)
