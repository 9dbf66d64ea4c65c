"""Render docs/results/*.json into the Markdown tables between `<!-- results:NAME -->` and `<!-- /results -->`.

    .venv/bin/python scripts/render_results.py [--check] [FILE.md ...]

NAME is a results file's stem (docs/results/NAME.json), optionally with a view: `engine_bench/trace` renders
engine_bench.json's trace-overhead table; `card` renders the shipped model's held-out figures from its
checkpoints/default/card.json (which `python -m engine card` writes). Every block is replaced by what its file
renders to: the table, then one line naming the machine, torch, threads, date, commit, load average and the
command that wrote the file. Without
files it updates docs/benchmarks.md, README.md and every docs/*.md holding a block; --check changes nothing and
exits with 1 if a block differs from its file (the test suite runs the same comparison).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from engine.bench.results_file import load  # noqa: E402

RESULTS = ROOT / "docs" / "results"
CARD = ROOT / "checkpoints" / "default" / "card.json"   # `python -m engine card` writes it; the block `card` reads it
BLOCK = re.compile(r"(<!-- results:(?P<name>[\w/-]+) -->\n)(?P<body>.*?)(<!-- /results -->)", re.S)


def table(head: list[str], rows: list[list]) -> list[str]:
    """A Markdown table; every cell already a string."""
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head),
            *("| " + " | ".join(map(str, row)) + " |" for row in rows)]


def spread(s: dict, digits: int = 1, unit: str = "") -> str:
    """median [min–max] of a spread dict (the median alone where there was one value)."""
    if s["min"] == s["max"]:
        return f"{s['median']:,.{digits}f}{unit}"
    return f"{s['median']:,.{digits}f}{unit} [{s['min']:,.{digits}f}–{s['max']:,.{digits}f}]"


def provenance(r: dict) -> str:
    """The line under every table: where, when, with what and under which load the file was measured."""
    m, load_ = r["machine"], r["load_average"]
    count = r["threads"]
    threads = "" if count is None else f", {'/'.join(map(str, count)) if isinstance(count, list) else count} thread(s)"
    return (f"*{m['cpu']}, {m['cores']} cores; torch {r['torch']}{threads}; {r['date']} at {r['commit']}; load "
            f"average {load_['before'][0]:.2f} before, {load_['after'][0]:.2f} after; {r['wall_s']:,.0f} s: "
            f"`{r['command']}`*")


def engine_bench(r: dict, view: str) -> list[str]:
    if view == "trace":
        return table(["config", "phase", "untraced tokens/s", "traced tokens/s", "traced / untraced step time"],
                     [[b["config"], phase, f"{b[f'{phase}_tokens_per_s']:,.1f}",
                       f"{b[f'traced_{phase}_tokens_per_s']:,.1f}", f"×{b[f'trace_overhead_{phase}']:.2f}"]
                      for b in r["rows"] for phase in ("prefill", "decode")])
    return table(["config", "dtype", "batch", "prompt", "new tokens", "repeats", "prefill tokens/s",
                  "decode tokens/s"],
                 [[b["config"], b["dtype"], b["batch"], b["prompt_len"], b["new_tokens"], b["repeats"],
                   f"{b['prefill_tokens_per_s']:,.1f}", f"{b['decode_tokens_per_s']:,.1f}"] for b in r["rows"]])


def revision(r: dict, view: str) -> list[str]:
    labels = r["settings"]["labels"]
    if view == "trace_overhead":
        def cell(s):
            return "not reported" if s is None else f"×{s['median']:.2f} [×{s['min']:.2f}–×{s['max']:.2f}]"
        return table(["config", "threads", f"{labels['rev']} trace overhead", f"{labels['tree']} trace overhead"],
                     [[t["config"], t["threads"], cell(t["rev"]), cell(t["tree"])]
                      for t in r["tables"]["trace_overhead"]])
    rows = r["tables"]["bf16"] if view == "bf16" else r["rows"]
    base, other = (r["settings"]["dtype"], "bfloat16") if view == "bf16" else (labels["rev"], labels["tree"])

    def side(row, name):
        return spread({stat: row[f"{name}_{stat}"] for stat in ("median", "min", "max")})
    return table(["config", "threads", "phase", f"{base} tokens/s", f"{other} tokens/s", "ratio", "per-run ratios"],
                 [[row["config"], row["threads"], row["phase"], side(row, "base"), side(row, "other"),
                   f"{row['ratio']:.2f}", f"[{row['pair_ratio_min']:.2f}–{row['pair_ratio_max']:.2f}]"]
                  for row in rows])


def dspark(r: dict, view: str) -> list[str]:
    def ratio(s):
        return f"{s['median']:.2f} ({s['min']:.2f}–{s['max']:.2f})"
    if view == "trace":   # --trace: each traced mode against its untraced run, per pair
        def times(s):
            return f"×{s['median']:.2f} (×{s['min']:.2f}–×{s['max']:.2f})"
        modes = ("plain", "auto")
        rows = [[f"**{row['prompt']}**" if row is r["rows"][-1] else row["prompt"],
                 *(times(row["trace_overhead"][mode][what]) for mode in modes for what in ("wall", "decode")),
                 "yes" if all(row["trace_overhead"][mode]["same_tokens"] for mode in modes) else "**no**"]
                for row in r["rows"]]
        return table(["prompt", "plain: wall", "plain: decode step", "DSpark auto: wall", "DSpark auto: decode step",
                      "same tokens"], rows)
    keys = ("auto", "all", "auto_cpu", "all_cpu")
    rows = [[row["prompt"], f"{row['plain_tokens_per_s']:.1f}", *(ratio(row[k]) for k in keys),
             f"{row['accepted_length']['auto']:.2f} / {row['accepted_length']['all']:.2f}",
             f"{row['auto_plain_steps']} of {row['auto_steps']}", row["identical"]] for row in r["rows"][:-1]]
    rows.append([f"**{r['rows'][-1]['prompt']}**", "", *(f"**{ratio(r['rows'][-1][k])}**" for k in keys), "", "", ""])
    return table(["prompt", "plain tokens/s", "auto / plain", "all / plain", "auto / plain, CPU time",
                  "all / plain, CPU time", "accepted length auto / all", "auto's plain steps", "identical"], rows)


def sampling(r: dict, view: str) -> list[str]:
    return table(["vocabulary", "torch.multinomial µs", "sample_index µs", "sample_index / torch.multinomial"],
                 [[f"{row['vocabulary']:,}", spread(row["multinomial_us"]), spread(row["sample_index_us"]),
                   f"×{row['ratio']:.3f}"] for row in r["rows"]])


def first_view(r: dict, view: str) -> list[str]:
    return table(["measure", "seconds: median [min–max]", "count"],
                 [[row["measure"], spread(row["seconds"], 2), row["n"]] for row in r["rows"]])


def cpu_bf16(r: dict, view: str) -> list[str]:
    ways = list(r["rows"][0]["ways"])
    return table(["weight", "rows", *(f"{w} µs (× fp32)" for w in ways), "engine's way"],
                 [[row["weight"], row["rows"], *(f"{spread(row['ways'][w])} ×{row['ways'][w]['ratio']:.2f}"
                                                 for w in ways), row["engine"]] for row in r["rows"]])


def decoding_sweep(r: dict, view: str) -> list[str]:
    def known(q):
        return "" if q["known_word_share"] is None else f"{100 * q['known_word_share']:.1f}%"
    return table(["repetition penalty", "no-repeat n-gram", "prompts", "whitespace tokens", "longest whitespace run",
                  "repeated 4-grams", "words (fewest in one)", "known words", "seconds"],
                 [[q["repetition_penalty"], q["no_repeat_ngram"], q["prompts"], f"{100 * q['whitespace_share']:.1f}%",
                   q["longest_whitespace_run_tokens"], f"{100 * q['repeated_ngram_share']:.1f}%",
                   f"{q['words']} ({q['fewest_words']})", known(q),
                   f"{q['seconds']:.0f}" if "seconds" in q else ""] for q in r["rows"]])


def vocab_sizes(r: dict, view: str) -> list[str]:
    return table(["min count", "vocabulary", "training tokens", "held-out tokens", "held-out bytes per token",
                  f"bits per byte at perplexity {r['settings']['perplexity']:g}"],
                 [[row["min_count"], f"{row['vocabulary']:,}", f"{row['training_tokens']:,}",
                   f"{row['heldout_tokens']:,}", f"{row['heldout_bytes_per_token']:.3f}", f"{row['bits_per_byte']:.3f}"]
                  for row in r["rows"]])


def decode_ops(r: dict, view: str) -> list[str]:
    dtypes = r["settings"]["dtypes"]
    return table(["aten op", *(f"{d} {what}" for d in dtypes for what in ("calls", "self µs"))],
                 [[row["op"], *(f"{row[d][what]:,.0f}" for d in dtypes for what in ("calls", "self_us"))]
                  for row in r["rows"]])


def parallel(r: dict, view: str) -> list[str]:
    if view == "volume":
        return ["```", *r["notes"], "```"]
    return table(["ranks", "decode tokens/s: median [min–max]", "× 1 rank"],
                 [[row["ranks"], spread(row["decode_tokens_per_s"]), f"×{row['ratio']:.2f}"] for row in r["rows"]])


def plan(r: dict, view: str) -> list[str]:
    """`engine plan --results`: one row per configuration, its per-GPU and host bytes and the verdict, then the
    checkpoint bytes every row places and the plan's notes. View `fits`: the configurations that fit, alone."""
    def gib(n: int) -> str:
        return f"{n / 2**30:,.1f} GiB"

    def context(tokens: int) -> str:
        return f"{tokens // 2**20}M" if tokens % 2**20 == 0 else f"{tokens // 1024}k" if tokens % 1024 == 0 \
            else f"{tokens:,}"
    body = table(["GPUs × memory", "TP/EP degree", "routed experts", "context", "per GPU (max)", "host RAM",
                  "Engram tables in page cache", "verdict"],
                 [[f"{row['gpus']} × {row['gpu_mem_gib']:g} GiB" + (f" + {row['host_mem_gib']:g} GiB host"
                                                                     if row["experts"] == "host" else ""),
                   row["parallel_degree"], "host RAM" if row["experts"] == "host" else "on the GPUs",
                   context(row["context"]), gib(row["per_gpu_bytes"]), gib(row["host_bytes"]),
                   "whole" if row["engram_fits_in_page_cache"] else "partly",
                   f"**{row['verdict']}**" if row["fits"] else row["verdict"]]
                  for row in r["rows"] if row["fits"] or view != "fits"])
    total = r["settings"]["accounting_checkpoint_bytes"]
    same = all(row["checkpoint_bytes"] == total for row in r["rows"])
    return [*body, "", f"Every row places the whole checkpoint, {total:,} B ({'equal to' if same else 'NOT'} the "
                       f"accounting layer's checkpoint bytes); host RAM counts the routed experts placed there, "
                       f"their CPU buffers, the Engram pages a context touches and the loading staging.",
            *(f"{note[0].upper()}{note[1:]}." for note in r["notes"] if view != "fits")]


