"""Architecture page: the diagram drawn from config.json, module details and accounting; painted with a run's facts."""
import streamlit as st

from v41viz.ui import arch_details, architecture_page, overlay_controls, weights_view
from v41viz.ui.sidebar import current_view, page_setup


@st.fragment
def view_and_details(config_key, view, index, live) -> None:
    """The selection, the diagram and what is shown of the selected box: a box click, a search or the module picker
    reruns only this part, not the header, the accounting and the memory plan below (they do not depend on it)."""
    state = architecture_page.sync_state(config_key, view, index)
    architecture_page.controls(view, index, painting=live is not None)
    architecture_page.write_url(state, overlay_controls.url_params(live))
    # The diagram takes the page's width and the details follow below it; or, on request, the details sit beside it.
    if architecture_page.details_beside():
        left, right = st.columns([0.68, 0.32], gap="small")
    else:
        left = right = st.container()
    with left:
        architecture_page.diagram(config_key, view, index, state, live)
    with right:
        with st.container(border=True, key="details_panel"):
            arch_details.details(config_key, view, index, state, live)
    weights_view.section(view, index, state)


page_setup("Architecture")
config_key, view = current_view()
index = architecture_page.modules(config_key, id(view), view)
architecture_page.restore_kept()
architecture_page.header(config_key, view)
architecture_page.reading_guide()
live = overlay_controls.live_data(config_key, view)
view_and_details(config_key, view, index, live)
architecture_page.accounting_tabs(view)
architecture_page.memory_plan_section(config_key, view)
