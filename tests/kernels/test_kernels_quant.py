"""FP8 / FP4 GEMM kernels vs PyTorch references: weights dequantized with engine.quant.formats, activations
quant-dequantized like the reference's act_quant, products in float64."""
import pytest
import torch

from engine.kernels import launch, launch_quant
from engine.kernels.runtime import KernelInputError
from engine.model.linear import Linear
from engine.model.quant import FP8_MAX, fp8_qdq, pow2_scale
from engine.quant.formats import dequantize_fp4, dequantize_fp8, quantize_fp4, quantize_fp8
from engine.quant.modules import FP4Linear, FP8Linear
from engine.speedups import active_backend, apply_kernels, remove_kernels
from engine.speedups.kernel_quant import KernelFP4Linear, KernelFP8Linear
from tests.kernel_helpers import DEVICE, MODES, NATIVE, assert_equal, gen

pytestmark = pytest.mark.slow  # FP8 / FP4 GEMMs in the Triton interpreter, many shapes [9 s]

ACT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]   # the dots multiply FP8, so bf16 is fine interpreted
MAGNITUDES = [1e-3, 1.0, 1e2]              # times per-block gains of 0.01..10: values over 1e-5..1e3
# Tolerance, stated: the kernel's products of FP8 codes are exact and the scales are powers of two, so the only
# errors are (1) the accumulation: in fp32 at most K · 2^-24 · Σ_k |a_k · w_k| (the interpreter, and mma.sync
# on a GPU); natively a Hopper FP8 wgmma keeps only ~14 bits inside each 32-product block (DeepSeek-V3 report
# §3.3.2; the kernel promotes to fp32 after every block, as the reference does), so there 2^-13 · Σ|a·w|;
# (2) rounding the result to the output dtype, half an ulp: 2^-24 (fp32), 2^-11 (fp16), 2^-8 (bf16) of |C|;
# a whole bf16 ulp (2^-7) under the interpreter, whose fp32 → bf16 cast truncates (natively: nearest even).
OUT_ROUNDING = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8 if NATIVE else 2.0**-7}


def accumulation_tol(K: int) -> float:
    return max(K * 2.0**-24, 2.0**-13 if NATIVE else 0.0)


def blocky(*shape, seed: int, magnitude: float, dtype=torch.float32) -> torch.Tensor:
    """Random normal values whose 32-wide column blocks (per row) carry gains of 0.01, 0.1, 1 or 10 around
    `magnitude`, so that every block gets its own scale; made on the CPU, moved to the test device."""
    g = gen(seed)
    x = torch.randn(*shape, generator=g)
    block_gain = 10.0 ** torch.randint(-2, 2, (*shape[:-1], -(-shape[-1] // 32)), generator=g).float()
    x = x * block_gain.repeat_interleave(32, -1)[..., : shape[-1]] * magnitude
    return x.to(dtype=dtype, device=DEVICE)


def act_quant_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spec §3.2 in PyTorch: per row and 32-wide block, s = 2^ceil(log2(max(amax, 1e-4)/448)), q = e4m3(x/s)."""
    xf = x.float()
    K = xf.size(-1)
    xg = torch.nn.functional.pad(xf, (0, -K % 32)).unflatten(-1, (-1, 32))   # [M, KB, 32]
    s = pow2_scale(xg.abs().amax(-1).clamp_min(1e-4), FP8_MAX)               # [M, KB]
    q = (xg / s.unsqueeze(-1)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).flatten(1)[:, :K]
    return q, s


def gemm_reference(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(C, Σ|a·w|) in float64 for activations x [M, K] (quant-dequantized to FP8 first) and a dequantized weight
    w [N, K]: what the kernel computes exactly, and the scale of its accumulation error."""
    a = fp8_qdq(x.float()).double().cpu()
    w = w.double().cpu()
    return a @ w.T, a.abs() @ w.abs().T


def assert_gemm_close(got: torch.Tensor, want: torch.Tensor, magnitude: torch.Tensor, K: int, what: str) -> None:
    """|got − want| ≤ OUT_ROUNDING[dtype]·|want| + accumulation_tol(K)·Σ|a·w| (+ the dtype's tiny); reports the
    max diff."""
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != reference {tuple(want.shape)}"
    g = got.double().cpu()
    diff = (g - want).abs()
    bound = OUT_ROUNDING[got.dtype] * want.abs() + accumulation_tol(K) * magnitude + torch.finfo(got.dtype).tiny
    if not bool((diff <= bound).all()):
        worst = int((diff - bound).flatten().argmax())
        raise AssertionError(f"{what}: max |diff| {diff.max().item():.3g} (max |ref| {want.abs().max().item():.3g}); "
                             f"worst element #{worst}: got {g.flatten()[worst].item():.8g}, reference "
                             f"{want.flatten()[worst].item():.8g}, allowed {bound.flatten()[worst].item():.3g}")


# ---- activation quantization ---------------------------------------------------------------------------
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 32), (5, 90), (3, 1000)], ids=lambda s: "M{}-K{}".format(*s))
def test_act_quant_is_bit_exact(mode, dtype, shape):
    """Codes and scales equal the PyTorch act_quant bit for bit; q·s equals the model's fp8_qdq emulation."""
    M, K = shape
    x = blocky(M, K, seed=K + M, magnitude=1.0, dtype=dtype)
    q, s = launch_quant.act_quant(x)
    q_want, s_want = act_quant_reference(x)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert_equal(q.view(torch.uint8), q_want.view(torch.uint8), "E4M3 codes")
    assert_equal(s, s_want, "block scales")
    dequant = (q.float() * s.repeat_interleave(32, 1)[:, :K]).to(dtype)
    assert_equal(dequant, fp8_qdq(x), "q·s vs engine.model.quant.fp8_qdq")


