"""The engine against DeepSeek's reference implementation of V4.1, on the same weights, side by side.

    .venv/bin/python scripts/bench_reference.py --reference DIR [--configs tiny-v4.1,default-small] [--threads 1]
        [--runs 5] [--prompts 64,512] [--decode-steps 16] [--prefills 3] [--dtypes float32,bfloat16]
        [--results docs/results/reference.json]

DIR is a folder holding DeepSeek's V4.1 reference inference code as a package (model.py with package-relative
imports of engram.py, kernel_cpu.py, image_processor.py and vision.py: the CPU-runnable copy vendored in
tenstorrent/tt-metal at models/demos/deepseek_v3_d_p/reference/deepseek_v41/, see docs/benchmarks.md). The project
never holds that code; the script imports it from DIR.

Each config runs in a fresh process, one torch thread (--threads): the engine's seeded random init of the config,
stored as the official layout stores it (BF16 / F32 tensors; the Engram tables FP8 with one E8M0 scale per row and 32
channels, the only form the reference's Engram takes), loads into the reference (its parameter names are the
official ones) and into the engine (the tables dequantized), so both hold the same values. The reference runs in
bf16, its only dtype on a CPU (its act_quant / sparse_attn ports take bf16 input only); the engine runs in each of
--dtypes. First both must agree, on the same weights with every compressed row kept (index_topk and
candidate_topk_blocks raised): each prompt's last-position logits close and the same greedy tokens for
--check-steps steps; otherwise nothing is timed and the script exits with 1. The configs' own top-k is checked
too, for the record (the share of indexer picks both make; near-tied picks may part). Then, --runs times, the sides
take turns call by call (the order rotating per run): --prefills prefills of each prompt (one forward of the whole
prompt, greedy pick included; the run's median) and --decode-steps eager decode steps after the first prompt (the
run's median step). Reported: each side's tokens/s, median and range over runs, and the engine / reference ratio as
the median of the per-run ratios, with their range.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PACKAGE = "deepseek_v41_reference"          # the name DIR is imported under
REFERENCE_FILES = ("model.py", "engram.py", "kernel_cpu.py", "image_processor.py", "vision.py")
REFERENCE_DTYPE = "bfloat16"
# max |Δ logit| / max |reference logit| when every compressed row is kept: bf16 like for like; the engine's fp32
# run also differs by the reference's bf16 roundings, which flip a near-tied expert choice now and then
LOGIT_TOLERANCE = {"bfloat16": 0.03, "float32": 0.10}
SHIPPED_FP4_BLOCK: dict[str, int] = {}      # the reference module's fp4_block_size as imported


def import_reference(folder: Path):
    """DIR's model.py, imported as PACKAGE.model (its imports are package-relative, as the vendored copy's README
    says). One reference model per process: its module keeps world_size, default_dtype and shared_attn globals."""
    missing = [f for f in REFERENCE_FILES if not (folder / f).is_file()]
    if missing:
        raise SystemExit(f"--reference {folder}: missing {', '.join(missing)} (want DeepSeek's V4.1 reference "
                         f"package: {', '.join(REFERENCE_FILES)})")
    package = types.ModuleType(PACKAGE)
    package.__path__ = [str(folder)]
    sys.modules[PACKAGE] = package
    return importlib.import_module(f"{PACKAGE}.model")


class TokenMapTokenizer:
    """What the reference's NgramHashState reads of a tokenizer (len, backend_tokenizer.decode / id_to_token), made
    from a token map: token i decodes to a text naming its compressed id, so the reference's normalizer groups the
    ids as the map does. The reference numbers compressed ids by first appearance and derives its hash multipliers
    from their count, which must be engram_compressed_vocab_size: a map numbered that way (engine.bench's i mod C
    is) is extended past the model's vocabulary with the ids it does not use (default-small's 13,886 tokens use
    13,886 of 99,092), which no input id reaches."""

    def __init__(self, token_map, compressed_vocab_size: int) -> None:
        self.token_map = [int(c) for c in token_map]
        seen = set(self.token_map)
        self.token_map += [c for c in range(compressed_vocab_size) if c not in seen]
        first = list(dict.fromkeys(self.token_map))
        if first != list(range(len(first))) or len(first) != compressed_vocab_size:
            raise SystemExit("the token map is not numbered by first appearance over the compressed vocabulary")
        self.backend_tokenizer = self

    def __len__(self) -> int:
        return len(self.token_map)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return f"c{self.token_map[ids[0]]}"

    def id_to_token(self, token_id: int) -> str:
        return self.decode([token_id])


def reference_args(ref, args):
    """The reference's ModelArgs for our config: every field both name, greedy sampling (temperature 0)."""
    ours = args.to_dict()
    fields = {f.name for f in dataclasses.fields(ref.ModelArgs)}
    values = {k: tuple(v) if isinstance(v, list) else v for k, v in ours.items() if k in fields}
    return ref.ModelArgs(**{**values, "temperature": 0.0})


