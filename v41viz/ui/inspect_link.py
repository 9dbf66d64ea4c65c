"""The Inspect page's shareable state: read a link once per session (strictly: bad values become notes), seed the
form, offer to run the linked generation, land on the linked view, and write the shown run's link back."""
from __future__ import annotations

from functools import lru_cache

import streamlit as st

from engine.spec.config import load_config
from engine.spec.presets import list_presets

from ..inspect.equivalent import kind_name, missing_reason, nearest_equivalent
from ..inspect.links import panel_for
from ..inspect.run import GenSettings, LiveRun
from ..inspect.run_meta import describe_intervention, interventions_of, settings_of
from ..inspect.url import PROMPT_INLINE, InspectLink, link_params, parse_link, prompt_id
from .page_links import INSPECT_JUMP
from .sidebar import UPLOADS, args_for

LINK, NOTES, VIEW = "inspect_link", "inspect_link_notes", "inspect_link_view"
REQUEST = "inspect_node_request"     # {"node", "from"}: a node asked for by a link or a diagram box
OFFER = "inspect_link_offer"         # the linked generation, until it is run or another one is
PANEL, NODE = "inspect_panel", "inspect_node"
MAX_STORED_PROMPTS = 1000            # long prompts kept for `pid` links (≤ 4000 characters each)


@st.cache_resource(show_spinner=False)
def _prompts() -> dict[str, str]:
    """Long prompts by their short id, for links made by this server (a link with `pid` works while it runs)."""
    return {}


def read_link() -> InspectLink:
    """The URL's link, parsed once per session (a later rerun keeps what the first one read)."""
    if LINK not in st.session_state:
        link, notes = parse_link(st.query_params.to_dict())
        if link.prompt_id:
            link.prompt = _prompts().get(link.prompt_id)
            if link.prompt is None:
                notes.append(f"The link names a long prompt by its id `{link.prompt_id}`, which this server does "
                             "not know (long prompts are kept only while the server that made the link runs); "
                             "type the prompt to run it.")
        st.session_state[LINK], st.session_state[NOTES] = link, notes
        st.session_state[VIEW] = {"layer": link.layer, "seam": link.seam, "token": link.token}
        if link.panel:
            st.session_state[PANEL] = link.panel
        if link.node:
            st.session_state[REQUEST] = {"node": link.node, "from": link.arch}
            st.session_state.setdefault(PANEL, panel_for(link.node) or link.panel or "Experts")
        if link.prompt is not None:
            st.session_state[OFFER] = True
    return st.session_state[LINK]


def take_jump() -> None:
    """A diagram box's "Inspect … live" button: its node becomes the request, its panel the panel."""
    jump = st.session_state.pop(INSPECT_JUMP, None)
    if jump:
        config, node = jump
        st.session_state[REQUEST] = {"node": node, "from": config}
        st.session_state[PANEL] = panel_for(node) or st.session_state.get(PANEL, "Experts")


def form_values(link: InspectLink) -> dict[str, object]:
    """GenSettings fields a link sets (the page puts them into the form on its first draw)."""
    return ({"prompt": link.prompt} if link.prompt is not None else {}) | link.settings


def show_notes() -> None:
    for note in st.session_state.get(NOTES, []):
        st.warning(f"This page's link: {note} The page uses its own value instead.", icon=":material/link_off:")


def offer_run(model: str) -> GenSettings | None:
    """The linked generation, offered once (the form holds the same values): the settings when accepted."""
    link: InspectLink | None = st.session_state.get(LINK)
    if not st.session_state.get(OFFER) or link is None or link.prompt is None:
        return None
    settings = GenSettings(**({"prompt": link.prompt} | link.settings), interventions=link.interventions)
    other = f" (the link was made with {link.model}, which this server cannot run)" if \
        link.model and link.model != model else ""
    with st.container(border=True, key="inspect_offer"):
        st.markdown(f":material/link: **This link shares a generation** on {model}{other}: prompt "
                    f"`{_short(link.prompt)}` ({len(link.prompt)} characters), {settings_summary(settings)}. "
                    "Run it to land on the view the link shows, or change the settings below first.")
        if link.interventions:
            st.markdown("It is a what-if run, with " + "; ".join(describe_intervention(t) for t in link.interventions)
                        + " (the button runs it with these changes; Generate below runs without them).")
        if st.button("Run the linked generation", key="inspect_offer_run", icon=":material/play_arrow:",
                     type="primary"):
            st.session_state[OFFER] = False
            return settings
    return None


