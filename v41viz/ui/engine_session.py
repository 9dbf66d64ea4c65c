"""The app's engine: loaded once per process (st.cache_resource), shared read-only, one generation at a time
through a lock whose queue the waiting sessions see; per-session runs live in st.session_state."""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import streamlit as st

from engine.accounting.accounting import account
from engine.checkpoint.official_layout import official_folder
from engine.spec.config import ModelArgs, load_config
from engine.spec.errors import EngineError
from engine.spec.presets import list_presets

ROOT = Path(__file__).resolve().parents[2]
CHECKPOINTS = ROOT / "checkpoints"
CHECKPOINT_PREFIX = "checkpoint:"
SERVICE_PREFIX = "service:"
SERVICE_ENV = "V41VIZ_ENGINE"  # engine.serving.client.ADDRESS_ENV, not imported here: that module pulls in torch
DEFAULT_MODEL = "tiny-v4.1"
MAX_RANDOM_PARAMS = 1_000_000_000  # presets beyond this are not offered with random weights (V4.1-Flash: 763B)
WEIGHT_SEED = 0
TORCH_THREADS = 1  # on the 2-core target, 2 threads under load ran 5-10× slower than 1
_GONE: dict[str, str] = {}  # service address -> why it is gone: no longer offered, in any session of this process


def shown_source(source: str) -> str:
    """The engine's source line ('checkpoint /abs/path/checkpoints/default, …') with the checkpoint named as the
    reader knows it: relative to the project (checkpoints/default), else the folder's name. The server's file
    system is not shown on the page nor written into exported traces."""
    head, sep, rest = source.partition("checkpoint ")
    if not sep or head:
        return source
    path_text, comma, tail = rest.partition(",")
    path = Path(path_text)
    try:
        name = str(path.relative_to(ROOT)) if path.is_absolute() else path_text
    except ValueError:
        name = path.name
    return f"checkpoint {name}{comma}{tail}"


@dataclass(frozen=True)
class ModelChoice:
    key: str                 # preset name, or "checkpoint:<dir name>"
    config: Path             # its config.json
    checkpoint: Path | None  # None = seeded random weights
    service: str = ""        # host:port of an engine service (`torchrun ... -m engine.serving`); then config is unused

    @property
    def label(self) -> str:
        if self.service:
            return f"engine service at {self.service} (torch.distributed ranks)"
        if self.checkpoint is None:
            return f"{self.key} (random weights, seed {WEIGHT_SEED})"
        kind = "official FP8/FP4 checkpoint" if self.official else "trained checkpoint"
        return f"{self.key.removeprefix(CHECKPOINT_PREFIX)} ({kind})"

    @property
    def official(self) -> bool:
        """A folder in the released checkpoint's format (FP8/FP4 shards, index, quantization_config)."""
        return self.checkpoint is not None and official_folder(self.checkpoint) is not None


def model_choices(checkpoints: Path = CHECKPOINTS) -> dict[str, ModelChoice]:
    """Every checkpoints/*/ directory with a config.json (this project's checkpoints and official-format
    folders alike), then the presets small enough to run; first, when the app was started with V41VIZ_ENGINE=host:port,
    the engine service there (an N-rank engine under torchrun)."""
    out: dict[str, ModelChoice] = {}
    if (address := os.environ.get(SERVICE_ENV, "")) and address not in _GONE:
        out[SERVICE_PREFIX + address] = ModelChoice(SERVICE_PREFIX + address, Path(), None, service=address)
    if checkpoints.is_dir():
        for d in sorted(p for p in checkpoints.iterdir() if (p / "config.json").is_file()):
            key = CHECKPOINT_PREFIX + d.name
            out[key] = ModelChoice(key, d / "config.json", d)
    for name, path in list_presets().items():
        if _runnable_preset(str(path)):
            out[name] = ModelChoice(name, Path(path), None)
    return out


@lru_cache(maxsize=64)
def _runnable_preset(path: str) -> bool:
    """Small enough for random weights in memory (cached: the accounting of a full config takes about a second)."""
    return account(load_config(path)).to_json()["params"]["total"] <= MAX_RANDOM_PARAMS


def why_not_offered(name: str) -> str | None:
    """Why the preset `name` is not among the models to run (random weights too large for this machine), with the
    way to run it (its synthetic official folder, read lazily); None for anything else."""
    path = list_presets().get(name)
    if path is None or _runnable_preset(str(path)):
        return None
    params = account(load_config(path)).to_json()["params"]["total"]
    return (f"the preset '{name}' has {params / 1e9:,.1f}B parameters: its random weights in float32 "
            f"({4 * params / 2**30:,.0f} GiB) are beyond the {MAX_RANDOM_PARAMS / 1e9:g}B-parameter limit for random "
            f"weights here. To run it, write its weights in the official FP8/FP4 layout, which the engine reads "
            f"lazily: `python -m engine quantize --synthetic {name} --out checkpoints/{name}`, then pick "
            f"checkpoint:{name}")


