"""The engine's real source for a diagram node, read with inspect (imports engine.model lazily: torch)."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from functools import lru_cache

# Module type → the classes/functions that implement it, by qualified name, shown in this order.
ENGINE_CODE: dict[str, tuple[str, ...]] = {
    "embed": ("engine.model.transformer.Transformer",),
    "head": ("engine.model.transformer.Transformer",),
    "block": ("engine.model.block.Block",),
    "draft_block": ("engine.model.draft.DraftStage",),
    "rmsnorm": ("engine.model.norm.RMSNorm",),
    "main_norm": ("engine.model.norm.RMSNorm",),
    "draft_norm": ("engine.model.norm.RMSNorm",),
    "mhc": ("engine.model.mhc.hc_mixes", "engine.model.mhc.sinkhorn", "engine.model.mhc.collapse",
            "engine.model.mhc.expand"),
    "hc_head": ("engine.model.mhc.HCHead",),
    "attention": ("engine.model.attention.Attention",),
    "compressor": ("engine.model.compressor.Compressor",),
    "indexer": ("engine.model.indexer.Indexer", "engine.model.indexer.select_candidate_blocks"),
    "moe": ("engine.model.moe.MoE",),
    "gate": ("engine.model.moe.Gate",),
    "hash_gate": ("engine.model.moe.HashGate",),
    "shared_experts": ("engine.model.moe.Expert", "engine.model.moe.swiglu"),
    "experts": ("engine.model.moe.Expert", "engine.model.moe.swiglu"),
    "engram": ("engine.text.engram_hash.NgramHash", "engine.model.engram.Engram"),
    "main_proj": ("engine.model.draft.DraftStage",),
    "markov_head": ("engine.model.draft.MarkovHead",),
    "confidence_head": ("engine.model.draft.ConfidenceHead",),
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


@lru_cache(maxsize=None)
def engine_source(module_type: str) -> SourceInfo:
    """The engine code of a module type (cached: the source does not change while the app runs)."""
    try:
        qualnames = ENGINE_CODE[module_type]
    except KeyError:
        return SourceInfo((), f"no engine code is mapped to module type {module_type!r}")
    pieces, problems = [], []
    for qualname in qualnames:
        module_name, name = qualname.rsplit(".", 1)
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and module_name.startswith(e.name):
                problems.append(f"not implemented in the engine yet ({module_name} does not exist)")
            else:
                problems.append(f"{module_name} could not be imported: {e}")
            continue
        except Exception as e:  # a half-written engine module must not break the page
            problems.append(f"{module_name} failed to import: {type(e).__name__}: {e}")
            continue
        obj = getattr(module, name, None)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            problems.append(f"not implemented in the engine yet ({module_name} has no {name})")
            continue
        lines, start = inspect.getsourcelines(obj)
        path = inspect.getsourcefile(obj) or ""
        rel = path[path.rfind("engine/"):] if "engine/" in path else path
        pieces.append(CodePiece(qualname, rel, start, "".join(lines)))
    return SourceInfo(tuple(pieces), "; ".join(problems))
