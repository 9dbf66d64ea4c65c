"""One rank of a parallel test, started by torchrun: build its shard, run the shared cases, or fail on purpose."""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from engine.parallel import build_shard, join_world
from engine.spec.config import load_config
from engine.spec.errors import EngineError
from tests.model_helpers import synthetic_token_map
from tests.parallel_cases import run_cases


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--checkpoint", help="also load this rank's shard from it; the tensors must equal random init's")
    p.add_argument("--fail", choices=("raise", "hang"), help="rank 1 raises, or stops answering, before its work")
    p.add_argument("--dtype", default="float32")
    a = p.parse_args()
    world = join_world("cpu")
    args = load_config(a.config)
    if a.fail and world.rank == 1:
        if a.fail == "raise":
            raise RuntimeError("rank 1 failed on purpose")
        time.sleep(120)
    dtype = getattr(torch, a.dtype)
    model = build_shard(args, world, token_map=synthetic_token_map(args), seed=0, dtype=dtype)
    out = run_cases(model)
    if a.checkpoint:
        loaded = build_shard(args, world, checkpoint=a.checkpoint, token_map=synthetic_token_map(args), dtype=dtype)
        state, want = loaded.state_dict(), model.state_dict()
        out["checkpoint_names_match"] = torch.tensor(sorted(state) == sorted(want))
        out["checkpoint_equal"] = torch.tensor(all(torch.equal(state[n], want[n]) for n in want))
    save_file(out, str(Path(a.out) / f"rank{world.rank}.safetensors"))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