def stored_weights(args, seed: int) -> dict:
    """The engine's seeded random init of `args`, as the official layout stores it (engine.checkpoint's encode):
    BF16 / F32 tensors by the inventory, and the Engram tables as FP8 rows with their E8M0 scales."""
    import torch

    from engine.accounting.inventory import inventory_tuple
    from engine.checkpoint.official_writer import encode
    from engine.model import Transformer, init_weights
    from engine.quant.formats import quantize_engram_rows
    model = Transformer(args, synthetic_token_map(args))
    init_weights(model, seed)
    source = model.state_dict()
    stored = {}
    for spec in inventory_tuple(args):
        if spec.is_scale or spec.name not in source:
            continue
        if spec.name.endswith(".engram.embed.weight"):
            rows, scale = quantize_engram_rows(source[spec.name].float())
            stored[spec.name], stored[spec.name.removesuffix(".weight") + ".scale"] = rows, scale
        else:
            stored.update(encode(spec, source[spec.name], args))
    del model
    assert all(t.dtype in (torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e8m0fnu)
               for t in stored.values())
    return stored


def synthetic_token_map(args):
    """engine.bench.cpu's map (id mod the compressed vocabulary): keeps the bench free of the tokenizer files."""
    import torch
    return torch.arange(args.vocab_size).remainder(args.engram_compressed_vocab_size).numpy()


def reference_state(model, stored: dict) -> dict:
    """The reference's state dict filled from `stored` (the names are the official ones; a draft stage's embed and
    head are the backbone's), each tensor in the dtype the reference keeps it."""
    state = {}
    for name, param in model.state_dict().items():
        source = name
        for shared in ("embed.", "head."):
            if name.startswith("mtp.") and name.split(".", 2)[2].startswith(shared):
                source = name.split(".", 2)[2]
        if source not in stored:
            raise SystemExit(f"the reference has '{name}', which the official layout of this config lacks")
        state[name] = stored[source].to(param.dtype)
    return state


def engine_state(model, stored: dict) -> dict:
    """The engine's state dict from `stored`: the Engram tables dequantized (FP8 × E8M0: exact in bf16 and fp32)."""
    from engine.quant.formats import dequantize_engram_rows
    state = {}
    for name, param in model.state_dict().items():
        if name.endswith(".engram.embed.weight"):
            value = dequantize_engram_rows(stored[name], stored[name.removesuffix(".weight") + ".scale"])
        elif name in stored:
            value = stored[name]
        else:
            raise SystemExit(f"the engine has '{name}', which the official layout of this config lacks")
        state[name] = value.to(param.dtype)
    return state


