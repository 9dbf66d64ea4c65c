"""bench --gpu helpers that run anywhere: the weight-bytes floor and the refusal to time without a backend."""
import pytest
import torch

from engine.bench.gpu import run_gpu_bench, weight_bytes_per_step
from engine.spec.config import load_config
from tests.model_helpers import tiny_model

SMALL = dict(vocab_size=2048, dspark_noise_token_id=2047)


def test_weight_bytes_count_only_the_activated_experts():
    two = tiny_model(dtype=torch.float32, n_activated_experts=2, **SMALL)
    three = tiny_model(dtype=torch.float32, n_activated_experts=3, **SMALL)
    a = two.args
    n_moe = a.n_layers + a.n_draft_stages
    expert_bytes = 3 * a.dim * a.moe_inter_dim * 4                       # w1, w2, w3 in fp32
    # the draft stages keep their own expert count; only the backbone's k changed
    assert weight_bytes_per_step(three) - weight_bytes_per_step(two) == a.n_layers * expert_bytes
    everything = sum(p.numel() * 4 for p in two.parameters())
    assert weight_bytes_per_step(two) < everything - two.embed.weight.numel() * 4
    assert n_moe > a.n_layers


def test_gpu_bench_refuses_cpu_without_the_interpreter(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(RuntimeError, match="Triton kernels unavailable"):
        run_gpu_bench(load_config("configs/tiny-v4.1.json"), device="cpu")


def test_bench_cli_gpu_flag_fails_early_with_the_reason(monkeypatch, capsys):
    from engine.cli import main

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert main(["bench", "--gpu", "--device", "cpu", "--prompt-len", "2", "--new-tokens", "2"]) == 2
    assert "--gpu on cpu: Triton kernels on CPU tensors need the interpreter" in capsys.readouterr().err