def rehearsal(r: dict, view: str) -> list[str]:
    """scripts/rehearsal.py: the main run (load, prefill, decode plain and DSpark, peak RSS against the plan's CPU
    figure); view `contexts`: one prefill per context length, each in a fresh process."""
    def gib(n: int) -> str:
        return f"{n / 2**30:,.2f} GiB"

    def against(row: dict) -> str:
        grew, plan = row["peak"] - row["base"], row["predicted"]["total"]
        return f"{gib(plan)} ({100 * (grew - plan) / plan:+.1f} %)"
    s = r["settings"]
    if view == "contexts":
        rows = [row for row in r["rows"] if row["measure"] == "prefill"]
        body = table(["context", "prefill", "tokens/s", "peak RSS above start", "plan (difference)",
                      "prefill's growth above the loaded model", "plan's caches + working"],
                     [[f"{row['tokens']:,}", f"{row['prefill_s']:,.1f} s", f"{row['prefill_tokens_per_s']:,.1f}",
                       gib(row["peak"] - row["base"]), against(row), gib(row["peak"] - row["loaded"]),
                       gib(row["predicted"]["caches"] + row["predicted"]["working"])] for row in rows])
        growth = []
        if len(rows) > 1:
            a, b = rows[0], rows[-1]
            grew = (b["peak"] - b["base"]) - (a["peak"] - a["base"])
            planned = b["predicted"]["total"] - a["predicted"]["total"]
            growth = [f"From {a['tokens']:,} to {b['tokens']:,} tokens the peak grew by {gib(grew)}, the plan's "
                      f"formula by {gib(planned)} ({grew / planned:.2f} of it).", ""]
        return [*body, "", *growth, *r["notes"]]
    main_rows = [row for row in r["rows"] if row["measure"] == "main"]
    if view == "summary":   # the README's one line
        return [f"{row['tokens']:,}-token prompt: load {row['load_s']:,.1f} s, prefill "
                f"{row['prefill_tokens_per_s']:,.1f} tokens/s, decode {row['decode_ms'] / 1000:,.1f} s/step, "
                f"DSpark {row['dspark_decode_ms'] / 1000:,.1f} s/token (same text: "
                f"{'yes' if row['dspark_same_tokens'] else 'no'}); peak RSS {gib(row['peak'] - row['base'])} above "
                f"start, plan {against(row)}." for row in main_rows]
    body = table(["prompt", "load", "prefill tokens/s", "decode ms/step", "DSpark ms/token", "same text",
                  "peak RSS above start", "plan (difference)"],
                 [[f"{row['tokens']:,}", f"{row['load_s']:,.1f} s", f"{row['prefill_tokens_per_s']:,.1f}",
                   f"{row['decode_ms']:,.0f}", f"{row['dspark_decode_ms']:,.0f}",
                   "yes" if row["dspark_same_tokens"] else "**no**", gib(row["peak"] - row["base"]), against(row)]
                  for row in main_rows])
    written = "reused" if s["write_s"] is None else f"written in {s['write_s']:,.0f} s"
    return [*body, "", f"`{s['config']}`: {s['layers']} layers + {s['draft_stages']} DSpark stages, "
                       f"{s['routed_experts']} routed experts; synthetic official folder of "
                       f"{s['checkpoint_bytes'] / 2**30:,.2f} GiB ({written}); {s['decode']} decode steps plain, "
                       f"then {s['decode']} tokens with DSpark."]


