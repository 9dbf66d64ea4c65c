"""Model card: measure a checkpoint on its prepared corpus and write MODEL_CARD.md, card.json and loss_curve.png."""
from __future__ import annotations

import datetime
import json
import math
import platform
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..accounting.accounting import account
from ..bench.machine import machine_description
from ..checkpoint.files import checkpoint_files
from ..generation import Engine
from ..request.decoding import SUGGESTED_NO_REPEAT_NGRAM, SUGGESTED_REPETITION_PENALTY
from ..spec.errors import InputError, MissingFileError
from ..text.vocab import ID_MAP_NAME, IdMap
from ..trace import Trace, TraceBudget
from .card_decoding import measure_dspark, measure_samples, measure_text_quality
from .card_prompts import heldout_prompts
from .card_render import render
from .corpus import MANIFEST_NAME, TOKENS_NAME, load_tokens, sha256_file
from .fields import option
from .log import read_log
from .text_quality import words_of
from .windows import heldout_windows


@dataclass(frozen=True)
class CardOptions:
    seq: int = option(256, "tokens per held-out window")       # the model sees seq, predicts seq
    # non-overlapping, spread evenly over the stream; the default takes every one of the shipped corpus's 669: a
    # max over 16 experts' loads is biased upwards on a small sample (32 windows read 0.62 where all read 0.48)
    windows: int = option(1024, "held-out windows, at most (every non-overlapping one when the split has fewer)")
    batch: int = option(8, "windows per forward")
    new_tokens: int = option(48, "new tokens per prompt for samples and decode timing")
    repeats: int = option(3, "timing repeats, median taken")   # DSpark / plain timing
    prompts: int = option(8, "held-out speech openings for the DSpark rows and the text quality")
    prompt_words: int = 4                                      # words of the speech after the speaker's heading
    quality_tokens: int = option(200, "greedy new tokens per held-out prompt for the text-quality measures")
    # the decoding options measured beside the engine's defaults (DSpark at T = 0, text quality): the app's defaults
    repetition_penalty: float = option(SUGGESTED_REPETITION_PENALTY, "repetition penalty of the decoding options "
                                       "measured beside the engine's defaults (1 = off)")
    no_repeat_ngram: int = option(SUGGESTED_NO_REPEAT_NGRAM, "no-repeat n-gram size of those options (0 = off)")
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


def text_bytes(tokenizer, ids: np.ndarray) -> int:
    """UTF-8 bytes of the text that model ids stand for; special tokens (BOS, EOS, ...) stand for none. The
    denominator of bits per byte, which compares models with different vocabularies fairly."""
    special = set(tokenizer.special_ids().values())
    values, counts = np.unique(np.asarray(ids).reshape(-1), return_counts=True)
    return int(sum(int(c) * len(tokenizer.token_bytes(int(v))) for v, c in zip(values, counts) if v not in special))


def bits_per_byte(loss: float, tokens: int, n_bytes: int) -> float:
    """A mean loss in nats per token over `tokens` tokens that stand for `n_bytes` bytes, in bits per byte."""
    return loss * tokens / (math.log(2) * n_bytes) if n_bytes else float("nan")


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
    # matplotlib is optional (the train extra): only the card's loss plot needs it
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


def build_card(ckpt: str | Path, data: str | Path, opts: CardOptions = CardOptions(), log=print) -> dict:
    """Measure everything and write MODEL_CARD.md, card.json and loss_curve.png into `ckpt`; returns card.json."""
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
    train_loads = measure_heldout(model, heldout_windows(tokens["train"], opts.seq, len(windows)), opts.batch)["loads"]
    train_balance = {r["layer"]: r["max_violation"] for r in balance_table(train_loads)}
    training = log_summary(read_log(ckpt / "log.csv"))
    n_bytes = text_bytes(engine.tokenizer, windows[:, 1:])
    prompts = heldout_prompts(decode(tokens["heldout"].tolist()), opts.prompts, opts.prompt_words)
    log(f"measuring samples and DSpark decoding on {len(prompts)} held-out prompts ...")
    samples, dspark = measure_samples(engine, opts), measure_dspark(engine, prompts, opts)
    log("measuring the text quality of greedy continuations ...")
    known = set(words_of(decode(tokens["train"].tolist())))            # coined words are not in it
    quality = measure_text_quality(engine, prompts, opts, known)
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
                    "perplexity": math.exp(held["loss"]), "unigram_loss": base, "unigram_perplexity": math.exp(base),
                    "bytes": n_bytes, "bits_per_byte": bits_per_byte(held["loss"], held["tokens"], n_bytes),
                    "unigram_bits_per_byte": bits_per_byte(base, held["tokens"], n_bytes)},
        "expert_balance": {"layers": [{**r, "train_max_violation": train_balance.get(r["layer"])} for r in balance],
                           "max_violation": max((r["max_violation"] for r in balance), default=None),
                           "train_max_violation": max(train_balance.values(), default=None)},
        "engram": engram, "drafter_training": drafter_phases(ckpt),
        "heldout_prompts": {"prompts": prompts, "rule": f"{len(prompts)} speeches spread evenly over the held-out "
                            f"works, each as its speaker's heading and first {opts.prompt_words} words "
                            "(engine.training.card_prompts)"},
        "decoding_options": {"repetition_penalty": opts.repetition_penalty, "no_repeat_ngram": opts.no_repeat_ngram},
        "dspark": dspark, "text_quality": quality, **samples,
    }
    plot_loss(training["curve"], base, ckpt / "loss_curve.png")
    (ckpt / "card.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    (ckpt / "MODEL_CARD.md").write_text(render(card), encoding="utf-8")
    return card
