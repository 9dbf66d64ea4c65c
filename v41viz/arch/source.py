"""The engine's real source for a diagram node, read with inspect (imports engine.model lazily: torch)."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

# Module type → (engine module, the classes/functions that implement it, all shown in this order).
ENGINE_CODE: dict[str, tuple[str, tuple[str, ...]]] = {
    "embed": ("engine.model.transformer", ("Transformer",)),
    "head": ("engine.model.transformer", ("Transformer",)),
    "block": ("engine.model.block", ("Block",)),
    "draft_block": ("engine.model.draft", ("DraftStage",)),
    "rmsnorm": ("engine.model.norm", ("RMSNorm",)),
    "main_norm": ("engine.model.norm", ("RMSNorm",)),
    "draft_norm": ("engine.model.norm", ("RMSNorm",)),
    "mhc": ("engine.model.mhc", ("hc_mixes", "sinkhorn", "collapse", "expand")),
    "hc_head": ("engine.model.mhc", ("HCHead",)),
    "attention": ("engine.model.attention", ("Attention",)),
    "compressor": ("engine.model.compressor", ("Compressor",)),
    "indexer": ("engine.model.indexer", ("Indexer", "select_candidate_blocks")),
    "moe": ("engine.model.moe", ("MoE",)),
    "gate": ("engine.model.moe", ("Gate",)),
    "hash_gate": ("engine.model.moe", ("HashGate",)),
    "shared_experts": ("engine.model.moe", ("Expert", "swiglu")),
    "experts": ("engine.model.moe", ("Expert", "swiglu")),
    "engram": ("engine.model.engram", ("NgramRows", "Engram")),
    "main_proj": ("engine.model.draft", ("DraftStage",)),
    "markov_head": ("engine.model.draft", ("MarkovHead",)),
    "confidence_head": ("engine.model.draft", ("ConfidenceHead",)),
}


@dataclass(frozen=True)
class CodePiece:
    qualname: str        # "engine.model.attention.Attention"
    path: str            # repository-relative file
    first_line: int
    code: str


@dataclass(frozen=True)
class SourceInfo:
    pieces: tuple[CodePiece, ...]
    message: str         # why (some of) it was not found; "" when everything was

    @property
    def found(self) -> bool:
        return bool(self.pieces)


def engine_source(module_type: str) -> SourceInfo:
    try:
        module_name, names = ENGINE_CODE[module_type]
    except KeyError:
        return SourceInfo((), f"no engine code is mapped to module type {module_type!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            return SourceInfo((), f"not implemented in the engine yet ({module_name} does not exist)")
        return SourceInfo((), f"{module_name} could not be imported: {e}")
    except Exception as e:  # a half-written engine module must not break the page
        return SourceInfo((), f"{module_name} failed to import: {type(e).__name__}: {e}")
    pieces, missing = [], []
    for name in names:
        obj = getattr(module, name, None)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            missing.append(name)
            continue
        lines, start = inspect.getsourcelines(obj)
        path = inspect.getsourcefile(obj) or ""
        rel = path[path.rfind("engine/"):] if "engine/" in path else path
        pieces.append(CodePiece(f"{module_name}.{name}", rel, start, "".join(lines)))
    message = f"not implemented in the engine yet ({module_name} has no {' / '.join(missing)})" if missing else ""
    return SourceInfo(tuple(pieces), message)
