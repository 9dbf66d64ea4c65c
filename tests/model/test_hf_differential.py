"""The V4 family against an implementation nobody on this project wrote: Hugging Face transformers'
`deepseek_v4` (a test dependency, installed by scripts/setup.sh; a missing package fails here, it is not skipped).

Each tiny random V4 config runs in both, with the same weights (the engine's, renamed by engine.checkpoint.hf_names):
a prefill of an odd-length prompt (so compressors end on a partial group), then teacher-forced one-token decode
steps through each side's own cache. Logits are compared per position in float32 by cosine and relative error.

Tolerance: both sides compute in float32 and differ only in operation order (transformers RMS-normalises the mHC
input before its projection where the engine scales after it, weights experts after the down projection, sums
them in another order, stabilises the sink softmax differently), so each of the ~40 ops per layer may round
differently: about 1e-7 relative each; measured worst case 4.4e-7 relative per position (1 − cosine 1e-13). A
different top-k pick or a mis-mapped tensor moves the logits by 1e-2 or more, a subtle semantic difference by
1e-4 or more (V4.1's single-pass mHC in place of V4's per-site one: 5e-4 on these random weights). Bounds:
relative error ≤ 1e-5 (20× the measured worst, 50× below that mHC difference) and 1 − cosine ≤ 1e-9.

Known difference (not a bug of either side): on exactly tied indexer scores — a ReLU zeroes every head's score,
which with few index heads happens often — the engine keeps the earliest rows (stable sort) and transformers
whichever torch.topk returns. The configs here use 8 index heads, and each run asserts that no query had a tie at
its top-k boundary, so the comparison is about the semantics, not about tie order."""
from __future__ import annotations

import pytest
import torch
import transformers  # noqa: F401  (the oracle: its absence must fail the suite, not skip it)

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.hf_layout import hf_folder, load_hf_checkpoint
from engine.model import EngineOptions, Transformer, init_weights
from engine.model.indexer import Indexer
from engine.spec.config import config_from_dict
from engine.speedups import fast_indexer, prepare_for_inference
from tests.hf_helpers import hf_logits, hf_twin
from tests.model_helpers import random_tokens

# imports transformers [5-10 s]; four V4 configs through it and the engine, two save_pretrained folders [~25 s]
pytestmark = pytest.mark.slow

REL_TOL, COS_TOL = 1e-5, 1e-9
EXACT = EngineOptions(quant_sim=False, act_quant=False)   # transformers simulates no FP8/FP4 rounding
BASE = dict(model_type="deepseek_v4", vocab_size=512, dim=64, moe_inter_dim=32, n_mtp_layers=0, n_heads=4,
            head_dim=32, rope_head_dim=16, q_lora_rank=32, o_groups=2, o_lora_rank=16, n_routed_experts=8,
            n_activated_experts=2, route_scale=1.5, swiglu_limit=10.0, norm_eps=1e-6, window_size=8,
            rope_theta=10000, compress_rope_theta=160000, index_n_heads=8, index_head_dim=16, index_topk=4,
            dtype="bf16")
# name: (config changes, prompt length, decode steps)
CASES = {
    # hash-routed first layers, CSA / HCA alternation (HCA ratio 8 so that groups complete), YaRN on compressed layers
    "hash-csa-hca": (dict(n_layers=6, n_hash_layers=2, compress_ratios=[0, 4, 8, 4, 8, 0], rope_factor=4,
                          original_seq_len=64), 29, 12),
    # no hash layers, the V4-Pro default pattern (two HCA layers first, then interleaved), no YaRN
    "hca-first-no-hash": (dict(n_layers=5, n_hash_layers=0, compress_ratios=[8, 8, 4, 8, 4]), 23, 10),
    # every layer hash-routed and CSA, top-2 of many rows, a wider window
    "all-hash-csa": (dict(n_layers=3, n_hash_layers=3, compress_ratios=[4, 4, 4], index_topk=2, window_size=16,
                          rope_factor=4, original_seq_len=64), 37, 9),
    # the release's ratios 4 / 128: one full HCA group of 128 and a partial one
    "release-ratios": (dict(n_layers=4, n_hash_layers=1, compress_ratios=[0, 4, 128, 4], rope_factor=16,
                            original_seq_len=64), 133, 4),
}


def engine_model(changes: dict, seed: int = 0) -> Transformer:
    torch.set_num_threads(1)  # the shared 2-core machine: tiny ops are ~10x slower with two contending threads
    args = config_from_dict({**BASE, **changes}, name="differential")
    model = prepare_for_inference(Transformer(args, options=EXACT))
    init_weights(model, seed)
    return model.eval()   # as the engine runs the models it builds (the speed paths on)


@torch.no_grad()
def engine_logits(model: Transformer, tokens: torch.Tensor, split: int) -> torch.Tensor:
    cache = model.new_cache(tokens.size(0), tokens.size(1))
    parts = [model(tokens[:, :split], cache, logits="all").logits]
    parts += [model(tokens[:, t:t + 1], cache, logits="all").logits for t in range(split, tokens.size(1))]
    return torch.cat(parts, 1)


def compare(ours: torch.Tensor, theirs: torch.Tensor) -> tuple[float, float]:
    """(worst relative error, worst 1 − cosine) over positions, in float64."""
    a, b = ours.double(), theirs.double()
    rel = ((a - b).norm(dim=-1) / b.norm(dim=-1)).max().item()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).min().item()
    return rel, 1 - cos