class ReferenceSide:
    """DeepSeek's Transformer: forward(ids, start_pos) → (greedy ids, last logits, main_hidden); its caches are its
    own buffers, overwritten by each prefill at position 0."""

    def __init__(self, ref, args, stored: dict, token_map) -> None:
        import torch
        self.name, self.dtype = "reference", REFERENCE_DTYPE
        tokenizer = TokenMapTokenizer(token_map, args.engram_compressed_vocab_size)
        with ref.set_dtype(torch.bfloat16):
            self.model = ref.Transformer(reference_args(ref, args), tokenizer)
        self.notes = fit_engram_blocks(self.model, ref.fp8_block_size) + fit_index_blocks(ref, args)
        self.model.load_state_dict(reference_state(self.model, stored), strict=True)
        self.model.eval()
        self.pos = 0

    def prefill(self, tokens):
        ids, logits, _ = self.model(tokens, 0)
        self.pos = tokens.size(1)
        return ids, logits

    def step(self, ids):
        ids, logits, _ = self.model(ids.view(-1, 1), self.pos)
        self.pos += 1
        return ids, logits


def fit_engram_blocks(model, block: int) -> list[str]:
    """The reference's Engram tables keep one E8M0 scale per `block` (32) channels and so need head_dim % 32 == 0;
    a narrower head (tiny-v4.1's 8) gets one scale per row, the form the official writer stores (ENGRAM_BLOCK
    covering the partial block): the table's own block_size attribute, read by its forward, set to head_dim."""
    import torch
    fitted = []
    for name, module in model.named_modules():
        if type(module).__name__ != "ParallelEngramEmbedding" or module.dim % block == 0:
            continue
        if module.dim > block:
            raise SystemExit(f"{name}: Engram head_dim {module.dim} is neither a multiple of {block} nor below it")
        module.block_size = module.dim
        module.scale = torch.nn.Parameter(torch.empty(module.part_num_embeddings, 1, dtype=module.scale.dtype),
                                          requires_grad=False)
        fitted.append((name, module.dim))
    if not fitted:
        return []
    return [f"its Engram head_dim of {fitted[0][1]} is below the reference's FP8 block of {block}: the tables "
            f"({', '.join(name for name, _ in fitted)}) keep one E8M0 scale per row, their block_size set to "
            f"{fitted[0][1]}, as the official writer stores them"]


def fit_index_blocks(ref, args) -> list[str]:
    """The reference quantizes indexer queries and keys to FP4 per fp4_block_size (32) channels, asserting that the
    width divides; a narrower index head (tiny-v4.1's 16) is one block, as the engine's zero-padded partial block
    makes it: the module's fp4_block_size set to index_head_dim (no FP4 weights use it: the tiny configs store
    bf16 experts)."""
    block = SHIPPED_FP4_BLOCK.setdefault("fp4_block_size", ref.fp4_block_size)    # before any change here
    if args.index_head_dim % block == 0:
        return []
    if args.index_head_dim > block or args.expert_dtype == "fp4":
        raise SystemExit(f"index_head_dim {args.index_head_dim} does not fit the reference's FP4 blocks of {block}")
    ref.fp4_block_size = args.index_head_dim
    return [f"its index_head_dim of {args.index_head_dim} is below the reference's FP4 block of {block}: the "
            f"reference's fp4_block_size set to {args.index_head_dim} (one block per index query and key, as the "
            f"engine's zero-padded partial block makes it)"]


class EngineSide:
    """The engine's model (its speed transforms applied, as Engine.load applies them) in `dtype`."""

    def __init__(self, args, stored: dict, token_map, dtype_name: str) -> None:
        import torch

        from engine.placement import build_model, prepare_model
        self.name, self.dtype = "engine", dtype_name
        model = build_model(args, token_map, dtype=getattr(torch, dtype_name))
        model.load_state_dict(engine_state(model, stored), strict=True)
        self.model = prepare_model(model).eval()
        self.cache = None

    def new_cache(self, length: int) -> None:
        self.cache = self.model.new_cache(1, length)

    def prefill(self, tokens):
        logits = self.model(tokens, self.cache, logits="last").logits
        return logits.argmax(-1), logits

    def step(self, ids):
        logits = self.model(ids.view(-1, 1), self.cache, logits="last").logits
        return logits.argmax(-1), logits


