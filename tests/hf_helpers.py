"""The transformers oracle of the V4 tests: its deepseek_v4 model from ModelArgs, with an engine model's weights."""
from __future__ import annotations

import torch

from engine.checkpoint.hf_names import to_hf
from engine.spec.config import ModelArgs

HF_LAYER_TYPE = {0: "sliding_attention", 4: "compressed_sparse_attention"}   # any other ratio: HCA


def hf_config(a: ModelArgs):
    """The transformers DeepseekV4Config of a V4-family ModelArgs (the backbone: transformers has no drafter)."""
    from transformers import DeepseekV4Config
    ratios = a.compress_ratios[: a.n_layers]
    hca = sorted({r for r in ratios if r not in HF_LAYER_TYPE})
    if len(hca) > 1:
        raise ValueError(f"transformers has one HCA ratio per model, this config has {hca}")
    yarn = None
    if a.original_seq_len > 0:
        yarn = {"type": "yarn", "factor": a.rope_factor, "original_max_position_embeddings": a.original_seq_len,
                "beta_fast": a.beta_fast, "beta_slow": a.beta_slow}
    cfg = DeepseekV4Config(
        vocab_size=a.vocab_size, hidden_size=a.dim, moe_intermediate_size=a.moe_inter_dim, num_hidden_layers=a.n_layers,
        num_attention_heads=a.n_heads, head_dim=a.head_dim, qk_rope_head_dim=a.rope_head_dim, q_lora_rank=a.q_lora_rank,
        o_groups=a.o_groups, o_lora_rank=a.o_lora_rank, n_routed_experts=a.n_routed_experts,
        num_experts_per_tok=a.n_activated_experts, n_shared_experts=a.n_shared_experts,
        routed_scaling_factor=a.route_scale, swiglu_limit=a.swiglu_limit, rms_norm_eps=a.norm_eps,
        sliding_window=a.window_size,
        layer_types=[HF_LAYER_TYPE.get(r, "heavily_compressed_attention") for r in ratios],
        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": hca[0] if hca else 128},
        mlp_layer_types=["hash_moe" if i < a.n_hash_layers else "moe" for i in range(a.n_layers)],
        rope_theta=a.rope_theta, compress_rope_theta=a.compress_rope_theta, rope_scaling=yarn,
        max_position_embeddings=a.original_seq_len * int(a.rope_factor) if yarn else 4096,
        index_n_heads=a.index_n_heads, index_head_dim=a.index_head_dim, index_topk=a.index_topk,
        hc_mult=a.hc_mult, hc_sinkhorn_iters=a.hc_sinkhorn_iters, hc_eps=a.hc_eps, num_nextn_predict_layers=0,
        bos_token_id=a.bos_token_id, eos_token_id=a.eos_token_id)
    cfg._attn_implementation = "eager"
    return cfg


def hf_twin(model):
    """A transformers DeepseekV4ForCausalLM (float32, eval) holding `model`'s weights, mapped by engine.checkpoint.
    hf_names; every HF tensor must be filled (strict load)."""
    from transformers import DeepseekV4ForCausalLM
    hf = DeepseekV4ForCausalLM(hf_config(model.args)).float().eval()
    state = {k: v.detach().float() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    hf.load_state_dict(to_hf(state), strict=True)
    return hf


@torch.no_grad()
def hf_logits(hf, tokens: torch.Tensor, split: int) -> torch.Tensor:
    """Logits [B, S, V] of a prefill of tokens[:, :split] and then one token at a time through the HF cache."""
    out = hf(tokens[:, :split], use_cache=True)
    cache, parts = out.past_key_values, [out.logits]
    for t in range(split, tokens.size(1)):
        out = hf(tokens[:, t:t + 1], past_key_values=cache, use_cache=True)
        cache = out.past_key_values
        parts.append(out.logits)
    return torch.cat(parts, 1).float()
