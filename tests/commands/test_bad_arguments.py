"""Bad prompts and arguments: each refused with exit code 2 and a message naming the flag or the problem, before any
work, on the CLI, the engine API and the app's settings; non-finite logits stop generation with a clear error."""
from __future__ import annotations

import os
import shutil
import time

import pytest
import torch

from engine.cli import main
from engine.generation import DSparkConfig, Engine, generate, generate_speculative
from engine.model.sampling import NonFiniteLogitsError
from engine.request import GenerationRequest
from engine.spec.errors import EngineError, InputError
from engine.text.prompt_text import MAX_TOKEN_CHARS
from tests.bounded import run_engine
from tests.model_helpers import tiny_model
from v41viz.inspect.run import GenSettings

GEN = ["generate", "--config", "tiny-v4.1", "--random-init", "--max-new-tokens", "2"]
OK = ["--prompt", "The cat"]
BENCH = ["bench", "--config", "tiny-v4.1", "--prompt-len", "4", "--new-tokens", "2", "--repeats", "1"]
TOO_MANY_CHARS = "x" * (512 * MAX_TOKEN_CHARS + 1)  # tiny-v4.1: max_seq_len 512

# (argv, what the message must say); "{tmp}" is the test's temporary folder. Every one is refused before a model is
# built (the fixture below makes building one fail the test).
CLI_CASES = [
    (GEN + ["--prompt", ""], "--prompt is empty: give some text"),
    (GEN + ["--prompt", " \n\t "], "--prompt is empty apart from whitespace"),
    (GEN + ["--prompt", "ab" + os.fsdecode(b"\xff")], "--prompt is not valid UTF-8: its byte 3 (0xff"),
    (GEN + ["--prompt", "a\ud800b"], "--prompt is not valid text: character 2 is a lone UTF-16 surrogate (U+D800)"),
    (GEN + ["--prompt", TOO_MANY_CHARS], "--prompt has 65,537 characters, more than the model's max_seq_len of 512"),
    (GEN + OK + ["--temperature", "nan"], "--temperature must be a finite number >= 0"),
    (GEN + OK + ["--temperature", "inf"], "--temperature must be a finite number >= 0"),
    (GEN + OK + ["--temperature", "-0.5"], "--temperature must be a finite number >= 0"),
    (GEN + OK + ["--temperature", "1e-45"], "--temperature 1e-45 is below 0.0001, too small to sample with"),
    (GEN + OK + ["--top-p", "0"], "--top-p must lie in (0, 1]"),
    (GEN + OK + ["--top-p", "1.5"], "--top-p must lie in (0, 1]"),
    (GEN + OK + ["--top-p", "nan"], "--top-p must lie in (0, 1]"),
    (GEN + OK + ["--top-k", "-1"], "--top-k must be a non-negative integer"),
    (GEN + OK + ["--repetition-penalty", "0"], "--repetition-penalty must be a finite number > 0 (1 = off"),
    (GEN + OK + ["--repetition-penalty", "nan"], "--repetition-penalty must be a finite number > 0"),
    (GEN + OK + ["--repetition-penalty", "inf"], "--repetition-penalty must be a finite number > 0"),
    (GEN + OK + ["--no-repeat-ngram", "-1"], "--no-repeat-ngram must be a non-negative integer (0 = off"),
    (GEN + OK + ["--max-new-tokens", "-1"], "--max-new-tokens must be at least 0, got -1"),
    (GEN + OK + ["--max-new-tokens", "100000"], "--max-new-tokens must be at most 511 (what the model's max_seq_len "
                                                "of 512 leaves after a one-token prompt), got 100,000"),
    (GEN + OK + ["--seed", "-1"], "--seed must lie in 0..2**63-1"),
    (GEN + OK + ["--seed", str(2**63)], f"--seed must lie in 0..2**63-1 ({2**63 - 1}), got {2**63}"),
    (GEN + OK + ["--seed", str(2**64)], "--seed must lie in 0..2**63-1"),
    (GEN + OK + ["--threads", "0"], "--threads must be at least 1, got 0"),
    (GEN + OK + ["--threads", "100000"], "--threads must be at most"),
    (GEN + OK + ["--device", "tpu:7"], "--device 'tpu:7' is not a device this engine runs on: use cpu, cuda or cuda:N"),
    (GEN + OK + ["--device", "cpu:1"], "--device 'cpu:1': the CPU takes no index"),
    (GEN + OK + ["--device", "cuda:99"], "--device cuda:99: "),
    (GEN + OK + ["--threshold", "2"], "--threshold must lie in [0, 1], got 2.0"),
    (GEN + OK + ["--threshold", "nan"], "--threshold must lie in [0, 1]"),
    (GEN + OK + ["--trace-max-tokens", "0"], "--trace-max-tokens must be at least 1, got 0"),
    (GEN + OK + ["--trace", "{tmp}/run.pkl"], "--trace {tmp}/run.pkl: unknown trace format"),
    (GEN + OK + ["--trace", "{tmp}/dir.json"], "--trace {tmp}/dir.json: is a directory"),
    (GEN + OK + ["--trace", "{tmp}/missing/run.json"], "--trace {tmp}/missing/run.json: the folder {tmp}/missing does "
                                                        "not exist"),
    (GEN + OK + ["--trace", "{tmp}/file.txt/run.json"], "--trace {tmp}/file.txt/run.json: {tmp}/file.txt is not a "
                                                         "folder"),
    (BENCH + ["--batch", "0"], "--batch must be at least 1, got 0"),
    (BENCH + ["--batch", "100000"], "--batch must be at most 4 (the config's max_batch_size), got 100,000"),
    (BENCH + ["--prompt-len", "0"], "--prompt-len must be at least 1, got 0"),
    (BENCH + ["--new-tokens", "1"], "--new-tokens must be at least 2, got 1"),
    (BENCH + ["--repeats", "0"], "--repeats must be at least 1, got 0"),
    (BENCH + ["--prompt-len", "600"], "--prompt-len + --new-tokens must be at most 512 (the config's max_seq_len)"),
    (BENCH + ["--device", "tpu:7"], "--device 'tpu:7' is not a device"),
    (BENCH + ["--seed", str(2**64)], "--seed must lie in 0..2**63-1"),
    (BENCH + ["--threads", "100000"], "--threads must be at most"),
    (["tokenizer", "--text", "caf" + os.fsdecode(b"\xe9")], "--text is not valid UTF-8: its byte 4 (0xe9"),
    (["plan", "tiny-v4.1", "--gpus", "1000000000"], "--gpus must be at most 4,096"),
    (["plan", "tiny-v4.1", "--reserve", "inf"], "--reserve must be a finite number, got inf"),
    (["plan", "tiny-v4.1", "--host-mem", "nan"], "--host-mem must be a finite number, got nan"),
    (["continuations", "--checkpoint", "{tmp}", "--out", "{tmp}/dir.json"], "--out {tmp}/dir.json: is a directory"),
    (["continuations", "--checkpoint", "{tmp}", "--out", "{tmp}/c.safetensors", "--seed", str(2**64)],
     "--seed must lie in 0..2**63-1"),
    (["continuations", "--checkpoint", "{tmp}", "--out", "{tmp}/c.safetensors", "--temperature", "nan"],
     "continuations: temperature must be a finite number >= 0 (0 = greedy), got nan"),
    (["continuations", "--checkpoint", "{tmp}", "--out", "{tmp}/c.safetensors", "--repetition-penalty", "0"],
     "continuations: repetition_penalty must be a finite number > 0 (1 = off"),
    (["train", "--config", "tiny-v4.1", "--out", "{tmp}/run", "--seed", "-3"], "--seed must lie in 0..2**63-1"),
    (["card", "{tmp}", "--seq", "100000"], "--seq must be at most 512 (the checkpoint's max_seq_len), got 100,000"),
    (["card", "{tmp}", "--new-tokens", "100000"], "--new-tokens must be at most 511"),
    (["card", "{tmp}", "--seed", str(2**64)], "--seed must lie in 0..2**63-1"),
    (["card", "{tmp}", "--new-tokens", "1"], "--new-tokens must be at least 2 (decode speed is measured after"),
    (["card", "{tmp}", "--prompts", "0"], "--prompts must be at least 1, got 0"),
    (["card", "{tmp}", "--quality-tokens", "100000"], "--quality-tokens must be at most 511"),
    (["card", "{tmp}", "--repetition-penalty", "-1"], "--repetition-penalty must be a finite number > 0"),
]


@pytest.fixture
def no_work(monkeypatch, tmp_path):
    """Building a model or running a bench fails the test: the refusals must come first. Returns the temp folder,
    holding a directory named dir.json, a file named file.txt and tiny-v4.1's config.json."""
    def started(*_args, **_kwargs):
        raise AssertionError("work started before the bad argument was refused")
    import engine.bench.cpu
    monkeypatch.setattr(Engine, "load", classmethod(started))
    monkeypatch.setattr(engine.bench.cpu, "run_bench", started)
    (tmp_path / "dir.json").mkdir()
    (tmp_path / "file.txt").write_text("x")
    shutil.copy("configs/tiny-v4.1.json", tmp_path / "config.json")  # a checkpoint folder's config, no weights
    return tmp_path


@pytest.mark.parametrize("argv, message", CLI_CASES, ids=range(len(CLI_CASES)))
def test_a_bad_argument_exits_2_naming_it_before_any_work(no_work, capsys, argv, message):
    tmp = str(no_work)
    assert main([a.replace("{tmp}", tmp) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert message.replace("{tmp}", tmp) in err, err


def test_the_corpus_covers_every_checked_flag():
    flags = {a for argv, _ in CLI_CASES for a in argv if a.startswith("--")}
    assert {"--prompt", "--temperature", "--top-p", "--top-k", "--max-new-tokens", "--seed", "--threads", "--device",
            "--threshold", "--trace-max-tokens", "--trace", "--batch", "--prompt-len", "--new-tokens", "--repeats",
            "--text", "--gpus", "--reserve", "--out"} <= flags
    assert len(CLI_CASES) >= 25


def test_no_token_spells_more_than_the_stated_characters():
    """The length refusal before tokenizing relies on it (a token's vocabulary string has one character per byte,
    at least as many as the text it decodes to)."""
    from engine.text.tokenizer import load_tokenizer
    vocab = load_tokenizer().backend.get_vocab(with_added_tokens=True)
    assert max(len(t) for t in vocab) <= MAX_TOKEN_CHARS


# ---- the same rules through the engine API and the app's settings -----------------------------------------------

@pytest.fixture(scope="module")
def engine():
    return Engine.load("tiny-v4.1", seed=4)


@pytest.mark.parametrize("prompts, message", [
    ("", "prompt 0 is empty: give some text"),
    (" \u3000\n", "prompt 0 is empty apart from whitespace"),
    (["fine", ""], "prompt 1 is empty"),
    ("x\udc80", "prompt 0 is not valid UTF-8: its byte 2 (0x80"),
    ("\udfff", "prompt 0 is not valid text: character 1 is a lone UTF-16 surrogate (U+DFFF)"),
    (b"bytes", "prompt 0 must be text (a str), got int"),
    ("word " * 600, "prompt 0 has 602 tokens, more than the model's max_seq_len of 512"),  # BOS + 601
])
def test_engine_api_refuses_bad_prompts(engine, prompts, message):
    with pytest.raises(InputError) as e:
        engine.generate_text(prompts, GenerationRequest.greedy(2))
    assert message in str(e.value)


def test_a_huge_prompt_is_refused_without_tokenizing_it(engine, monkeypatch):
    def tokenized(_text):
        raise AssertionError("the whole prompt was tokenized")
    monkeypatch.setattr(engine.tokenizer, "encode", tokenized)
    t0 = time.perf_counter()
    with pytest.raises(InputError, match="prompt 0 has 4,000,000 characters, more than the model's max_seq_len"):
        engine.generate_text("four" * 1_000_000, GenerationRequest.greedy(1))
    assert time.perf_counter() - t0 < 1.0


@pytest.mark.parametrize("kwargs, message", [
    ({"temperature": 1e-45}, "temperature 1e-45 is below 0.0001"),
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"top_p": float("nan")}, "top_p must lie in (0, 1]"),
    ({"top_k": 2.5}, "top_k must be a non-negative integer"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be a finite number > 0"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty must be a finite number > 0"),
    ({"no_repeat_ngram": 1.5}, "no_repeat_ngram must be a non-negative integer"),
    ({"no_repeat_ngram": 2, "dspark": DSparkConfig(), "repetition_penalty": "1.2"},
     "repetition_penalty must be a finite number > 0"),
    ({"seed": 2**63}, "the seed of row 0 is 9223372036854775808, outside 0..2**63-1"),
    ({"seed": 2**63 - 1}, "the seed of row 1 is 9223372036854775808"),   # seed + row overflows
    ({"seed": -1}, "outside 0..2**63-1"),
    ({"seed": [0, 2**64]}, "the seed of row 1 is 18446744073709551616"),
    ({"max_new_tokens": -1}, "max_new_tokens must be a non-negative integer"),
    ({"prompts": [[0, 5], [0, 1.5]]}, "prompt 1 has 1.5 at position 1, not an integer token id"),
    ({"prompts": [[0, 5], "0 6"]}, "prompt 1 must be a list of token ids, got str"),
    ({"prompts": [list(range(10**6))]}, "prompt 0 has 1000000 tokens, more than the model's max_seq_len of 512"),
])
def test_engine_api_refuses_bad_settings_naming_them(engine, kwargs, message):
    settings = {"max_new_tokens": 2, **kwargs}
    prompts = settings.pop("prompts", [[0, 5], [0, 6]])
    with pytest.raises(InputError) as e:
        engine.generate(prompts, GenerationRequest.of(**settings))
    assert message in str(e.value)