def card_summary(checkpoint: Path) -> str | None:
    """One line from a checkpoint's card.json (written by `python -m engine card`), or None without one."""
    try:
        card = json.loads((checkpoint / "card.json").read_text(encoding="utf-8"))
        h, works = card["heldout"], card["corpus"]["works"]
        line = (f"Trained on {len(works['train'])} works from {', '.join(s['package'] for s in card['sources'])}; "
                f"held-out loss {h['loss']:.2f} nats/token (perplexity {h['perplexity']:.0f}) against "
                f"{h['unigram_loss']:.2f} for a unigram model")
        if card.get("dspark"):
            line += f"; DSpark at T=0 accepts {card['dspark']['T=0']['mean_accepted_length']:.2f} tokens per step"
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return line + f". Model card: `{checkpoint.name}/MODEL_CARD.md`."


def service_gone(key: str) -> str | None:
    """Why the engine service of a model key ('service:host:port') is gone, or None (not a service, or there)."""
    return _GONE.get(key.removeprefix(SERVICE_PREFIX)) if key.startswith(SERVICE_PREFIX) else None


def default_model(choices: dict[str, ModelChoice]) -> str:
    """The shipped trained model when it exists, else the tiny preset with random weights."""
    trained = CHECKPOINT_PREFIX + "default"
    return trained if trained in choices else (DEFAULT_MODEL if DEFAULT_MODEL in choices else next(iter(choices)))


class EngineSlot:
    """One loaded Engine and the turn-taking around it. Generations run one at a time, so each session gets
    exactly the tokens it would get alone; a waiting session learns its place in the queue."""

    def __init__(self, engine, choice: ModelChoice, load_s: float, experts: str = "device"):
        self.engine, self.choice, self.load_s, self.experts = engine, choice, load_s, experts
        self._lock = threading.Lock()
        self._guard = threading.Lock()
        self._queue: deque[object] = deque()

    @property
    def args(self) -> ModelArgs:
        return self.engine.args

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    def waiting(self) -> int:
        with self._guard:
            return len(self._queue)

    @contextmanager
    def turn(self, on_wait=None, poll_s: float = 0.25):
        """Hold the engine for one generation; on_wait(ahead) is called while others are ahead."""
        ticket = object()
        with self._guard:
            self._queue.append(ticket)
        try:
            while True:
                with self._guard:
                    ahead = self._queue.index(ticket) + (1 if self._lock.locked() else 0)
                    mine = self._queue[0] is ticket and self._lock.acquire(blocking=False)
                    if mine:
                        self._queue.popleft()
                        break
                if on_wait is not None:
                    on_wait(ahead)
                time.sleep(poll_s)
        except BaseException:
            with self._guard:
                if ticket in self._queue:
                    self._queue.remove(ticket)
            raise
        try:
            yield self.engine
        finally:
            self._lock.release()


def load_slot(choice: ModelChoice, experts: str = "device") -> EngineSlot:
    """Build the engine (no Streamlit); the app wraps this in st.cache_resource. experts: where the routed experts
    live (Engine.load's experts: "host" keeps them in host memory and runs them on the CPU; the app runs on the CPU,
    where both placements hold the same memory and compute the same text)."""
    # torch only when a model is loaded: the pages without one stay torch-free
    import torch

    from engine.generation import Engine

    from ..inspect.profile_ahead import profile_ahead
    torch.set_num_threads(TORCH_THREADS)
    t0 = time.perf_counter()
    if choice.service:
        # loads torch as well: only when the app attaches to a service
        from engine.serving import RemoteEngine
        engine = RemoteEngine(choice.service)
    elif choice.checkpoint is None:
        engine = Engine.load(load_config(choice.config), seed=WEIGHT_SEED, experts=experts)
    else:
        engine = Engine.load(load_config(choice.config), choice.checkpoint, experts=experts)
    slot = EngineSlot(engine, choice, time.perf_counter() - t0, "device" if choice.service else experts)
    if os.environ.get("V41VIZ_PROFILE_AHEAD", "1") != "0":   # the tests' processes are too short-lived for it
        profile_ahead(slot)   # the auto DSpark schedule's table, timed while the engine is idle (once per machine)
    return slot


@st.cache_resource(max_entries=2, show_spinner=False)
def _cached_slot(key: str, config: str, checkpoint: str | None, service: str = "", experts: str = "device"
                 ) -> EngineSlot:
    return load_slot(ModelChoice(key, Path(config), None if checkpoint is None else Path(checkpoint), service),
                     experts)


def engine_slot(choice: ModelChoice, experts: str = "device") -> EngineSlot:
    """The process-wide slot for a model (and expert placement); the first session to ask loads it behind a timed
    spinner. A service's ranks hold their own placement: experts applies to models this process loads. A service
    that is not there, refuses this app's key, or ended during a request is no longer offered, and the page is
    drawn again: it runs a local model and says why (inspect_page.model_sidebar)."""
    with st.spinner(f"Loading {choice.label}: tokenizer, Engram token map, weights…", show_time=True):
        checkpoint = None if choice.checkpoint is None else str(choice.checkpoint)
        if not choice.service:
            return _cached_slot(choice.key, str(choice.config), checkpoint, "", experts)
        try:
            slot = _cached_slot(choice.key, str(choice.config), checkpoint, choice.service, "device")
        except EngineError as e:
            _GONE[choice.service] = str(e)
        else:
            if slot.engine.gone is None:
                return slot
            _GONE[choice.service] = slot.engine.gone
    st.rerun()
