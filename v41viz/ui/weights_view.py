"""The Architecture page's "Learned weights" section: a checkpoint folder (the release, a subset of its shards, or
this project's own) read lazily as the real parameters of the selected box, with how many of its bytes the page
has read; a second folder side by side; the tables for download. The engine (and torch) is imported only once a
folder is given: the page's first view stays light."""
from __future__ import annotations

import io
import os
from pathlib import Path

import pandas as pd
import streamlit as st

from engine.spec.errors import InputError

from ..arch import weight_figures as figs
from ..arch.details import human
from ..arch.model_view import ModelView
from ..arch.search import ModuleIndex
from .plain_text import literal
from .static_table import show_table
from .url_state import ViewState

FOLDER, OTHER, CHOICE = "weights_folder", "weights_other", "weights_view"
EXPERTS_ON = "weights_experts_on"        # folders whose expert norms the user asked for
CHART = {"displayModeBar": False}
MAX_STORED = 64                          # views' statistics kept (of any folders), shared by the sessions
SHAPES = ("n_layers", "dim", "n_routed_experts", "hc_mult", "family")


def section(view: ModelView, index: ModuleIndex, state: ViewState) -> None:
    st.subheader("Learned weights")
    c1, c2 = st.columns(2)
    folder = _path(c1.text_input(
        "Checkpoint folder", key=FOLDER, placeholder="~/DeepSeek-V4.1-Flash (all shards or some)",
        help="An official-format folder (config.json, the index, any subset of the shards) or one of this project's "
             "checkpoints. Headers are read at once; tensors only as a view shows them."))
    other = _path(c2.text_input(
        "Compare with (optional)", key=OTHER, placeholder="a second checkpoint folder",
        help="V4 against V4.1, or two training states: the same statistics side by side."))
    if not folder:
        st.caption("Give a checkpoint folder to see what the model learned, box by box: router biases, mHC mixing, "
                   "attention sinks, norm gains, Engram tables, the DSpark heads and (on request) every expert's "
                   "weight norms. `python -m engine weights FOLDER` prints the same statistics.")
        return
    reader = _open(folder)
    if reader is None:
        return
    _status(reader, view)
    from engine.weights.views import EXPERTS, VIEWS, view_for
    names = [*VIEWS, EXPERTS]
    node = state.node
    step = index.steps.get(node)
    node_type = view.graph.nodes[step.parent if node not in view.graph else node]["type"]
    suggested = view_for(node_type) or "router"
    if st.session_state.get("weights_for_node") != node:   # a new selection shows its box's view
        st.session_state[CHOICE], st.session_state["weights_for_node"] = suggested, node
    choice = st.segmented_control("View", names, key=CHOICE, format_func=lambda n: VIEWS[n].title if n in VIEWS
                                  else "Expert norms (opt-in)") or suggested
    if choice == EXPERTS and not _experts_allowed(reader, folder):
        return
    result = _result(folder, choice)
    other_result = None
    if other:
        other_reader = _open(other)
        if other_reader is not None and (choice != EXPERTS or _experts_allowed(other_reader, other, key="b")):
            other_result = _result(other, choice)
    _show(result, choice, node, reader, view)
    if other_result is not None:
        _comparison(result, other_result, node)
    st.caption(f"Read so far from {literal(folder)}: **{human(reader.bytes_read, 'B')}** of "
               f"{human(reader.total_bytes, 'B')} ({100 * reader.bytes_read / max(1, reader.total_bytes):.3f} %).")


def _path(text: str) -> str:
    return str(Path(text.strip()).expanduser()) if text.strip() else ""


def _fingerprint(folder: str) -> tuple:
    """What the folder holds now (its files' names, sizes and times): a shard downloaded or replaced since the
    folder was opened gives a fresh reader and fresh statistics."""
    try:
        with os.scandir(folder) as entries:
            return tuple(sorted((e.name, e.stat().st_size, e.stat().st_mtime_ns) for e in entries
                                if e.name.endswith((".safetensors", ".json")) and e.is_file()))
    except OSError:
        return ()


def _open(folder: str):
    from engine.checkpoint.errors import CheckpointError
    try:
        return _reader(folder, _fingerprint(folder))
    except (CheckpointError, InputError, OSError) as e:
        st.error(f"Cannot open {literal(folder)}: {literal(str(e), 600)}")
        return None


@st.cache_resource(max_entries=4, show_spinner="Reading the shards' headers…")
def _reader(folder: str, fingerprint: tuple):
    """One reader per folder as it is now, shared by the sessions (its byte count is the page's, since it was
    opened)."""
    from engine.weights.reader import WeightReader
    return WeightReader(folder)


@st.cache_resource(show_spinner=False)
def _store() -> dict:
    """(folder, view) → its statistics, shared by the sessions: a view is read from a folder once."""
    return {}


def _result(folder: str, name: str):
    from engine.weights.views import EXPERTS, run_view
    fingerprint = _fingerprint(folder)
    store, key = _store(), (folder, fingerprint, name)
    if key not in store:
        while len(store) >= MAX_STORED:   # the oldest first (dicts keep their order)
            store.pop(next(iter(store)))
        reader = _reader(folder, fingerprint)
        if name != EXPERTS:
            with st.spinner("Reading the tensors this view shows…"):
                store[key] = run_view(reader, name)
        else:
            from engine.weights.expert_norms import expert_norms
            bar = st.progress(0.0, text="expert norms")
            store[key] = expert_norms(reader, lambda done, total, shard: bar.progress(
                done / total, text=f"expert norms: {done}/{total} shards ({shard})"))
            bar.empty()
    return store[key]


