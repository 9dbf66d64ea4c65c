"""Text-quality measures and the card's held-out prompts, on hand-made continuations and texts."""
from __future__ import annotations

import pytest

from engine.spec.errors import InputError
from engine.training.card_prompts import heldout_prompts, speech_openings, spread
from engine.training.text_quality import is_whitespace, longest_run, measure, pooled, repeated_ngrams


def test_whitespace_tokens_and_their_longest_run():
    pieces = ["And", " his", "\n", "   ", " ", "\n\n", "sub", " ", "", "\t"]
    assert [is_whitespace(p) for p in pieces] == [False, False, True, True, True, True, False, True, False, True]
    assert longest_run([is_whitespace(p) for p in pieces]) == 4
    assert longest_run([]) == 0 and longest_run([False, False]) == 0 and longest_run([True] * 3) == 3


def test_repeated_ngrams_count_every_later_copy():
    ids = [1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 5]
    # 4-grams: 9 in all; (1,2,3,4) again at 4, (2,3,4,1) at 5, (3,4,1,2) at 6, (4,1,2,3) at 7: 4 repeats
    assert repeated_ngrams(ids, 4) == (4, 9)
    assert repeated_ngrams(ids, 2) == (6, 11)          # again: (1,2) twice, (2,3) twice, (3,4), (4,1)
    assert repeated_ngrams([7] * 10, 4) == (6, 7)      # a run of one token: every 4-gram after the first repeats
    assert repeated_ngrams([1, 2, 3], 4) == (0, 0)


def test_one_continuation_measured():
    ids = [10, 11, 12, 13, 13, 13, 13, 14]
    pieces = ["Hence", "!", " home", " ", " ", " ", " ", "you"]
    text = "".join(pieces)
    m = measure(ids, pieces, text, n=2)
    assert m["tokens"] == 8 and m["whitespace_tokens"] == 4 and m["whitespace_share"] == 0.5
    assert m["longest_whitespace_run_tokens"] == 4 and m["longest_whitespace_run_chars"] == 4
    assert (m["repeated_ngrams"], m["ngrams"]) == (2, 7) and m["repeated_ngram_share"] == pytest.approx(2 / 7)
    assert m["words"] == 3 and m["known_words"] is None   # Hence, home, you; no reference words given
    assert measure(ids, pieces, text, known={"hence", "you", "thee"})["known_words"] == 2   # lower-cased words
    assert measure([], [], "")["whitespace_share"] == 0.0
    with pytest.raises(InputError, match="3 token ids but 2 token texts"):
        measure([1, 2, 3], ["a", "b"], "ab")


def test_words_are_runs_of_letters():
    assert measure([1], ["x"], "O Romeo, Romeo! wherefore art thou Romeo's 2nd_self")["words"] == 10


def test_pooled_shares_are_over_all_tokens_not_a_mean_of_shares():
    a = measure([1, 2, 3, 4, 5], ["a", " ", "b", "c", "d"], "a bcd", n=2)
    b = measure([9, 9, 9], [" ", " ", " "], "   ", n=2)
    p = pooled([a, b])
    assert p["continuations"] == 2 and p["tokens"] == 8
    assert p["whitespace_share"] == pytest.approx(4 / 8)                 # (1 + 3) / 8, not (0.2 + 1) / 2
    assert p["repeated_ngram_share"] == pytest.approx(1 / 6)             # (0 + 1) / (4 + 2)
    assert p["longest_whitespace_run_tokens"] == 3 and p["longest_whitespace_run_chars"] == 3
    assert p["words"] == 2 and p["fewest_words"] == 0 and p["known_word_share"] is None
    c = measure([1, 2], ["Good", " den"], "Good den", known={"good"})
    d = measure([3, 4], ["fair", " coz"], "fair coz", known={"good"})
    assert pooled([c, d])["known_word_share"] == 0.25 and pooled([c, a])["known_word_share"] is None


PLAY = """<s>THE TRAGEDY

ACT I.

SCENE I. A street.

[Enter Flavius.]

FLAVIUS.
Hence! home, you idle creatures, get you home!

FIRST CITIZEN.
Why, sir, a carpenter.

MARULLUS.
[Aside.] What trade art thou? Answer me directly.

SECOND CITIZEN.
   Truly, sir, in respect of a fine workman

CASSIUS.
Go.

BRUTUS: not a heading here
"""


def test_speech_openings_are_headings_then_the_first_words():
    assert speech_openings(PLAY, words=4) == ["FLAVIUS.\nHence! home, you idle",
                                              "SECOND CITIZEN.\nTruly, sir, in respect"]
    # 'Why, sir, a carpenter.' has only 4 words (a prompt must stop inside the line); a stage direction, an act
    # heading followed by a blank line and a 'NAME:' line are no speeches; 'Go.' is too short
    assert speech_openings(PLAY, words=3) == ["FLAVIUS.\nHence! home, you", "FIRST CITIZEN.\nWhy, sir, a",
                                              "SECOND CITIZEN.\nTruly, sir, in"]
    with pytest.raises(InputError, match="words must be at least 1"):
        speech_openings(PLAY, words=0)


def test_prompts_are_spread_evenly_and_deterministically():
    items = list(range(100))
    assert spread(items, 4) == [12, 37, 62, 87]                 # the middle of each quarter
    assert spread(items, 4, phase=0.0) == [0, 25, 50, 75]
    assert spread(items[:3], 8) == [0, 1, 2]                    # fewer items than asked: all of them
    with pytest.raises(InputError, match="phase must lie in"):
        spread(items, 4, phase=1.0)
    text = "\n\n".join(f"SPEAKER{'ABCDEFGHIJ'[i % 10]}.\nLine number {i} of the play." for i in range(40))
    got = heldout_prompts(text, count=4, words=3)
    assert got == heldout_prompts(text, count=4, words=3) == [
        "SPEAKERF.\nLine number 5", "SPEAKERF.\nLine number 15",
        "SPEAKERF.\nLine number 25", "SPEAKERF.\nLine number 35"]
    assert heldout_prompts(text, count=2, words=3, phase=0.0) == ["SPEAKERA.\nLine number 0",
                                                                  "SPEAKERA.\nLine number 20"]
    with pytest.raises(InputError, match="no speech to take the card's prompts from"):
        heldout_prompts("JULIET: Wherefore art thou Romeo?\n", count=4)
