"""The home page renders and links every page."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parents[2]


def test_home_page_renders_and_links_all_pages():
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=60).run()
    assert not at.exception
    assert at.title[0].value == "v41viz"
    source = (ROOT / "app.py").read_text()
    for page in sorted((ROOT / "pages").glob("*.py")):
        assert f'"pages/{page.name}"' in source, f"app.py does not link {page}"
