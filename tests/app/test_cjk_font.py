"""The CJK webfont the app serves (scripts/build_cjk_font.py): config.toml's [[theme.fontFaces]] name files that exist,
their unicodeRanges are valid, disjoint, short and hold what each woff2 has (its cmap, read with fontTools, which
matplotlib brings, and brotli for woff2), the theme's font lists fall back to it, and it covers what the app can show:
every CJK character of the tokenizer's vocabulary, CJK punctuation, kana, the fullwidth bars and the common Hanzi."""
from __future__ import annotations

import tomllib
from functools import lru_cache

import pytest
from fontTools.ttLib import TTFont

from tests.script_helpers import ROOT, script_module

build = script_module("build_cjk_font.py")


@lru_cache(maxsize=1)
def config() -> dict:
    return tomllib.loads((ROOT / ".streamlit" / "config.toml").read_text())


@lru_cache(maxsize=1)
def faces() -> list[tuple[str, set[int]]]:
    """(url, code points of its unicodeRange) per fontFaces table of the served family."""
    tables = config()["theme"]["fontFaces"]
    assert tables and all(t["family"] == build.FAMILY for t in tables), tables
    return [(t["url"], build.parse_unicode_range(t["unicodeRange"])) for t in tables]


def covered() -> set[int]:
    return set().union(*(cps for _, cps in faces()))


def test_font_faces_are_served_files_whose_cmap_is_their_unicode_range():
    assert config()["server"]["enableStaticServing"] is True
    seen: set[int] = set()
    for url, cps in faces():
        assert url.startswith("app/static/"), url
        path = ROOT / "static" / url.removeprefix("app/static/")
        assert path.is_file(), f"{url}: {path} is missing (run scripts/build_cjk_font.py)"
        assert path.read_bytes()[:4] == b"wOF2", path
        assert set(TTFont(str(path)).getBestCmap()) <= cps, f"{path.name}: glyphs outside its unicodeRange"
        assert not cps & seen, f"{url} overlaps an earlier face"
        seen |= cps
    assert (ROOT / "static" / "fonts" / "cjk" / "OFL.txt").read_text().count("SIL OPEN FONT LICENSE Version 1.1") == 1
    total = sum((ROOT / "static" / u.removeprefix("app/static/")).stat().st_size for u, _ in faces())
    assert total < 4e6, f"the served font is {total / 1e6:.1f} MB"


def test_the_ranges_stay_small():
    """Streamlit sends the theme, every unicodeRange included, with each script run (every click)."""
    text = sum(len(t["unicodeRange"]) for t in config()["theme"]["fontFaces"])
    assert text < 2000, f"the fontFaces' unicodeRanges are {text} characters"


def test_claimed_spans_close_gaps_only_where_no_other_file_has_a_code_point():
    files = [("a", [0x10, 0x12, 0x20]), ("b", [0x15, 0x30]), ("c", [0x31, 0x40])]
    assert build.claimed_ranges(files) == {"a": [(0x10, 0x12), (0x20, 0x20)], "b": [(0x15, 0x15), (0x30, 0x30)],
                                           "c": [(0x31, 0x40)]}


def test_unicode_range_round_trip_and_refusals():
    cps = [0x2581, 0x3000, 0x3001, 0x3002, 0xFF5C, 0x4E00]
    text = build.unicode_range(sorted(cps))
    assert text == "U+2581, U+3000-3002, U+4E00, U+FF5C"
    assert build.parse_unicode_range(text) == set(cps)
    for bad in ("U+3002-3000", "3000", "U+110000", "U+30G0"):
        with pytest.raises(ValueError):
            build.parse_unicode_range(bad)


def test_theme_fonts_fall_back_to_the_served_family_after_the_system_cjk_fonts():
    for key, system_cjk in (("font", "Noto Sans CJK SC"), ("codeFont", "Noto Sans Mono CJK SC")):
        names = [n.strip() for n in config()["theme"][key].split(",")]
        assert names.index(system_cjk) < names.index(build.FAMILY) < len(names) - 1, names


def test_covers_punctuation_kana_fullwidth_bars_and_the_common_hanzi():
    want = {0x2581, 0xFF5C, *range(0x3001, 0x3004), *range(0x3041, 0x3097), *range(0x30A1, 0x30FB),
            *range(0xFF01, 0xFF5F)}
    want |= {ord(ch) for ch in build.common_chars() if build.is_cjk(ch)}
    assert len(want) > 6763 + 2350
    assert not want - covered(), "".join(map(chr, sorted(want - covered())))[:200]


@pytest.mark.slow  # loads the 129,280-id tokenizer and decodes every token [~3 s]
def test_covers_every_cjk_character_of_the_tokenizer_vocabulary():
    vocabulary = {ord(ch) for ch in build.vocabulary_cjk_chars()}
    assert len(vocabulary) > 5000
    assert {0xFF5C, 0x2581} <= vocabulary    # the bars and `▁` of `<｜begin▁of▁sentence｜>`
    assert not vocabulary - covered(), "".join(map(chr, sorted(vocabulary - covered())))[:200]