def weights(r: dict, view: str) -> list[str]:
    """scripts/bench_weights.py: each Learned weights view's bytes read and time, whole folders and half-shard
    ones; view `summary`: per folder, the default views together against the expert norms."""
    def size(n: int) -> str:
        return f"{n / 2**20:,.2f} MiB" if n >= 2**20 else f"{n / 2**10:,.1f} KiB" if n >= 2**10 else f"{n:,} B"
    if view == "summary":
        folders = list(dict.fromkeys(row["folder"] for row in r["rows"]))
        out = []
        for f in folders:
            rows = [row for row in r["rows"] if row["folder"] == f]
            default = [row for row in rows if not row["view"].startswith("experts")]
            experts = next(row for row in rows if row["view"] == "experts")
            read = sum(row["bytes_read"] for row in default)
            out.append([f, f"{rows[0]['shards_here']} of {rows[0]['shards']}", size(rows[0]["total_bytes"]),
                        f"{size(read)} ({100 * read / rows[0]['total_bytes']:.2f} %)",
                        f"{sum(row['seconds'] for row in default):.2f}",
                        f"{size(experts['bytes_read'])} ({100 * experts['bytes_read'] / rows[0]['total_bytes']:.1f} %)",
                        f"{experts['seconds']:.2f}"])
        return table(["folder", "shards here", "checkpoint", "every view but the experts: read", "seconds",
                      "expert norms: read", "seconds"], out)
    return table(["folder", "shards here", "view", "bytes read", "of the checkpoint", "reads", "seconds",
                  "statistics", "boxes absent"],
                 [[row["folder"], f"{row['shards_here']} of {row['shards']}", row["view"], size(row["bytes_read"]),
                   f"{100 * row['bytes_read'] / row['total_bytes']:.3f} %", f"{row['reads']:,}",
                   f"{row['seconds']:.3f}", f"{row['statistics']:,}", row["absent_boxes"]] for row in r["rows"]])


