"""One Inspect generation (no Streamlit): settings, the traced run it produces, and the streaming loop."""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field
from typing import Callable

from engine.dspark.config import SCHEDULES, DSparkConfig
from engine.spec.errors import InputError
from engine.trace import Trace, TraceBudget

TRACE_MAX_TOKENS = 1024
_RUN_SERIALS = itertools.count(1)
MAX_PROMPT_CHARS = 4000


@dataclass(frozen=True)
class GenSettings:
    prompt: str
    max_new_tokens: int = 24
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    dspark: bool = False
    schedule: str = "all"
    threshold: float = 0.5
    attention: bool = True

    def check(self) -> None:
        """Raise ValueError naming the setting that is out of range."""
        if not self.prompt.strip():
            raise InputError("The prompt is empty: type some text to continue.")
        if len(self.prompt) > MAX_PROMPT_CHARS:
            raise InputError(f"The prompt has {len(self.prompt):,} characters; the Inspect page takes at most "
                             f"{MAX_PROMPT_CHARS:,} (every token is traced).")
        if not 1 <= self.max_new_tokens <= 512:
            raise InputError(f"max new tokens must lie in 1..512, got {self.max_new_tokens}")
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise InputError("temperature must be ≥ 0, top-p in (0, 1] and top-k ≥ 0")
        if self.schedule not in SCHEDULES:
            raise InputError(f"unknown DSpark schedule {self.schedule!r}; choose {', '.join(SCHEDULES)}")


@dataclass
class LiveRun:
    """What one generation leaves in the session: its trace, text and timings (source says live or loaded)."""
    trace: Trace
    model: str
    source: str = "live"               # "live" or "loaded: <file name>"
    prompt: str = ""
    text: str = ""
    status: str = "running"            # running | done | stopped | error
    n_tokens: int = 0
    started: float = field(default_factory=time.perf_counter)
    first_token_s: float | None = None  # from the click to the first streamed token
    elapsed_s: float = 0.0
    finish: str = ""
    message: str = ""
    serial: int = field(default_factory=lambda: next(_RUN_SERIALS))  # tells one run from the next in a session

    @property
    def tokens_per_s(self) -> float:
        """Streaming rate after the first token (the wait in the queue and the prefill are in first_token_s)."""
        if self.first_token_s is None or self.n_tokens < 2 or self.elapsed_s <= self.first_token_s:
            return float("nan")
        return (self.n_tokens - 1) / (self.elapsed_s - self.first_token_s)


def new_trace(settings: GenSettings, model: str, weights: str) -> Trace:
    meta = {"config": model, "weights": weights, "prompt": settings.prompt, "temperature": settings.temperature,
            "top_k": settings.top_k, "top_p": settings.top_p, "seed": settings.seed, "dspark": settings.dspark,
            "schedule": settings.schedule if settings.dspark else "", "max_new_tokens": settings.max_new_tokens,
            "threshold": settings.threshold, "attention": settings.attention}
    return Trace(TraceBudget(max_tokens=TRACE_MAX_TOKENS, attention=settings.attention), meta=meta)


def dspark_config(engine, settings: GenSettings) -> DSparkConfig | None:
    """The DSparkConfig of the settings, or None when DSpark is off."""
    if not settings.dspark:
        return None
    return DSparkConfig.from_settings(settings.schedule, settings.threshold, engine.model)


def generate_into(engine, settings: GenSettings, run: LiveRun, on_piece: Callable[[LiveRun, str], None]) -> None:
    """Generate with the run's trace; on_piece(run, text) after each decoded piece. Updates run in place, so
    an interrupted generation (the Stop button) leaves what it produced."""
    from engine.generation import TextStream
    ids = [engine.encode(settings.prompt)]
    stream = TextStream(engine.tokenizer)

    def on_token(_row: int, token: int, _info) -> None:
        run.n_tokens += 1
        run.elapsed_s = time.perf_counter() - run.started
        if run.first_token_s is None:
            run.first_token_s = run.elapsed_s
        piece = stream.push(token)
        run.text += piece
        on_piece(run, piece)

    result = engine.generate(ids, max_new_tokens=settings.max_new_tokens, temperature=settings.temperature,
                             top_k=settings.top_k, top_p=settings.top_p, seed=settings.seed, trace=run.trace,
                             on_token=on_token, dspark=dspark_config(engine, settings))
    run.elapsed_s = time.perf_counter() - run.started
    run.finish, run.status = result.finish_reasons[0], "done"


def settings_of(meta: dict) -> dict[str, object]:
    """The generation settings a trace's meta records (older traces lack some; those are left out)."""
    out: dict[str, object] = {}
    for name, kind in (("prompt", str), ("max_new_tokens", int), ("temperature", float), ("top_p", float),
                       ("top_k", int), ("seed", int), ("dspark", bool), ("schedule", str), ("threshold", float),
                       ("attention", bool)):
        value = meta.get(name)
        if value is None or value == "":
            continue
        try:
            out[name] = str(value).lower() in ("true", "1") if kind is bool else kind(value)
        except (TypeError, ValueError):
            continue
    return out


def settings_line(model: str, meta: dict) -> str:
    """One sentence naming the model and the settings that made a run."""
    s = settings_of(meta)
    parts = [f"model {model or 'unknown'}"]
    for name, label in (("temperature", "temperature"), ("top_p", "top-p"), ("top_k", "top-k"), ("seed", "seed"),
                        ("max_new_tokens", "max new tokens")):
        if name in s:
            parts.append(f"{label} {s[name]:g}" if isinstance(s[name], float) else f"{label} {s[name]}")
    if "dspark" in s:
        parts.append(f"DSpark schedule {s.get('schedule') or 'all'}" if s["dspark"] else "DSpark off")
    return "Made with " + " · ".join(parts) + "."
