"""GenerationRequest and SamplingParams: every bad value is refused at construction, naming its field; good values
are kept in one canonical form; the package loads without torch."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from engine.request import MAX_SEED, GenerationRequest, SamplingParams
from engine.request.interventions import Intervention
from engine.spec.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("field, value, message", [
    ("temperature", -1, "temperature must be a finite number >= 0"),
    ("temperature", float("nan"), "temperature must be a finite number >= 0"),
    ("temperature", float("inf"), "temperature must be a finite number >= 0"),
    ("temperature", True, "temperature must be a finite number >= 0"),
    ("temperature", "1", "temperature must be a finite number >= 0"),
    ("temperature", 1e-5, "temperature 1e-05 is below 0.0001"),
    ("top_k", -1, "top_k must be a non-negative integer"),
    ("top_k", 2.5, "top_k must be a non-negative integer"),
    ("top_k", True, "top_k must be a non-negative integer"),
    ("top_p", 0.0, "top_p must lie in (0, 1]"),
    ("top_p", 1.5, "top_p must lie in (0, 1]"),
    ("top_p", float("nan"), "top_p must lie in (0, 1]"),
    ("repetition_penalty", 0.0, "repetition_penalty must be a finite number > 0"),
    ("repetition_penalty", -1.2, "repetition_penalty must be a finite number > 0"),
    ("repetition_penalty", float("inf"), "repetition_penalty must be a finite number > 0"),
    ("repetition_penalty", "1.2", "repetition_penalty must be a finite number > 0"),
    ("no_repeat_ngram", -1, "no_repeat_ngram must be a non-negative integer"),
    ("no_repeat_ngram", 2.0, "no_repeat_ngram must be a non-negative integer"),
    ("no_repeat_ngram", True, "no_repeat_ngram must be a non-negative integer"),
    ("seed", -1, "the seed of row 0 is -1, outside 0..2**63-1"),
    ("seed", MAX_SEED + 1, f"the seed of row 0 is {MAX_SEED + 1}, outside 0..2**63-1"),
    ("seed", [0, 2**64], f"the seed of row 1 is {2**64}, outside 0..2**63-1"),
    ("seed", "3", "seed must be an integer"),
    ("seed", 1.5, "seed must be an integer"),
    ("seed", [1, 2.5], "seed must be an integer"),
    ("seed", True, "seed must be an integer"),
])
def test_bad_sampling_values_are_refused_by_name(field, value, message):
    with pytest.raises(InputError) as e:
        SamplingParams(**{field: value})
    assert message in str(e.value)
    with pytest.raises(InputError) as flat:          # the flat form checks the same way
        GenerationRequest.of(4, **{field: value})
    assert message in str(flat.value)


@pytest.mark.parametrize("field, value, message", [
    ("max_new_tokens", -1, "max_new_tokens must be a non-negative integer"),
    ("max_new_tokens", 2.0, "max_new_tokens must be a non-negative integer"),
    ("max_new_tokens", None, "max_new_tokens must be a non-negative integer"),
    ("max_new_tokens", True, "max_new_tokens must be a non-negative integer"),
    ("sampling", {"temperature": 1.0}, "sampling must be a SamplingParams"),
    ("stop_tokens", "1", "stop_tokens must be a list of token ids"),
    ("stop_tokens", 1, "stop_tokens must be a list of token ids"),
    ("stop_tokens", [1.5], "stop_tokens must be token ids"),
    ("interventions", "engram-off:1", "interventions must be a list of interventions"),
    ("interventions", ["no-such-kind:1"], "unknown kind 'no-such-kind'"),
    ("interventions", [3], "an intervention must be text"),
    ("cuda_graphs", 1, "cuda_graphs must be True or False"),
    ("compiled", "yes", "compiled must be True or False"),
])
def test_bad_request_values_are_refused_by_name(field, value, message):
    settings = {"max_new_tokens": 4, field: value}
    with pytest.raises(InputError) as e:
        GenerationRequest(**settings)
    assert message in str(e.value)


def test_good_values_take_one_canonical_form():
    sampling = SamplingParams(1, top_p=1, repetition_penalty=2, seed=[3, 4])
    assert (sampling.temperature, sampling.top_p, sampling.repetition_penalty, sampling.seed) == (1.0, 1.0, 2.0, (3, 4))
    assert type(sampling.temperature) is float and not sampling.greedy and sampling.uses_history
    request = GenerationRequest(4, sampling, stop_tokens=[1, 2], interventions=["ban-expert:3:5@12"])
    assert request.stop_tokens == (1, 2)
    assert request.interventions == (Intervention("ban-expert", 3, 5, 12, 12),)
    assert request == GenerationRequest.of(4, temperature=1, repetition_penalty=2, seed=(3, 4), stop_tokens=(1, 2),
                                           interventions=[Intervention("ban-expert", 3, 5, 12, 12)])
    greedy = GenerationRequest.greedy(7)
    assert greedy.max_new_tokens == 7 and greedy.sampling.greedy and greedy.dspark is None and greedy.trace is None
    assert greedy.stop_tokens == (1,) and not greedy.graphed and replace(greedy, compiled=True).graphed
    assert greedy.with_sampling(seed=5).sampling == SamplingParams(seed=5)
    with pytest.raises(InputError, match="top_p"):
        greedy.with_sampling(top_p=2.0)


def test_the_request_package_loads_without_torch():
    code = ("import sys, engine.request, engine.request.decoding, engine.request.interventions, "
            "engine.request.schedules; print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr
