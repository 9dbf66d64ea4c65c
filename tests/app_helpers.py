"""The AppTest helpers the app's page tests share: the app's entry script, the patience of a page run, and a page
opened the way a user arrives (the home page first, then the page link), with URL query values."""
from __future__ import annotations

from pathlib import Path

from streamlit.testing.v1 import AppTest

TIMEOUT = 180   # seconds a page run may take: a first load of the default model on a busy 2-core machine
APP = str(Path(__file__).resolve().parents[1] / "app.py")


def open_page(page: str, timeout: float = TIMEOUT, **query) -> AppTest:
    """`page` (e.g. "pages/architecture.py") reached as a user reaches it: the home page with the URL's query values
    first, then the page link."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    at.switch_page(page)
    return at.run()


def inspect_page(**query) -> AppTest:
    return open_page("pages/inspect.py", **query)


def architecture_page(**query) -> AppTest:
    return open_page("pages/architecture.py", **query)