def agreement(reference: ReferenceSide, engine: EngineSide, prompts: dict, steps: int) -> list[dict]:
    """Per prompt: the last-position logits of both prefills (max |Δ| over max |reference|) and the share of
    queries whose indexer picks are the same rows, then `steps` greedy steps from the first prompt: the tokens
    each side picks, fed back to itself."""
    rows = []
    for length, tokens in prompts.items():
        engine.new_cache(length + steps)
        with IndexerPicks(reference.model, offset=length) as theirs, IndexerPicks(engine.model) as mine:
            ref_ids, ref_logits = reference.prefill(tokens)
            ids, logits = engine.prefill(tokens)
        diff = (logits.float() - ref_logits.float()).abs().max().item()
        scale = ref_logits.float().abs().max().item()
        ref_tokens, tokens_ = [int(ref_ids)], [int(ids)]
        if length == min(prompts):
            for _ in range(steps - 1):
                ref_ids, _ = reference.step(ref_ids)
                ids, _ = engine.step(ids)
                ref_tokens.append(int(ref_ids))
                tokens_.append(int(ids))
        rows.append({"engine_dtype": engine.dtype, "prompt": length, "max_logit_diff": diff,
                     "relative_logit_diff": diff / scale, "same_picks": theirs.same_share(mine),
                     "reference_tokens": ref_tokens, "engine_tokens": tokens_, "same_tokens": ref_tokens == tokens_,
                     "agrees": ref_tokens == tokens_ and diff / scale <= LOGIT_TOLERANCE[engine.dtype]})
    return rows


class IndexerPicks:
    """Forward hooks on every backbone layer's indexer: the compressed rows each query picks, [S, k] ascending with
    −1 for none, by layer (the reference's indices shifted back by the window offset it adds)."""

    def __init__(self, model, offset: int = 0) -> None:
        self.model, self.offset, self.picks, self.handles = model, offset, {}, []

    def __enter__(self) -> IndexerPicks:
        for i, layer in enumerate(self.model.layers):
            indexer = getattr(layer.attn, "indexer", None)
            if indexer is not None:
                self.handles.append(indexer.register_forward_hook(self.keep(i)))
        return self

    def keep(self, i: int):
        import torch

        def hook(module, inputs, out):
            out = out[0].long()                                              # [S, k]
            self.picks[i] = torch.where(out >= 0, out - self.offset, -1).sort(-1).values
        return hook

    def __exit__(self, *exc) -> None:
        for h in self.handles:
            h.remove()

    def same_share(self, other: IndexerPicks) -> float:
        """The share of (layer, query) pairs whose picks are the same rows on both sides."""
        same = total = 0
        for i, mine in self.picks.items():
            theirs = other.picks[i]
            same += int((mine == theirs).all(-1).sum()) if mine.shape == theirs.shape else 0
            total += mine.size(0)
        return same / total if total else 1.0


def timed(fn, *args) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - t0, out


def measure(sides: list, prompts: dict, runs: int, decode_steps: int, prefills: int) -> dict:
    """{(side index, phase): [tokens/s per run]}: phase "prefill N" (the median of `prefills` forwards of the
    N-token prompt) or "decode" (the median of decode_steps greedy steps after the shortest prompt). The sides take
    turns call by call, in an order that rotates run by run, so a busy machine slows them alike."""
    rates: dict = {}
    first = min(prompts)
    for run in range(runs):
        order = [sides[(run + k) % len(sides)] for k in range(len(sides))]
        for length, tokens in prompts.items():
            seconds = {side: [] for side in order}
            for _ in range(prefills):
                for side in order:
                    if side.name == "engine":
                        side.new_cache(length + decode_steps)
                    seconds[side].append(timed(side.prefill, tokens)[0])
            for side in order:
                rates.setdefault((sides.index(side), f"prefill {length}"), []).append(
                    length / statistics.median(seconds[side]))
        ids, seconds = {}, {side: [] for side in order}
        for side in order:
            if side.name == "engine":
                side.new_cache(first + decode_steps)
            ids[side] = side.prefill(prompts[first])[0]
        for _ in range(decode_steps):
            for side in order:
                dt, (ids[side], _) = timed(side.step, ids[side])
                seconds[side].append(dt)
        for side in order:
            rates.setdefault((sides.index(side), "decode"), []).append(1 / statistics.median(seconds[side]))
    return rates


