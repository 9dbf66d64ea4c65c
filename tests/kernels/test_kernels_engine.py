"""The kernels transform on the tiny V4.1 model: same logits and trace as the PyTorch path; switching and errors."""
import pytest
import torch

from engine.kernels.runtime import unavailable_reason  # noqa: E402
from engine.model import EngineOptions  # noqa: E402
from engine.model.block import Block  # noqa: E402
from engine.model.draft import DraftStage  # noqa: E402
from engine.speedups import active_backend, apply_kernels, remove_kernels  # noqa: E402
from engine.speedups.kernel_modules import KernelBlock, KernelEngram, KernelMoE  # noqa: E402
from tests.kernel_helpers import DEVICE, MODES, assert_close, assert_equal
from tests.model_helpers import RecordingTrace, random_tokens, tiny_model

SMALL = dict(vocab_size=2048, dspark_noise_token_id=2047)


def _pair(**options):
    ref = tiny_model(dtype=torch.float32, **SMALL).to(DEVICE)
    fast = tiny_model(dtype=torch.float32, options=EngineOptions(kernels="triton", **options), **SMALL).to(DEVICE)
    assert active_backend(fast) == "triton"  # the option alone selects the kernels (prepare_for_inference)
    return ref, fast


@pytest.mark.slow  # Triton interpreter [6 s]
@pytest.mark.parametrize("mode", MODES)
def test_kernel_engine_matches_reference_prefill_and_decode(mode):
    ref, fast = _pair()
    assert active_backend(fast) == "triton" and active_backend(ref) == "torch"
    # two rows at different positions (the second joins later): the interpreter runs ~0.2 s per mHC program
    toks = random_tokens(1, 2, seed=11, vocab=2048)
    nxt = random_tokens(2, 1, seed=12, vocab=2048)
    out = {}
    with torch.no_grad():
        for name, m in (("ref", ref), ("fast", fast)):
            cache, trace = m.new_cache(2, 8), RecordingTrace(attention=False)
            prefill = m(toks, cache, rows=[0], trace=trace, logits="all").logits
            decode = m(nxt, cache, trace=trace).logits                        # row 0 at position 2, row 1 at 0
            out[name] = (prefill, decode, trace)
    (p_ref, d_ref, t_ref), (p_fast, d_fast, t_fast) = out["ref"], out["fast"]
    assert_close(p_fast, p_ref, 1e-4, "prefill logits (all positions)")
    assert_close(d_fast, d_ref, 1e-4, "decode logits")
    assert len(t_fast.moe) == len(t_ref.moe) == 2 * ref.args.n_layers
    for a, b in zip(t_fast.moe, t_ref.moe):
        assert a["path"] == b["path"]
        assert_equal(a["ids"], b["ids"], f"{a['path']} expert ids")
        assert_close(a["weights"], b["weights"], 1e-4, f"{a['path']} routing weights")
    assert len(t_fast.mhc) == len(t_ref.mhc) and len(t_fast.engram) == len(t_ref.engram) > 0
    for a, b in zip(t_fast.mhc, t_ref.mhc):
        assert (a["path"], a["site"]) == (b["path"], b["site"])
        assert_close(a["comb"], b["comb"], 1e-4, f"{a['path']} {a['site']} comb")
    for a, b in zip(t_fast.engram, t_ref.engram):
        assert_equal(a["row_ids"], b["row_ids"], f"{a['path']} row ids")
        assert_close(a["gates"], b["gates"], 1e-4, f"{a['path']} gates")


def test_apply_and_remove_swap_module_classes_only():
    ref, fast = _pair()
    n_blocks = sum(isinstance(m, Block) for m in ref.modules())
    assert n_blocks >= fast.args.n_layers and sum(isinstance(m, KernelBlock) for m in fast.modules()) == n_blocks
    assert (any(isinstance(m, KernelMoE) for m in fast.modules())
            and any(isinstance(m, KernelEngram) for m in fast.modules()))
    state = {k: v.clone() for k, v in fast.state_dict().items()}
    remove_kernels(fast)
    assert active_backend(fast) == "torch" and all(type(m) is not KernelBlock for m in fast.modules())
    assert sum(type(m) in (Block, DraftStage) for m in fast.modules()) == n_blocks
    assert all(torch.equal(state[k], v) for k, v in fast.state_dict().items())
    assert apply_kernels(fast, "triton") is fast and active_backend(fast) == "triton"
    assert active_backend(apply_kernels(fast, "torch")) == "torch"


