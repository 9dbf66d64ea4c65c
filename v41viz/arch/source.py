"""The engine's real source for a diagram node, read from the engine's files (parsed with ast, never imported:
the Architecture page stays free of torch)."""
from __future__ import annotations

import ast
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]   # the repository: engine/ lies beside v41viz/

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


def engine_source(module_type: str) -> SourceInfo:
    """The engine code of a module type."""
    try:
        qualnames = ENGINE_CODE[module_type]
    except KeyError:
        return SourceInfo((), f"no engine code is mapped to module type {module_type!r}")
    return engine_code(qualnames)


@cache
def engine_code(qualnames: tuple[str, ...]) -> SourceInfo:
    """The source of engine functions, classes or methods by qualified name ('engine.model.moe.Gate',
    'engine.model.attention.Attention.queries'); cached: the source does not change while the app runs."""
    pieces, problems = [], []
    for qualname in qualnames:
        module_name, name = _split(qualname)
        rel = module_name.replace(".", "/") + ".py"
        try:
            definitions, lines = _definitions(rel)
        except FileNotFoundError:
            problems.append(f"not implemented in the engine yet ({module_name} does not exist)")
            continue
        except (SyntaxError, UnicodeDecodeError, OSError) as e:  # a half-written engine file must not break the page
            problems.append(f"{rel} could not be read: {type(e).__name__}: {e}")
            continue
        if name not in definitions:
            problems.append(f"not implemented in the engine yet ({module_name} has no {name})")
            continue
        first, last = definitions[name]
        pieces.append(CodePiece(qualname, rel, first, "".join(lines[first - 1:last])))
    return SourceInfo(tuple(pieces), "; ".join(problems))


def _split(qualname: str) -> tuple[str, str]:
    """'engine.model.attention.Attention.queries' → ('engine.model.attention', 'Attention.queries'): the longest
    prefix that names an engine file is the module."""
    parts = qualname.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module = ".".join(parts[:cut])
        if (ROOT / (module.replace(".", "/") + ".py")).is_file():
            return module, ".".join(parts[cut:])
    return qualname.rsplit(".", 1)[0], qualname.rsplit(".", 1)[1]


@lru_cache(maxsize=64)
def _definitions(rel: str) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """A file's top-level classes and functions, and the methods of its classes ('Class.method'): name → (first
    line with decorators, last line), and its lines."""
    text = (ROOT / rel).read_text(encoding="utf-8")
    spans = {}
    kinds = (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    for node in ast.parse(text, filename=rel).body:
        if isinstance(node, kinds):
            spans[node.name] = _span(node)
        if isinstance(node, ast.ClassDef):
            spans.update((f"{node.name}.{m.name}", _span(m)) for m in node.body if isinstance(m, kinds))
    return spans, text.splitlines(keepends=True)


def _span(node) -> tuple[int, int]:
    return min([node.lineno] + [d.lineno for d in node.decorator_list]), node.end_lineno or node.lineno
