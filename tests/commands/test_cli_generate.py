"""`python -m engine generate` and `bench`: streamed text, a trace file that loads back, checkpoints, errors."""
from __future__ import annotations

import json

import pytest

from engine.checkpoint.store import save_checkpoint
from engine.cli import main
from engine.generation import Engine
from engine.request import GenerationRequest
from engine.trace import Trace

BASE = ["generate", "--prompt", "The cat", "--max-new-tokens", "3"]


def test_random_init_generate_writes_a_trace_that_loads_back(tmp_path, capsys):
    out = tmp_path / "run.safetensors"
    assert main(BASE + ["--config", "tiny-v4.1", "--random-init", "--seed", "4", "--trace", str(out)]) == 0
    stdout, stderr = capsys.readouterr()
    assert stdout.startswith("The cat") and "tokens/s" in stderr
    trace = Trace.load(out)
    tokens = trace.tokens(0)
    assert tokens[0].token_id == 0 and sum(t.generated for t in tokens) == 3
    assert stdout.rstrip("\n") == "The cat" + "".join(t.text for t in tokens if t.generated)
    assert trace.meta["weights"] == "random init (seed 4)" and trace.paths("moe")


def test_decoding_option_flags_reach_the_engine_and_the_trace(tmp_path, capsys):
    out = tmp_path / "run.json"
    flags = ["--repetition-penalty", "0.3", "--no-repeat-ngram", "2", "--max-new-tokens", "6"]
    assert main(BASE + ["--config", "tiny-v4.1", "--random-init", "--seed", "4", "--trace", str(out)] + flags) == 0
    stdout = capsys.readouterr().out
    engine = Engine.load("tiny-v4.1", seed=4)
    want = engine.generate_text("The cat", GenerationRequest.of(6, repetition_penalty=0.3, no_repeat_ngram=2)).texts[0]
    plain = engine.generate_text("The cat", GenerationRequest.greedy(6)).texts[0]
    assert stdout.rstrip("\n") == "The cat" + want != "The cat" + plain
    meta = Trace.load(out).meta
    assert (meta["repetition_penalty"], meta["no_repeat_ngram"]) == (0.3, 2)


def test_dtype_flag_runs_the_model_in_bf16_and_names_it_in_the_trace(tmp_path, capsys):
    import torch
    out = tmp_path / "run.json"
    args = ["--config", "tiny-v4.1", "--random-init", "--seed", "4", "--max-new-tokens", "8", "--trace", str(out)]
    assert main(BASE + args + ["--dtype", "bfloat16"]) == 0
    stdout = capsys.readouterr().out
    request = GenerationRequest.greedy(8)
    bf16 = Engine.load("tiny-v4.1", seed=4, dtype=torch.bfloat16).generate_text("The cat", request).texts[0]
    fp32 = Engine.load("tiny-v4.1", seed=4).generate_text("The cat", request).texts[0]
    assert stdout.rstrip("\n") == "The cat" + bf16 != "The cat" + fp32      # this seed's texts differ by dtype
    assert Trace.load(out).meta["dtype"] == "bfloat16"
    with pytest.raises(SystemExit) as refused:                              # argparse's own refusal
        main(BASE + args + ["--dtype", "float16"])
    assert refused.value.code == 2 and "invalid choice: 'float16'" in capsys.readouterr().err


def test_checkpoint_generates_what_the_random_init_generated(tmp_path, capsys):
    engine = Engine.load("tiny-v4.1", seed=4)
    save_checkpoint(engine.model, tmp_path / "ckpt")
    assert main(BASE + ["--config", "tiny-v4.1", "--random-init", "--seed", "4"]) == 0
    from_init = capsys.readouterr().out
    assert main(BASE + ["--checkpoint", str(tmp_path / "ckpt")]) == 0
    assert capsys.readouterr().out == from_init


@pytest.mark.parametrize("extra, message", [
    (["--random-init"], "--random-init needs --config"),
    (["--config", "tiny-v4.1", "--random-init", "--trace", "x.pkl"], "unknown trace format"),
    (["--config", "no-such-preset", "--random-init"], "neither a config file nor a preset"),
    (["--checkpoint", "/nonexistent/ckpt.safetensors"], "no such checkpoint"),
])
def test_bad_invocations_get_a_clear_error(extra, message, capsys):
    assert main(BASE + extra) == 2
    assert message in capsys.readouterr().err


def test_default_weights_are_the_shipped_checkpoint(tmp_path, monkeypatch, capsys):
    from engine.commands import generate as command
    monkeypatch.setattr(command, "DEFAULT_CHECKPOINT", tmp_path / "default")
    assert main(["generate", "--prompt", "The cat"]) == 2
    assert "no trained default checkpoint is shipped yet" in capsys.readouterr().err
    save_checkpoint(Engine.load("tiny-v4.1", seed=4).model, tmp_path / "default")
    assert main(["generate", "--prompt", "The cat", "--max-new-tokens", "3"]) == 0
    from_default = capsys.readouterr().out
    assert main(BASE + ["--config", "tiny-v4.1", "--random-init", "--seed", "4"]) == 0
    assert capsys.readouterr().out == from_default


def test_too_long_or_empty_prompts_fail_before_any_output(capsys):
    long = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "word " * 600, "--max-new-tokens", "1"]
    assert main(long) == 2
    out, err = capsys.readouterr()
    assert out == "" and "more than the model's max_seq_len of 512" in err
    empty = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "", "--no-bos", "--max-new-tokens", "1"]
    assert main(empty) == 2
    assert "--prompt is empty" in capsys.readouterr().err


def test_bench_reports_throughput_and_trace_overhead(capsys):
    assert main(["bench", "--config", "tiny-v4.1", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1",
                 "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    for key in ("prefill_tokens_per_s", "decode_tokens_per_s", "trace_overhead_prefill", "trace_overhead_decode"):
        assert result[key] > 0, key
    assert result["trace_records"]["moe"] == 10 * (4 + 1)  # 10 layers × (4 prompt + 1 fed-back) tokens
