"""One Inspect generation (no Streamlit, no torch): its settings and the traced run they produce (the loop that runs
it on an engine: v41viz.inspect.engine_run)."""
from __future__ import annotations

import itertools
import threading
import time
from dataclasses import dataclass, field

from engine.request.decoding import SUGGESTED_NO_REPEAT_NGRAM, SUGGESTED_REPETITION_PENALTY
from engine.request.interventions import parse_intervention
from engine.request.sampling import check_repetition, check_sampling
from engine.request.schedules import SCHEDULES
from engine.spec.errors import InputError
from engine.text.prompt_text import check_prompt_text
from engine.trace import Trace, TraceBudget

from .trace_model import model_facts

TRACE_MAX_TOKENS = 1024
_RUN_SERIALS = itertools.count(1)
MAX_PROMPT_CHARS = 4000


def prompt_problem(prompt: str) -> str:
    """Why a prompt cannot be run, as a clause ('' when it can): empty, too long, or not valid text."""
    try:
        check_prompt_text(prompt, "the prompt")  # the engine's one rule (CLI and API too): valid Unicode, not blank
    except InputError as e:
        return str(e)
    if len(prompt) > MAX_PROMPT_CHARS:
        return (f"the prompt has {len(prompt):,} characters; the Inspect page takes at most {MAX_PROMPT_CHARS:,} "
                "(every token is traced)")
    return ""


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
    interventions: tuple[str, ...] = ()   # what-if changes in their text form ('ban-expert:3:5@12-')
    # the page decodes with the options measured against degenerate greedy text (the engine's own defaults: 1 / 0)
    repetition_penalty: float = SUGGESTED_REPETITION_PENALTY
    no_repeat_ngram: int = SUGGESTED_NO_REPEAT_NGRAM

    def check(self) -> None:
        """Raise ValueError naming the setting that is out of range."""
        if problem := prompt_problem(self.prompt):
            raise InputError(problem[0].upper() + problem[1:] + ".")
        if not 1 <= self.max_new_tokens <= 512:
            raise InputError(f"max new tokens must lie in 1..512, got {self.max_new_tokens}")
        check_sampling(self.temperature, self.top_k, self.top_p, names=("temperature", "top-k", "top-p"))
        check_repetition(self.repetition_penalty, self.no_repeat_ngram,
                         names=("repetition penalty", "no-repeat n-gram"))
        if self.schedule not in SCHEDULES:
            raise InputError(f"unknown DSpark schedule {self.schedule!r}; choose {', '.join(SCHEDULES)}")
        for text in self.interventions:   # their form here; the engine checks them against the model
            parse_intervention(text)


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
    started_at: float = field(default_factory=time.time)   # wall clock, for the saved trace's file name
    first_token_s: float | None = None  # from the click to the first streamed token
    elapsed_s: float = 0.0
    finish: str = ""                   # the engine's finish reason: length | stop | max_seq_len
    message: str = ""
    serial: int = field(default_factory=lambda: next(_RUN_SERIALS))  # tells one run from the next in a session
    max_new_tokens: int = 0
    phase: str = ""                    # while running: queued | schedule | profiling | prefill | decoding
    ahead: int = 0                     # generations of other sessions ahead of this one in the queue
    profiled: tuple[int, int] = (0, 0)  # (shapes timed, shapes) while profiling for the auto schedule
    profile_s: float = 0.0
    stop_requested: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)
    stopped_by: str = ""               # "you" when the Stop button ended it
    shown_running: bool = False        # a page has shown it while it ran (still_watched)
    end_seen: bool = False             # a page was showing it when it ended (still_watched, or its Stop)
    finished_at: float = 0.0
    thread: threading.Thread | None = field(default=None, repr=False, compare=False)  # a background run's
    store_id: str = ""                 # its id in the run store (v41viz.inspect.run_store), when it is kept there

    @property
    def tokens_per_s(self) -> float:
        """Streaming rate after the first token (the wait in the queue and the prefill are in first_token_s)."""
        if self.first_token_s is None or self.n_tokens < 2 or self.elapsed_s <= self.first_token_s:
            return float("nan")
        return (self.n_tokens - 1) / (self.elapsed_s - self.first_token_s)


    @property
    def active(self) -> bool:
        """A background generation is still going (or about to end: its thread has not finished)."""
        return self.thread is not None and self.thread.is_alive()

    def still_watched(self) -> bool:
        """The loop condition of a page that streams this run: whether it is still going. Notes that a page showed
        it running and, once it has ended, that a page saw the end (finished_unwatched tells the two apart)."""
        if self.active:
            self.shown_running = True
            return True
        self.end_seen = True
        return False

    @property
    def finished_unwatched(self) -> bool:
        """It ended while no page was showing it (the user was on another page): a page showed it running, and the
        page's watching was cut short (by leaving) before it saw the end."""
        return self.finished_at > 0 and self.shown_running and not self.end_seen


def new_trace(settings: GenSettings, model: str, weights: str, args=None) -> Trace:
    meta = {"config": model, "weights": weights, "prompt": settings.prompt, "temperature": settings.temperature,
            "top_k": settings.top_k, "top_p": settings.top_p, "seed": settings.seed, "dspark": settings.dspark,
            "schedule": settings.schedule if settings.dspark else "", "max_new_tokens": settings.max_new_tokens,
            "threshold": settings.threshold, "attention": settings.attention,
            "repetition_penalty": settings.repetition_penalty, "no_repeat_ngram": settings.no_repeat_ngram,
            "interventions": list(settings.interventions)}   # the engine writes the canonical texts again
    if args is not None:
        meta.update(model_facts(args))
    return Trace(TraceBudget(max_tokens=TRACE_MAX_TOKENS, attention=settings.attention, lens=True), meta=meta)


class StopRequested(Exception):
    """Raised inside the generation loop when the user asked it to stop (the trace keeps what was made)."""


def status_sentence(run: LiveRun) -> str:
    """How the run stands or ended, as a sentence fragment ('stopped at max new tokens (24)')."""
    n = run.n_tokens
    tokens = f"{n} token{'' if n == 1 else 's'}"
    if run.status == "running":
        return {"queued": f"waiting for the engine ({run.ahead} generation(s) ahead)",
                "schedule": "reading the auto schedule's throughput table",
                "profiling": "profiling this machine for the auto schedule ({}/{} shapes)".format(*run.profiled),
                "prefill": "reading the prompt (prefill)"}.get(run.phase, f"generating ({tokens} so far)")
    if run.status == "stopped":
        return f"stopped by you after {tokens}" if run.stopped_by == "you" else f"interrupted after {tokens}"
    if run.status == "error":
        return f"stopped by an error after {tokens}"
    return {"length": f"stopped at max new tokens ({tokens})", "stop": f"reached end of text after {tokens}",
            "max_seq_len": f"reached the model's context length after {tokens}"}.get(run.finish,
                                                                                      f"finished after {tokens}")
