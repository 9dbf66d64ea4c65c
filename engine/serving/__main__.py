"""`torchrun --nproc-per-node N -m engine.serving --config … [--checkpoint DIR | --random-init] [--port 8765]`."""
from __future__ import annotations

import argparse
import sys

import torch

from ..generation import Engine
from ..parallel import join_world, leave_world
from ..spec.errors import EngineError
from .key import KEY_ENV, chosen_key
from .protocol import DEFAULT_PORT
from .service import serve


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engine.serving", description="Serve the engine on 127.0.0.1 (under "
                                "torchrun: every rank loads its shard; rank 0 takes the requests). Attach the app with "
                                f"V41VIZ_ENGINE=127.0.0.1:PORT. Each start makes a random key (or takes {KEY_ENV}) and "
                                "writes it to a file only this user can read, where this user's clients find it.")
    p.add_argument("--config", help="config.json path or preset name (default: the config beside --checkpoint)")
    weights = p.add_mutually_exclusive_group(required=True)
    weights.add_argument("--checkpoint", help="safetensors file or directory in the project's layout")
    weights.add_argument("--random-init", action="store_true", help="seeded random weights (needs --config)")
    p.add_argument("--seed", type=int, default=0, help="weight-init seed (default 0)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"local port of rank 0 (default {DEFAULT_PORT})")
    p.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads per rank (default 1)")
    a = p.parse_args(argv)
    try:
        chosen_key()   # a published or short ENGINE_SERVICE_KEY is refused before anything loads
        torch.set_num_threads(a.threads)
        world = join_world(a.device)
        engine = Engine.load(a.config, None if a.random_init else a.checkpoint, seed=a.seed, device=a.device)

        def ready(address, key_path) -> None:
            print(f"engine service: {engine.source} on {address[0]}:{address[1]}; attach the app with "
                  f"V41VIZ_ENGINE={address[0]}:{address[1]}\nengine service key: {key_path.read_text()} (in "
                  f"{key_path}, mode 0600, where this user's clients read it)", flush=True)

        serve(engine, world, port=a.port, checkpoint=a.checkpoint, on_ready=ready)
        leave_world()   # after a shutdown request every rank is here: end the process groups before exiting
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
