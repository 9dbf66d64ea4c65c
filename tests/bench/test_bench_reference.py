"""scripts/bench_reference.py, the parts that run without DeepSeek's reference code (which the project does not
hold): a folder lacking the reference's files is refused by name, and the tokenizer it hands the reference's Engram
hash groups token ids exactly as the engine's token map does, over the whole compressed vocabulary."""
from __future__ import annotations

import numpy as np
import pytest

from tests.script_helpers import script_module

BENCH = script_module("bench_reference.py")


def test_a_folder_without_the_reference_files_is_refused_naming_them(tmp_path):
    (tmp_path / "model.py").write_text("")
    with pytest.raises(SystemExit, match="missing engram.py, kernel_cpu.py, image_processor.py, vision.py"):
        BENCH.import_reference(tmp_path)


def reference_grouping(tokenizer) -> list[int]:
    """The reference's build_compressed_token_map numbering: keys in id order, each new key the next id."""
    seen: dict[str, int] = {}
    return [seen.setdefault(tokenizer.backend_tokenizer.decode([i]), len(seen)) for i in range(len(tokenizer))]


@pytest.mark.parametrize("vocab, compressed", [(40, 25), (10, 25)])
def test_the_tokenizer_groups_ids_as_the_token_map_over_the_whole_compressed_vocabulary(vocab, compressed):
    token_map = np.arange(vocab) % compressed                   # engine.bench's synthetic map
    tokenizer = BENCH.TokenMapTokenizer(token_map, compressed)
    ids = reference_grouping(tokenizer)
    assert ids[:vocab] == token_map.tolist()                    # every input id hashes from its own compressed id
    assert len(set(ids)) == compressed                          # the count the reference derives multipliers from


def test_a_map_not_numbered_by_first_appearance_is_refused():
    with pytest.raises(SystemExit, match="first appearance"):
        BENCH.TokenMapTokenizer(np.array([1, 0, 2]), 3)
