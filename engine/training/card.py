"""Model card: measure a checkpoint on its prepared corpus and write MODEL_CARD.md, card.json and loss_curve.png."""
from __future__ import annotations

import datetime
import json
import math
import platform
import statistics
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..bench.cpu import machine_description
from ..spec.errors import InputError, MissingFileError
from .corpus import MANIFEST_NAME, TOKENS_NAME, load_tokens, sha256_file
from .fields import option
from .log import read_log
from .windows import heldout_windows

PROMPTS = ("ROMEO:", "JULIET:", "To be, or not to be", "KING HENRY:")


@dataclass(frozen=True)
class CardOptions:
    seq: int = option(256, "tokens per held-out window")       # the model sees seq, predicts seq
    windows: int = option(32, "held-out windows")              # non-overlapping, spread evenly over the stream
    batch: int = option(8, "windows per forward")
    new_tokens: int = option(48, "new tokens per prompt for samples and decode timing")
    repeats: int = option(3, "timing repeats, median taken")   # DSpark / plain timing
    sample_temperature: float = 0.8
    seed: int = option(0, "sampling seed")
    top_ngrams: int = 12


def check_inputs(ckpt: Path, data: Path) -> None:
    """FileNotFoundError naming every input the card needs that is missing."""
    needed = [ckpt / "config.json", ckpt / "model.safetensors", ckpt / "log.csv",
              data / MANIFEST_NAME, data / TOKENS_NAME]
    missing = [str(p) for p in needed if not p.is_file()]
    if missing:
        raise MissingFileError("model card: missing input(s): " + ", ".join(missing))


def check_same_vocabulary(engine, data: Path) -> None:
    """The corpus's model ids must mean what the checkpoint's do: both id maps list the same tokenizer ids."""
    from ..text.vocab import ID_MAP_NAME, IdMap
    ours = getattr(engine.tokenizer, "reduced_vocab", None)
    if (data / ID_MAP_NAME).is_file() != (ours is not None):
        raise InputError(f"{data} and the checkpoint disagree on the vocabulary: only one of them has {ID_MAP_NAME}")
    if ours is None:
        return
    theirs = IdMap.load(data / ID_MAP_NAME, ours.tokenizer)
    if not np.array_equal(theirs.ids, ours.ids):
        raise InputError(f"{data / ID_MAP_NAME} ({theirs.vocab_size} ids) differs from the checkpoint's id map "
                         f"({ours.vocab_size} ids): the corpus was prepared for another model")


def unigram_loss(train: np.ndarray, targets: np.ndarray, vocab_size: int) -> float:
    """Mean NLL (nats) of `targets` under the training split's unigram frequencies with add-one smoothing."""
    counts = np.bincount(train, minlength=vocab_size).astype(np.float64) + 1.0
    logp = np.log(counts) - np.log(counts.sum())
    return float(-logp[targets].mean())


@torch.no_grad()
def measure_heldout(model, windows: np.ndarray, batch: int) -> dict:
    """Cross-entropy, per-layer expert loads and Engram gates over the held-out windows (one Trace per batch)."""
    from ..trace import Trace, TraceBudget
    total, count = 0.0, 0
    loads: dict[str, np.ndarray] = {}
    gates: dict[str, list[np.ndarray]] = {}      # path -> [positions, hc] per batch
    gate_at: list[tuple[float, str, int, int]] = []  # (mean gate, path, window, pos)
    n_experts = model.args.n_routed_experts
    for start in range(0, len(windows), batch):
        chunk = torch.from_numpy(windows[start:start + batch])           # [b, seq + 1]
        trace = Trace(TraceBudget(max_tokens=None, top_k_logits=0))
        logits = model(chunk[:, :-1], trace=trace, logits="all").logits  # [b, seq, V]
        total += float(F.cross_entropy(logits.flatten(0, 1).float(), chunk[:, 1:].flatten(), reduction="sum"))
        count += chunk[:, 1:].numel()
        for path in trace.paths("moe"):
            if path.startswith("layers."):                               # backbone routers only
                load = trace.expert_load(path, n_experts)
                loads[path] = loads.get(path, 0) + load
        for path, _, row, pos, values in trace.facts("engram"):
            g = np.asarray(values[2], dtype=np.float64).reshape(-1)      # [hc] one gate per stream
            gates.setdefault(path, []).append(g)
            gate_at.append((float(g.mean()), path, start + row, pos))
    return {"loss": total / count, "tokens": count, "loads": loads,
            "gates": {p: np.stack(v) for p, v in gates.items()}, "gate_at": gate_at}


