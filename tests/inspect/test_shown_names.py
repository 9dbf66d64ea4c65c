"""Names the app shows or saves (issue 45): a saved trace named by model, prompt and time; a checkpoint named
without the server's path; a failed load that names its file once."""
from __future__ import annotations

import re

from v41viz.inspect.export import FORMATS, download_name
from v41viz.ui.engine_session import ROOT, shown_source
from v41viz.ui.plain_text import load_failure


def test_a_saved_trace_is_named_by_model_prompt_and_time_in_safe_characters():
    names = {fmt: download_name("checkpoint:default", "Hello 世界 / ..\\ <x>", 1_700_000_000, fmt) for fmt in FORMATS}
    assert names["json"] == "checkpoint-default_Hello-x_20231114-221320.json"
    assert names["parquet"].endswith(".parquet.zip") and names["safetensors"].endswith(".safetensors")
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", n) for n in names.values())
    assert download_name("tiny-v4.1", "世界", 0, "json") == "tiny-v4.1_prompt_19700101-000000.json"
    assert len(download_name("m", "x" * 500, 0, "json")) < 80


def test_a_checkpoint_is_shown_without_the_servers_path():
    assert shown_source(f"checkpoint {ROOT}/checkpoints/default") == "checkpoint checkpoints/default"
    assert shown_source("checkpoint /srv/models/v41, split over 2 ranks") == "checkpoint v41, split over 2 ranks"
    assert shown_source("random init (seed 0)") == "random init (seed 0)"


def test_a_failed_load_names_the_file_once():
    error = ValueError("bad_trace.json: not a readable v41viz trace (JSONDecodeError)")
    assert load_failure("bad_trace.json", error) == \
        "Could not load bad_trace.json: not a readable v41viz trace (JSONDecodeError)"
    assert load_failure("x.json", ValueError("unknown format")) == "Could not load x.json: unknown format"