def test_autograd_runs_the_reference_path_exactly():
    """Kernels have no backward: with gradients on, the kernel modules fall back to the PyTorch code."""
    ref, fast = _pair()
    toks = random_tokens(1, 2, seed=13, vocab=2048)
    lr, lf = ref(toks).logits, fast(toks).logits
    assert lf.requires_grad and torch.equal(lf, lr)


def test_errors_name_the_problem(monkeypatch):
    with pytest.raises(ValueError, match="kernels must be 'torch' or 'triton'"):
        EngineOptions(kernels="cuda")
    with pytest.raises(ValueError, match="unknown kernels backend 'cuda'"):
        apply_kernels(tiny_model(dtype=torch.float32, **SMALL), "cuda")
    with pytest.raises(ValueError, match="not float64"):
        apply_kernels(tiny_model(dtype=torch.float64, **SMALL).to(DEVICE), "triton")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert "TRITON_INTERPRET=1" in unavailable_reason("cpu")
    with pytest.raises(RuntimeError, match="Triton kernels unavailable.*TRITON_INTERPRET=1"):
        apply_kernels(tiny_model(dtype=torch.float32, **SMALL), "triton")


@pytest.mark.slow  # a drafter in the Triton interpreter [7 s]
@pytest.mark.parametrize("mode", MODES)
def test_kernel_drafter_matches_reference(mode):
    """DSpark draft stages (KernelDraftStage) give the same drafts and confidence logits."""
    from engine.dspark.drafter import draft
    from engine.dspark.drafter_cache import DrafterCache
    from engine.request.sampling import SamplingParams

    ref, fast = _pair()
    toks = random_tokens(1, 2, seed=14, vocab=2048)
    drafts = {}
    with torch.no_grad():
        # the target's prefill (compared above) once, on the reference: only the drafter runs kernels here
        logits, taps = ref(toks, ref.new_cache(1, 16), logits="all")
        for name, m in (("ref", ref), ("fast", fast)):
            trace = RecordingTrace(attention=False)
            rings = DrafterCache(m, 1, m.margin)
            rings.append(m, taps, [0])
            drafts[name] = draft(m, rings, torch.tensor([0]), logits[:, -1].argmax(-1).cpu(), SamplingParams(),
                                 [None], trace=trace), trace
    (d_ref, t_ref), (d_fast, t_fast) = drafts["ref"], drafts["fast"]
    assert_equal(d_fast.tokens, d_ref.tokens, "drafted tokens")
    assert_close(d_fast.confidence_logits, d_ref.confidence_logits, 1e-4, "confidence logits")
    assert len(t_fast.mhc) == len(t_ref.mhc) == 2 * fast.args.n_draft_stages
    for a, b in zip(t_fast.moe, t_ref.moe):
        assert_equal(a["ids"], b["ids"], f"{a['path']} drafter expert ids")


@pytest.mark.slow  # the same [6 s]
@pytest.mark.parametrize("mode", MODES)
def test_cli_generate_with_triton_kernels_prints_the_reference_text(mode, capsys):
    from engine.cli import main as cli_main
    argv = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "Hi", "--max-new-tokens", "2",
            "--device", DEVICE.type]
    assert cli_main(argv) == 0
    ref = capsys.readouterr().out
    assert cli_main(argv + ["--kernels", "triton"]) == 0
    assert capsys.readouterr().out == ref


def test_cli_kernels_on_cpu_without_the_interpreter_is_refused(monkeypatch, capsys):
    from engine.cli import main as cli_main
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    argv = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "Hi", "--kernels", "triton"]
    assert cli_main(argv) == 2
    err = capsys.readouterr().err
    assert "--kernels triton on cpu" in err and "TRITON_INTERPRET=1" in err
