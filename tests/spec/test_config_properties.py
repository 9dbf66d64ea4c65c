"""Property-based tests (hypothesis) of the config reader (issue 46): any JSON text, and any real config with keys
changed, dropped or added, ends in a ModelArgs or a ConfigError naming the problem — never another exception — in
bounded time."""
from __future__ import annotations

import json
import time
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engine.spec.config import FIELD_TYPES, ModelArgs, config_from_text
from engine.spec.errors import ConfigError

CONFIGS = {name: json.loads(Path(f"configs/{name}.json").read_text())
           for name in ("tiny-v4.1", "tiny-v4", "deepseek-v4.1-flash")}   # flat V4.1 and V4, the HF composite form
# no per-example deadline (the first example builds hypothesis's Unicode tables), no example database
PROPERTY = settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
CASE_MAX_S = 2.0   # one config, however hostile: ~1 ms when refused, ~2-30 ms when it describes a model
MESSAGE_MAX_CHARS = 600

json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=30)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4) |
                           st.dictionaries(st.text(max_size=12), inner, max_size=4), max_leaves=12)
# values near what the keys take: small and large integers, short lists of them
near_values = st.integers(-3, 300) | st.sampled_from([0, 1, 4, 128, 2**31, 10**12]) | \
    st.lists(st.integers(-1, 12), max_size=14) | json_values


def outcome(text: str) -> ModelArgs | ConfigError:
    start = time.perf_counter()
    try:
        result = config_from_text(text, source="c.json")
    except ConfigError as e:
        result = e
    assert time.perf_counter() - start < CASE_MAX_S
    if isinstance(result, ConfigError):
        message = str(result)
        assert message.startswith("c.json: ") and len(message) <= MESSAGE_MAX_CHARS, message[:800]
    return result


@PROPERTY
@given(json_values)
def test_any_json_is_a_config_or_a_config_error(value):
    outcome(json.dumps(value))


@PROPERTY
@given(st.binary(max_size=200))
def test_any_bytes_are_a_config_or_a_config_error(data):
    try:
        config_from_text(data, source="c.json")
    except ConfigError as e:
        assert str(e).startswith("c.json: ")


@PROPERTY
@given(st.sampled_from(sorted(CONFIGS)),
       st.lists(st.tuples(st.sampled_from(sorted(FIELD_TYPES) + ["hidden_size", "kv_source_layer_ids", "x"]),
                          near_values), min_size=1, max_size=4),
       st.lists(st.integers(0, 200), max_size=2))
def test_a_real_config_with_keys_changed_or_dropped_loads_or_is_refused(name, changes, drops):
    config = json.loads(json.dumps(CONFIGS[name]))
    target = config.get("text_config", config)
    for i in drops:
        target.pop(sorted(target)[i % len(target)], None)
    for key, value in changes:
        target[key] = value
    result = outcome(json.dumps(config))
    if isinstance(result, ModelArgs):
        assert len(result.roles) == len(result.compress_ratios)   # an accepted config can be described
