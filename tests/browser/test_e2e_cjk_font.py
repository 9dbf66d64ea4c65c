"""End-to-end: CJK text is drawn with the webfont the app serves (scripts/build_cjk_font.py) on a machine without a CJK
font, and the font costs a page without CJK text nothing. Chromium runs on a fontconfig set-up that holds only the
system's DejaVu and Liberation fonts, so whatever the test machine has installed, no local font can draw the text."""
from __future__ import annotations

import subprocess
import tomllib

import pytest
from playwright.sync_api import sync_playwright

from tests.browser_helpers import settled
from tests.conftest import CHROMIUM, CHROMIUM_ARGS
from tests.script_helpers import script_module

# a fresh server, the Home page, then the Inspect page's engine load [~40 s under load]
pytestmark = pytest.mark.slow

BUILD = script_module("build_cjk_font.py")
FAMILY = BUILD.FAMILY
PROMPT = "你好，世界。<｜User｜>カタカナ"
FONTS_JS = """(family) => [...document.fonts].filter(f => f.family.replace(/"/g, '') === family)
    .map(f => [f.unicodeRange, f.status])"""
WOFF2_JS = """() => performance.getEntriesByType('resource').map(e => e.name)
    .filter(n => n.includes('/app/static/fonts/cjk/')).map(n => n.split('/').pop()).sort()"""


def slices_of(text: str) -> set[str]:
    """The served files whose unicodeRange (in .streamlit/config.toml) holds a character of `text`."""
    tables = tomllib.loads(BUILD.CONFIG.read_text())["theme"]["fontFaces"]
    return {t["url"].split("/")[-1] for t in tables for ch in text
            if ord(ch) in BUILD.parse_unicode_range(t["unicodeRange"])}


def _find(node: dict, match) -> dict:
    """The first node of a DOM.getDocument tree (shadow roots included) that `match`es."""
    if match(node):
        return node
    for child in node.get("children", []) + node.get("shadowRoots", []):
        if (found := _find(child, match)) is not None:
            return found
    return None


@pytest.fixture(scope="module")
def latin_only_env(tmp_path_factory) -> dict[str, str]:
    """A fontconfig configuration of /usr/share/fonts/truetype alone (DejaVu, Liberation: no CJK), checked."""
    folder = tmp_path_factory.mktemp("fontconfig")
    conf = folder / "fonts.conf"
    conf.write_text('<?xml version="1.0"?>\n<!DOCTYPE fontconfig SYSTEM "fonts.dtd">\n<fontconfig>\n'
                    f"  <dir>/usr/share/fonts/truetype</dir>\n  <cachedir>{folder / 'cache'}</cachedir>\n"
                    "</fontconfig>\n")
    env = {"FONTCONFIG_FILE": str(conf)}
    listed = subprocess.run(["fc-list", ":lang=zh"], capture_output=True, text=True, env=env, check=True).stdout
    assert listed.strip() == "", f"the test's fontconfig still lists CJK fonts: {listed}"
    return env


def test_cjk_prompt_uses_the_served_font_and_a_latin_page_loads_none(server, latin_only_env, screenshots):
    base, _ = server
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, env=latin_only_env)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(60_000)
        page.goto(base + "/")
        page.get_by_role("heading").first.wait_for(timeout=90_000)
        settled(page)
        faces = page.evaluate(FONTS_JS, FAMILY)
        assert len(faces) > 10, faces   # the theme's fontFaces reached the page ...
        assert page.evaluate(WOFF2_JS) == [], "a page without CJK text downloaded the CJK font"   # ... unloaded

        page.goto(base + "/inspect")
        prompt = page.get_by_label("Prompt")
        prompt.fill(PROMPT)
        page.wait_for_function("(family) => [...document.fonts].some(f => f.family.replace(/\"/g, '') === family "
                               "&& f.status === 'loaded')", arg=FAMILY, timeout=30_000)
        page.evaluate("() => document.fonts.ready")
        page.wait_for_timeout(500)
        # The slices whose ranges hold the prompt's characters (symbols for ，。｜, kana, the Han ones of 你好世界),
        # and not Hangul or every Han slice.
        loaded = set(page.evaluate(WOFF2_JS))
        assert slices_of(PROMPT) <= loaded and "hangul.woff2" not in loaded, loaded
        assert len([name for name in loaded if name.startswith("han")]) < 6, loaded
        statuses = dict(page.evaluate(FONTS_JS, FAMILY))
        assert "loaded" in statuses.values() and "unloaded" in statuses.values(), statuses

        # What Chromium drew the prompt's glyphs with: the served subset (a web font, its internal name Noto Sans
        # CJK SC), since no local font of this fontconfig has them.
        cdp = page.context.new_cdp_session(page)
        cdp.send("DOM.enable")
        cdp.send("CSS.enable")
        textarea = _find(cdp.send("DOM.getDocument", {"depth": -1, "pierce": True})["root"],
                         lambda n: n["nodeName"] == "TEXTAREA" and "Prompt" in n.get("attributes", []))
        editor = _find(textarea["shadowRoots"][0], lambda n: n["nodeName"] == "DIV" and "pseudo" not in
                       n.get("attributes", []))   # the user-agent box that holds the typed text (not the placeholder)
        fonts = cdp.send("CSS.getPlatformFontsForNode", {"nodeId": editor["nodeId"]})["fonts"]
        served = [f for f in fonts if f["isCustomFont"] and "CJK" in f["familyName"]]
        assert served and sum(f["glyphCount"] for f in served) >= len("你好，世界。｜｜カタカナ"), fonts
        assert not [f for f in fonts if not f["isCustomFont"] and f["glyphCount"] > 0 and "CJK" in f["familyName"]]
        prompt.screenshot(path=str(screenshots / "cjk_font_prompt.png"))
        browser.close()
