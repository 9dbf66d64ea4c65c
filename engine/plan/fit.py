"""What fits: every GPU count the engine's layout allows × expert placement, each with the longest context that fits.

`engine plan CONFIG --fit` and the Architecture page's "what fits" table both read `fit_options`. A GPU count is
also the tensor/expert-parallel degree (heads, output groups and experts split N ways: engine/spec/
parallel_degree.py); routed experts on the host are planned for one GPU (Hardware says why).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from ..accounting.accounting import GIB
from ..spec.parallel_degree import parallel_degrees, split_counts, uneven_counts
from .memory_plan import EXPERT_PLACEMENTS, Hardware, MemoryPlan, context_label, memory_plan

if TYPE_CHECKING:
    from ..spec.config import ModelArgs

LADDER = tuple(4096 * 2**k for k in range(9))   # 4k, 8k, …, 1M tokens: the contexts tried, longest that fits wins
MAX_GPUS = 8                                    # one node; --max-gpus raises it


@dataclass(frozen=True)
class Option:
    """One configuration: `plan` is at the longest context that fits, or at the shortest tried when none does."""
    plan: MemoryPlan
    contexts: tuple[int, ...]   # the contexts tried, shortest first

    @property
    def fits(self) -> bool:
        return self.plan.fits

    @property
    def gpus(self) -> int:
        return self.plan.hardware.gpus

    @property
    def experts(self) -> str:
        return self.plan.hardware.experts

    @property
    def per_gpu(self) -> int:
        return max(v.need for v in self.plan.gpus)

    @property
    def label(self) -> str:
        hw = self.plan.hardware
        where = "experts on host" if hw.experts == "host" else "experts on device"
        host = f" + {hw.host_mem_gib:g} GiB host" if hw.experts == "host" else ""
        return f"{hw.gpus} × {hw.gpu_mem_gib:g} GiB{host}, {where}"

    @property
    def reason(self) -> str:
        """Why it does not fit (at the shortest context tried), or how far it goes."""
        hw, p = self.plan.hardware, self.plan
        at = context_label(hw.context)
        if self.fits:
            longest = "" if len(self.contexts) == 1 else " (the longest tried)" if hw.context == self.contexts[-1] \
                else " (the longest that fits)"
            return f"fits at context {at}{longest}"
        short = []
        if not all(v.fits for v in p.gpus):
            short.append(f"needs {self.per_gpu / GIB:.1f} GiB per GPU, has {hw.gpu_mem_gib:g} GiB")
        if not p.host.fits:
            short.append(f"needs {p.host.need / GIB:.1f} GiB host RAM, has {hw.host_mem_gib:g} GiB")
        shortest = " even" if len(self.contexts) > 1 else ""
        return f"does not fit{shortest} at context {at}: {'; '.join(short)}"

    def to_json(self) -> dict:
        hw, p = self.plan.hardware, self.plan
        return {"gpus": hw.gpus, "parallel_degree": hw.gpus, "gpu_mem_gib": hw.gpu_mem_gib,
                "host_mem_gib": hw.host_mem_gib, "experts": hw.experts, "context": hw.context, "batch": hw.batch,
                "fits": self.fits, "per_gpu_bytes": self.per_gpu, "host_bytes": p.host.need,
                "experts_on_host_bytes": p.experts_on_host, "engram_mapped_bytes": p.engram_mapped,
                "engram_fits_in_page_cache": p.engram_cached, "checkpoint_bytes": p.checkpoint_bytes,
                "verdict": self.reason, "label": self.label}


def contexts_to_try(args: ModelArgs, context: int | None) -> tuple[int, ...]:
    """The given context alone, else the ladder up to the config's max_position_embeddings (itself included)."""
    if context:
        return (context,)
    top = args.max_position_embeddings or LADDER[-1]
    return (*(c for c in LADDER if c < top), top)


def best_option(args: ModelArgs, base: Hardware, contexts: tuple[int, ...]) -> Option:
    """The plan at the longest of `contexts` that fits (needs grow with the context), else at the shortest."""
    plans = [memory_plan(args, replace(base, context=c)) for c in contexts]
    fitting = [p for p in plans if p.fits]
    return Option(fitting[-1] if fitting else plans[0], contexts)


def fit_options(args: ModelArgs, gpu_mem_gib: float, host_mem_gib: float, max_gpus: int = MAX_GPUS,
                context: int | None = None, batch: int = 1, prefill_chunk: int = 4096, reserve_gib: float = 2.0,
                placements: tuple[str, ...] = EXPERT_PLACEMENTS) -> tuple[Option, ...]:
    """Every allowed GPU count up to `max_gpus` (fewest first) × placement (host for one GPU only), judged."""
    contexts = contexts_to_try(args, context)
    options = []
    for n in parallel_degrees(args, max_gpus):
        for experts in placements:
            if experts == "host" and n > 1:
                continue
            base = Hardware(gpus=n, gpu_mem_gib=gpu_mem_gib, host_mem_gib=host_mem_gib, context=contexts[0],
                            batch=batch, prefill_chunk=prefill_chunk, reserve_gib=reserve_gib, experts=experts)
            options.append(best_option(args, base, contexts))
    return tuple(options)


def impossible_counts(args: ModelArgs, max_gpus: int) -> str:
    """GPU counts up to max_gpus the layout cannot split the config over, and why ('' when there are none)."""
    skipped = [n for n in range(2, max_gpus + 1) if uneven_counts(args, n)]
    if not skipped:
        return ""
    counts = ", ".join(f"{k} {v}" for k, v in split_counts(args).items())
    return (f"{', '.join(map(str, skipped))} GPUs: no even split ({counts} must each be divisible by the GPU "
            f"count)")
