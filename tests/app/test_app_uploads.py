"""Hostile and careless config uploads on every page with the config picker (AppTest): a clear message in the main
area, shown literally, and the page keeps working on the config it showed before (issue 16)."""
from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from engine.spec.config import ConfigError
from engine.spec.limits import CONFIG_MAX_BYTES
from engine.trace.limits import MAX_FILE_BYTES
from v41viz.ui.plain_text import literal
from v41viz.ui.sidebar import parse_upload

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")
V41 = json.loads((ROOT / "configs" / "deepseek-v4.1-flash.json").read_text())


def with_value(key: str, value, where: str = "text_config") -> bytes:
    """The V4.1-Flash config with one value changed, as uploaded bytes (json writes Infinity/NaN for floats)."""
    config = json.loads(json.dumps(V41))
    (config[where] if where else config)[key] = value
    return json.dumps(config).encode()


# (file name, bytes, what the message must say)
BAD_UPLOADS = [
    ("broken.json", b'{"dim": 64', "invalid JSON at line 1"),
    ("infinite.json", with_value("n_routed_experts", float("inf")), "'n_routed_experts' must be a finite integer"),
    ("nan.json", with_value("n_routed_experts", float("nan")), "'n_routed_experts' must be a finite integer"),
    ("experts.json", with_value("n_routed_experts", 10**7), "'n_routed_experts' is 10,000,000, above the limit"),
    ("layers.json", with_value("num_hidden_layers", 10**6), "'n_layers' is 1,000,000, above the limit"),
    ("beyond-int64.json", with_value("n_routed_experts", 10**40), "beyond the 64-bit integer range"),
    ("latin1.json", b'\xff\xfe{"dim": 64}', "not UTF-8"),
    ("huge.json", b" " * (CONFIG_MAX_BYTES + 1) + b"{}", f"at most {CONFIG_MAX_BYTES:,} bytes"),
    ("deep.json", b"[" * 200_000 + b"]" * 200_000, "nest"),
    ("<img src=x onerror=alert(1)>**bold**:red[x].json", b"[1, 2]", "top level must be a JSON object"),
    ("script.json", with_value("hidden_act", "<script>alert(1)</script>"), "is '<script>alert(1)</script>'"),
    ("key.json", with_value("<img src=x onerror=alert(1)>", 1), "unknown key '<img src=x onerror=alert(1)>'"),
]


def shown(markdown: str) -> str:
    """The text backslash-escaped markdown shows."""
    return re.sub(r"\\(.)", r"\1", markdown)


def upload(at: AppTest, name: str, data: bytes) -> AppTest:
    at.sidebar.get("file_uploader")[0].set_value((name, data, "application/json"))
    return at.run()


def test_every_bad_upload_is_refused_in_the_main_area_and_the_page_keeps_its_config():
    at = AppTest.from_file(APP, default_timeout=120)
    at.query_params["config"] = "tiny-v4.1"
    at.run()
    at.switch_page("pages/architecture.py").run()
    problems = []
    for name, data, expected in BAD_UPLOADS:
        upload(at, name, data)
        errors = [shown(e.value) for e in at.main.error]
        if at.exception or not errors or "Upload rejected" not in errors[0] or expected not in errors[0]:
            problems.append((name[:40], at.exception, errors))
        elif at.sidebar.error or at.title[0].value != "tiny-v4.1" or not at.get("bidi_component"):
            problems.append((name[:40], "the page did not keep tiny-v4.1 and its diagram", at.title[0].value))
    assert not problems, problems


def test_a_hostile_file_name_is_shown_literally_in_title_and_picker():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("pages/architecture.py").run()
    name = "<b>x</b> **bold** :red[y] $z$.json"
    upload(at, name, (ROOT / "configs" / "tiny-v4.1.json").read_bytes())
    assert not at.exception and not at.error
    title = at.title[0].value
    assert shown(title).startswith(name.removesuffix(".json") + " · V4.1 · 10 layers · 8 experts")
    assert "<b>" not in title and "**" not in title and ":red[" not in title   # every markup character is escaped
    assert at.sidebar.selectbox(key="config_widget").value.startswith("upload:" + name.removesuffix(".json") + "@")


def test_the_other_page_with_the_picker_reports_a_bad_upload_in_the_main_area():
    at = AppTest.from_file(APP, default_timeout=120).run()    # Home (Compare picks its A and B on the page)
    upload(at, "infinite.json", with_value("n_routed_experts", float("inf")))
    assert not at.exception, at.exception
    assert any("must be a finite integer" in shown(e.value) for e in at.main.error)
    assert not at.sidebar.error
    assert at.title[0].value == "v41viz"


def test_the_size_is_checked_before_parsing():
    with pytest.raises(ConfigError, match=f"at most {CONFIG_MAX_BYTES:,} bytes"):
        parse_upload("big.json", b"{" * (CONFIG_MAX_BYTES + 1))   # never reaches the JSON parser


def test_the_server_upload_cap_admits_the_largest_trace_and_little_more():
    cap_mib = tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())["server"]["maxUploadSize"]
    largest = max(MAX_FILE_BYTES.values())
    assert largest <= cap_mib * 2**20 <= 2 * largest, (cap_mib, largest)
    assert CONFIG_MAX_BYTES <= cap_mib * 2**20


def test_literal_escapes_markup_and_shows_invisible_characters():
    assert shown(literal("a*b_c [l](javascript:x) <b> :red[x] $m$")) == "a*b_c [l](javascript:x) <b> :red[x] $m$"
    assert "\\*" in literal("*") and "\\<" in literal("<")
    assert shown(literal("line\nbreak\x00")) == "line\\u000abreak\\u0000"
    assert len(shown(literal("x" * 10_000))) == 400
