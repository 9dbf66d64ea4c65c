"""A generation that runs in its own thread, so that it survives the page that started it: a rerun, a widget
change or a visit to another page only stops the page from watching; Stop (or a new Generate) ends it."""
from __future__ import annotations

import sys
import threading
import time
import traceback

from engine.spec.errors import EngineError

from .engine_run import generate_into
from .run import GenSettings, LiveRun, StopRequested
from .run_store import RunStore, RunWriter
from .trace_model import record_texts


def start(slot, settings: GenSettings, run: LiveRun, store: RunStore | None = None) -> threading.Thread:
    """Run the generation in a daemon thread: wait for the engine's turn, generate into `run` (its status,
    phase and text change as it goes), and end as done, stopped or error. The thread touches no Streamlit
    state; pages read `run` as they please. store: keep the run there as it goes (its tokens as they come, the
    whole trace at the end), so that it outlives the session; run.store_id is its id."""
    run.max_new_tokens, run.phase = settings.max_new_tokens, "queued"
    writer = _begin(store, run)

    def waiting(ahead: int) -> None:
        run.ahead = ahead
        if run.stop_requested.is_set():
            raise StopRequested

    def on_piece(r: LiveRun, _piece: str) -> None:
        if writer is not None:
            _saving(writer.tokens)
        if r.stop_requested.is_set():
            raise StopRequested

    def body() -> None:
        try:
            with slot.turn(waiting, poll_s=0.05) as engine:
                try:
                    generate_into(engine, settings, run, on_piece)
                finally:
                    record_texts(run.trace, engine.tokenizer.token_text)
        except StopRequested:
            run.status, run.stopped_by = "stopped", "you"
        except EngineError as e:  # e.g. a prompt longer than the model's context
            run.status, run.message = "error", str(e)
        except Exception as e:  # a bug: say so on the page (and in the server log) instead of losing the run
            traceback.print_exc(file=sys.stderr)
            run.status, run.message = "error", f"The generation failed unexpectedly: {type(e).__name__}: {e}"
        finally:
            run.elapsed_s = time.perf_counter() - run.started
            run.trace.meta["finish"] = run.finish if run.status == "done" else run.status
            if writer is not None:
                _saving(lambda: writer.finish(run.status))
            run.phase, run.finished_at = "", time.perf_counter()

    thread = threading.Thread(target=body, name=f"inspect-run-{run.serial}", daemon=True)
    run.thread = thread
    thread.start()
    return thread


def _begin(store: RunStore | None, run: LiveRun) -> RunWriter | None:
    if store is None:
        return None
    writer = _saving(lambda: store.begin(run.trace, run.model))
    run.store_id = writer.run_id if writer is not None else ""
    return writer


def _saving(write):
    """A run-store write; a full disk or an unwritable folder costs the stored copy, never the run itself."""
    try:
        return write()
    except (OSError, EngineError) as e:
        print(f"run store: {type(e).__name__}: {e}", file=sys.stderr)
        return None


def stop(run: LiveRun, wait_s: float = 30.0) -> None:
    """Ask a running generation to stop after its current step, and wait (bounded) until it has."""
    run.stop_requested.set()
    if run.thread is not None:
        run.thread.join(wait_s)
