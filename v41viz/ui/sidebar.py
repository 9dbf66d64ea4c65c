"""The shared sidebar: which config the pages show (a preset or an uploaded config.json), kept in the URL."""
from __future__ import annotations

import hashlib

import streamlit as st

from engine.spec.config import ConfigError, ModelArgs, config_from_text, load_config
from engine.spec.errors import EngineError
from engine.spec.limits import CONFIG_MAX_BYTES
from engine.spec.presets import list_presets

from ..arch.model_view import ModelView, build_view
from . import kept, page_style, stale_fragment
from .plain_text import literal, short_name
from .url_state import DEFAULT_CONFIG, UPLOAD_PREFIX

CHOICE = "config_choice"     # session key of the chosen config (plain state: survives page switches)
WIDGET = "config_widget"     # the selectbox's own key, re-seeded from CHOICE on every page
UPLOADS = "uploaded_configs"  # session key: {"upload:<file stem>@<hash>": (sha256 of the bytes, ModelArgs)}
ERROR = "config_error"       # session key: (page title, message) of the last rejected upload


def parse_upload(name: str, data: bytes) -> ModelArgs:
    """Bytes of an uploaded config.json → ModelArgs, or ConfigError naming the file and the problem. The size is
    checked before anything is parsed (the uploader and the server cap it too)."""
    shown = short_name(name)
    if len(data) > CONFIG_MAX_BYTES:
        raise ConfigError(f"{shown}: {len(data):,} bytes; a config.json has at most {CONFIG_MAX_BYTES:,} bytes "
                          "(real ones are a few KB)")
    return config_from_text(data, name=short_name(name.removesuffix(".json")), source=shown)


@st.cache_resource(max_entries=8, show_spinner="Building the model graph and accounting…")
def _preset_view(name: str) -> ModelView:
    # cache_resource, not cache_data: the V4.1 view holds ~96k tensor specs (7.8 MB pickled, ~0.8 s to copy
    # back per rerun under cache_data); pages only read it.
    return build_view(load_config(list_presets()[name]))


@st.cache_resource(max_entries=4, show_spinner="Building the model graph and accounting…")
def _upload_view(key: str, digest: str, _args: ModelArgs) -> ModelView:
    return build_view(_args)


def page_setup(title: str, config_picker: bool = True) -> None:
    """First call of every page (pages/ auto-discovery runs each page script on its own): config + sidebar.

    A page that runs a model of its own (Inspect) or picks its own configs (Compare) hides the diagram's config
    picker, so the sidebar shows only what that page uses; the chosen config stays in the session for the other
    pages."""
    st.set_page_config(page_title=f"{title} · v41viz", page_icon="🧭", layout="wide")
    stale_fragment.install()   # a text box's commit that arrives after a link click no longer blanks the new page
    stale_fragment.page_shown()
    kept.remember()   # the last page's widget values, before Streamlit drops those this page does not draw
    page_style.page_css()
    page_style.navigation()
    if config_picker:
        config_sidebar(title)
    if notice := st.session_state.pop("config_notice", None):
        st.warning(notice)


def config_sidebar(page: str) -> None:
    """Render the config picker; the choice lives in st.session_state and the `config` query parameter.

    A rejected upload's error belongs to the page where it was made and to the choice it was made with: it is
    dropped on another page or when another config is picked."""
    presets = list(list_presets())
    uploads: dict = st.session_state.setdefault(UPLOADS, {})
    if CHOICE not in st.session_state:
        wanted = st.query_params.get("config", DEFAULT_CONFIG)
        if wanted in presets or wanted in uploads:
            st.session_state[CHOICE] = wanted
        else:
            st.session_state[CHOICE] = DEFAULT_CONFIG
            if wanted.startswith(UPLOAD_PREFIX):
                st.session_state["config_notice"] = (f"The link points to an uploaded config "
                                                     f"({literal(wanted.removeprefix(UPLOAD_PREFIX))}) that this "
                                                     "browser session does not have; upload it again. Showing "
                                                     f"{DEFAULT_CONFIG} meanwhile.")
            else:
                st.session_state["config_notice"] = (f"Unknown config '{literal(wanted)}' in the link; showing "
                                                     f"{DEFAULT_CONFIG}.")
    file = st.session_state.get("config_upload")  # the uploader's file is known before it is drawn
    if file is not None:
        _take_upload(page, file.name, file.getvalue(), uploads)
    if (error := st.session_state.get(ERROR)) and error[0] != page:
        del st.session_state[ERROR]
    with st.sidebar:
        st.markdown("### Model config")
        st.session_state[WIDGET] = st.session_state[CHOICE]
        st.selectbox("Config", presets + list(uploads), key=WIDGET, on_change=_copy_choice,
                     format_func=config_label)
        st.file_uploader("…or upload a config.json", type=["json"], key="config_upload",
                         max_upload_size=max(1, CONFIG_MAX_BYTES >> 20))
        st.caption("Presets live in `configs/`. Uploaded configs stay in this browser session only.")
    if error := st.session_state.get(ERROR):  # in the main area, above the page, which keeps showing the last config
        st.error(error[1], icon=":material/error:")