@pytest.mark.parametrize("prompt", ["", "  \t", "a\ud800", "x\udcff"])
def test_the_app_applies_the_engine_prompt_rule(engine, prompt):
    with pytest.raises(InputError) as app:
        GenSettings(prompt).check()
    with pytest.raises(InputError) as api:
        engine.generate_text(prompt, GenerationRequest.greedy(1))
    assert str(app.value) == str(api.value).replace("prompt 0", "The prompt") + "."


def test_the_app_refuses_a_temperature_too_small_to_sample(engine):
    with pytest.raises(InputError, match="temperature 1e-45 is below"):
        GenSettings("The cat", temperature=1e-45).check()
    with pytest.raises(InputError, match="repetition penalty must be a finite number > 0"):
        GenSettings("The cat", repetition_penalty=float("inf")).check()
    with pytest.raises(InputError, match="no-repeat n-gram must be a non-negative integer"):
        GenSettings("The cat", no_repeat_ngram=-2).check()


# ---- in a real process (each costs seconds): bytes in argv as a shell passes them; a thread count that used to take
# the whole process down inside torch.set_num_threads --------------------------------------------------------------

@pytest.mark.parametrize("extra, message", [
    (["--prompt", os.fsdecode(b"The caf\xe9 \xff")],
     "error: --prompt is not valid UTF-8: its byte 8 (0xe9, in character 8) does not decode; pass the text in UTF-8\n"),
    (OK + ["--threads", "100000"], f"error: --threads must be at most {os.cpu_count():,} (this machine's CPU count), "
                                   "got 100,000\n"),
], ids=["invalid-utf8-argv", "threads"])
def test_in_a_real_process(extra, message):
    out = run_engine(*GEN, *extra, timeout_s=60, memory_cap_mib=3072)
    assert (out.returncode, out.stdout, out.stderr) == (2, "", message), out


