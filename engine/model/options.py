"""EngineOptions: named switches for the forward pass; every deviation from the reference is off by default."""
from __future__ import annotations

from dataclasses import dataclass

from ..spec.errors import InputError

EXPERT_PLACEMENTS = ("device", "host")   # the CLI's --experts choices (engine.commands.run_args.EXPERTS)


@dataclass(frozen=True)
class EngineOptions:
    # Spec §5 "SWA bounded replay": in a prefill longer than the window, layers after the last KV
    # source run only over the final window_size tokens. An approximation; off = exact reference.
    bounded_replay: bool = False
    # Quant-dequant of cached activations as the reference does: FP8 (block 32, ue8m0) on window KV,
    # FP4 on compressed KV (block 16, e4m3 scales) and on indexer q/k (block 32, ue8m0). Off for training.
    quant_sim: bool = True
    # FP8 quant-dequant of the inputs of linears whose official weights are FP8/FP4 (the reference's
    # dynamic activation quantization). None = follow the config's `dtype`/`expert_dtype`.
    act_quant: bool | None = None
    # Extra window-ring slots kept so that up to this many tokens can be rolled back exactly.
    # None = 2 * (dspark_block_size + 1), at least 8.
    rollback_margin: int | None = None
    # Queries processed per block inside sparse attention (bounds the gathered-KV memory in prefill).
    attn_query_block: int = 256
    # Which speed transform engine.speedups.prepare_for_inference(model) applies: "triton" swaps in fused Triton
    # kernels for the mHC seams, router, routed experts and Engram (CUDA, or CPU under TRITON_INTERPRET=1);
    # "torch" the PyTorch speed paths. The model itself always runs the reference code it is built with.
    kernels: str = "torch"
    # Where the routed experts live (engine.placement): "device" with the rest of the model, or "host": in host memory,
    # run on the host's CPU for the tokens routed to them (one GPU + host RAM); the loaders allocate them there.
    experts: str = "device"

    def __post_init__(self):
        if self.kernels not in ("torch", "triton"):
            raise InputError(f"EngineOptions.kernels must be 'torch' or 'triton', got {self.kernels!r}")
        if self.experts not in EXPERT_PLACEMENTS:
            raise InputError(f"EngineOptions.experts must be one of {', '.join(map(repr, EXPERT_PLACEMENTS))}, "
                             f"got {self.experts!r}")

    def margin_for(self, dspark_block_size: int) -> int:
        need = max(2 * (dspark_block_size + 1), 8)
        if self.rollback_margin is None:
            return need
        if self.rollback_margin < 2 * (dspark_block_size + 1):
            raise InputError(f"EngineOptions.rollback_margin={self.rollback_margin} is too small: draft "
                             f"verification needs at least 2*(dspark_block_size+1) = {2 * (dspark_block_size + 1)}")
        return self.rollback_margin
