"""Does a DSpark verify block compute its first row as a one-token decode step does? Row 0 of a block forward
(γ + 1 tokens) against the one-token forward of the same token on an identical cache, layer by layer, at a few decode
positions, with the reference's numerics and without its FP8/FP4 activation rounding.

Greedy DSpark is lossless when both forwards give a position the same logits. They run the same model, but a block
is a matrix of rows where a decode step is a vector, and torch's matmuls, reductions and the attention then add in
another order: the same value up to the last bits. This script measures how far those bits travel (each layer's
residual stream, then the logits) and how often they can swap the greedy choice (the decode step's top-2 margin).

    python scripts/verify_rows.py [--checkpoint checkpoints/v4.1-flash-rehearsal] [--prompt 64] [--steps 4]
                                  [--results docs/results/verify_rows.json]
"""
from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from engine.bench.results_file import ResultsRecorder  # noqa: E402
from engine.generation import Engine  # noqa: E402
from engine.model.options import EngineOptions  # noqa: E402

NUMERICS = {  # name → the options' numerics; the first is the reference's (the engine's default)
    "reference (FP8 activations, FP8/FP4 caches)": EngineOptions(),
    "no activation or cache rounding": EngineOptions(act_quant=False, quant_sim=False),
}


def compare(engine: Engine, prompt: list[int], steps: int, gen: torch.Generator) -> list[dict]:
    """Per decode position: the largest |difference| of each layer's output and of the logits between row 0 of a
    block forward and the one-token forward, the decode step's top-2 margin, whether the greedy tokens agree."""
    model, width = engine.model, engine.args.dspark_block_size + 1
    outputs: dict[str, list[torch.Tensor]] = {}

    def keep(mod, inp, out):
        outputs.setdefault(mod.path, []).append((out[0] if isinstance(out, tuple) else out).detach().clone())
    hooks = [layer.register_forward_hook(keep) for layer in model.layers]
    rows = []
    try:
        with torch.inference_mode():
            cache = model.new_cache(1, len(prompt) + steps + width + 1)
            token = int(model(torch.tensor([prompt]), cache, logits="last").logits[0].argmax())
            for _ in range(steps):
                block_cache = copy.deepcopy(cache)
                drafts = torch.randint(3, engine.args.vocab_size, (width - 1,), generator=gen).tolist()
                outputs.clear()
                one = model(torch.tensor([[token]]), cache, logits="last").logits[0]            # [V]
                single = {k: v[0] for k, v in outputs.items()}
                outputs.clear()
                block = model(torch.tensor([[token, *drafts]]), block_cache, logits="all").logits[0, 0]
                layers = {k: float((single[k].double() - v[0][:, :1].double()).abs().max()) for k, v in outputs.items()}
                top2 = one.topk(2).values
                rows.append({"position": int(cache.pos[0]) - 1, "layers": layers,
                             "logits": float((one.double() - block.double()).abs().max()),
                             "margin": float(top2[0] - top2[1]),
                             "same_token": int(one.argmax()) == int(block.argmax())})
                token = int(one.argmax())
    finally:
        for h in hooks:
            h.remove()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--checkpoint", type=Path, default=ROOT / "checkpoints" / "v4.1-flash-rehearsal")
    p.add_argument("--prompt", type=int, default=64, help="prompt tokens (seeded random ids)")
    p.add_argument("--steps", type=int, default=4, help="decode positions compared")
    p.add_argument("--results", type=Path, default=None, help="write docs/results/<name>.json")
    args = p.parse_args(argv)
    recorder = ResultsRecorder(args.results, "verify_rows", "scripts/verify_rows.py", argv)
    results, layer_names = [], []
    for name, options in NUMERICS.items():
        t = time.perf_counter()
        engine = Engine.load(checkpoint=args.checkpoint, options=options)
        gen = torch.Generator().manual_seed(0)
        prompt = torch.randint(3, engine.args.vocab_size, (args.prompt,), generator=gen).tolist()
        for row in compare(engine, prompt, args.steps, gen):
            layer_names = list(row["layers"])
            results.append({"numerics": name, **row})
            print(f"{name}: position {row['position']}: logits |Δ| {row['logits']:.2e}, "
                  f"top-2 margin {row['margin']:.3f}, same token {row['same_token']}", file=sys.stderr)
        print(f"{name}: {time.perf_counter() - t:.0f} s", file=sys.stderr)
        del engine
    recorder.write(results, torch.get_num_threads(),
                   settings={"checkpoint": str(args.checkpoint.relative_to(ROOT) if args.checkpoint.is_absolute()
                                               and args.checkpoint.is_relative_to(ROOT) else args.checkpoint),
                             "prompt": args.prompt, "steps": args.steps, "layers": layer_names})
    return 0


if __name__ == "__main__":
    sys.exit(main())
