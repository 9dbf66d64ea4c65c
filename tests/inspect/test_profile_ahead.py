"""The auto schedule's table is profiled in the background when the app loads a model with a drafter, stored in the
user's cache folder, and not profiled again (by a restart: another process) once stored; a generation that wants the
engine stops the profile, which then starts again when the engine is idle."""
import time
from pathlib import Path

import pytest

from engine.dspark import profile
from v41viz.inspect import profile_ahead as ahead
from v41viz.ui.engine_session import EngineSlot, ModelChoice

pytestmark = pytest.mark.slow  # loads tiny-v4.1 and profiles it [~3 s each once the kernels are built]


def test_the_cache_folder_is_the_users_and_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.delenv("V41VIZ_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert profile.user_cache_dir() == tmp_path / "v41viz"
    monkeypatch.setenv("V41VIZ_CACHE_DIR", str(tmp_path / "mine"))
    assert profile.user_cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.delenv("V41VIZ_CACHE_DIR")
    assert profile.user_cache_dir() == Path.home() / ".cache" / "v41viz"


def _slot(monkeypatch, tmp_path):
    from engine.generation import Engine
    from engine.spec.config import load_config
    from engine.spec.presets import list_presets
    monkeypatch.setattr(profile, "CACHE_DIR", tmp_path)
    monkeypatch.setattr(profile.profile_and_store, "__defaults__", (tmp_path,))
    monkeypatch.setattr(profile.stored_table, "__defaults__", (tmp_path,))
    small = dict(max_batch=1, repeats=1, context=4)
    real = profile.profile_throughput
    monkeypatch.setattr(profile, "profile_throughput", lambda model, **kw: real(model, **(kw | small)))
    engine = Engine.load(load_config(list_presets()["tiny-v4.1"]), seed=0)
    return EngineSlot(engine, ModelChoice("tiny-v4.1", Path(list_presets()["tiny-v4.1"]), None), 0.0)


def test_the_table_is_profiled_in_the_background_once(monkeypatch, tmp_path):
    slot = _slot(monkeypatch, tmp_path)
    monkeypatch.setattr(ahead, "IDLE_BEFORE_S", 0.1)
    thread = ahead.profile_ahead(slot)
    assert thread is not None
    thread.join(600)   # a fresh process may build the CPU kernels first
    assert not thread.is_alive()
    stored = profile.stored_table(slot.engine.model)
    assert stored is not None and stored.meta["key"]["cpu"] == profile.cpu_model()
    assert ahead.profile_ahead(slot) is None      # stored: nothing to do
    # a restart reads the file again (stored_table reads the disk each time): it is the user cache folder's
    assert profile.table_path(slot.engine.model, tmp_path).exists()


def test_a_generation_stops_the_profile_which_resumes_when_idle(monkeypatch, tmp_path):
    slot = _slot(monkeypatch, tmp_path)
    monkeypatch.setattr(ahead, "IDLE_POLL_S", 0.05)
    monkeypatch.setattr(ahead, "IDLE_BEFORE_S", 0.1)
    tries = []
    real = profile.profile_and_store

    def counted(model, *a, **kw):
        tries.append(time.perf_counter())
        if len(tries) == 1:
            slot._queue.append("a generation")      # it asks for the turn while the profile holds it
            try:
                return real(model, *a, **kw)
            finally:
                slot._queue.remove("a generation")
        return real(model, *a, **kw)

    monkeypatch.setattr(ahead, "profile_and_store", counted)
    thread = ahead.profile_ahead(slot)
    thread.join(600)   # a fresh process may build the CPU kernels first
    assert len(tries) == 2 and profile.stored_table(slot.engine.model) is not None