def long_prompt(r: dict, view: str) -> list[str]:
    """scripts/bench_long_prompt.py: prefill time by prompt length, the indexer's quadratic part apart, each part's
    growth over the previous length per token (×1.00 = linear), peak RSS above start beside the plan's figure."""
    s, rows = r["settings"], r["rows"]

    def growth(i: int, key: str) -> str:   # over the previous length, per token: ×1.00 = linear
        if i == 0:
            return "–"
        before, now = rows[i - 1], rows[i]
        return f"×{now[key] / before[key] * before['tokens'] / now['tokens']:.2f}"
    body = table(["prompt", "prefill s: median [min–max]", "indexer s (S·S/r)", "indexer growth", "rest s",
                  "rest growth", "peak RSS above start", "plan (whole run)"],
                 [[f"{row['tokens']:,}", f"{row['prefill_s']:,.2f} [{row['prefill_s_min']:,.2f}–"
                   f"{row['prefill_s_max']:,.2f}]", f"{row['indexer_s']:,.2f}", growth(i, "indexer_s"),
                   f"{row['rest_s']:,.2f}", growth(i, "rest_s"), f"{row['peak_above_start_bytes'] / 2**20:,.0f} MiB",
                   f"{row['plan_bytes'] / 2**20:,.0f} MiB"] for i, row in enumerate(rows)])
    return [*body, "", f"`{s['config']}` ({s['dtype']}, random-init), prefill in chunks of {s['prefill_chunk']:,} "
                       f"tokens, median of {s['runs']} prefills per length, each length in a fresh process."]