@pytest.fixture
def index_scores(monkeypatch):
    """Records every (scores [B, s, W], visible [B, s]) the engine's indexers rank: the model code's Indexer._scores
    and the fast indexer's in-place form of it."""
    seen = []

    def recording(scores_of):
        def scores(q, w, keys, visible, *scratch):
            out = scores_of(q, w, keys, visible, *scratch)
            seen.append((out.clone(), visible))   # (the fast form's scores are a view the next block overwrites)
            return out
        return scores

    monkeypatch.setattr(Indexer, "_scores", staticmethod(recording(Indexer._scores)))
    monkeypatch.setattr(fast_indexer, "scores_in_place", recording(fast_indexer.scores_in_place))
    return seen


def ties_at_the_cut(seen, k: int) -> int:
    """Queries with more than k visible rows whose k-th and (k+1)-th best scores are equal."""
    n = 0
    for scores, visible in seen:
        if scores.size(-1) > k:
            top = scores.sort(-1, descending=True).values
            n += int(((visible > k) & (top[..., k - 1] == top[..., k])).sum())
    return n


@pytest.mark.parametrize("case", sorted(CASES))
def test_prefill_and_decode_logits_match_transformers(case, index_scores):
    changes, prompt, steps = CASES[case]
    model = engine_model(changes)
    tokens = random_tokens(2, prompt + steps, seed=1, vocab=model.args.vocab_size)
    ours = engine_logits(model, tokens, prompt)
    assert index_scores, "no indexer ran"
    assert ties_at_the_cut(index_scores, model.args.index_topk) == 0, "a tied top-k cut would test tie order"
    theirs = hf_logits(hf_twin(model), tokens, prompt)
    assert ours.shape == theirs.shape == (2, prompt + steps, model.args.vocab_size)
    rel_pre, cos_pre = compare(ours[:, :prompt], theirs[:, :prompt])
    rel_dec, cos_dec = compare(ours[:, prompt:], theirs[:, prompt:])
    print(f"{case}: prefill rel {rel_pre:.2e} 1-cos {cos_pre:.1e}; decode rel {rel_dec:.2e} 1-cos {cos_dec:.1e}")
    assert rel_pre <= REL_TOL and rel_dec <= REL_TOL
    assert cos_pre <= COS_TOL and cos_dec <= COS_TOL


def test_a_wrong_weight_or_the_v41_mhc_is_caught():
    """The comparison's power: one mis-mapped tensor (layer 0's hash table shifted by one expert) fails it, and so
    does V4.1's single-pass mHC (each site collapsing with the previous site's pre) in place of V4's per-site one."""
    changes, prompt, steps = CASES["hash-csa-hca"]
    model = engine_model(changes)
    tokens = random_tokens(1, prompt + steps, seed=2, vocab=model.args.vocab_size)
    hf = hf_twin(model)
    reference = hf_logits(hf, tokens, prompt)
    assert compare(engine_logits(model, tokens, prompt), reference)[0] <= REL_TOL
    for block in model.layers:
        block.single_pass = True
    single_pass = compare(engine_logits(model, tokens, prompt), reference)[0]
    for block in model.layers:
        block.single_pass = False
    table = hf.model.layers[0].mlp.gate.tid2eid
    table.copy_((table + 1) % model.args.n_routed_experts)
    shifted = compare(engine_logits(model, tokens, prompt), hf_logits(hf, tokens, prompt))[0]
    print(f"relative error with V4.1's single-pass mHC {single_pass:.2e}, with a shifted hash table {shifted:.2e}")
    assert single_pass > 10 * REL_TOL and shifted > 100 * REL_TOL


@pytest.mark.parametrize("original_format", [True, False], ids=["saved-names", "module-names"])
def test_a_transformers_checkpoint_loads(original_format, tmp_path):
    """save_pretrained's folder (its default half-reverted names, or the module names) loads into the engine:
    the config translated back (layer_types, mlp_layer_types, rope_parameters), every weight equal."""
    changes, prompt, _ = CASES["hash-csa-hca"]
    model = engine_model(changes)
    hf_twin(model).save_pretrained(tmp_path / "hf", save_original_format=original_format)
    assert hf_folder(tmp_path / "hf") == tmp_path / "hf"
    args, loaded = load_hf_checkpoint(tmp_path / "hf", options=EXACT)
    assert args.replace(max_position_embeddings=0) == model.args
    held = loaded.state_dict()
    assert all(torch.equal(held[n], t) for n, t in model.state_dict().items())
    tokens = random_tokens(1, prompt, seed=3, vocab=model.args.vocab_size)
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)


def test_a_transformers_checkpoint_with_a_bad_hash_table_is_refused(tmp_path):
    """A `tid2eid` id past the last expert (transformers saves it without complaint) is refused at load, naming
    the tensor (official name), the ids it holds and the gate's range."""
    changes, _, _ = CASES["hash-csa-hca"]
    model = engine_model(changes)
    n_experts = model.args.n_routed_experts
    with torch.no_grad():
        model.layers[0].ffn.gate.tid2eid[3, 1] = n_experts + 2
    hf_twin(model).save_pretrained(tmp_path / "hf")
    with pytest.raises(CheckpointError, match=rf"'layers\.0\.ffn\.gate\.tid2eid' names expert ids "
                                              rf"0\.\.{n_experts + 2}, outside the 0\.\.{n_experts - 1}"):
        load_hf_checkpoint(tmp_path / "hf", options=EXACT)
