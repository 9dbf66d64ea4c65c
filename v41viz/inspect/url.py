"""The Inspect page's URL: the generation (model, prompt, settings) and the view (panel, node, layer, seam, token),
parsed strictly (ASCII digits only, ranges checked; anything else is a note, never an exception)."""
from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from engine.request.interventions import parse_intervention
from engine.request.schedules import SCHEDULES
from engine.spec.errors import InputError

from .equivalent import NODE
from .links import PANELS
from .run import prompt_problem

PROMPT_INLINE = 1000       # characters: a longer prompt travels as a short id of itself (pid)
MAX_TOKEN_POS = 10**7
INT = re.compile(r"[0-9]{1,10}", re.ASCII)
FLOAT = re.compile(r"[0-9]{1,6}(\.[0-9]{1,8})?", re.ASCII)
BOOL = {"1": True, "true": True, "on": True, "0": False, "false": False, "off": False}
LAYER = re.compile(r"(layers|mtp)\.[0-9]{1,6}", re.ASCII)
PROMPT_ID = re.compile(r"[0-9a-f]{12}", re.ASCII)
RUN_ID = re.compile(r"[0-9a-f]{16}", re.ASCII)   # a run in this server's run store (v41viz.inspect.run_store)
MAX_CHANGES = 16           # what-if changes a link may carry (`intervene`, comma-separated)

# URL key -> (GenSettings field, kind, low, high): the form's own bounds, so a value from a link always fits it
SETTINGS = {"max_new": ("max_new_tokens", int, 1, 512), "temperature": ("temperature", float, 0.0, 5.0),
            "top_p": ("top_p", float, 0.01, 1.0), "top_k": ("top_k", int, 0, 1000),
            "seed": ("seed", int, 0, 2**31 - 1), "attention": ("attention", bool, 0, 1),
            "dspark": ("dspark", bool, 0, 1), "schedule": ("schedule", str, 0, 0),
            "threshold": ("threshold", float, 0.0, 1.0),
            "rep_penalty": ("repetition_penalty", float, 0.1, 10.0), "no_repeat": ("no_repeat_ngram", int, 0, 10)}


@dataclass
class InspectLink:
    model: str = ""
    prompt: str | None = None      # the prompt itself, or None (see prompt_id)
    prompt_id: str = ""            # a short id of a long prompt, known to the server that made the link
    settings: dict[str, object] = field(default_factory=dict)   # GenSettings field -> value
    panel: str = ""
    node: str = ""
    layer: str = ""
    seam: str = ""
    token: int | None = None
    arch: str = ""                 # the diagram config a node came from (its layer kinds and depth)
    interventions: tuple[str, ...] = ()   # the run's what-if changes (their text form), checked against the model
                                          # when it runs
    run_id: str = ""               # the stored run itself (opened from the run store instead of run again)


def one(params: Mapping, key: str) -> str | None:
    """A query parameter's value (the last one when repeated), or None when absent."""
    if key not in params:
        return None
    v = params[key]
    if isinstance(v, (list, tuple)):
        v = v[-1] if v else ""
    return str(v)