def balance_table(loads: dict[str, np.ndarray]) -> list[dict]:
    """Per router: max violation = max load / mean load − 1 over the held-out tokens."""
    rows = []
    for path, load in loads.items():
        load = np.asarray(load, dtype=np.float64)
        mean = load.mean()
        rows.append({"layer": path, "tokens_routed": int(load.sum()), "max_load": int(load.max()),
                     "min_load": int(load.min()), "max_violation": float(load.max() / mean - 1) if mean else 0.0})
    return rows


def gate_stats(gates: dict[str, np.ndarray], gate_at, windows: np.ndarray, decode, order: int, top: int) -> dict:
    """Mean and percentiles of each Engram layer's per-stream gates, and the n-grams whose gates are highest."""
    layers = []
    for path, g in gates.items():                                        # g [positions, hc]
        q = np.percentile(g, [5, 25, 50, 75, 95])
        layers.append({"layer": path, "positions": int(g.shape[0]), "mean": float(g.mean()),
                       "per_stream_mean": [float(x) for x in g.mean(0)],
                       **{f"p{p}": float(v) for p, v in zip((5, 25, 50, 75, 95), q)}})
    best, seen = [], set()
    for mean, path, w, pos in sorted(gate_at, key=lambda r: -r[0]):
        # the n-gram Engram looked up at `pos`: the token there and the order − 1 before it
        ids = windows[w, max(0, pos - order + 1):pos + 1].tolist()
        text = decode(ids)
        if (path, text) in seen:
            continue
        seen.add((path, text))
        best.append({"layer": path, "ngram": text, "gate": mean})
        if len(best) == top:
            break
    return {"layers": layers, "top_ngrams": best}


def log_summary(rows: list[dict[str, str]]) -> dict:
    if not rows:
        raise InputError("log.csv has no rows: nothing was trained")

    def col(name):
        return [(int(r["step"]), float(r[name])) for r in rows if r.get(name) not in (None, "")]
    train, held, vio, rate = col("train_loss"), col("heldout_loss"), col("max_violation"), col("tokens_per_s")
    last = rows[-1]
    tail = [v for _, v in train[-10:]]
    return {"steps": int(last["step"]), "tokens": int(float(last["tokens"])),
            "elapsed_s": float(last["elapsed_s"]) if last.get("elapsed_s") else None,
            "final_train_loss_mean_last10": float(np.mean(tail)) if tail else None,
            "last_logged_heldout_loss": held[-1][1] if held else None,
            "final_max_violation": vio[-1][1] if vio else None,
            "median_tokens_per_s": float(np.median([v for _, v in rate])) if rate else None,
            "curve": {"train": train, "heldout": held}}


def drafter_phases(ckpt: Path) -> list[dict]:
    """One entry per drafter training log in the checkpoint: drafter_phase*_log.csv in order, then
    drafter_log.csv (the phase that produced the shipped drafter)."""
    out = []
    for path in sorted(ckpt.glob("drafter_phase*_log.csv")) + [ckpt / "drafter_log.csv"]:
        rows = read_log(path) if path.is_file() else []
        if rows:
            out.append({"log": path.name, "steps": int(rows[-1]["step"]), "elapsed_s": float(rows[-1]["elapsed_s"]),
                        "final_ce_mean_last10": float(np.mean([float(r["ce"]) for r in rows[-10:]]))})
    return out