def settings_summary(s: GenSettings) -> str:
    draft = f"DSpark {s.schedule}" if s.dspark else "DSpark off"
    return (f"{s.max_new_tokens} new tokens, temperature {s.temperature:g}, top-p {s.top_p:g}, top-k {s.top_k}, "
            f"seed {s.seed}, {draft}")


def run_started() -> None:
    """A generation started: the link's offer is spent (its view still applies to the first run shown)."""
    st.session_state[OFFER] = False


def take_view(key: str):
    """The link's layer, seam or token, once: the first run shown lands on it."""
    return st.session_state.get(VIEW, {}).pop(key, None)


def node_request(args, model: str, options: list[str] | None) -> str | None:
    """The requested node when this run (options: its traced nodes; None before any run) has it: it is taken
    and returned. Otherwise the page says why it is missing and offers the nearest node of the same kind."""
    request = st.session_state.get(REQUEST)
    if not request:
        return None
    node, origin = request["node"], request.get("from") or ""
    if options is not None and node in options:
        del st.session_state[REQUEST]
        return node
    reason = missing_reason(node, args, model)
    source = _source_args(origin)
    nearest = nearest_equivalent(node, args, source) if reason else None
    where = f" (from the {origin} diagram)" if origin else ""
    if options is None:
        if reason is None:
            return None            # a node of this model: the first run will show it
        head = f"`{node}`{where} is not in this model: {reason}."
    else:
        why = reason or f"the inspected model has {len(options) - 1} traced modules, none of them `{node}`"
        head = (f"`{node}`{where} has no recorded data in this run: {why}. The {panel_for(node) or 'chosen'} panel "
                "shows every module instead.")
    with st.container(border=True, key="inspect_node_request"):
        if nearest and (options is None or nearest in options):
            st.warning(f"{head} The nearest {kind_name(node)} in {model} is `{nearest}`.",
                       icon=":material/swap_horiz:")
            if st.button(f"Inspect `{nearest}` instead", key="inspect_take_nearest"):
                st.session_state[REQUEST] = {"node": nearest, "from": ""}
                st.session_state[PANEL] = panel_for(nearest) or st.session_state.get(PANEL, "Experts")
                st.session_state.pop(NODE, None)
                st.rerun()
        elif reason:
            st.warning(f"{head} It has no {kind_name(node)} to offer instead.", icon=":material/swap_horiz:")
        else:
            st.warning(head, icon=":material/swap_horiz:")
        st.button("Dismiss", key="inspect_drop_request", type="tertiary",
                  on_click=lambda: st.session_state.pop(REQUEST, None))
    return None


def write_link(model: str, run: LiveRun, view: dict[str, object]) -> None:
    """The URL of the shown run: its model, prompt (or its short id), settings and the view."""
    settings = settings_of(run.trace.meta)
    settings["prompt"], settings["interventions"] = run.prompt, interventions_of(run.trace.meta)
    if len(run.prompt) > PROMPT_INLINE:
        store = _prompts()
        store[prompt_id(run.prompt)] = run.prompt
        while len(store) > MAX_STORED_PROMPTS:   # the oldest links stop resolving first
            del store[next(iter(store))]
    st.query_params.from_dict(link_params(model, settings, view))


def write_model(model: str) -> None:
    """No run of this model is shown: the URL names the model picked (a link made now opens it), and keeps no other
    model's prompt, settings or view (they belong to a run this model did not make)."""
    named = st.query_params.get("model")
    if named is None:
        st.query_params["model"] = model     # a link without a model (a diagram box's): its view stays
    elif named != model:
        st.query_params.from_dict({"model": model})


def _source_args(config: str):
    """The ModelArgs of the diagram a node came from, when it is a known preset or this session's upload."""
    if config in list_presets():
        return _preset_args(config)
    if config in st.session_state.get(UPLOADS, {}):
        return args_for(config)
    return None   # unknown (an upload this session no longer has): layer numbers are compared instead


@lru_cache(maxsize=16)
def _preset_args(name: str):
    return load_config(list_presets()[name])


def _short(text: str, n: int = 60) -> str:
    shown = text.replace("`", "'").replace("\n", "⏎")
    return shown if len(shown) <= n else shown[:n - 1] + "…"
