"""Which decoding options keep a checkpoint's greedy text readable: a grid of repetition penalties and no-repeat
n-gram sizes, each measured on greedy continuations of held-out speech openings (not the card's own prompts) and
of the card samples' fixed prompts ('ROMEO:', ...: where the shipped model's greedy text ran into whitespace).

    .venv/bin/python scripts/decoding_sweep.py [--checkpoint checkpoints/default] [--data data/shakespeare]
        [--results OUT]

Prints one row per setting (engine.training.text_quality: whitespace tokens, longest whitespace run, repeated
4-grams, words, known-word share); engine.request.decoding's SUGGESTED_* constants record the choice made from it.
"""
from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.generation import Engine  # noqa: E402
from engine.training.card import check_same_vocabulary  # noqa: E402
from engine.training.card_decoding import PROMPTS, greedy_quality  # noqa: E402
from engine.training.card_prompts import heldout_prompts  # noqa: E402
from engine.training.corpus import load_tokens  # noqa: E402
from engine.training.text_quality import REPEAT_N, measure_ids, pooled, words_of  # noqa: E402


def held_out_text_itself(engine, held: str, prompts: list[str], new_tokens: int, known: set[str]) -> dict:
    """The measures on the held-out text's own next `new_tokens` tokens after each prompt: what real text reads."""
    tok, rows = engine.tokenizer, []
    for prompt in prompts:
        start = re.search(r"\s+".join(map(re.escape, prompt.split())), held).end()   # as the text spaces it
        ids = engine.encode(held[start:start + 16 * new_tokens], add_bos=False)[:new_tokens]
        rows.append(measure_ids(tok, ids, known))
    return pooled(rows)


def row(label: str, n: str, name: str, q: dict, seconds: str) -> str:
    """One line of the printed table from pooled text-quality measures."""
    return (f"| {label} | {n} | {name} | {100 * q['whitespace_share']:.1f}% | {q['longest_whitespace_run_tokens']} | "
            f"{100 * q['repeated_ngram_share']:.1f}% | {q['words']} ({q['fewest_words']}) | "
            f"{100 * q['known_word_share']:.1f}% | {seconds} |")


def record(label: str, n: str, name: str, q: dict, seconds: float | None) -> dict:
    """One row of the results file: the setting, the prompt group and its pooled measures."""
    return {"repetition_penalty": label, "no_repeat_ngram": n, "prompts": name, **q,
            **({} if seconds is None else {"seconds": seconds})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default="checkpoints/default")
    parser.add_argument("--data", default="data/shakespeare")
    parser.add_argument("--new-tokens", type=int, default=200)
    parser.add_argument("--penalties", default="1,1.1,1.2,1.3,1.4,1.5,1.7,2",
                        help="comma-separated repetition penalties")
    parser.add_argument("--ngrams", default="0,3,6", help="comma-separated no-repeat n-gram sizes")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--results", help="also write the table as a results file (docs/results/decoding_sweep.json)")
    args = parser.parse_args(argv)
    from engine.bench.results_file import ResultsRecorder
    recorder = ResultsRecorder(args.results, "decoding_sweep", "scripts/decoding_sweep.py", argv)
    import torch
    torch.set_num_threads(args.threads)
    engine = Engine.load(checkpoint=args.checkpoint)
    check_same_vocabulary(engine, Path(args.data))   # the corpus's ids must mean what the checkpoint's do
    tokens = load_tokens(args.data)
    held = engine.tokenizer.decode(tokens["heldout"].tolist())
    # 16 speeches between the card's 8 (which sit at the middles of eight equal parts of the held-out speeches)
    groups = {"held-out": heldout_prompts(held, 8, phase=0.25) + heldout_prompts(held, 8, phase=0.75),
              "fixed": list(PROMPTS)}
    known = set(words_of(engine.tokenizer.decode(tokens["train"].tolist())))
    print(f"{len(groups['held-out'])} held-out prompts and the {len(PROMPTS)} fixed ones, {args.new_tokens} greedy "
          "tokens each, one batch per group")
    print(f"| repetition penalty | no-repeat n-gram | prompts | whitespace tokens | longest whitespace run | repeated "
          f"{REPEAT_N}-grams | words (fewest in one) | known words | seconds |")
    print("|---|---|---|---|---|---|---|---|---|")
    itself = held_out_text_itself(engine, held, groups["held-out"], args.new_tokens, known)
    print(row("the held-out text itself", "", "held-out", itself, ""), flush=True)
    rows = [record("the held-out text itself", "", "held-out", itself, None)]
    for penalty in (float(x) for x in args.penalties.split(",")):
        for n in (int(x) for x in args.ngrams.split(",")):
            for name, prompts in groups.items():
                t0 = time.perf_counter()
                q, _ = greedy_quality(engine, prompts, args.new_tokens, known, repetition_penalty=penalty,
                                      no_repeat_ngram=n)
                seconds = time.perf_counter() - t0
                print(row(f"{penalty:g}", str(n), name, q, f"{seconds:.0f}"), flush=True)
                rows.append(record(f"{penalty:g}", str(n), name, q, seconds))
    recorder.write(rows, args.threads, settings={"checkpoint": args.checkpoint, "new_tokens": args.new_tokens,
                                                 "heldout_prompts": len(groups["held-out"]),
                                                 "fixed_prompts": len(PROMPTS)})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
