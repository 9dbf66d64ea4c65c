"""Architecture page: the diagram drawn from config.json, module details and accounting."""
import streamlit as st

from v41viz.ui import architecture_page
from v41viz.ui.sidebar import current_view, page_setup

page_setup("Architecture")
config_key, view = current_view()
state = architecture_page.sync_state(config_key, view)
architecture_page.header(config_key, view)
architecture_page.reading_guide()
architecture_page.controls(view)
architecture_page.write_url(state)
left, right = st.columns([0.63, 0.37], gap="small")
with left:
    architecture_page.diagram(config_key, view, state)
with right:
    with st.container(border=True, key="details_panel"):
        architecture_page.details(config_key, view, state)
architecture_page.accounting_tabs(view)
architecture_page.memory_plan_section(config_key, view)