@pytest.mark.parametrize("mode", MODES)
def test_act_quant_rounding_edges(mode):
    """Ties to even (17 → 16, 19 → 20), E4M3 subnormals (steps of 2^-9) and their ties, −0, a block of zeros
    (amax clamped to 1e-4), and a block at the 448 limit."""
    edges = [448.0, 17.0, 19.0, -17.0, 2.5 * 2**-9, 3.5 * 2**-9, 2**-10, 1.5 * 2**-9, -0.0, 0.0, 1e-30, 240.0, 232.0]
    row = torch.zeros(96)
    row[: len(edges)] = torch.tensor(edges)
    row[64:] = torch.linspace(-3e-5, 3e-5, 32)                    # amax below the 1e-4 clamp
    x = row.unsqueeze(0).to(DEVICE)
    q, s = launch_quant.act_quant(x)
    q_want, s_want = act_quant_reference(x)
    assert_equal(s, s_want, "scales")
    assert_equal(q.view(torch.uint8), q_want.view(torch.uint8), "codes")
    assert q[0, :4].float().tolist() == [448.0, 16.0, 20.0, -16.0]
    assert q[0, 4:8].float().tolist() == [2 * 2**-9, 4 * 2**-9, 0.0, 2 * 2**-9]


# ---- FP8 GEMM --------------------------------------------------------------------------------------------
# (tokens M, out features N, in features K): decode; odd sizes with partial 32-blocks on both N and K; several
# row and column tiles; exactly one K block
FP8_CASES = [(1, 32, 64), (7, 50, 90), (37, 100, 160), (20, 64, 32)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("magnitude", MAGNITUDES, ids=lambda m: f"x{m:g}")
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=str)
@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "M{}-N{}-K{}".format(*c))
def test_fp8_linear_matches_dequantized_reference(mode, magnitude, dtype, case):
    M, N, K = case
    x = blocky(M, K, seed=M + K, magnitude=magnitude, dtype=dtype)
    w8, ws = quantize_fp8(blocky(N, K, seed=N, magnitude=K**-0.5).float().cpu())
    got = launch_quant.fp8_linear(x, w8.to(DEVICE), ws.to(DEVICE))
    assert got.dtype == dtype and got.shape == (M, N)
    want, scale = gemm_reference(x, dequantize_fp8(w8, ws))
    assert_gemm_close(got, want, scale, K, f"FP8 linear {dtype} x{magnitude:g}")


