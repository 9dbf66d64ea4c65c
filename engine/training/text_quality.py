"""Quality measures of generated continuations: whitespace tokens and runs, repeated n-grams, words (torch-free)."""
from __future__ import annotations

import re
from collections.abc import Sequence

from ..spec.errors import InputError

REPEAT_N = 4  # the n of the repeated-n-gram share: 4 tokens, about a short phrase
WORD = re.compile(r"[^\W\d_]+")  # a maximal run of letters


def is_whitespace(piece: str) -> bool:
    """A token whose text is only whitespace (spaces, newlines, tabs): the filler of degenerate greedy text."""
    return piece != "" and piece.isspace()


def longest_run(flags: Sequence[bool]) -> int:
    """The length of the longest run of consecutive True values."""
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def repeated_ngrams(ids: Sequence[int], n: int = REPEAT_N) -> tuple[int, int]:
    """(repeated, total): of the sequence's n-grams, how many equal an n-gram that started earlier in it."""
    seen, repeated = set(), 0
    total = max(len(ids) - n + 1, 0)
    for i in range(total):
        gram = tuple(ids[i:i + n])
        repeated += gram in seen
        seen.add(gram)
    return repeated, total


def words_of(text: str) -> list[str]:
    """The text's words (runs of letters), lower-cased."""
    return [w.lower() for w in WORD.findall(text)]


def measure(ids: Sequence[int], pieces: Sequence[str], text: str, n: int = REPEAT_N,
            known: set[str] | None = None) -> dict:
    """The measures of one continuation: ids its new token ids, pieces each id's text, text the decoded whole;
    known: the lower-cased words of a reference text (the training text), to count the words found in it (coined
    words are not; None leaves known_words None)."""
    if len(ids) != len(pieces):
        raise InputError(f"text quality: {len(ids)} token ids but {len(pieces)} token texts")
    blank = [is_whitespace(p) for p in pieces]
    runs = [len(m) for m in re.findall(r"\s+", text)]
    repeated, total = repeated_ngrams(ids, n)
    words = words_of(text)
    return {"tokens": len(ids), "whitespace_tokens": sum(blank),
            "whitespace_share": sum(blank) / len(ids) if ids else 0.0,
            "longest_whitespace_run_tokens": longest_run(blank),
            "longest_whitespace_run_chars": max(runs, default=0),
            "repeated_ngrams": repeated, "ngrams": total, "repeated_ngram_share": repeated / total if total else 0.0,
            "words": len(words), "known_words": None if known is None else sum(w in known for w in words)}


def measure_ids(tokenizer, ids: Sequence[int], known: set[str] | None = None) -> dict:
    """measure() of a continuation given as token ids, its texts read from the tokenizer (token_text, decode)."""
    return measure(ids, [tokenizer.token_text(t) for t in ids], tokenizer.decode(ids), known=known)


def pooled(rows: Sequence[dict]) -> dict:
    """The measures of several continuations together: shares over all their tokens, n-grams and words, the longest
    run of any, words in all, and the fewest words in one."""
    tokens, ngrams = sum(r["tokens"] for r in rows), sum(r["ngrams"] for r in rows)
    blank, repeated = sum(r["whitespace_tokens"] for r in rows), sum(r["repeated_ngrams"] for r in rows)
    words = sum(r["words"] for r in rows)
    known = None if any(r.get("known_words") is None for r in rows) else sum(r["known_words"] for r in rows)
    return {"continuations": len(rows), "tokens": tokens, "whitespace_share": blank / tokens if tokens else 0.0,
            "longest_whitespace_run_tokens": max((r["longest_whitespace_run_tokens"] for r in rows), default=0),
            "longest_whitespace_run_chars": max((r["longest_whitespace_run_chars"] for r in rows), default=0),
            "repeated_ngram_share": repeated / ngrams if ngrams else 0.0,
            "words": words, "fewest_words": min((r["words"] for r in rows), default=0),
            "known_word_share": None if known is None or not words else known / words}
