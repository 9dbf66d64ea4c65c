"""engine.speedups.cpu_bf16: small bf16 weights on the CPU multiplied through a resident fp32 copy (made once, rebuilt
when the weight changes) in every product on a CPU without bf16 matrix instructions and in small products on one
with them; larger weights widened to fp32 for products of several rows on a CPU without bf16 matrix instructions;
all equal to torch's bf16 kernels up to summation order, in the modules that use them too (Linear, the MoE's expert
stacks, the attention's grouped output projection). Both kinds of CPU are tested on any machine (the probe is
replaced). A few rows normally go through engine.speedups.row_invariant's kernel instead (tests/speedups/
test_row_invariant.py); here it is off, as where it did not build, so that these products take cpu_bf16's routes."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model.moe import MoE
from engine.speedups import cpu_bf16, fast_attention, fast_linear
from engine.speedups.fast_linear import FastLinear
from engine.speedups.fast_moe import FastMoE
from tests.speedups.test_speedups_fast import args_of, pair


@pytest.fixture(autouse=True)
def without_row_invariant_kernel(monkeypatch):
    for module in (fast_linear, fast_attention):
        monkeypatch.setattr(module, "few_rows_linear", lambda *args, **kwargs: None)


def operands(rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 192, generator=g).bfloat16()
    w = torch.randn(768, 192, generator=g).bfloat16()
    return x, w


def test_which_products_widen(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: False)
    x, w = operands(4)
    assert cpu_bf16.widens(x, w)
    assert cpu_bf16.widens(x.view(2, 2, -1), w)                 # rows counted over every leading dim
    assert not cpu_bf16.widens(x[:1], w)                        # plain decode keeps the bf16 kernel
    assert not cpu_bf16.widens(x.float(), w.float())
    assert not cpu_bf16.widens(x, w.float())
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: True)
    assert not cpu_bf16.widens(x, w)


def test_widened_products_equal_the_bf16_kernels_up_to_summation_order(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: False)
    for rows in (2, 7, 32):
        x, w = operands(rows, seed=rows)
        exact = F.linear(x.double(), w.double())
        for got, kernel in ((cpu_bf16.linear(x, w), F.linear(x, w)), (cpu_bf16.mm(x, w.t()), torch.mm(x, w.t()))):
            assert got.dtype == torch.bfloat16 and got.shape == (rows, 768)
            # both round an fp32 sum of exact products once: at most one bf16 step apart, and as close to exact
            step = exact.abs().clamp_min(1e-3) * 2 ** -7
            assert bool(((got.double() - kernel.double()).abs() <= step).all())
            assert (got.double() - exact).abs().max() <= (kernel.double() - exact).abs().max() * 1.01 + 1e-6



def assert_one_rounding_apart(got: torch.Tensor, kernel: torch.Tensor, exact: torch.Tensor) -> None:
    """got and the bf16 kernel both round an fp32 sum of exact products once: at most one bf16 step apart, and got
    as close to exact as the kernel."""
    assert got.dtype == kernel.dtype == torch.bfloat16 and got.shape == kernel.shape
    step = exact.abs().clamp_min(1e-3) * 2 ** -7
    assert bool(((got.double() - kernel.double()).abs() <= step).all())
    assert (got.double() - exact).abs().max() <= (kernel.double() - exact).abs().max() * 1.01 + 1e-6


def test_which_weights_are_kept_in_fp32():
    w = torch.zeros(768, 192, dtype=torch.bfloat16)
    assert cpu_bf16.resident(w)
    assert not cpu_bf16.resident(w.float()) and not cpu_bf16.resident(w.half())
    assert not cpu_bf16.resident(torch.zeros(cpu_bf16.RESIDENT_MAX_ELEMENTS + 1, dtype=torch.bfloat16))


def test_which_products_read_the_fp32_copy(monkeypatch):
    w = torch.zeros(768, 192, dtype=torch.bfloat16)                 # 147,456 elements
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: True)
    assert cpu_bf16.through_fp32_copy(1, w) and cpu_bf16.through_fp32_copy(7, w)   # 1,032,192 multiply-adds
    assert not cpu_bf16.through_fp32_copy(8, w)                     # beyond COPY_MAX_MACS: the bf16 kernel
    assert not cpu_bf16.through_fp32_copy(1, w.float())             # an fp32 weight is its own copy
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: False)
    assert cpu_bf16.through_fp32_copy(4096, w)                      # no bf16 instructions: every product
    assert not cpu_bf16.through_fp32_copy(1, torch.zeros(cpu_bf16.RESIDENT_MAX_ELEMENTS + 1, dtype=torch.bfloat16))


def test_a_large_bf16_product_keeps_the_bf16_kernel_where_the_cpu_has_bf16_instructions(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: True)
    x, w = operands(8, seed=4)
    layer = FastLinear(192, 768, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight))
        assert "_derived" not in layer.__dict__                     # no copy made for it
        layer(x[:1])
    assert "weight:fp32" in layer.__dict__["_derived"]._entries


@pytest.mark.parametrize("native", [False, True], ids=["no-bf16-instructions", "bf16-instructions"])
def test_a_small_bf16_linear_reads_one_fp32_copy_that_follows_the_weight(monkeypatch, native):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: native)
    g = torch.Generator().manual_seed(1)
    layer = FastLinear(192, 768, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(torch.randn(768, 192, generator=g))
    for rows in (1, 2, 7):                                          # all through the copy (COPY_MAX_MACS)
        x = torch.randn(rows, 192, generator=g).bfloat16()
        with torch.inference_mode():
            got = layer(x)
        assert_one_rounding_apart(got, F.linear(x, layer.weight), F.linear(x.double(), layer.weight.double()))
    copy = layer.__dict__["_derived"]._entries["weight:fp32"][2]
    assert copy.dtype == torch.float32 and torch.equal(copy, layer.weight.float())
    with torch.inference_mode():
        layer(x)
    assert layer.__dict__["_derived"]._entries["weight:fp32"][2] is copy          # no conversion per call
    with torch.no_grad():
        layer.weight.mul_(2)                                                        # an in-place update reaches it
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x.float(), layer.weight.float()).bfloat16())
    with torch.inference_mode():                                                    # an fp32 input is cast first,
        assert torch.equal(layer(x.float() / 3), F.linear((x.float() / 3).bfloat16().float(),  # as Linear casts it
                                                           layer.weight.float()).bfloat16())


def test_a_large_bf16_weight_keeps_the_bf16_kernel_for_one_row(monkeypatch):
    monkeypatch.setattr(cpu_bf16, "RESIDENT_MAX_ELEMENTS", 1000)
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: False)
    x, w = operands(1, seed=3)
    layer = FastLinear(192, 768, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(w)                                       # an empty weight may hold NaN, never equal
    with torch.inference_mode():
        assert torch.equal(layer(x), F.linear(x, layer.weight))
    assert "_derived" not in layer.__dict__


@pytest.mark.parametrize("native", [False, True], ids=["no-bf16-instructions", "bf16-instructions"])
@pytest.mark.parametrize("tokens", [1, 3, 12, 300], ids=lambda n: f"{n}-tokens")
def test_bf16_expert_stacks_in_fp32_round_each_product_as_the_bf16_experts(monkeypatch, tokens, native):
    """The MoE's paths (by expert, gathered, dense) read fp32 copies of small bf16 experts and round each product
    to bf16 as the experts' own kernels do — except products too large for the copy to pay on a CPU with bf16
    instructions, which read bf16 copies of the stacks: the reference MoE's output up to the summation order of
    the products, and as close to the float64 MoE."""
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: native)
    args = args_of("v4.1")
    E, k = args.n_routed_experts, args.n_activated_experts
    torch.manual_seed(0)
    ref = MoE(args, E, k, dtype=torch.bfloat16)
    for p in ref.parameters():
        torch.nn.init.normal_(p, std=0.05)
    exact = MoE(args, E, k, dtype=torch.float64)
    exact.load_state_dict(ref.state_dict())
    fast = FastMoE.adopt(MoE(args, E, k, dtype=torch.bfloat16))
    fast.load_state_dict(ref.state_dict())
    x = torch.randn(tokens, args.dim).bfloat16()
    with torch.inference_mode():
        weights, ids, _ = ref.gate(x)
        want = ref.routed_experts(x, weights, ids) + ref.shared_experts(x).float()        # [N, dim] fp32
        truth = exact.routed_experts(x.double(), weights.double(), ids) + exact.shared_experts(x.double())
        pick = torch.cat([ids, torch.full((tokens, 1), E)], 1).view(-1)                   # the shared expert last
        pair_weights = torch.cat([weights, torch.ones(tokens, 1)], 1).view(-1, 1)
        paths = {"by expert": fast.sorted_pairs(x, pair_weights, pick, tokens),
                 "gathered": fast.gathered_pairs(x, pair_weights, pick, tokens),
                 "dense": fast.dense_experts(x, weights, ids) + fast.shared_experts(x).float()}
        w13, w2t = fast.fused()
    assert w13.dtype == w2t.dtype == torch.float32 and fast.fused_experts.param_dtype == torch.bfloat16
    # one expert's [W1; W3] has 2 · 32 · 64 elements: by expert, 300 tokens pass COPY_MAX_MACS; dense (all 8), 32
    bf16_stacks = fast.__dict__["_derived"]._entries if "_derived" in fast.__dict__ else {}
    assert ("w13:param" in bf16_stacks) == (native and tokens == 300)
    assert all(entry[2].dtype == torch.bfloat16 for entry in bf16_stacks.values())
    err_ref = (want.double() - truth).abs().mean()
    for name, got in paths.items():
        assert got.dtype == torch.float32, name
        torch.testing.assert_close(got, want, rtol=2 ** -6, atol=2 ** -6 * want.abs().mean().item(), msg=name)
        assert (got.double() - truth).abs().mean() <= 1.25 * err_ref, name


@pytest.mark.parametrize("native", [False, True], ids=["no-bf16-instructions", "bf16-instructions"])
@pytest.mark.parametrize("tokens", [3, 600], ids=lambda n: f"{n}-tokens")
def test_the_grouped_output_projection_reads_an_fp32_copy_in_bf16(monkeypatch, tokens, native):
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: native)
    ref, fast = pair("v4.1", torch.bfloat16)
    attn_ref, attn_fast = ref.layers[0].attn, fast.layers[0].attn
    o = torch.randn(1, tokens, ref.args.n_heads, ref.args.head_dim).bfloat16()
    with torch.inference_mode():
        got = attn_fast.grouped_output(o)
        wo_a = attn_ref.wo_a.weight.view(attn_ref.groups, attn_ref.o_rank, -1)
        z = torch.einsum("bsgd,grd->bsgr", o.reshape(1, tokens, attn_ref.groups, -1), wo_a)   # the reference's
        want = attn_ref.wo_b(z.flatten(2))
    entries = attn_fast.__dict__["_derived"]._entries
    assert ("wo_a:fp32" in entries) == (not native or tokens * wo_a.numel() <= cpu_bf16.COPY_MAX_MACS)
    assert "wo_a:fp32" not in entries or entries["wo_a:fp32"][2].dtype == torch.float32
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -6, atol=2 ** -6 * want.float().abs().mean().item())


def compiled_graphs(fn, *args):
    """fn(*args) through torch.compile with a backend that keeps each traced FX graph and runs it as traced."""
    graphs = []

    def keep(gm, example_inputs):
        graphs.append(gm)
        return gm.forward
    torch._dynamo.reset()
    try:
        return torch.compile(fn, backend=keep, fullgraph=True)(*args), graphs
    finally:
        torch._dynamo.reset()


def weights_converted_in(graphs, w: torch.Tensor) -> list[str]:
    """The graphs' nodes that compute an fp32 tensor of w's shape (the weight converted on every call)."""
    return [str(node) for gm in graphs for node in gm.graph.nodes if node.op not in ("placeholder", "get_attr")
            and isinstance(value := node.meta.get("example_value"), torch.Tensor)
            and value.dtype == torch.float32 and value.shape == w.shape]


@pytest.mark.parametrize("native", [True, False], ids=["bf16-instructions", "no-bf16-instructions"])
@pytest.mark.parametrize("made_first", [False, True], ids=["no-copy-yet", "copy-made-eagerly"])
def test_compiled_one_row_bf16_products_convert_their_weights_in_the_graph_only_without_bf16_instructions(
        monkeypatch, made_first, native):
    """A copy made while tracing is traced as a conversion of the whole weight, run by the compiled graph on every
    call. On a CPU with bf16 instructions compiled code reads the fp32 copies that exist (as the eager calls before
    it made them) and otherwise the bf16 weight with torch's bf16 kernel; without them it keeps the conversion
    (the product widened). All equal the bf16 kernel up to summation order."""
    monkeypatch.setattr(cpu_bf16, "native_bf16_matmul", lambda: native)
    ref, fast = pair("v4.1", torch.bfloat16)
    layer, attn = fast.layers[0].attn.wq_b, fast.layers[0].attn
    g = torch.Generator().manual_seed(5)
    x = torch.randn(1, 1, layer.in_features, generator=g).bfloat16()
    o = torch.randn(1, 1, ref.args.n_heads, ref.args.head_dim, generator=g).bfloat16()
    with torch.no_grad():
        layer(x), attn.grouped_output(o)                           # eager calls: they make the copies
        want = F.linear(x, layer.weight), attn.grouped_output(o)
        if not made_first:
            del layer.__dict__["_derived"], attn.__dict__["_derived"]
        (got, got_o), graphs = compiled_graphs(lambda x, o: (layer(x), attn.grouped_output(o)), x, o)
    assert graphs, "nothing was traced"
    converts = not native and not made_first
    assert layer.__dict__["_derived"].has("weight:fp32") == (made_first or converts)
    assert attn.__dict__["_derived"].has("wo_a:fp32") == (made_first or converts)
    assert bool(weights_converted_in(graphs, layer.weight)) == converts
    wo_a = attn.wo_a.weight.view(attn.groups, attn.o_rank, -1).transpose(1, 2)
    assert bool(weights_converted_in(graphs, wo_a)) == converts
    exact = F.linear(x.double(), layer.weight.double())
    assert_one_rounding_apart(got.view(1, -1), want[0].view(1, -1), exact.view(1, -1))
    torch.testing.assert_close(got_o.float(), want[1].float(), rtol=2 ** -7, atol=1e-6)


def test_compiled_bf16_code_reads_the_instruction_probe_without_a_graph_break():
    """The real probe, not a stub: dynamo cannot trace torch's CPU-feature probe, so code being compiled must read
    a value probed before. A graph break there split a compiled bf16 decode body into per-module pieces (and
    those broke on the Engram layers' tables of different sizes); fullgraph=True turns such a break into an
    error."""
    _, fast = pair("v4.1", torch.bfloat16)
    layer = fast.layers[0].attn.wq_b
    x = torch.randn(1, 1, layer.in_features, generator=torch.Generator().manual_seed(8)).bfloat16()
    with torch.no_grad():
        want = layer(x)
        got, graphs = compiled_graphs(lambda x: (layer(x), cpu_bf16.native_bf16_matmul()), x)
    assert graphs and got[1] == cpu_bf16._probe_bf16_matmul()
    torch.testing.assert_close(got[0].float(), want.float(), rtol=2 ** -7, atol=1e-6)
