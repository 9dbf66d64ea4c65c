"""A finished app run on an engine slot, as the Inspect and Compare pages make one (generate_into, no Streamlit)."""
from __future__ import annotations

from v41viz.inspect.engine_run import generate_into
from v41viz.inspect.run import GenSettings, LiveRun, new_trace


def traced_run(slot, prompt: str, max_new_tokens: int, **settings):
    """The Trace of one run of `prompt` on `slot` (an engine_session.EngineSlot) with these GenSettings."""
    gen = GenSettings(prompt, max_new_tokens=max_new_tokens, **settings)
    run = LiveRun(new_trace(gen, slot.choice.key, slot.engine.source, slot.args), slot.choice.key, prompt=prompt)
    with slot.turn() as engine:
        generate_into(engine, gen, run, lambda r, p: None)
    return run.trace
