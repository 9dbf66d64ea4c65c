"""The home page's body: what the tool is, a three-step tour, and the glossary every page links to (terms_line)."""
from __future__ import annotations

import streamlit as st

# term → (anchor, what it means). Written from the spec (deepseek-v41-spec.md §4–§8) and docs/; the anchors are the
# glossary headings' ids, which the other pages link to (./#anchor opens the home page there).
GLOSSARY: dict[str, tuple[str, str]] = {
    "mHC": ("mhc", "Manifold-constrained hyper-connections. The residual stream is kept as several parallel streams "
                   "(4 in the Flash models) instead of one. Before each sublayer (attention, then the FFN) a *seam* "
                   "collapses them into the sublayer's input with learned `pre` weights; after it, the output is "
                   "written back with `post` weights while a 4×4 mixing matrix, made doubly stochastic by Sinkhorn "
                   "iterations, blends the streams. The mHC panel shows `pre`, `post` and the matrix per seam; the "
                   "overlay paints each seam's gain."),
    "Engram": ("engram", "A hashed memory lookup on a few layers (V4.1: layers 1 and 14 of Flash). The token ids are "
                         "first compressed (case, accents and spacing folded), then the last few compressed ids are "
                         "hashed into rows of large embedding tables; a learned gate per token decides how much of "
                         "the looked-up vector joins the residual stream. The Engram panel shows the ids, rows and "
                         "gates; the what-if can switch it off."),
    "DSpark": ("dspark", "The speculative drafter: a few extra blocks (`mtp.0`, `mtp.1`, …) fed with taps of the last "
                         "layers' residual streams propose a block of next tokens with a confidence each; the main "
                         "model verifies them in one forward, and the accepted ones are kept, so the text is the same "
                         "as without it (lossless). The schedule decides how many drafts to verify: `all`, "
                         "`threshold` on confidence, or `auto` (DSpark's Algorithm 1 on this machine's measured "
                         "speed)."),
    "CSA / HCA / SWA": ("csa-hca-swa", "Kinds of attention layer. Every layer attends to a sliding window of recent "
                                       "tokens (SWA: window only). Compressed layers also read *compressed rows*, "
                                       "each summarising a group of tokens: V4's CSA (ratio 4, overlapping groups, a "
                                       "lightning indexer picks which rows to read) and HCA (ratio 128, every row "
                                       "read). V4.1 labels its compressed layers by ratio instead (ratio 2 in the "
                                       "first half, ratio 1 in the second)."),
    "KV←n / idx←n": ("kv-idx", "Sharing between layers. `KV←n`: the layer reads the compressed key/value rows that "
                               "layer n's compressor wrote, instead of compressing its own (V4.1: layers 2, 8, 14 "
                               "and 20 publish them). `idx←n`: it reuses the list of compressed rows that layer n's "
                               "indexer selected, instead of scoring the rows itself."),
    "Reindex / Reuse": ("reindex-reuse", "How a compressed layer gets its index list. *Reuse*: it takes the list of "
                                         "the last index source unchanged (dashed boxes in the diagram read another "
                                         "layer's). *Reindex*: it scores the rows again with its own query weights "
                                         "but the shared keys of its KV source, within the candidate blocks the "
                                         "candidate-source layer picked (V4.1 layers 24, 28, 32, 36)."),
    "hash-routed": ("hash-routed", "V4's first MoE layers choose their experts by the token id (a fixed table, "
                                   "`tid2eid`), not by a learned router: the same token always goes to the same "
                                   "experts. V4.1 has none. Such layers cannot be given a banned or forced expert "
                                   "in the what-if."),
}


def link(term: str) -> str:
    """A markdown link to the term's glossary entry (opens the home page at it)."""
    return f"[{term}](./#{GLOSSARY[term][0]})"


def terms_line(terms: list[str] | None = None) -> str:
    """The line of glossary links a page shows where these terms appear."""
    return ":material/menu_book: Terms: " + " · ".join(link(t) for t in (terms or list(GLOSSARY)))


def help_text(term: str) -> str:
    """A widget's help: the term's meaning and where to read more."""
    return f"{GLOSSARY[term][1]}\n\nGlossary: {link(term)}"


def intro() -> None:
    st.markdown("v41viz shows how DeepSeek-V4.1-Flash (and V4-Flash before it) is built and what it does on a real "
                "prompt. The **Architecture** page draws the model from its `config.json`: every layer, its "
                "attention kind, the experts, the mHC seams, Engram and the DSpark drafter, with the tensor shapes "
                "and exact parameter and byte counts. The **Inspect** page runs the project's own PyTorch engine on "
                "a prompt and records, for every token, which experts each layer chose, the mHC gates, the Engram "
                "lookups, the attention split and the drafter's guesses; the diagram can then be painted with "
                "those facts. **Compare** puts two configs, or two runs, side by side.")


def tour() -> None:
    st.header("A three-step tour", anchor="tour")
    c = st.columns(3)
    with c[0].container(border=True):
        st.markdown("**1 · Generate**")
        st.markdown("Open **Inspect**, keep the prompt or type one, and press **Generate**. Tokens stream in; the "
                    "panels below fill with what the model recorded on every token.")
        st.page_link("pages/inspect.py", label="Go to Inspect", icon=":material/play_arrow:")
    with c[1].container(border=True):
        st.markdown("**2 · Live data on the diagram**")
        st.markdown("Open **Architecture**: after a run, **Live data** is on and the boxes are painted with the "
                    "run's facts (expert load, Engram gates, mHC gain, …). Pick a metric or one token above the "
                    "diagram.")
        st.page_link("pages/architecture.py", label="Go to Architecture", icon=":material/account_tree:")
    with c[2].container(border=True):
        st.markdown("**3 · Click a painted box**")
        st.markdown("Its details show the value and explain the module; **Inspect … live** opens the matching "
                    "panel at that layer and token, and the panel's **in the diagram** button comes back.")


def glossary() -> None:
    st.header("Glossary", anchor="glossary")
    st.caption("The terms the pages use; each page links here where they appear.")
    for term, (anchor, text) in GLOSSARY.items():
        st.subheader(term, anchor=anchor)
        st.markdown(text)
