"""The DeepSeek tokenizer wrapper: vocabulary, special ids, lossless round trips, errors, id-map hook, CLI."""
import argparse
import json

import numpy as np
import pytest

from engine.commands import tokenizer as command
from engine.text.tokenizer import Tokenizer, default_tokenizer_path, load_tokenizer

TRICKY = [
    "  leading and trailing spaces  ",
    "\n\nnewlines\r\n\tand tabs\n",
    "digits 1234567890 3.14159 -42",
    "中文分词测试，日本語のかなカナ",
    "emoji 😀👍🏽 family 👨‍👩‍👧",
    "accents: café naïve Ångström Ω ﬁ",
    " ",
    "",
    "<think>reasoning</think> <｜User｜>hi<｜Assistant｜>",
]


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_vocabulary_counts_distinct_ids(tok):
    assert tok.vocab_size == 129_280
    raw = json.loads(default_tokenizer_path().read_text(encoding="utf-8"))
    bpe, added = raw["model"]["vocab"], raw["added_tokens"]
    assert len(bpe) == 128_000
    # the package's 129,283 counts the three ids listed both in the BPE vocabulary and as added tokens
    assert len(bpe) + len(added) == 129_283
    assert len(set(bpe.values()) | {t["id"] for t in added}) == 129_280


def test_special_ids(tok):
    assert tok.special_ids() == {"bos": 0, "eos": 1, "pad": 2, "image": 129264, "noise": 128799,
                                 "think": 128821, "end_think": 128822}
    assert tok.token_text(0) == "<｜begin▁of▁sentence｜>"
    assert tok.token_text(1) == "<｜end▁of▁sentence｜>"
    assert tok.token_text(2) == "<｜▁pad▁｜>"
    assert tok.token_text(129264) == "<｜image2｜>"
    assert tok.token_text(128799) == "<｜place▁holder▁no▁799｜>"


def test_load_tokenizer_is_cached(tok):
    assert load_tokenizer() is tok


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_is_lossless(tok, text):
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)


def test_encode_adds_no_bos_and_special_strings_become_ids(tok):
    ids = tok.encode("hello")
    assert ids and ids[0] != 0
    assert tok.encode("<think>")[0] == 128821
    assert tok.decode([0] + ids) == "<｜begin▁of▁sentence｜>hello"


def test_digits_split_in_runs_of_at_most_three(tok):
    pieces = [tok.token_text(i) for i in tok.encode("1234567")]
    assert "".join(pieces) == "1234567" and max(len(p) for p in pieces) <= 3


def test_token_text_shows_partial_utf8_bytes(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # the emoji is split inside its 4 UTF-8 bytes
    joined = b"".join(tok.token_bytes(i) for i in ids)
    assert joined == "😀".encode()
    assert any("\\x" in tok.token_text(i) for i in ids)


def test_token_bytes_agree_with_backend_decode(tok):
    # every 97th id plus the special range: bytes decoded with replacement == the Rust decoder's text
    sample = list(range(0, tok.vocab_size, 97)) + list(range(128_000, tok.vocab_size, 7))
    texts = tok.backend.decode_batch([[i] for i in sample], skip_special_tokens=False)
    assert [tok.token_bytes(i).decode("utf-8", errors="replace") for i in sample] == texts


def test_numpy_ids_are_accepted(tok):
    ids = np.array(tok.encode("numpy ids"), dtype=np.int64)
    assert tok.decode(ids) == "numpy ids"


@pytest.mark.parametrize("bad, message", [([5, 129_280], "129280 at position 1"), ([-1], "-1 at position 0"),
                                          ([1.5], "not an integer"), (["7"], "not an integer")])
def test_bad_ids_raise_clear_errors(tok, bad, message):
    with pytest.raises(ValueError, match=message):
        tok.decode(bad)


def test_bad_token_text_and_encode_input(tok):
    with pytest.raises(ValueError, match="outside 0..129279"):
        tok.token_text(200_000)
    with pytest.raises(ValueError, match="takes a str"):
        tok.encode(b"bytes")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Tokenizer(tmp_path / "nope.json")


def test_id_map_hook_maps_both_ways(tok):
    text = "hello world"
    full = tok.encode(text)
    keep = [0, 1, 2] + sorted(set(full))
    small = Tokenizer(id_map=keep)
    assert small.vocab_size == len(keep)
    ids = small.encode(text)
    assert [keep[i] for i in ids] == full and max(ids) < len(keep)
    assert small.decode(ids) == text
    assert small.special_ids() == {"bos": 0, "eos": 1, "pad": 2}
    with pytest.raises(ValueError, match="not in this model's"):
        small.encode("zebra")
    with pytest.raises(ValueError, match="outside 0.."):
        small.decode([len(keep)])
    with pytest.raises(ValueError, match="twice"):
        Tokenizer(id_map=[3, 3])


def run_cli(capsys, *argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_cli_summary(capsys):
    code, out = run_cli(capsys, "--json")
    report = json.loads(out)
    assert code == 0 and report["vocab_size"] == 129_280 and report["special_ids"]["image"] == 129264


def test_cli_encode_lists_ids_and_token_strings(capsys, tok):
    code, out = run_cli(capsys, "--text", "Hi\n中文", "--json")
    report = json.loads(out)
    assert code == 0 and report["ids"] == tok.encode("Hi\n中文")
    assert "".join(report["tokens"]) == "Hi\n中文"
    code, out = run_cli(capsys, "--text", "Hi\n")
    assert out.splitlines()[0] == f"{len(tok.encode('Hi' + chr(10)))} tokens" and "'\\n'" in out


def test_cli_decode_and_its_errors(capsys, tok):
    ids = tok.encode("round trip")
    code, out = run_cli(capsys, "--ids", ",".join(map(str, ids)), "--json")
    assert json.loads(out)["text"] == "round trip"
    with pytest.raises(ValueError, match="outside"):
        run_cli(capsys, "--ids", "1 129280")
    with pytest.raises(ValueError, match="must be integers"):
        run_cli(capsys, "--ids", "1,x")
    with pytest.raises(ValueError, match="only apply"):
        run_cli(capsys, "--rebuild")


def test_through_the_engine_cli(capsys):
    from engine.cli import main

    assert main(["tokenizer", "--text", "hi there", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["text"] == "hi there"
    assert main(["tokenizer", "--ids", "1 129280"]) == 2
    assert "error: token id 129280 at position 1 is outside 0..129279" in capsys.readouterr().err