def _status(reader, view: ModelView) -> None:
    a = reader.args
    shards = len(set(reader.weight_map.values()))
    here = shards - len(reader.missing_shards) - len(reader.broken_shards)
    st.markdown(f"**{literal(a.name or reader.folder.name)}** ({a.family}) · {here} of {shards} shard(s) here · "
                f"{human(reader.folder_bytes, 'B')} of {human(reader.total_bytes, 'B')} on disk · "
                f"{len(reader.entries):,} tensors")
    if reader.missing_shards:
        st.caption(f"Missing shards ({len(reader.missing_shards)}): "
                   f"{literal(', '.join(reader.missing_shards[:8]))}{' …' if len(reader.missing_shards) > 8 else ''}"
                   " — boxes whose tensors live there say so; the rest works.")
    for why in reader.broken_shards.values():
        st.warning(literal(why, 600))
    differs = [f for f in SHAPES if getattr(a, f) != getattr(view.args, f)]
    if differs:
        st.info(f"The folder's config differs from the diagram's ({', '.join(differs)}): the statistics follow the "
                "folder's own config.")


def _experts_allowed(reader, folder: str, key: str = "a") -> bool:
    """The expert norms read most of the checkpoint: only after the user asks (the cache then serves them)."""
    allowed = st.session_state.setdefault(EXPERTS_ON, set())
    if folder in allowed:
        return True
    import re
    experts = sum(reader.nbytes(n) for n in reader.entries if re.search(r"\.ffn\.experts\.\d+\.", n))
    st.info(f"The routed experts of {literal(folder)} hold {human(experts, 'B')} here "
            f"({100 * experts / max(1, reader.folder_bytes):.0f} % of the folder). Their norms are computed shard by "
            "shard and cached beside the folder (or in your cache folder), so this is done once.")
    if st.button("Compute expert norms", key=f"weights_experts_go_{key}", icon=":material/calculate:"):
        allowed.add(folder)
        st.rerun()
    return False


def _show(result, name: str, node: str, reader, view: ModelView) -> None:
    df = figs.frame(result.rows)
    st.caption(f"{len(result.rows):,} statistics · this view read {human(result.bytes_read, 'B')} in "
               f"{result.tensors_read:,} reads, {result.seconds:.2f} s" + (" (from the cache)" if result.cached
                                                                            else ""))
    for note in result.notes:
        st.caption(literal(note, 400))
    for tensor, why in result.problems.items():
        st.warning(f"`{literal(tensor)}`: {literal(why, 500)}")
    mine = next((w for m, w in result.absent.items() if m == node or node.startswith(m + ".")
                 or m.startswith(node + ".")), None)
    if mine is not None:
        st.info(f"`{literal(node)}`: its tensors are not in this folder: {literal(mine, 500)}")
    if result.absent:
        with st.expander(f"{len(result.absent)} box(es) without their tensors here", expanded=False):
            show_table(pd.DataFrame([{"box": m, "why": w} for m, w in result.absent.items()]), scroll_height=300)
    if not len(df):
        return
    for fig in _figures(df, name, node, reader.args):
        st.plotly_chart(fig, width="stretch", config=CHART)
    _downloads(df, name)


def _figures(df: pd.DataFrame, name: str, node: str, args) -> list:
    if name == "norms":
        return [figs.norm_gains(df, "mean"), figs.norm_gains(df, "std")]
    if name == "dspark":
        out = [figs.curves(df, ("singular_value", "product_singular_value"), title="Markov head singular values")]
        out += [figs.heatmap(df, s, node) for s in ("norm",) if s in set(df["stat"])]
        return out
    if name == "engram":
        return [figs.heatmap(df, s, node) for s in ("row_norm_mean", "value_std", "zero_rows", "row_norm")
                if s in set(df["stat"])]
    out = [figs.heatmap(df, s, node) for s in figs.stats_of(df) if s != "comb"]
    if name == "mhc":
        layer = _layer_of(node, args)
        comb = figs.sinkhorn_matrices(df, layer if layer is not None else 0, args.hc_mult)
        if comb is not None:
            out.insert(0, comb)
    return out


def _layer_of(node: str, args) -> int | None:
    head, _, rest = node.partition(".")
    number = rest.partition(".")[0]
    if not number.isdigit():
        return None
    return int(number) + (args.n_layers if head == "mtp" else 0)


def _comparison(a, b, node: str) -> None:
    from engine.weights.compare import compare_rows, summary
    rows = compare_rows(a.rows, b.rows)
    st.markdown("**Comparison** (b − a: the second folder minus the first)")
    show_table(pd.DataFrame(summary(rows)), scroll_height=260)
    both = pd.DataFrame([r for r in rows if r["difference"] is not None])
    for stat in (figs.stats_of(both) if len(both) else [])[:3]:
        st.plotly_chart(figs.heatmap(both, stat, node, value="difference", title=f"{stat}: b − a"), width="stretch",
                        config=CHART)
    _downloads(pd.DataFrame(rows), "comparison")


def _downloads(df: pd.DataFrame, name: str) -> None:
    c1, c2 = st.columns(2)
    c1.download_button("Table as CSV", df.to_csv(index=False).encode(), f"weights-{name}.csv", "text/csv",
                       key=f"weights_csv_{name}")
    buffer = io.BytesIO()
    df.to_parquet(buffer, index=False)
    c2.download_button("Table as Parquet", buffer.getvalue(), f"weights-{name}.parquet", "application/octet-stream",
                       key=f"weights_parquet_{name}")
