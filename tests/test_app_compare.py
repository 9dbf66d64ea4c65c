"""AppTest of the compare page: two configs side by side with the differences counted and highlighted."""
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "app.py")


def test_compare_v4_and_v41():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("pages/compare.py").run()
    assert not at.exception, at.exception
    assert at.title[0].value == "Compare configs"
    assert at.selectbox(key="compare_a").value == "deepseek-v4-flash"
    assert at.selectbox(key="compare_b").value == "deepseek-v4.1-flash"
    summary = next(m.value for m in at.markdown if "sizes and mechanisms differ" in m.value)
    assert summary.startswith("**") and not summary.startswith("**0 of")
    assert any("44 of 44 positions differ" in m.value for m in at.markdown)


def test_compare_a_config_with_itself_finds_no_difference():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.switch_page("pages/compare.py").run()
    at.selectbox(key="compare_a").set_value("tiny-v4.1").run()
    at.selectbox(key="compare_b").set_value("tiny-v4.1").run()
    assert any(m.value.startswith("**0 of") for m in at.markdown)
    assert any("0 of 13 positions differ" in m.value for m in at.markdown)


def test_compare_pair_comes_from_and_goes_to_the_url():
    at = AppTest.from_file(APP, default_timeout=120).run()
    at.query_params["a"], at.query_params["b"] = "tiny-v4", "tiny-v4.1"
    at.switch_page("pages/compare.py").run()
    assert (at.selectbox(key="compare_a").value, at.selectbox(key="compare_b").value) == ("tiny-v4", "tiny-v4.1")
    at.selectbox(key="compare_b").set_value("deepseek-v4-flash-dspark").run()
    b = at.query_params["b"]
    assert (b[-1] if isinstance(b, list) else b) == "deepseek-v4-flash-dspark"
