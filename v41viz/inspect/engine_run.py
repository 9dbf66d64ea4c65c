"""One Inspect generation run on an engine: the request its settings make, its DSpark config, the streaming loop."""
from __future__ import annotations

import time
from collections.abc import Callable

from engine.dspark.config import DSparkConfig
from engine.dspark.profile import load_or_profile
from engine.generation import Engine, StepInfo, TextStream
from engine.request import GenerationRequest, SamplingParams
from engine.spec.errors import InputError
from engine.trace import Trace

from .run import GenSettings, LiveRun, StopRequested


def generation_request(settings: GenSettings, dspark: DSparkConfig | None, trace: Trace | None) -> GenerationRequest:
    """The engine request of the Inspect settings (checked by GenSettings.check)."""
    sampling = SamplingParams(settings.temperature, settings.top_k, settings.top_p, settings.repetition_penalty,
                              settings.no_repeat_ngram, settings.seed)
    return GenerationRequest(settings.max_new_tokens, sampling, dspark=dspark, interventions=settings.interventions,
                             trace=trace)


def dspark_config(engine: Engine, settings: GenSettings, run: LiveRun | None = None) -> DSparkConfig | None:
    """The DSparkConfig of the settings, or None when DSpark is off. The auto schedule needs this machine's
    throughput table: read, or profiled once and stored; the run's phase and progress say which."""
    if not settings.dspark:
        return None
    if settings.schedule != "auto":
        return DSparkConfig.from_settings(settings.schedule, settings.threshold, engine.model)
    if engine.model is None:  # an engine service: its weights live in the ranks, not in this process
        raise InputError("the auto DSpark schedule profiles the model in this process, but this engine runs as a "
                         "service (its ranks hold the weights): pick the all or threshold schedule")
    t0 = time.perf_counter()

    def progress(done: int, total: int) -> None:
        if run is not None:
            run.phase, run.profiled = "profiling", (done, total)
            if run.stop_requested.is_set():
                raise StopRequested
    if run is not None:
        run.phase = "schedule"
    table = load_or_profile(engine.model, on_progress=progress)
    if run is not None and run.phase == "profiling":
        run.profile_s = time.perf_counter() - t0
    return DSparkConfig("auto", threshold=settings.threshold, sps=table)


def generate_into(engine: Engine, settings: GenSettings, run: LiveRun,
                  on_piece: Callable[[LiveRun, str], None]) -> None:
    """Generate with the run's trace; on_piece(run, text) after each decoded piece. Updates run in place, so
    an interrupted generation (the Stop button) leaves what it produced."""
    ids = [engine.encode_prompt(settings.prompt)]
    stream = TextStream(engine.tokenizer)
    dspark = dspark_config(engine, settings, run)
    run.phase = "prefill"

    def on_token(_row: int, token: int, _info: StepInfo) -> None:
        run.phase = "decoding"
        run.n_tokens += 1
        run.elapsed_s = time.perf_counter() - run.started
        if run.first_token_s is None:
            run.first_token_s = run.elapsed_s
        piece = stream.push(token)
        run.text += piece
        on_piece(run, piece)

    result = engine.generate(ids, generation_request(settings, dspark, run.trace), on_token=on_token)
    run.elapsed_s = time.perf_counter() - run.started
    run.finish, run.status = result.finish_reasons[0], "done"