def one_config(a) -> dict:
    """In this process: build the sides for one config, check agreement, time; → rows, agreement, notes."""
    import torch

    from engine.spec.presets import resolve_config
    torch.set_num_threads(a.threads)
    ref = import_reference(a.reference)
    args = resolve_config(a.one)
    prompt_lengths = [int(x) for x in a.prompts.split(",")]
    need = max(max(prompt_lengths), min(prompt_lengths) + max(a.decode_steps, a.check_steps))
    if need > args.max_seq_len:
        raise SystemExit(f"{a.one}: prompts and decode steps need {need} positions, max_seq_len is {args.max_seq_len}")
    token_map = synthetic_token_map(args)
    stored = stored_weights(args, a.seed)
    g = torch.Generator().manual_seed(a.seed)
    prompts = {n: torch.randint(3, args.vocab_size, (1, n), generator=g) for n in sorted(prompt_lengths)}
    checks = []
    # first every compressed row kept (the same weights: index_topk and candidate_topk_blocks are no parameters),
    # where only the arithmetic can differ; then the config itself, where near-tied picks may go either way
    for selection, variant in (("every row", dense_selection(args)), ("top-k", args)):
        with torch.inference_mode():
            reference = ReferenceSide(ref, variant, stored, token_map)
            engines = [EngineSide(variant, stored, token_map, d) for d in a.dtypes.split(",")]
            for engine in engines:
                for row in agreement(reference, engine, prompts, a.check_steps):
                    checks.append({"config": a.one, "selection": selection, **row})
        if selection == "every row" and not all(row["agrees"] for row in checks):
            return {"agreement": checks, "rows": [], "refused": True, "notes": reference.notes}
    with torch.inference_mode():
        sides = [reference, *engines]
        rates = measure(sides, prompts, a.runs, a.decode_steps, a.prefills)
    rows = []
    for k, engine in enumerate(engines, start=1):
        for phase in [f"prefill {n}" for n in prompts] + ["decode"]:
            mine, theirs = rates[(k, phase)], rates[(0, phase)]
            pair = [m / t for m, t in zip(mine, theirs)]
            rows.append({"config": a.one, "phase": phase, "threads": a.threads, "runs": a.runs,
                         "engine_dtype": engine.dtype, "reference_dtype": reference.dtype,
                         "engine_tokens_per_s": spread(mine), "reference_tokens_per_s": spread(theirs),
                         "ratio": statistics.median(pair),
                         "pair_ratio_min": min(pair), "pair_ratio_max": max(pair)})
    return {"agreement": checks, "rows": rows, "refused": False, "notes": reference.notes}


def dense_selection(args):
    """args with the indexer's top-k and the candidate filter wide enough to keep every compressed row."""
    return args.replace(index_topk=args.max_seq_len, candidate_topk_blocks=args.max_seq_len)


