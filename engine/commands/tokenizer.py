"""`python -m engine tokenizer`: inspect the DeepSeek tokenizer and the Engram compressed-token map."""
from __future__ import annotations

import argparse
import json
import time

from ..spec.errors import InputError
from ..text.engram_map import load_token_map_report
from ..text.prompt_text import check_text
from ..text.tokenizer import load_tokenizer

HELP = "encode/decode text with the DeepSeek tokenizer, or build and check the Engram compressed-token map"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--text", help="text to encode: prints ids and the text of each token")
    what.add_argument("--ids", help="comma- or space-separated token ids to decode")
    what.add_argument("--engram-map", action="store_true",
                      help="load (or build) the Engram compressed-token map and print its sizes and timing")
    parser.add_argument("--rebuild", action="store_true",
                        help="with --engram-map: ignore the caches, time a cold build")
    parser.add_argument("--cache-dir", help="with --engram-map: where the map is cached (default: <repo>/.cache)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:

    if (args.rebuild or args.cache_dir) and not args.engram_map:
        raise InputError("--rebuild and --cache-dir only apply with --engram-map")
    if args.text is not None:
        check_text(args.text, "--text")  # bytes that are not UTF-8 cannot be tokenized
    t0 = time.perf_counter()
    tok = load_tokenizer()
    load_s = time.perf_counter() - t0
    if args.engram_map:
        report = _engram_map_report(tok, args.rebuild, args.cache_dir)
    elif args.text is not None:
        ids = tok.encode(args.text)
        report = {"text": args.text, "n_tokens": len(ids), "ids": ids, "tokens": [tok.token_text(i) for i in ids]}
    elif args.ids is not None:
        ids = _parse_ids(args.ids)
        tok.check_ids(ids)
        report = {"ids": ids, "text": tok.decode(ids), "tokens": [tok.token_text(i) for i in ids]}
    else:
        report = {"tokenizer": str(tok.path), "vocab_size": tok.vocab_size, "special_ids": tok.special_ids(),
                  "load_seconds": round(load_s, 3)}
    print(json.dumps(report, ensure_ascii=False) if args.json else _as_text(report))
    return 0


def _engram_map_report(tok, rebuild: bool, cache_dir: str | None) -> dict:

    loaded = load_token_map_report(tok, cache_dir=cache_dir, rebuild=rebuild)
    return {"vocab_size": tok.vocab_size, "compressed_vocab_size": loaded.compressed_vocab_size,
            "source": loaded.source, "seconds": round(loaded.seconds, 3),
            "cache": str(loaded.cache_path) if loaded.cache_path else None}


def _parse_ids(raw: str) -> list[int]:
    parts = raw.replace(",", " ").split()
    if not parts:
        raise InputError("--ids is empty; give token ids such as --ids '0,19923,3059'")
    try:
        return [int(p) for p in parts]
    except ValueError:
        raise InputError(f"--ids must be integers separated by commas or spaces, got {raw!r}") from None


def _shown(text: str) -> str:
    """Quoted, with whitespace and control characters visible (a token's `\\xNN` byte escapes stay as they are)."""
    named = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}
    return "'" + "".join(named.get(c, f"\\x{ord(c):02x}" if ord(c) < 32 or ord(c) == 127 else c) for c in text) + "'"


def _as_text(report: dict) -> str:
    if "compressed_vocab_size" in report:
        how = {"built": "built (cold)", "disk": "read from disk cache", "memory": "from memory"}[report["source"]]
        return (f"vocabulary size      {report['vocab_size']:,}\n"
                f"Engram compressed    {report['compressed_vocab_size']:,}\n"
                f"token map            {how} in {report['seconds']:.3f} s\n"
                f"cache                {report['cache']}")
    if "tokens" in report:
        lines = [f"{len(report['ids'])} tokens"] + [f"{i:>8}  {_shown(t)}"
                                                     for i, t in zip(report["ids"], report["tokens"])]
        if "n_tokens" not in report:
            lines.append(f"text: {_shown(report['text'])}")
        return "\n".join(lines)
    specials = ", ".join(f"{k}={v}" for k, v in report["special_ids"].items())
    return (f"tokenizer   {report['tokenizer']}\nvocab size  {report['vocab_size']:,}\n"
            f"special ids {specials}\nloaded in   {report['load_seconds']:.3f} s")
