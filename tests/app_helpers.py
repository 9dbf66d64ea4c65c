"""The AppTest helpers the app's page tests share: the app's entry script, the patience of a page run, and the
Inspect page opened the way a user arrives (the home page first, then the page link), with URL query values."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

TIMEOUT = 180   # seconds a page run may take: a first load of the default model on a busy 2-core machine
APP = str(Path(__file__).resolve().parents[1] / "app.py")


def inspect_page(**query) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    at.switch_page("pages/inspect.py")
    return at.run()
