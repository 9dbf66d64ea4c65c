"""Compare page: two configs side by side (differences highlighted), or two runs of one prompt (Runs tab)."""
import streamlit as st

from v41viz.arch import compare
from v41viz.ui.compare_runs import runs_part
from v41viz.ui.plain_text import literal
from v41viz.ui.sidebar import args_for, available_configs, config_label, page_setup
from v41viz.ui.start_page import terms_line

page_setup("Compare", config_picker=False)   # its A and B pickers choose
st.title("Compare")
# Only the open tab's body runs, so the Configs tab never imports torch. The tab is kept in the URL (?view=Runs) and
# in the session by hand: a tab bound to the URL would make st.switch_page (Open in Inspect) fail to clear it.
TABS, VIEW, VIEW_KEPT = ("Configs", "Runs"), "compare_view", "compare_view_kept"
if VIEW not in st.session_state:
    wanted = st.query_params.get("view", st.session_state.get(VIEW_KEPT, TABS[0]))
    st.session_state[VIEW] = wanted if wanted in TABS else TABS[0]
configs_tab, runs_tab = st.tabs(list(TABS), key=VIEW, on_change="rerun")
st.session_state[VIEW_KEPT] = st.session_state[VIEW]
if st.session_state[VIEW] == TABS[0]:
    st.query_params.pop("view", None)
elif st.query_params.get("view") != st.session_state[VIEW]:
    st.query_params["view"] = st.session_state[VIEW]


def highlight(df):
    return df.style.apply(lambda row: ["background-color: #fef3c7" if row["differs"] else ""] * len(row), axis=1)


def configs_part() -> None:
    st.caption("Both columns are derived from the configs (no live data). Rows that differ are highlighted.")
    st.caption(terms_line())
    options = available_configs()
    for side, default in (("a", "deepseek-v4-flash"), ("b", "deepseek-v4.1-flash")):  # the URL (?a=&b=) seeds them
        if f"compare_{side}" not in st.session_state:
            wanted = st.query_params.get(side, default)
            st.session_state[f"compare_{side}"] = wanted if wanted in options else options[0]
    c1, c2 = st.columns(2)
    key_a = c1.selectbox("A", options, key="compare_a", format_func=config_label)
    key_b = c2.selectbox("B", options, key="compare_b", format_func=config_label)
    if (st.query_params.get("a"), st.query_params.get("b")) != (key_a, key_b):
        st.query_params["a"], st.query_params["b"] = key_a, key_b   # one by one: ?view stays
    a, b = args_for(key_a), args_for(key_b)
    table = compare.side_by_side(a, b)
    st.markdown(f"**{table['differs'].sum()} of {len(table)}** sizes and mechanisms differ.")
    st.table(highlight(table.set_index("quantity")))
    s1, s2 = st.columns(2)
    s1.markdown(f"**Folded layer stack — {literal(config_label(key_a))}**")
    s1.dataframe(compare.folded_stack(a), hide_index=True, width="stretch")
    s2.markdown(f"**Folded layer stack — {literal(config_label(key_b))}**")
    s2.dataframe(compare.folded_stack(b), hide_index=True, width="stretch")
    roles = compare.role_diff(a, b)
    st.markdown(f"**Layer roles** — {roles['differs'].sum()} of {len(roles)} positions differ")
    st.dataframe(highlight(roles), hide_index=True, width="stretch")
    with st.expander("Every config field that differs"):
        st.dataframe(compare.field_diff(a, b), hide_index=True, width="stretch")


with configs_tab:
    if configs_tab.open:
        configs_part()
with runs_tab:
    if runs_tab.open:
        runs_part()