@pytest.mark.parametrize("mode", MODES)
def test_fp8_gemm_takes_leading_dims_and_out_dtype(mode):
    """fp8_linear flattens [B, S, K]; fp8_gemm writes any kernel dtype from the same quantized inputs."""
    x = blocky(2, 3, 64, seed=8, magnitude=1.0)
    w8, ws = quantize_fp8(blocky(48, 64, seed=9, magnitude=0.1).cpu())
    w8, ws = w8.to(DEVICE), ws.to(DEVICE)
    y = launch_quant.fp8_linear(x, w8, ws)
    assert y.shape == (2, 3, 48)
    q, s = launch_quant.act_quant(x.reshape(6, 64))
    y16 = launch_quant.fp8_gemm(q, s, w8, ws, torch.float16)
    assert y16.dtype == torch.float16
    want, scale = gemm_reference(x.reshape(6, 64), dequantize_fp8(w8.cpu(), ws.cpu()))
    assert_gemm_close(y.reshape(6, 48), want, scale, 64, "leading dims")
    assert_gemm_close(y16, want, scale, 64, "fp16 out")


def test_fp8_launcher_rejects_bad_inputs():
    x = torch.randn(3, 64, device=DEVICE)
    w8, ws = quantize_fp8(torch.randn(40, 64))
    w8, ws = w8.to(DEVICE), ws.to(DEVICE)
    with pytest.raises(KernelInputError, match="weight has dtype torch.bfloat16"):
        launch_quant.fp8_linear(x, w8.bfloat16(), ws)
    with pytest.raises(KernelInputError, match="weight_scale has dtype torch.float32"):
        launch_quant.fp8_linear(x, w8, ws.float())
    with pytest.raises(KernelInputError, match=r"weight has shape \[40, 32\]; expected \[\*, 64\]"):
        launch_quant.fp8_linear(x, w8[:, :32].contiguous(), ws)
    with pytest.raises(KernelInputError, match=r"weight_scale has shape \[1, 2\]; expected \[2, 2\]"):
        launch_quant.fp8_linear(x, w8, ws[:1].contiguous())


# ---- FP4 (MXFP4) expert GEMM ------------------------------------------------------------------------------
# (tokens M, out features N, in features K even): decode; K with a partial 32-group; several tiles; one group
FP4_CASES = [(1, 32, 64), (7, 50, 90), (37, 33, 48), (16, 64, 32)]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("magnitude", MAGNITUDES, ids=lambda m: f"x{m:g}")
@pytest.mark.parametrize("dtype", ACT_DTYPES, ids=str)
@pytest.mark.parametrize("case", FP4_CASES, ids=lambda c: "M{}-N{}-K{}".format(*c))
def test_fp4_linear_matches_dequantized_reference(mode, magnitude, dtype, case):
    M, N, K = case
    x = blocky(M, K, seed=M + K + 1, magnitude=magnitude, dtype=dtype)
    w4, s4 = quantize_fp4(blocky(N, K, seed=N + 1, magnitude=K**-0.5).cpu())
    got = launch_quant.fp4_linear(x, w4.to(DEVICE), s4.to(DEVICE))
    assert got.dtype == dtype and got.shape == (M, N)
    want, scale = gemm_reference(x, dequantize_fp4(w4, s4))
    assert_gemm_close(got, want, scale, K, f"FP4 linear {dtype} x{magnitude:g}")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tokens,experts,k", [(1, 8, 2), (11, 5, 3), (40, 3, 2)], ids=lambda v: str(v))
def test_fp4_grouped_experts_gather_their_rows(mode, tokens, experts, k):
    """Expert-sorted tiles (launch.expert_tiles) with rows gathered by token: output row r = x[token of pair r]
    times the weight of pair r's expert, for every routed pair; decode (fewer pairs than experts) included."""
    N, K = 40, 96
    x = blocky(tokens, K, seed=tokens, magnitude=1.0)
    ids = torch.stack([torch.randperm(experts, generator=gen(t))[:k] for t in range(tokens)]).to(DEVICE)
    packed = [quantize_fp4(blocky(N, K, seed=100 + e, magnitude=0.2).cpu()) for e in range(experts)]
    w = torch.stack([p[0] for p in packed]).to(DEVICE)                 # [E, N, K/2]
    ws = torch.stack([p[1] for p in packed]).to(DEVICE)                # [E, N, K/32]
    order, t_exp, t_start, t_end, _ = launch.expert_tiles(ids, experts, 16)
    token = order // k                                                  # [P] token of the sorted pair
    q, s = launch_quant.act_quant(x)
    got = launch_quant.fp4_expert_gemm(q, s, w, ws, t_exp, t_start, t_end, rows=token, out_dtype=torch.float32)
    expert_of_row = ids.flatten()[order].cpu()
    deq = torch.stack([dequantize_fp4(*p) for p in packed])            # [E, N, K]
    want, scale = gemm_reference(x, deq.flatten(0, 1))                 # [tokens, E·N]: every token × every expert

    def pick(full: torch.Tensor) -> torch.Tensor:                       # [tokens, E·N] → [P, N] per sorted pair
        return full.unflatten(1, (experts, N))[token.cpu(), expert_of_row]

    assert got.shape == (tokens * k, N)
    assert_gemm_close(got, pick(want), pick(scale), K, "grouped FP4 experts")