# ---- non-finite logits ---------------------------------------------------------------------------------------------

def broken(where: str, value: float = float("inf")):
    """A tiny model (64-token vocabulary) with one weight made non-finite after loading."""
    model = tiny_model(dtype=torch.float32, vocab_size=64, dspark_noise_token_id=63)
    with torch.no_grad():
        model.get_parameter(where).fill_(value)
    return model


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_non_finite_logits_stop_plain_generation(temperature):
    model = broken("norm.weight")
    seen = []
    with pytest.raises(NonFiniteLogitsError) as e:
        generate(model, [[0, 5, 7]], GenerationRequest.of(4, temperature=temperature, seed=0),
                 on_token=lambda *a: seen.append(a))
    assert seen == []  # not one token came out
    assert isinstance(e.value, EngineError)
    assert "the model's logits at step 0 (row 0, choosing the token at position 3) are not finite (NaN or Inf)" \
        in str(e.value)


def test_logits_that_turn_non_finite_mid_generation_stop_at_that_step():
    model = tiny_model(dtype=torch.float32, vocab_size=64, dspark_noise_token_id=63)
    first = generate(model, [[0, 5, 7]], GenerationRequest.of(1, stop_tokens=())).tokens[0][0]
    assert first not in (0, 5, 7)
    with torch.no_grad():
        model.embed.weight[first] = float("nan")  # the prompt is fine; feeding back the first new token is not
    seen = []
    with pytest.raises(NonFiniteLogitsError, match=r"at step 1 \(row 0, choosing the token at position 4\)"):
        generate(model, [[0, 5, 7]], GenerationRequest.of(4, stop_tokens=()), on_token=lambda r, t, i: seen.append(t))
    assert seen == [first]


@pytest.mark.parametrize("where, temperature, message", [
    ("norm.weight", 0.0, "after the prefill of row 0"),
    ("mtp.0.attn_norm.weight", 0.0, "DSpark drafter's confidence head at step 1"),
    ("mtp.0.attn_norm.weight", 1.0, "DSpark step 1 (the drafter's sampling)"),
])
def test_non_finite_logits_stop_dspark_generation(where, temperature, message):
    model = broken(where, float("nan"))
    with pytest.raises(NonFiniteLogitsError) as e:
        generate_speculative(model, [[0, 5, 7]],
                             GenerationRequest.of(6, temperature=temperature, seed=0, dspark=DSparkConfig()))
    assert message in str(e.value) and "not finite" in str(e.value)


def test_the_cli_reports_non_finite_logits_with_exit_2(monkeypatch, capsys, engine):
    original = Engine.load.__func__

    def load_broken(cls, *args, **kwargs):
        loaded = original(cls, *args, **kwargs)
        with torch.no_grad():
            loaded.model.norm.weight.fill_(float("inf"))
        return loaded
    monkeypatch.setattr(Engine, "load", classmethod(load_broken))
    assert main(GEN + OK) == 2
    out, err = capsys.readouterr()
    assert out == "The cat"  # the prompt is echoed, then nothing: no BOS tokens, no garbage
    assert err.splitlines()[-1].startswith("error: generation stopped: the model's logits at step 0 (row 0")
