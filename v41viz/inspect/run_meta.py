"""What a trace's meta says about the run that made it: its settings and what-if changes, read leniently (a loaded
trace may be old or hand-edited). Torch-free: pages that only show traces use it."""
from __future__ import annotations

from engine.request.interventions import parse_intervention
from engine.spec.errors import InputError


def settings_of(meta: dict) -> dict[str, object]:
    """The generation settings a trace's meta records (older traces lack some; those are left out)."""
    out: dict[str, object] = {}
    for name, kind in (("prompt", str), ("max_new_tokens", int), ("temperature", float), ("top_p", float),
                       ("top_k", int), ("seed", int), ("dspark", bool), ("schedule", str), ("threshold", float),
                       ("attention", bool), ("repetition_penalty", float), ("no_repeat_ngram", int)):
        value = meta.get(name)
        if value is None or value == "":
            continue
        try:
            out[name] = str(value).lower() in ("true", "1") if kind is bool else kind(value)
        except (TypeError, ValueError):
            continue
    return out


def interventions_of(meta: dict) -> tuple[str, ...]:
    """The what-if changes a trace's meta records, in their text form (none for a plain run or an older trace)."""
    recorded = meta.get("interventions") or ()
    return tuple(str(t) for t in recorded) if isinstance(recorded, (list, tuple)) else ()


def describe_intervention(text: str) -> str:
    """An intervention's sentence ('ban expert 5 at layer 3, from token 12 on'), or its text when unreadable."""
    try:
        return parse_intervention(text).describe()
    except InputError:
        return text


def settings_line(model: str, meta: dict) -> str:
    """One sentence naming the model and the settings that made a run (and its what-if changes)."""
    s = settings_of(meta)
    parts = [f"model {model or 'unknown'}"]
    for name, label in (("temperature", "temperature"), ("top_p", "top-p"), ("top_k", "top-k"), ("seed", "seed"),
                        ("max_new_tokens", "max new tokens"), ("repetition_penalty", "repetition penalty"),
                        ("no_repeat_ngram", "no-repeat n-gram")):
        if name in s:
            parts.append(f"{label} {s[name]:g}" if isinstance(s[name], float) else f"{label} {s[name]}")
    if "dspark" in s:
        parts.append(f"DSpark schedule {s.get('schedule') or 'all'}" if s["dspark"] else "DSpark off")
    changes = interventions_of(meta)
    if changes:
        parts.append("changed: " + "; ".join(describe_intervention(t) for t in changes))
    return "Made with " + " · ".join(parts) + "."
