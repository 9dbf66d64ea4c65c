"""`python -m engine limits`: every bound the engine and the app check on their input, read from where it is set."""
from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from ..checkpoint.header import MAX_HEADER_BYTES
from ..checkpoint.index import MAX_INDEX_BYTES, MAX_SHARDS
from ..request import interventions
from ..request.sampling import MAX_SEED, MIN_TEMPERATURE
from ..serving.listener import CLIENT_TIMEOUT_S
from ..serving.schema import MAX_REQUEST_BYTES, MAX_ROWS
from ..spec import limits as config
from ..text.prompt_text import MAX_TOKEN_CHARS
from ..text.vocab import MAX_ID_MAP_BYTES
from ..trace import limits as trace

HELP = "print the limits checked on configs, checkpoints, prompts, arguments, traces, service requests and uploads"
STREAMLIT_CONFIG = Path(__file__).resolve().parents[2] / ".streamlit" / "config.toml"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """No options."""


def lines() -> list[str]:
    """One Markdown bullet per kind of input (docs/limits.md lists this output)."""
    mib = 2**20
    upload_mb = tomllib.loads(STREAMLIT_CONFIG.read_text(encoding="utf-8"))["server"]["maxUploadSize"]
    return [
        f"- config.json: at most {config.CONFIG_MAX_BYTES // mib} MiB, {config.JSON_MAX_DEPTH} levels of nesting, "
        f"no duplicate keys, integers within int64 and floats finite; {config.LAYERS_MAX} layers, "
        f"{config.INT_RANGES['n_routed_experts'][1]:,} routed experts per layer and "
        f"{config.MAX_ROUTED_EXPERTS_TOTAL:,} in all, a vocabulary of {config.VOCAB_MAX:,}, widths up to "
        f"{config.WIDTH_MAX:,}, {config.INT_RANGES['hc_sinkhorn_iters'][1]} Sinkhorn iterations "
        "(every field's range is in `engine/spec/limits.py`); a model is built only if its weights fit the "
        "memory available (`engine/plan/memory_fit.py`)",
        f"- checkpoints: safetensors headers up to {MAX_HEADER_BYTES // mib} MiB, checked (dtypes, shapes, offsets) "
        f"before any tensor is read; a shard index up to {MAX_INDEX_BYTES // mib} MiB naming at most {MAX_SHARDS:,} "
        f"shards, all inside the checkpoint folder, each tensor in the one shard the index names; `id_map.json` up to "
        f"{MAX_ID_MAP_BYTES // mib} MiB; every "
        "weight and scale finite",
        f"- prompts: valid Unicode, not blank, at most {MAX_TOKEN_CHARS} × max_seq_len characters (refused before "
        "tokenizing) and max_seq_len tokens with the new tokens",
        f"- arguments: temperature 0 (greedy) or at least {MIN_TEMPERATURE:g}; seed 0..{MAX_SEED:,}; threads up to "
        "the machine's CPU count; device `cpu`, `cuda` or `cuda:N` of an existing GPU; an output path whose folder "
        "exists and is writable, checked before generating",
        f"- what-if changes (`--intervene`, the app's form, a link's `intervene=`): at most "
        f"{interventions.MAX_TEXT_CHARS} characters each, numbers of at most {interventions.MAX_DIGITS} digits, "
        f"{interventions.MAX_INTERVENTIONS} per run, each valid for the model and given once",
        f"- traces: {trace.describe()}",
        f"- engine service requests: at most {MAX_REQUEST_BYTES // mib} MiB per message (a longer one is dropped "
        f"unread) and {MAX_ROWS} prompts, every field checked against the request schema (`engine/serving/schema.py`) "
        f"before any rank acts; a client's connection is dropped when one read or write waits {CLIENT_TIMEOUT_S:g} s",
        f"- app uploads: {upload_mb} MB per file (`.streamlit/config.toml`), then the limits above",
    ]


def run(args: argparse.Namespace) -> int:
    print("\n".join(lines()))
    return 0
