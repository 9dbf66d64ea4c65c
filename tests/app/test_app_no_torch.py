"""The Architecture, Compare (both tabs, before a run) and Home pages never import torch (issue 18): built in a fresh
process, with a module selected whose engine source the details show, torch stays out of sys.modules."""
from __future__ import annotations

import json

import pytest

from tests.bounded import run_python

# builds three pages under AppTest in a fresh process to watch sys.modules [6 s idle, 13 s loaded]
pytestmark = pytest.mark.slow

CHILD = r"""
import json, sys
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("app.py", default_timeout=120)
at.query_params["config"] = "tiny-v4.1"
at.run()
at.switch_page("pages/architecture.py").run()
at.selectbox(key="arch_node").set_value("layers.4.attn").run()
sources = [e.label for e in at.expander if e.label.startswith("Engine source")]
at.switch_page("pages/compare.py").run()
at.session_state["compare_view"] = "Runs"   # the Runs tab's pickers, before a run
at.run()
runs = [s.key for s in at.selectbox if s.key.startswith("compare_runs_")]
at.switch_page("app.py").run()
print(json.dumps({"exception": [str(e.value) for e in at.exception], "sources": sources, "runs": runs,
                  "torch": sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))[:5]}))
"""


def test_pages_without_a_model_never_import_torch():
    result = run_python(CHILD, timeout_s=120)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert not seen["exception"], seen["exception"]
    assert any("engine.model.attention.Attention" in s for s in seen["sources"]), seen["sources"]
    assert seen["runs"] == ["compare_runs_a", "compare_runs_b"], seen["runs"]
    assert seen["torch"] == [], seen["torch"]
