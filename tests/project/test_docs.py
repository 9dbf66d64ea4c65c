"""The docs hold together: every relative link and anchor resolves, every topic file is reachable from the README,
the README stays a front door, the limits list is the `engine limits` output, and the Python examples run."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [ROOT / "README.md", *DOCS]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ *```.*?^ *```", re.DOTALL | re.MULTILINE)
PYTHON_BLOCK = re.compile(r"^( *)```python\n(.*?)^\1```", re.DOTALL | re.MULTILINE)   # indented in a list item too
README_MAX_LINES = 250


def prose(path: Path) -> str:
    """The page without its fenced code blocks (a link inside one is an example, not a link)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, each space a hyphen."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a page's headings; a repeated heading gets -1, -2, ... as on GitHub."""
    found, count = set(), {}
    for line in prose(path).splitlines():
        if m := re.match(r"#{1,6} (.+)", line):
            base = slug(m.group(1))
            n = count.get(base, 0)
            count[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
    return found


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"[a-z]+:", t)]


def test_slug_follows_github():
    assert slug("torch.compile (opt-in)") == "torchcompile-opt-in"
    assert slug("DeepSeek's official layout (FP8 / FP4)") == "deepseeks-official-layout-fp8--fp4"
    assert slug("CPU kernels (C++)") == "cpu-kernels-c"


def broken_links(page: Path) -> list[str]:
    broken = []
    for target in relative_links(page):
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.is_file():
            broken.append(f"{page.name}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{page.name}: {target} (no heading with that anchor)")
    return broken


def test_broken_links_are_found(tmp_path):
    (tmp_path / "b.md").write_text("# B\n\n## Two words\n\n## Two words\n", encoding="utf-8")
    page = tmp_path / "a.md"
    page.write_text("# A\n[ok](b.md#two-words) [ok](b.md#two-words-1) [ok](#a) [web](https://example.org)\n"
                    "[gone](c.md) [bad anchor](b.md#three) ![gone](c.png)\n```\n[example](nowhere.md)\n```\n",
                    encoding="utf-8")
    assert broken_links(page) == ["a.md: c.md (no such file)", "a.md: b.md#three (no heading with that anchor)",
                                  "a.md: c.png (no such file)"]


def test_every_relative_link_points_to_an_existing_file_and_anchor():
    broken = [line for page in PAGES for line in broken_links(page)]
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    assert not [p.name for p in DOCS if p.resolve() not in linked]


def test_readme_stays_a_front_door():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines: move reference material into docs/"


def test_input_limits_list_is_the_limits_command_output():
    from engine.commands.limits import lines
    limits_page = (ROOT / "docs" / "limits.md").read_text(encoding="utf-8")
    assert "\n".join(lines()) in limits_page, ("re-run `python -m engine limits` "
                                               "and paste its output into docs/limits.md")


def test_python_examples_run_as_written(monkeypatch):
    """Every ```python block of the README and docs/ runs as it is written, from the repository root."""
    monkeypatch.chdir(ROOT)
    blocks = [(page, textwrap.dedent(m.group(2))) for page in PAGES
              for m in PYTHON_BLOCK.finditer(page.read_text(encoding="utf-8"))]
    assert blocks, "no Python example found: the pattern or the docs changed"
    for page, code in blocks:
        exec(compile(code, f"<example in {page.relative_to(ROOT)}>", "exec"), {"__name__": "__example__"})