def spread(values: list[float]) -> dict:
    from engine.bench.results_file import spread as spread_
    return spread_(values)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--reference", type=Path, required=True, metavar="DIR",
                   help="folder of DeepSeek's V4.1 reference package (model.py, engram.py, kernel_cpu.py, ...)")
    p.add_argument("--configs", default="tiny-v4.1,default-small")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--prompts", default="64,512")
    p.add_argument("--decode-steps", type=int, default=16)
    p.add_argument("--prefills", type=int, default=3, help="prefills of each prompt per side and run (median)")
    p.add_argument("--check-steps", type=int, default=8, help="greedy steps both sides must agree on")
    p.add_argument("--dtypes", default="float32,bfloat16", help="the engine's dtypes (the reference runs bf16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--results", type=Path, metavar="OUT", help="also write a results file (docs/results/...)")
    p.add_argument("--one", help=argparse.SUPPRESS)                 # the child process: one config
    a = p.parse_args(argv)
    a.reference = a.reference.resolve()
    if a.one:
        print(json.dumps(one_config(a)))
        return 0
    from engine.bench.results_file import ResultsRecorder
    recorder = ResultsRecorder(a.results, "reference", "scripts/bench_reference.py", argv)
    rows, checks, refused, extra = [], [], [], []
    passed = ["--reference", str(a.reference), "--threads", str(a.threads), "--runs", str(a.runs), "--prompts",
              a.prompts, "--decode-steps", str(a.decode_steps), "--prefills", str(a.prefills), "--check-steps",
              str(a.check_steps), "--dtypes", a.dtypes, "--seed", str(a.seed)]
    for config in a.configs.split(","):
        env = {**os.environ, "OMP_NUM_THREADS": str(a.threads)}
        run = subprocess.run([sys.executable, __file__, "--one", config, *passed], capture_output=True, text=True,
                             env=env, check=False)
        if run.returncode != 0:
            print(run.stderr, file=sys.stderr)
            raise SystemExit(f"{config}: the measuring process failed (exit {run.returncode})")
        out = json.loads(run.stdout.strip().splitlines()[-1])
        checks += out["agreement"]
        extra += [f"{config}: {note}" for note in out["notes"]]
        for c in out["agreement"]:
            print(f"{config} {c['selection']:>9} {c['engine_dtype']:>8} prompt {c['prompt']:>4}: max |Δ logit| "
                  f"{c['max_logit_diff']:.4f} ({c['relative_logit_diff']:.2%} of the largest), indexer picks "
                  f"{c['same_picks']:.0%} the same, greedy tokens {'same' if c['same_tokens'] else 'differ'}",
                  flush=True)
        if out["refused"]:
            refused.append(config)
            continue
        rows += out["rows"]
        for r in out["rows"]:
            print(f"{config} {r['phase']:>12} engine {r['engine_dtype']:>8} {r['engine_tokens_per_s']['median']:10,.1f}"
                  f" tokens/s, reference {r['reference_tokens_per_s']['median']:10,.1f}: x{r['ratio']:.2f} "
                  f"[{r['pair_ratio_min']:.2f}-{r['pair_ratio_max']:.2f}]", flush=True)
    if refused:
        print(f"not timed: the engine and the reference disagree on {', '.join(refused)}", file=sys.stderr)
        return 1
    notes = ["the reference runs in bf16 only on a CPU: its kernel_cpu ports of act_quant, fp4_act_quant and "
             "sparse_attn take bf16 input (as the tilelang kernels do), so every ratio divides by the reference's "
             "bf16 rate; the engine's float32 rows compare its float32 run with that",
             f"agreement before timing, on the same weights with every compressed row kept (index_topk and "
             f"candidate_topk_blocks raised; no parameter changes): last-position logits within "
             f"{LOGIT_TOLERANCE['bfloat16']:.0%} (engine bf16) or {LOGIT_TOLERANCE['float32']:.0%} (engine fp32) of "
             f"the largest reference logit and the same {a.check_steps} greedy tokens; with the configs' own top-k "
             f"the picks of near-tied rows may differ (the reference's topk(sorted=False) breaks ties as the CPU "
             f"kernel does, the engine to the lower index), which the agreement table counts",
             *sorted(set(extra))]
    settings = {"configs": a.configs, "prompts": a.prompts, "runs": a.runs, "decode_steps": a.decode_steps,
                "prefills": a.prefills, "dtypes": a.dtypes, "seed": a.seed}
    recorder.write(rows, a.threads, settings=settings,
                   tables={"agreement": checks}, notes=notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