def verify_rows(r: dict, view: str) -> list[str]:
    """scripts/verify_rows.py: row 0 of a verify block against the one-token decode step, per decode position
    (the logits' largest |difference| beside the decode step's top-2 margin), or per layer ("layers": the largest
    |difference| of each layer's output over the positions), under each numerics."""
    rows, settings = r["rows"], r["settings"]
    kinds = list(dict.fromkeys(row["numerics"] for row in rows))
    if view == "layers":
        return table(["layer output", *kinds],
                     [[name, *(f"{max(row['layers'][name] for row in rows if row['numerics'] == k):.1e}"
                               for k in kinds)] for name in settings["layers"]])
    return table(["numerics", "position", "logits: largest absolute difference", "decode's top-2 margin",
                  "same greedy token"],
                 [[row["numerics"], f"{row['position']:,}", f"{row['logits']:.1e}", f"{row['margin']:.3f}",
                   "yes" if row["same_token"] else "**no**"] for row in rows])


def reference(r: dict, view: str) -> list[str]:
    """scripts/bench_reference.py: the engine against DeepSeek's V4.1 reference on the same weights, tokens/s of
    each side and their ratio (engine / reference); view `agreement`: the check that came before the timing."""
    if view == "agreement":
        return [*table(["config", "selection", "engine dtype", "prompt", "max Δ logit (of the largest)",
                        "same indexer picks", "same greedy tokens"],
                       [[c["config"], c["selection"], c["engine_dtype"], c["prompt"],
                         f"{c['max_logit_diff']:.3f} ({100 * c['relative_logit_diff']:.1f} %)",
                         f"{100 * c['same_picks']:.0f} %", "yes" if c["same_tokens"] else "no"]
                        for c in r["tables"]["agreement"]]),
                "", *(f"{note[0].upper()}{note[1:]}." for note in r["notes"])]
    return table(["config", "phase", "engine dtype", "engine tokens/s", "reference (bf16) tokens/s",
                  "engine / reference (median run)", "per-run ratios"],
                 [[row["config"], row["phase"], row["engine_dtype"], spread(row["engine_tokens_per_s"]),
                   spread(row["reference_tokens_per_s"]), f"×{row['ratio']:.2f}",
                   f"[×{row['pair_ratio_min']:.2f}–×{row['pair_ratio_max']:.2f}]"] for row in r["rows"]])