def plot_loss(curve: dict, unigram: float, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    if curve["train"]:
        ax.plot(*zip(*curve["train"]), lw=1, label="train loss")
    if curve["heldout"]:
        ax.plot(*zip(*curve["heldout"]), "o-", ms=3, label="held-out loss")
    ax.axhline(unigram, color="grey", ls="--", lw=1, label=f"unigram baseline ({unigram:.2f})")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / token)")
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, format="png")
    plt.close(fig)


def measure_decoding(engine, opts: CardOptions) -> dict:
    """Samples from fixed prompts, and plain vs DSpark decode (same prompts) at T=0 and T=1."""
    from ..dspark.metrics import summarize
    from ..generation import DSparkConfig
    samples = engine.generate_text(list(PROMPTS), max_new_tokens=opts.new_tokens, seed=opts.seed,
                                   temperature=opts.sample_temperature)
    out = {"samples": [{"prompt": p, "text": t} for p, t in zip(PROMPTS, samples.texts)],
           "sample_settings": {"temperature": opts.sample_temperature, "seed": opts.seed,
                               "max_new_tokens": opts.new_tokens}}
    if not engine.args.has_dspark:
        out["dspark"] = None
        return out
    ids = [engine.encode(p) for p in PROMPTS]
    kw = dict(max_new_tokens=opts.new_tokens, seed=opts.seed, stop_tokens=())
    engine.generate(ids[:1], **{**kw, "max_new_tokens": 2})            # warm-up
    runs = {}
    for t in (0.0, 1.0):
        rates: dict[bool, list[float]] = {False: [], True: []}
        last: dict[bool, list] = {}
        for rep in range(opts.repeats):
            for spec in ((False, True) if rep % 2 == 0 else (True, False)):  # a busy machine slows both alike
                # one prompt at a time (batch 1, as `generate --prompt` runs), pooled over the prompts
                res = [engine.generate([p], temperature=t, dspark=DSparkConfig() if spec else None, **kw)
                       for p in ids]
                decoded = sum(max(len(r.tokens[0]) - 1, 0) for r in res)
                rates[spec].append(decoded / sum(r.decode_s for r in res))
                last[spec] = res                                         # seeded: every repeat has the same tokens
        m = summarize([s for r in last[True] for s in r.steps])
        plain_rate, spec_rate = statistics.median(rates[False]), statistics.median(rates[True])
        ratios = [d / p for p, d in zip(rates[False], rates[True])]      # one plain/DSpark pair per repeat
        runs[f"T={t:g}"] = {"mean_accepted_length": m.mean_accepted_length, "acceptance_rate": m.acceptance_rate,
                            "per_position_acceptance": m.conditional_acceptance,
                            "dspark_steps": m.steps,
                            "decoded_tokens": sum(max(len(r.tokens[0]) - 1, 0) for r in last[True]),
                            "plain_tokens_per_s": plain_rate, "dspark_tokens_per_s": spec_rate,
                            "speedup": spec_rate / plain_rate, "speedup_range": [min(ratios), max(ratios)],
                            "outputs_identical": [r.tokens for r in last[False]] == [r.tokens for r in last[True]]}
    out["dspark"] = {"prompts": list(PROMPTS), "batch": 1, "repeats": opts.repeats,
                     "threads": torch.get_num_threads(), **runs}
    return out


