"""The README is true to the tree and the shipped model: its table is card.json's, its layout the folders'."""
from __future__ import annotations

import json
import re
from pathlib import Path

from engine.training.card_render import readme_table

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_default_model_table_is_rendered_from_card_json():
    card = json.loads((ROOT / "checkpoints" / "default" / "card.json").read_text(encoding="utf-8"))
    assert readme_table(card) in README, "re-run `python -m engine card` and paste the table it prints into README.md"


def layout_block() -> str:
    section = README.split("## Layout", 1)[1]
    return re.search(r"```\n(.*?)```", section, re.DOTALL).group(1)


def test_layout_section_lists_exactly_the_sub_packages():
    listed, top = set(), None
    for line in layout_block().splitlines():
        if m := re.match(r"([a-z0-9_]+)/", line):
            top = m.group(1)
        elif (m := re.match(r"  ([a-z0-9_]+)/", line)) and top in ("engine", "v41viz"):
            listed.add(f"{top}/{m.group(1)}")
    packages = {f"{p.parts[-3]}/{p.parts[-2]}" for p in ROOT.glob("*/*/__init__.py")
                if p.parts[-3] in ("engine", "v41viz")}
    assert listed == packages, (f"README layout: missing {sorted(packages - listed)}, "
                                f"no such folder {sorted(listed - packages)}")

