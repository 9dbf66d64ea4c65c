"""The engine's real source for a diagram node, read with inspect (imports engine.model lazily: torch)."""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

# Module type → (engine module, class names to try in order). The first class found is shown.
ENGINE_CLASSES: dict[str, tuple[str, tuple[str, ...]]] = {
    "embed": ("engine.model.transformer", ("Transformer",)),
    "head": ("engine.model.transformer", ("Transformer",)),
    "block": ("engine.model.block", ("Block",)),
    "draft_block": ("engine.model.block", ("DSparkBlock", "MTPBlock", "Block")),
    "rmsnorm": ("engine.model.norm", ("RMSNorm",)),
    "main_norm": ("engine.model.norm", ("RMSNorm",)),
    "draft_norm": ("engine.model.norm", ("RMSNorm",)),
    "mhc": ("engine.model.mhc", ("HyperConnection", "MHC", "HCSite", "HyperConnections")),
    "hc_head": ("engine.model.mhc", ("HCHead", "HyperHead")),
    "attention": ("engine.model.attention", ("Attention",)),
    "compressor": ("engine.model.compressor", ("Compressor",)),
    "indexer": ("engine.model.indexer", ("Indexer",)),
    "moe": ("engine.model.moe", ("MoE",)),
    "gate": ("engine.model.moe", ("Gate",)),
    "hash_gate": ("engine.model.moe", ("HashGate", "Gate")),
    "shared_experts": ("engine.model.moe", ("Expert",)),
    "experts": ("engine.model.moe", ("Expert",)),
    "engram": ("engine.model.engram", ("Engram",)),
    "main_proj": ("engine.model.dspark", ("DSparkHead", "Drafter", "DSpark")),
    "markov_head": ("engine.model.dspark", ("MarkovHead",)),
    "confidence_head": ("engine.model.dspark", ("ConfidenceHead",)),
}


@dataclass(frozen=True)
class SourceInfo:
    found: bool
    qualname: str        # "engine.model.attention.Attention" (or the module we looked in)
    path: str            # repository-relative file, "" when not found
    first_line: int
    code: str            # the class source, or "" when not found
    message: str         # why it was not found


def engine_source(module_type: str) -> SourceInfo:
    try:
        module_name, class_names = ENGINE_CLASSES[module_type]
    except KeyError:
        return SourceInfo(False, module_type, "", 0, "", f"no engine class is mapped to module type {module_type!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name and module_name.startswith(e.name):
            return SourceInfo(False, module_name, "", 0, "", f"not implemented in the engine yet ({module_name} does not exist)")
        return SourceInfo(False, module_name, "", 0, "", f"{module_name} could not be imported: {e}")
    except Exception as e:  # a half-written engine module must not break the page
        return SourceInfo(False, module_name, "", 0, "", f"{module_name} failed to import: {type(e).__name__}: {e}")
    for name in class_names:
        cls = getattr(module, name, None)
        if inspect.isclass(cls):
            lines, start = inspect.getsourcelines(cls)
            path = inspect.getsourcefile(cls) or ""
            rel = path[path.rfind("engine/"):] if "engine/" in path else path
            return SourceInfo(True, f"{module_name}.{name}", rel, start, "".join(lines), "")
    return SourceInfo(False, module_name, "", 0, "",
                      f"not implemented in the engine yet ({module_name} has no class {' / '.join(class_names)})")