def build_card(ckpt: str | Path, data: str | Path, opts: CardOptions = CardOptions(), log=print) -> dict:
    """Measure everything and write MODEL_CARD.md, card.json and loss_curve.png into `ckpt`; returns card.json."""
    from ..checkpoint.files import checkpoint_files
    from ..generation import Engine
    from ..spec.accounting import account
    ckpt, data = Path(ckpt), Path(data)
    check_inputs(ckpt, data)
    manifest = json.loads((data / MANIFEST_NAME).read_text(encoding="utf-8"))
    recorded = manifest.get("outputs", {}).get(TOKENS_NAME)
    actual = sha256_file(data / TOKENS_NAME)
    if recorded != actual:
        raise InputError(f"{data / TOKENS_NAME}: sha256 {actual} differs from the manifest's {recorded}; "
                         "re-run prepare_data")
    engine = Engine.load(checkpoint=ckpt)
    args, model = engine.args, engine.model
    check_same_vocabulary(engine, data)
    tokens = load_tokens(data)
    for part in ("train", "heldout"):
        if tokens[part].size and int(tokens[part].max()) >= args.vocab_size:
            raise InputError(f"{data}: {part} tokens reach id {int(tokens[part].max())}, outside the checkpoint's "
                             f"vocab_size {args.vocab_size}: the data and the checkpoint use different id maps")
    log("measuring held-out loss, expert load and Engram gates ...")
    windows = heldout_windows(tokens["heldout"], opts.seq, opts.windows)   # [n, seq + 1]
    held = measure_heldout(model, windows, opts.batch)
    base = unigram_loss(tokens["train"], windows[:, 1:].reshape(-1), args.vocab_size)
    decode = engine.tokenizer.decode
    engram = gate_stats(held["gates"], held["gate_at"], windows, decode, args.engram_max_ngram_size,
                        opts.top_ngrams) if args.has_engram else None
    balance = balance_table(held["loads"])
    # the same measurement on training text: balancing tuned the biases there, so the gap to the held-out
    # table shows how much routing shifts on unseen works
    train_loads = measure_heldout(model, heldout_windows(tokens["train"], opts.seq, opts.windows), opts.batch)["loads"]
    train_balance = {r["layer"]: r["max_violation"] for r in balance_table(train_loads)}
    training = log_summary(read_log(ckpt / "log.csv"))
    log("measuring samples and DSpark decoding ...")
    decoding = measure_decoding(engine, opts)
    acc = account(args)
    card = {
        "format": "v41viz-model-card/1", "checkpoint": str(ckpt), "data": str(data),
        "measured": {"date": datetime.date.today().isoformat(), "machine": machine_description("cpu"),
                     "torch": torch.__version__, "python": platform.python_version(),
                     "threads": torch.get_num_threads()},
        "sources": manifest.get("sources", []),
        "corpus": {"works": {s: sorted(n for n, w in manifest.get("works", {}).items() if w.get("split") == s)
                             for s in ("train", "heldout")},
                   "tokens": manifest.get("tokens"), "tokens_sha256": actual,
                   "vocab_size": args.vocab_size, "cleaning": manifest.get("cleaning")},
        "model": {"name": args.name, "total_params": acc.total_params, "backbone_params": acc.backbone_params,
                  "params_by_kind": dict(acc.params_by_kind),
                  "bytes_on_disk": sum(f.stat().st_size for f in checkpoint_files(ckpt))},
        "training": {k: v for k, v in training.items() if k != "curve"},
        "heldout": {"windows": len(windows), "seq": opts.seq, "tokens": held["tokens"], "loss": held["loss"],
                    "perplexity": math.exp(held["loss"]), "unigram_loss": base, "unigram_perplexity": math.exp(base)},
        "expert_balance": {"layers": [{**r, "train_max_violation": train_balance.get(r["layer"])} for r in balance],
                           "max_violation": max((r["max_violation"] for r in balance), default=None),
                           "train_max_violation": max(train_balance.values(), default=None)},
        "engram": engram, "drafter_training": drafter_phases(ckpt), **decoding,
    }
    plot_loss(training["curve"], base, ckpt / "loss_curve.png")
    (ckpt / "card.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    (ckpt / "MODEL_CARD.md").write_text(render(card), encoding="utf-8")
    return card


def _f(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _range(pair) -> str:
    return "n/a" if not pair else f"{pair[0]:.2f}–{pair[1]:.2f}"


def _positions(rates) -> str:
    return "n/a" if not rates else " / ".join("–" if x != x else f"{100 * x:.0f}%" for x in rates)


def readme_table(card: dict) -> str:
    """The README's table of the shipped model, from card.json (tests/test_readme.py checks the README holds it)."""
    h, b, e, d = card["heldout"], card["expert_balance"], card["engram"], card["dspark"]
    works = ", ".join(w.removesuffix("_gut").replace("_", " ").title() for w in card["corpus"]["works"]["heldout"])
    worst = max(b["layers"], key=lambda r: r["max_violation"])
    best = min(b["layers"], key=lambda r: r["max_violation"])
    rows = [f"| measured by `python -m engine card` on held-out works ({works}) | |", "|---|---|",
            f"| held-out loss / perplexity | {h['loss']:.3f} nats/token / {h['perplexity']:.1f} "
            f"(unigram baseline {h['unigram_loss']:.3f} / {h['unigram_perplexity']:.1f}) |",
            f"| expert load, max violation (max/mean − 1) | worst layer {worst['max_violation']:.3f} (best "
            f"{best['max_violation']:.3f}) on the held-out works; worst {b['train_max_violation']:.3f} on as many "
            "windows of training text |"]
    if e:
        rows.append("| Engram gates, mean | " + ", ".join(f"{r['mean']:.2f} ({r['layer']})" for r in e["layers"]) + " |")
    if d:
        for k in ("T=0", "T=1"):
            r = d[k]
            rows.append(f"| DSpark, {k.replace('=', ' = ')} | mean accepted length {r['mean_accepted_length']:.3f} over "
                        f"{r['dspark_steps']} steps; {r['speedup']:.2f}× the tokens/s of plain decoding (per-repeat "
                        f"range {_range(r['speedup_range'])}, {d['repeats']} repeats); "
                        f"{'identical output' if r['outputs_identical'] else 'sampled output'}; acceptance by draft "
                        f"position {_positions(r['per_position_acceptance'])} |")
    m = card["measured"]
    rows.append(f"| measured on | {m['date']}, {m['machine']}, torch {m['torch']}, {m['threads']} thread(s) |")
    return "\n".join(rows) + "\n"


def render(card: dict) -> str:
    """MODEL_CARD.md from card.json (every number comes from the measurement)."""
    m, t, h, b = card["model"], card["training"], card["heldout"], card["expert_balance"]
    when = card.get("measured") or {}
    out = [f"# Model card: {m['name'] or 'checkpoint'}", "",
           "Generated by `python -m engine card`; every number below was measured by that script"
           + (f" on {when['date']}, {when['machine']}, torch {when['torch']}, {when['threads']} thread(s)."
              if when else "."), "",
           "## Data", ""]
    for s in card["sources"]:
        out += [f"- {s.get('package')} from {s.get('registry')}: `{s.get('file')}`, sha256 `{s.get('sha256')}`",
                f"  - licence: {s.get('licence')}"]
    c = card["corpus"]
    out += [f"- held-out works: {', '.join(c['works']['heldout']) or 'none listed'}; "
            f"{len(c['works']['train'])} works for training",
            f"- tokens: {', '.join(f'{k} {v:,}' for k, v in (c['tokens'] or {}).items())} "
            f"(tokens.safetensors sha256 `{c['tokens_sha256']}`), vocabulary {c['vocab_size']} ids",
            "", "## Size", "",
            f"- parameters: {m['total_params']:,} total, {m['backbone_params']:,} backbone",
            f"- weights on disk: {m['bytes_on_disk']:,} bytes", "",
            "## Training", "", "![loss curve](loss_curve.png)", "",
            f"- {t['steps']:,} steps, {t['tokens']:,} tokens, {_f(t['elapsed_s'], 0)} s, "
            f"median {_f(t['median_tokens_per_s'], 0)} tokens/s",
            f"- train loss (mean of the last 10 logged steps) {_f(t['final_train_loss_mean_last10'])}; "
            f"last logged held-out loss {_f(t['last_logged_heldout_loss'])}; "
            f"last logged max load violation {_f(t['final_max_violation'])}", "",
            "## Held-out evaluation", "",
            f"{h['windows']} windows of {h['seq']} tokens ({h['tokens']:,} predicted tokens).", "",
            "| | loss (nats/token) | perplexity |", "|---|---|---|",
            f"| model | {_f(h['loss'])} | {_f(h['perplexity'], 1)} |",
            f"| unigram (train frequencies, add-one) | {_f(h['unigram_loss'])} | {_f(h['unigram_perplexity'], 1)} |",
            "", "## Expert load balance (held-out tokens)", "",
            f"Max violation = max load / mean load − 1; worst layer {_f(b['max_violation'])} on held-out text, "
            f"{_f(b.get('train_max_violation'))} on as many windows of training text (where balancing set the biases).",
            "", "| router | tokens routed | max load | min load | max violation | on training text |",
            "|---|---|---|---|---|---|"]
    out += [f"| {r['layer']} | {r['tokens_routed']} | {r['max_load']} | {r['min_load']} | {_f(r['max_violation'])} | "
            f"{_f(r.get('train_max_violation'))} |" for r in b["layers"]]
    e = card["engram"]
    out += ["", "## Engram gates (held-out text)", ""]
    if e is None:
        out.append("This model has no Engram layers.")
    else:
        out += ["| layer | mean | p5 | p25 | p50 | p75 | p95 | mean per stream |", "|---|---|---|---|---|---|---|---|"]
        out += [f"| {r['layer']} | {_f(r['mean'])} | {_f(r['p5'])} | {_f(r['p25'])} | {_f(r['p50'])} | {_f(r['p75'])} | "
                f"{_f(r['p95'])} | {' '.join(_f(x, 2) for x in r['per_stream_mean'])} |" for r in e["layers"]]
        out += ["", "Highest-gated n-grams (mean gate over streams):", ""]
        out += [f"- {_f(r['gate'])} `{r['ngram']!r}` ({r['layer']})" for r in e["top_ngrams"]]
    d = card["dspark"]
    out += ["", "## DSpark speculative decoding", ""]
    if d is None:
        out.append("This model has no DSpark drafter.")
    else:
        out += [f"Prompts {', '.join(repr(p) for p in d['prompts'])}, one at a time (batch 1), {d['threads']} torch "
                f"thread(s); tokens/s is the median of {d['repeats']} alternating plain/DSpark repeats, the ratio is "
                "DSpark's median over plain's with the range of the per-repeat ratios.", "",
                "| | DSpark steps | mean accepted length | acceptance rate | plain tokens/s | DSpark tokens/s | "
                "ratio (range) | same output |",
                "|---|---|---|---|---|---|---|---|"]
        for k in ("T=0", "T=1"):
            r = d[k]
            out.append(f"| {k} | {r.get('dspark_steps', 'n/a')} | {_f(r['mean_accepted_length'])} | "
                       f"{_f(r['acceptance_rate'])} | {_f(r['plain_tokens_per_s'], 1)} | "
                       f"{_f(r['dspark_tokens_per_s'], 1)} | {_f(r['speedup'], 2)} ({_range(r.get('speedup_range'))}) | "
                       f"{'yes' if r['outputs_identical'] else 'no'} |")
        out += ["", "Acceptance by draft position k (DSpark steps that verified draft k with drafts 1..k−1 accepted, "
                "the share that accepted it too): "
                + "; ".join(f"{k} {_positions(d[k].get('per_position_acceptance'))}" for k in ("T=0", "T=1")) + "."]
        out += ["", "At T=1 the sampled tokens follow the same distribution but need not be the same tokens."]
        phases = card.get("drafter_training") or []
        if phases:
            out += ["", "Drafter training (backbone frozen; block cross-entropy over each phase's own batches, so "
                    "phases trained on different data are not comparable):", "",
                    "| log | steps | seconds | block CE, last 10 steps |", "|---|---|---|---|"]
            out += [f"| {p['log']} | {p['steps']} | {_f(p['elapsed_s'], 0)} | {_f(p['final_ce_mean_last10'])} |"
                    for p in phases]
    s = card["sample_settings"]
    out += ["", f"## Samples (temperature {s['temperature']}, seed {s['seed']}, {s['max_new_tokens']} new tokens)", ""]
    for r in card["samples"]:
        out += ["```", r["prompt"] + r["text"], "```"]
    return "\n".join(out) + "\n"
