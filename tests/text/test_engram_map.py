"""Engram compressed-token map (§4.4.1): the 99,092 oracle, an independent pure-Python rebuild, caches, lookup."""
import argparse
import json
import re
import unicodedata

import numpy as np
import pytest

from engine.commands import tokenizer as command
from engine.spec.config import load_config
from engine.text import engram_map
from engine.text.tokenizer import load_tokenizer

V41 = "configs/deepseek-v4.1-flash.json"
# Rust's char::is_whitespace set (Unicode White_Space); Python's str.strip() also strips U+001C..U+001F.
RUST_WHITESPACE = ("\t\n\x0b\x0c\r \x85\xa0\u1680" + "".join(chr(c) for c in range(0x2000, 0x200B))
                   + "\u2028\u2029\u202f\u205f\u3000")
SPACE_RUNS = re.compile(r"[ \t\r\n]+")


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(scope="module")
def texts(tok):
    return engram_map.decoded_vocabulary(tok)


@pytest.fixture(scope="module")
def keys(tok, texts):
    return engram_map.token_keys(tok, texts=texts)


@pytest.fixture(scope="module")
def token_map(keys):
    return engram_map.number_by_first_appearance(keys)


def python_key(strip_marks=("Mn", "Mc", "Me"), strip=lambda s: s.strip(RUST_WHITESPACE)):
    """§4.4.1's normalizer written with unicodedata instead of the HF `tokenizers` normalizers."""
    def key(text):
        text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
        text = "".join(c for c in text if unicodedata.category(c) not in strip_marks).lower()
        text = SPACE_RUNS.sub(" ", text)
        return text if text == " " else strip(text)
    return key


def test_full_vocabulary_compresses_to_99092(token_map):
    assert token_map.dtype == np.int64 and token_map.shape == (129_280,)
    assert len(np.unique(token_map)) == 99_092
    # first-appearance numbering: ids 0,1,2 are the three distinct special tokens; each new key takes the next id
    assert list(token_map[:3]) == [0, 1, 2]
    running_max = np.maximum.accumulate(token_map)
    assert np.all(np.diff(running_max) <= 1) and running_max[-1] == 99_091


def test_independent_python_rebuild_matches_elementwise(tok, texts, token_map):
    rebuilt = engram_map.number_by_first_appearance(engram_map.token_keys(tok, normalize=python_key(), texts=texts))
    np.testing.assert_array_equal(rebuilt, token_map)


def test_near_miss_variants_give_the_spec_counts(tok, texts):
    # spec §13 oracles: each rule matters, and these variants land on the documented wrong counts
    no_fffd_rule = engram_map.token_keys(tok, raw_for_partial_bytes=False, texts=texts)
    assert len(set(no_fffd_rule)) == 97_940
    mn_only_python_strip = python_key(strip_marks=("Mn",), strip=str.strip)
    assert len(set(engram_map.token_keys(tok, normalize=mn_only_python_strip, texts=texts))) == 99_510


def test_partial_byte_tokens_are_keyed_by_their_raw_string(tok, texts, keys):
    partial = [i for i, t in enumerate(texts) if "\ufffd" in t]
    assert len(partial) == 1_484
    assert all(keys[i] == tok.id_to_token(i) for i in partial)


def test_normalizer_rules():
    n = engram_map.compression_normalizer().normalize_str
    assert n(" Hello") == "hello"
    assert n("Café") == "cafe"
    assert n("ﬁ") == "fi"  # NFKC ligature
    assert n("\n\n") == " " and n(" \t ") == " "  # whitespace-only tokens keep a single space
    assert n(" a \n b ") == "a b"


def test_tokens_that_differ_only_in_case_accent_or_space_share_an_id(tok, token_map):
    def single(text):
        ids = tok.encode(text)
        assert len(ids) == 1, (text, ids)
        return ids[0]
    assert token_map[single(" Hello")] == token_map[single("hello")] == token_map[single("Hello")]
    assert token_map[single(" the")] != token_map[single(" a")]


def test_disk_cache_round_trip_memory_cache_and_corrupt_cache(tok, tmp_path, token_map):
    path = engram_map.cache_path_for(tok, tmp_path)
    np.save(path, np.zeros(10, dtype=np.int64))  # a stale or corrupt cache file is rebuilt, not trusted
    first = engram_map.load_token_map_report(tok, cache_dir=tmp_path)
    assert first.source == "built" and first.cache_path == path and first.compressed_vocab_size == 99_092
    assert first.cache_path.name == f"engram_map-{tok.fingerprint[:16]}.npy"
    assert engram_map.load_token_map_report(tok, cache_dir=tmp_path).source == "memory"
    engram_map._MEMORY.pop(first.cache_path)
    second = engram_map.load_token_map_report(tok, cache_dir=tmp_path)
    assert second.source == "disk"
    np.testing.assert_array_equal(second.token_map, token_map)
    assert not second.token_map.flags.writeable
    assert np.load(first.cache_path, allow_pickle=False).dtype == np.int64



def test_lookup_checks_the_config(tok, token_map, cache_dir):
    args = load_config(V41)
    np.testing.assert_array_equal(engram_map.lookup(args, tok, cache_dir=cache_dir), token_map)
    with pytest.raises(ValueError, match="99092 Engram ids but the config's engram_compressed_vocab_size is 99000"):
        engram_map.lookup(args.replace(engram_compressed_vocab_size=99000), tok, cache_dir=cache_dir)
    with pytest.raises(ValueError, match="vocab_size is 129000"):
        engram_map.lookup(args.replace(vocab_size=129000), tok, cache_dir=cache_dir)


def run_cli(capsys, *argv):
    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    code = command.run(parser.parse_args(list(argv)))
    return code, capsys.readouterr().out


def test_cli_engram_map_reports_sizes_and_cache(capsys, cache_dir):
    code, out = run_cli(capsys, "--engram-map", "--cache-dir", str(cache_dir), "--rebuild")
    assert code == 0 and "vocabulary size      129,280" in out and "Engram compressed    99,092" in out
    assert "built (cold) in" in out
    code, out = run_cli(capsys, "--engram-map", "--cache-dir", str(cache_dir), "--json")
    report = json.loads(out)
    assert code == 0 and report["vocab_size"] == 129_280 and report["compressed_vocab_size"] == 99_092
    assert report["source"] == "memory" and report["cache"].startswith(str(cache_dir))
