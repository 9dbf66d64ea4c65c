"""The Architecture page's inputs below the diagram, kept across page visits and in the URL: the accounting tab and
the memory plan's hardware (a link opens the same tab and plan). Only values other than the defaults are written."""
from __future__ import annotations

import math
import re
from collections.abc import Mapping

import streamlit as st

from engine.plan.memory_plan import Hardware

from . import kept

TAB, EXPERTS = "arch_accounting_tab", "plan_experts"
TABS = ("Parameters", "Bytes", "KV cache per token", "Layer roles", "Experts touched")
ON_GPUS, ON_HOST = "on the GPUs", "in host RAM (one GPU)"
# widget key → (URL key, kind, low, high): the number inputs' own bounds
NUMBERS = {"plan_gpus": ("gpus", int, 1, 256), "plan_gpu_mem": ("gpu_mem", float, 1.0, 4096.0),
           "plan_host_mem": ("host_mem", float, 1.0, 65536.0), "plan_context": ("context", int, 1, 16 * 2**20),
           "plan_batch": ("batch", int, 1, 4096)}
NUMBER = re.compile(r"[0-9]{1,9}(\.[0-9]{1,6})?", re.ASCII)
SEEDED = "arch_inputs_seeded"


def defaults() -> dict[str, object]:
    d = Hardware()
    return {TAB: TABS[0], EXPERTS: ON_GPUS, "plan_gpus": d.gpus, "plan_gpu_mem": d.gpu_mem_gib,
            "plan_host_mem": d.host_mem_gib, "plan_context": d.context, "plan_batch": d.batch}


def from_query(params: Mapping[str, str]) -> tuple[dict[str, object], list[str]]:
    """Widget values a link sets, and a note for each value that was ignored (naming the key and why)."""
    values, notes = {}, []
    if (tab := params.get("tab")) is not None:
        if tab in TABS:
            values[TAB] = tab
        else:
            notes.append(f"`tab={tab[:40]}` was ignored: the tabs are {', '.join(TABS)}.")
    if (where := params.get("experts")) is not None:
        if where in ("host", "device"):
            values[EXPERTS] = ON_HOST if where == "host" else ON_GPUS
        else:
            notes.append(f"`experts={where[:40]}` was ignored: write host or device.")
    for widget, (name, kind, low, high) in NUMBERS.items():
        if (text := params.get(name)) is None:
            continue
        number = kind(float(text)) if NUMBER.fullmatch(text) and (kind is float or "." not in text) else None
        if number is None or not (low <= number <= high) or not math.isfinite(number):
            notes.append(f"`{name}={text[:40]}` was ignored: a {'whole ' if kind is int else ''}number in "
                         f"{low:g}..{high:g}.")
        else:
            values[widget] = number
    return values, notes


def restore() -> None:
    """Before the inputs are drawn: their values from the last visit, or on the session's first view from the URL."""
    linked, notes = {}, []
    if SEEDED not in st.session_state:
        st.session_state[SEEDED] = True
        linked, notes = from_query(st.query_params.to_dict())
    kept.restore(defaults(), linked)
    for note in notes:
        st.warning(f"This page's link: {note}", icon=":material/link_off:")


def to_query() -> dict[str, str]:
    """The inputs that differ from their defaults, as URL parameters."""
    out, base = {}, defaults()
    if (tab := kept.value(TAB, TABS[0])) != TABS[0]:
        out["tab"] = str(tab)
    if kept.value(EXPERTS, ON_GPUS) == ON_HOST:
        out["experts"] = "host"
    for widget, (name, kind, _, _) in NUMBERS.items():
        value = kept.value(widget, base[widget])
        if value != base[widget]:
            out[name] = str(value) if kind is int else format(float(value), "g")
    return out