def test_fp4_launcher_rejects_bad_inputs():
    q, s = launch_quant.act_quant(torch.randn(3, 64, device=DEVICE))
    w4, s4 = quantize_fp4(torch.randn(40, 64))
    w4, s4 = w4.to(DEVICE).unsqueeze(0), s4.to(DEVICE).unsqueeze(0)
    tiles = [torch.zeros(1, dtype=torch.long, device=DEVICE), torch.zeros(1, dtype=torch.long, device=DEVICE),
             torch.full((1,), 3, dtype=torch.long, device=DEVICE)]
    with pytest.raises(KernelInputError, match=r"weight has shape \[1, 40, 16\]; expected \[\*, \*, 32\]"):
        launch_quant.fp4_expert_gemm(q, s, w4[..., :16].contiguous(), s4, *tiles)
    with pytest.raises(KernelInputError, match=r"weight_scale has shape \[1, 40, 1\]; expected \[1, 40, 2\]"):
        launch_quant.fp4_expert_gemm(q, s, w4, s4[..., :1].contiguous(), *tiles)
    with pytest.raises(KernelInputError, match="K must be even"):
        qo, so = launch_quant.act_quant(torch.randn(3, 63, device=DEVICE))
        launch_quant.fp4_expert_gemm(qo, so, w4, s4, *tiles)
    with pytest.raises(KernelInputError, match="block_m must be a power of two"):
        launch_quant.fp4_expert_gemm(q, s, w4, s4, *tiles, block_m=24)


# ---- the kernel-backed quantized linears (EngineOptions(kernels="triton")) --------------------------------
@pytest.mark.parametrize("mode", MODES)
def test_apply_kernels_swaps_the_quantized_linears(mode):
    """apply_kernels turns FP8Linear / FP4Linear into their kernel-backed classes (same state dict), whose
    forward, like the PyTorch one, matches the float64 reference; without act_quant they run the PyTorch forward
    (the kernels always quantize their input); remove_kernels swaps back."""
    def built(out_features: int, seed: int) -> Linear:
        linear = Linear(90, out_features, quantized=True)
        with torch.no_grad():
            linear.weight.copy_(blocky(out_features, 90, seed=seed, magnitude=0.1).cpu())
        return linear

    dense = FP8Linear.adopt(built(50, 1), (32, 32))
    expert = FP4Linear.adopt(built(40, 2), (32, 32))
    model = torch.nn.ModuleDict({"dense": dense, "expert": expert}).to(DEVICE)
    x = blocky(5, 90, seed=3, magnitude=1.0)
    dense.act_quant = expert.act_quant = True
    with torch.no_grad():
        want = {name: m(x) for name, m in model.items()}
        state = {k: v.clone() for k, v in model.state_dict().items()}
        apply_kernels(model, "triton")
        assert (type(dense), type(expert)) == (KernelFP8Linear, KernelFP4Linear)
        assert active_backend(model) == "triton"
        assert all(torch.equal(v.view(torch.uint8), state[k].view(torch.uint8)) for k, v in model.state_dict().items())
        for name, m in model.items():
            exact, scale = gemm_reference(x, dequantize_fp8(m.weight, m.scale) if name == "dense"
                                          else dequantize_fp4(m.weight, m.scale))
            assert_gemm_close(want[name], exact, scale, 90, f"PyTorch {name}")
            assert_gemm_close(m(x), exact, scale, 90, f"kernel-backed {name}")
        dense.act_quant = False
        assert torch.equal(dense(x), FP8Linear.forward(dense, x)), "no act_quant: the PyTorch forward"
        remove_kernels(model)
    assert (type(dense), type(expert)) == (FP8Linear, FP4Linear)