def parse_link(params: Mapping) -> tuple[InspectLink, list[str]]:
    """The link's parts and a note for every value that was ignored, naming the key and why."""
    link, notes = InspectLink(), []

    def bad(key: str, value: str, why: str) -> None:
        shown = value if len(value) <= 40 else value[:39] + "…"
        notes.append(f"`{key}={shown}` was ignored: {why}.")

    if (v := one(params, "model")) is not None:
        if 0 < len(v) <= 200 and v.isprintable():
            link.model = v
        else:
            bad("model", v, "not a model name")
    if (v := one(params, "prompt")) is not None:
        problem = prompt_problem(v)
        if problem:
            bad("prompt", v, problem)
        else:
            link.prompt = v
    if (v := one(params, "pid")) is not None and link.prompt is None:
        if PROMPT_ID.fullmatch(v):
            link.prompt_id = v
        else:
            bad("pid", v, "a prompt id is 12 hexadecimal digits")
    for key, (name, kind, low, high) in SETTINGS.items():
        if (v := one(params, key)) is None:
            continue
        value, why = _setting(v, kind, low, high)
        if why:
            bad(key, v, why)
        else:
            link.settings[name] = value
    if (v := one(params, "intervene")) is not None and v:
        changes, why = _changes(v)
        if why:
            bad("intervene", v, why)
        else:
            link.interventions = changes
    if (v := one(params, "panel")) is not None:
        if v in PANELS:
            link.panel = v
        else:
            bad("panel", v, f"the panels are {', '.join(PANELS)}")
    if (v := one(params, "node")) is not None and v:
        if NODE.fullmatch(v):
            link.node = v
        else:
            bad("node", v, "a node is a dotted layer path such as layers.4.engram or mtp.0")
    if (v := one(params, "layer")) is not None and v:
        if LAYER.fullmatch(v):
            link.layer = v
        else:
            bad("layer", v, "a layer is written layers.N or mtp.N")
    if (v := one(params, "seam")) is not None:
        if v in ("attn", "ffn"):
            link.seam = v
        else:
            bad("seam", v, "a seam is attn or ffn")
    if (v := one(params, "token")) is not None:
        if INT.fullmatch(v) and int(v) <= MAX_TOKEN_POS:
            link.token = int(v)
        else:
            bad("token", v, "a token is a position 0, 1, 2, … written in digits")
    if (v := one(params, "run")) is not None and v:
        if RUN_ID.fullmatch(v):
            link.run_id = v
        else:
            bad("run", v, "a run id is 16 hexadecimal digits")
    if (v := one(params, "arch")) is not None and 0 < len(v) <= 200 and v.isprintable():
        link.arch = v
    return link, notes


def _setting(value: str, kind, low, high) -> tuple[object, str]:
    """(parsed value, '') or (None, why it was refused)."""
    if kind is bool:
        if value.lower() not in BOOL:
            return None, "write 1 or 0"
        return BOOL[value.lower()], ""
    if kind is str:
        return (value, "") if value in SCHEDULES else (None, f"the schedules are {', '.join(SCHEDULES)}")
    pattern = INT if kind is int else FLOAT
    if not pattern.fullmatch(value):
        return None, f"not a plain {'whole ' if kind is int else ''}number in {low:g}..{high:g}"
    number = kind(value)
    if not (low <= number <= high) or (kind is float and not math.isfinite(number)):
        return None, f"outside {low:g}..{high:g}"
    return number, ""


def _changes(value: str) -> tuple[tuple[str, ...], str]:
    """(what-if changes in their canonical text form, '') or ((), why the list was refused)."""
    texts = value.split(",")
    if len(texts) > MAX_CHANGES:
        return (), f"at most {MAX_CHANGES} comma-separated changes"
    try:
        return tuple(parse_intervention(t).text for t in texts), ""
    except InputError as e:
        return (), str(e)


def prompt_id(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8", "surrogatepass")).hexdigest()[:12]


def link_params(model: str, settings: dict[str, object], view: dict[str, object]) -> dict[str, str]:
    """The query parameters of a run (model, prompt or its id, settings, what-if changes) and its view (panel, node,
    layer, seam, token, and the stored run's id: empty ones left out)."""
    out = {"model": model}
    prompt = settings.get("prompt")
    if isinstance(prompt, str):
        if len(prompt) <= PROMPT_INLINE:
            out["prompt"] = prompt
        else:
            out["pid"] = prompt_id(prompt)
    for key, (name, *_) in SETTINGS.items():
        if name in settings and settings[name] != "":
            out[key] = _text(settings[name])
    if settings.get("interventions"):
        out["intervene"] = ",".join(settings["interventions"])
    for key in ("panel", "node", "layer", "seam", "token", "run"):
        if view.get(key) not in (None, ""):
            out[key] = str(view[key])
    return out


def _text(value: object) -> str:
    """A setting as the parser reads it back: 1/0, digits, or a decimal without exponent."""
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float):
        return format(value, ".8f").rstrip("0").rstrip(".") or "0"
    return str(value)