def _copy_choice() -> None:
    st.session_state[CHOICE] = st.session_state[WIDGET]
    st.session_state.pop(ERROR, None)


def _take_upload(page: str, name: str, data: bytes, uploads: dict) -> None:
    digest = hashlib.sha256(data).hexdigest()
    if st.session_state.get("config_upload_digest") == digest:
        return  # already handled this file
    st.session_state["config_upload_digest"] = digest
    key = upload_key(name, digest)
    try:
        args = parse_upload(name, data)
        _upload_view(key, digest, args)   # built now, so a config that cannot be drawn is refused here
    except EngineError as e:
        message = str(e).rstrip()
        message += "" if message.endswith((".", "?", "!")) else "."
        st.session_state[ERROR] = (page, f"Upload rejected — {literal(message)} The page keeps showing the config "
                                         "it showed before.")
        return
    except MemoryError:
        st.session_state[ERROR] = (page, f"Upload rejected — {literal(short_name(name))}: describing this config "
                                         "needs more memory than the server has. The page keeps showing the config "
                                         "it showed before.")
        return
    uploads[key] = (digest, args)
    st.session_state.pop(ERROR, None)
    st.session_state[CHOICE] = key


def upload_key(name: str, digest: str) -> str:
    """'upload:<file stem>@<8 hex of the bytes' sha256>': two files named config.json with different contents are
    two configs (the second used to replace the first), the same bytes uploaded twice are one."""
    return f"{UPLOAD_PREFIX}{short_name(name.removesuffix('.json'), 60)}@{digest[:8]}"


def config_label(key: str) -> str:
    """How every page names a config: a preset by its name; an upload by its file name and what it holds (family,
    layers, experts, short hash), and the preset it equals, if any. Plain text: markdown callers pass it through
    literal()."""
    uploads = st.session_state.get(UPLOADS, {})
    if key not in uploads:
        return key
    digest, args = uploads[key]
    name = key.removeprefix(UPLOAD_PREFIX).split("@", 1)[0]
    facts = (f"{name} · {args.family.upper()} · {args.n_layers} layers · {args.n_routed_experts} experts · "
             f"{digest[:8]}")
    same = preset_named_for(args)
    return facts + (f" · same as preset {same}" if same else " · uploaded")


def current_view() -> tuple[str, ModelView]:
    """The chosen config's key (preset name or upload_key) and its cached ModelView."""
    key = st.session_state.get(CHOICE, DEFAULT_CONFIG)
    uploads = st.session_state.get(UPLOADS, {})
    if key in uploads:
        digest, args = uploads[key]
        return key, _upload_view(key, digest, args)
    return key, _preset_view(key)


@st.cache_resource(show_spinner=False)
def _preset_args() -> dict[str, ModelArgs]:
    return {name: load_config(path) for name, path in list_presets().items()}


def preset_named_for(args: ModelArgs) -> str | None:
    """The preset whose architecture equals these args (names aside), or None."""
    return next((name for name, preset in _preset_args().items() if preset == args), None)


def available_configs() -> list[str]:
    return list(list_presets()) + list(st.session_state.get(UPLOADS, {}))


def args_for(key: str) -> ModelArgs:
    uploads = st.session_state.get(UPLOADS, {})
    if key in uploads:
        return uploads[key][1]
    return _preset_args()[key]
