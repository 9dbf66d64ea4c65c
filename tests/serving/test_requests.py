"""The service's request checks (engine.serving.schema, then the typed API): every malformed request is refused
with an InputError naming its field, before any rank would see it."""
from __future__ import annotations

import json
import re

import pytest

from engine.serving.protocol import request_from_json
from engine.serving.schema import MAX_ROWS, parse_request
from engine.spec.errors import InputError

GOOD = {"op": "generate", "prompts": [[0, 5]], "max_new_tokens": 2, "settings": {}, "dspark": None, "trace": None}


def refused(message) -> str:
    data = message if isinstance(message, bytes) else json.dumps(message).encode()
    with pytest.raises(InputError) as e:
        request_from_json(parse_request(data))
    return str(e.value)


@pytest.mark.parametrize("change, field", [
    ({"settings": {"bogus": 1}}, "settings.bogus: unknown field"),
    ({"settings": {"temperature": "hot"}}, "settings.temperature: expected a number"),
    ({"settings": {"top_k": 1.5}}, "settings.top_k: expected an integer"),
    ({"settings": {"seed": [1, "x"]}}, r"settings.seed\[1\]: expected"),
    ({"settings": {"cuda_graphs": 1}}, "settings.cuda_graphs: expected true or false"),
    ({"settings": {"interventions": "ban-expert:3:5"}}, "settings.interventions: expected a list"),
    ({"settings": {"temperature": -1.0}}, "settings: .*temperature"),
    ({"settings": []}, "settings: expected an object"),
    ({"prompts": [[0, "5"]]}, r"prompts\[0\]\[1\]: expected an integer"),
    ({"prompts": []}, "prompts: expected 1 to"),
    ({"prompts": [[0]] * (MAX_ROWS + 1)}, f"prompts: expected 1 to {MAX_ROWS} prompts, got {MAX_ROWS + 1}"),
    ({"prompts": "hello"}, "prompts: expected a list"),
    ({"max_new_tokens": None}, "max_new_tokens: expected an integer"),
    ({"max_new_tokens": True}, "max_new_tokens: expected an integer, got true"),
    ({"max_new_tokens": -1}, "settings: generate: max_new_tokens"),
    ({"path": "/etc/passwd"}, "path: unknown field"),
    ({"dspark": {"schedule": "auto"}}, "dspark: .*'auto' profiles one process"),
    ({"dspark": {"schedule": "all", "threshold": 2.0}}, "dspark: DSpark threshold"),
    ({"dspark": {"schedule": "all", "tresh": 0.5}}, "dspark.tresh: unknown field"),
    ({"trace": {"budget": {}, "meta": {}, "path": "/tmp/x"}}, "trace.path: unknown field"),
    ({"trace": {"budget": {}}}, "trace.meta: missing"),
    ({"trace": {"budget": {"attention": "all"}, "meta": {}}}, "trace.budget.attention: expected true or false or a "
                                                                "list"),
    ({"trace": {"budget": {"max_tokens": -3}, "meta": {}}}, "trace.budget: TraceBudget.max_tokens"),
])
def test_a_malformed_generate_request_is_refused_naming_its_field(change, field):
    message = refused({**GOOD, **change})
    assert re.match(field, message), message


@pytest.mark.parametrize("data, message", [
    (b"\xff\xfe", "the request is not JSON"),
    (b'{"op": "generate", ', "the request is not JSON"),
    (b"[" * 100_000 + b"]" * 100_000, "the request is not JSON (RecursionError"),
    (b'{"op": "generate", "prompts": [[0]], "max_new_tokens": 2, "settings": {"temperature": NaN}}', "NaN"),
    (b'["op", "hello"]', "a request must be a JSON object, got a list"),
    (b'{"op": "format_disk"}', 'op: expected one of hello, generate, shutdown, got "format_disk"'),
    (b'{"token": [0, 1, {}]}', "op: expected one of"),
    (b'{"op": "shutdown", "now": true}', "now: unknown field"),
    (b'{"op": "generate"}', "prompts: missing"),
])
def test_a_message_that_is_not_a_request_is_refused(data, message):
    assert message in refused(data)


def test_a_trace_budget_without_attention_takes_the_default():
    trace = {"budget": {"max_tokens": 5, "layers": [0, "layers.1"]}, "meta": {"prompt": "hi"}}
    request = request_from_json(parse_request(json.dumps({**GOOD, "trace": trace}).encode()))
    assert request.trace.budget.attention is False and request.trace.budget.layers == {"layers.0", "layers.1"}
    assert request.trace.meta == {"prompt": "hi"}


def test_a_well_formed_request_becomes_its_generation_request():
    request = request_from_json(parse_request(json.dumps(
        {**GOOD, "settings": {"temperature": 0.7, "seed": 3, "stop_tokens": [1]},
         "dspark": {"schedule": "threshold", "threshold": 0.3, "early_stop": True,
                    "confidence_temperature": None}}).encode()))
    assert request.max_new_tokens == 2 and request.sampling.temperature == 0.7 and request.sampling.seed == 3
    assert request.stop_tokens == (1,) and request.dspark.schedule == "threshold" and request.trace is None