def card(c: dict) -> list[str]:
    """The shipped model's held-out figures from its card.json, and the line naming where the card measured them."""
    h, m = c["heldout"], c["measured"]
    body = table(["parameters", "held-out windows × tokens", "loss (nats/token)", "perplexity", "bits per byte",
                  "unigram perplexity"],
                 [[f"{c['model']['total_params']:,}", f"{h['windows']:,} × {h['seq']} ({h['tokens']:,} predicted)",
                   f"{h['loss']:.3f}", f"{h['perplexity']:.1f}", f"{h['bits_per_byte']:.3f}",
                   f"{h['unigram_perplexity']:.1f}"]])
    return [*body, "", f"*{m['machine']}; torch {m['torch']}, {m['threads']} thread(s); {m['date']}: "
                       f"`python -m engine card {c['checkpoint']}` ({c['checkpoint']}/card.json)*"]


RENDERERS = {"engine_bench": engine_bench, "revision": revision, "dspark": dspark, "sampling": sampling,
             "first_view": first_view, "cpu_bf16": cpu_bf16, "decoding_sweep": decoding_sweep,
             "vocab_sizes": vocab_sizes, "decode_ops": decode_ops, "parallel": parallel, "plan": plan,
             "rehearsal": rehearsal, "weights": weights, "long_prompt": long_prompt,
             "verify_rows": verify_rows, "reference": reference}


def render(name: str, results_dir: Path = RESULTS) -> str:
    """The block's body for NAME ("stem" or "stem/view"): the table, a blank line, the provenance line."""
    stem, _, view = name.partition("/")
    if stem == "card":
        return "\n".join(card(json.loads(CARD.read_text(encoding="utf-8")))) + "\n"
    path = results_dir / f"{stem}.json"
    if not path.is_file():
        raise FileNotFoundError(f"the block '{name}' has no results file {path}: run its command with --results")
    results = load(path)
    return "\n".join([*RENDERERS[results["kind"]](results, view), "", provenance(results)]) + "\n"


def blocks(text: str) -> list[str]:
    """The NAMEs of the results blocks in a Markdown text, in order."""
    return [m["name"] for m in BLOCK.finditer(text)]


def rendered(text: str, results_dir: Path = RESULTS) -> str:
    """text with every results block replaced by what its file renders to."""
    return BLOCK.sub(lambda m: m[1] + render(m["name"], results_dir) + m[4], text)


def documents() -> list[Path]:
    """The Markdown files that may hold results blocks."""
    return [p for p in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))] if p.is_file()]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("files", nargs="*", type=Path, help="Markdown files (default: README.md and docs/*.md)")
    p.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs from its file")
    args = p.parse_args(argv)
    stale = []
    for path in args.files or documents():
        text = path.read_text(encoding="utf-8")
        new = rendered(text)
        if new != text:
            stale.append(path)
            if not args.check:
                path.write_text(new, encoding="utf-8")
    verb = "differ from their results files" if args.check else "re-rendered"
    print(f"{verb}: {', '.join(map(str, stale))}" if stale else "every results block matches its file")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
