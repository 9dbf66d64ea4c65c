"""Tensor/expert parallelism (engine.parallel): the layout, sharded loading, and N ranks against one process.

Ranks run either as threads of this process, each a member of one real gloo group over an in-memory store (fast:
torch is imported once), or as processes started by torchrun (the real launch; the slow stage). Tolerance in
fp32: the ranks sum partial products (wo_b, the routed experts) in an all-reduce instead of inside one matmul, a
different summation order, so logits differ from one process by a few float32 ulps (~2e-6 measured on logits
of magnitude ~5); 1e-4 leaves room for other BLAS builds. In float64 the same differences are ~4e-15 (1e-9 used;
the trace stores float32 columns whatever the model's dtype, so there 1e-6).
Everything discrete (routing, index top-k, tokens, DSpark accepted counts) is equal, and the ranks' own outputs,
replicated caches included, are bit-identical to each other (an all-reduce gives every rank the same sum)."""
from __future__ import annotations

import copy
import json
import time

import pytest
import torch

from engine.checkpoint.store import save_checkpoint
from engine.parallel import DistributedError, Layout, Source, World, build_shard, shard_model
from engine.parallel.settings import lockstep_settings
from engine.parallel.volume import decode_collectives, volume_lines
from engine.request import GenerationRequest
from engine.spec.errors import InputError
from engine.spec.presets import resolve_config
from tests.model_helpers import synthetic_token_map, tiny_args, tiny_model
from tests.parallel_cases import forward_cases, generation_cases
from tests.parallel_helpers import CPU, assert_close, assert_same_on_every_rank, run_ranks, torchrun


# ---- the layout ---------------------------------------------------------------------------------------------
def test_layout_of_v41_flash_at_eight_ranks():
    a = resolve_config("deepseek-v4.1-flash")
    lay = Layout(a, 3, 8)
    assert (lay.heads, lay.groups) == (slice(24, 32), slice(3, 4))                  # 64 heads, 8 groups
    assert (lay.experts(False), lay.experts(True)) == (slice(144, 192), slice(48, 64))  # 384 and 128 experts
    assert lay.vocab == slice(48480, 64640) and sum(lay.vocab_sizes()) == a.vocab_size
    assert lay.source("layers.5.ffn.experts.2.w1.weight").name == "layers.5.ffn.experts.146.w1.weight"
    assert lay.source("mtp.1.ffn.experts.0.w2.weight").name == "mtp.1.ffn.experts.48.w2.weight"
    assert lay.source("layers.0.attn.wq_b.weight") == Source("layers.0.attn.wq_b.weight", 0, 24 * 512, 32 * 512)
    assert lay.source("layers.0.attn.wo_b.weight") == Source("layers.0.attn.wo_b.weight", 1, 3 * 1024, 4 * 1024)
    # an FP8 weight's E8M0 scale (official checkpoints): the [32, 32] blocks over the weight's part
    assert a.weight_block_size == (32, 32)
    assert lay.source("layers.0.attn.wo_b.scale") == Source("layers.0.attn.wo_b.scale", 1, 3 * 32, 4 * 32)
    assert lay.source("mtp.0.attn.wq_b.scale") == Source("mtp.0.attn.wq_b.scale", 0, 24 * 16, 32 * 16)
    assert lay.source("layers.5.ffn.experts.2.w1.scale") == Source("layers.5.ffn.experts.146.w1.scale")
    for whole in ("layers.0.attn.indexer.wq_b.weight", "layers.0.attn.wkv.weight", "layers.0.ffn.gate.weight",
                  "layers.0.ffn.shared_experts.w1.weight", "layers.1.engram.embed.weight",
                  "mtp.2.markov_head.embed.weight", "layers.3.hc_attn_fn"):
        assert lay.source(whole) == Source(whole)


def test_layout_refuses_a_split_the_config_does_not_divide():
    with pytest.raises(InputError, match=r"over 4 ranks: o_groups = 2 must"):
        Layout(tiny_args(), 0, 4)
    with pytest.raises(InputError, match="rank 2 lies outside a world of 2"):
        Layout(tiny_args(), 2, 2)
    uneven = Layout(resolve_config("default-small").replace(o_groups=4), 0, 4)   # vocabulary 13886 = 4·3471 + 2
    assert uneven.vocab_sizes() == [3471, 3472, 3471, 3472]


def test_a_shard_holds_exactly_its_parts_of_the_full_model():
    model = tiny_model(torch.float32)
    full = model.state_dict()
    held: dict[str, list[tuple[int, bool]]] = {}
    for rank in range(2):
        shard = shard_model(copy.deepcopy(model), World(rank, 2, CPU, group=None))  # sharding never communicates
        for name, t in shard.state_dict().items():
            src = shard.layout.source(name)
            whole = full[src.name]
            part = whole if src.dim is None else whole.narrow(src.dim, src.start, src.stop - src.start)
            assert torch.equal(t, part), f"rank {rank}: {name} is not {src}"
            held.setdefault(src.name, []).append((t.numel(), src.dim is None and src.name == name))
    assert set(held) == set(full)
    replicated = {n for n, parts in held.items() if len(parts) == 2 and all(whole for _, whole in parts)}
    for name, parts in held.items():
        if name in replicated:                    # the whole tensor on both ranks
            assert [n for n, _ in parts] == [full[name].numel()] * 2, name
        else:                                     # split: every element on exactly one rank (an expert: on one)
            assert sum(n for n, _ in parts) == full[name].numel(), name
    assert {n for n in held if "experts.5." in n or n.endswith("attn.wo_b.weight")}.isdisjoint(replicated)


@pytest.mark.slow  # the first meta-device build imports torch._refs [5-12 s at load average 9]
def test_a_shard_reads_its_slices_of_a_checkpoint(tmp_path):
    a, model = tiny_args(), tiny_model(torch.float32)
    save_checkpoint(model, tmp_path / "ckpt")

    def work(world):
        loaded = build_shard(a, world, checkpoint=tmp_path / "ckpt", token_map=synthetic_token_map(a))
        made = shard_model(copy.deepcopy(model), World(world.rank, 2, CPU, group=None))
        want, got = made.state_dict(), loaded.state_dict()
        assert sorted(got) == sorted(want)
        assert all(torch.equal(got[n], want[n]) for n in want), f"rank {world.rank}: loaded shard differs"
        freqs = [(m.freqs, f.freqs) for m, f in zip(loaded.modules(), made.modules()) if hasattr(m, "freqs")]
        assert freqs and all(torch.equal(x, y) for x, y in freqs)           # rebuilt after the meta-device build

    results, errors = run_ranks(2, work)
    assert not errors and len(results) == 2, errors


def test_a_shard_built_under_inference_mode_has_ordinary_parameters(tmp_path):
    """Sharding and the meta-device load make new tensors after the speed transforms: inside torch.inference_mode
    they would be inference tensors, whose missing version counter the speed paths' derived weights read."""
    a = tiny_args()
    save_checkpoint(tiny_model(torch.float32), tmp_path / "ckpt")

    def work(world):
        with torch.inference_mode():
            for shard in (build_shard(a, world, checkpoint=tmp_path / "ckpt", token_map=synthetic_token_map(a)),
                          build_shard(a, world, token_map=synthetic_token_map(a), seed=0)):
                assert not any(t.is_inference() for t in [*shard.parameters(), *shard.buffers()])

    _, errors = run_ranks(2, work)
    assert not errors, errors


# ---- two ranks against one process ----------------------------------------------------------------------------
def test_two_ranks_compute_what_one_process_does():
    """Prefill and decode logits, a decode chunk rolled back and redone, every cache's live state and the trace
    (MoE, mHC, Engram and attention facts) of 2 ranks equal one process's within the fp32 tolerance."""
    model = tiny_model(torch.float32)
    want = forward_cases(model)
    results, errors = run_ranks(2, lambda world: forward_cases(shard_model(copy.deepcopy(model), world)))
    assert not errors, errors
    assert_same_on_every_rank(results)
    assert_close(want, results[0], 1e-4, "2 ranks, fp32")


@pytest.mark.slow  # greedy, DSpark and sampled generation on 2 rank threads and in one process [16 s at load average 9]
def test_two_ranks_generate_the_tokens_of_one_process():
    """Greedy, DSpark greedy (drafter sharded, rings and caches rolled back on every rank) and seeded sampling."""
    model = tiny_model(torch.float32)
    want = generation_cases(model)
    results, errors = run_ranks(2, lambda world: generation_cases(shard_model(copy.deepcopy(model), world)))
    assert not errors, errors
    assert_same_on_every_rank(results)
    assert_close(want, results[0], 0, "2 ranks, generation")


def test_a_rank_that_fails_ends_the_other_with_a_clear_error():
    model = tiny_model(torch.float32)

    def work(world):
        shard = shard_model(copy.deepcopy(model), world)
        if world.rank == 1:
            raise RuntimeError("rank 1 failed on purpose")
        return forward_cases(shard)

    start = time.perf_counter()
    _, errors = run_ranks(2, work, timeout_s=2.0)
    assert time.perf_counter() - start < 20
    assert isinstance(errors[0], DistributedError)
    message = str(errors[0])
    assert message.startswith("rank 0 of 2: all_reduce for embed failed") and "ENGINE_DIST_TIMEOUT_S" in message


def test_settings_every_rank_could_not_share_are_refused():
    with pytest.raises(InputError, match="cuda_graphs"):
        lockstep_settings(GenerationRequest.of(4, cuda_graphs=True), World(0, 2, CPU, group=None))
    with pytest.raises(InputError, match="compiled"):
        lockstep_settings(GenerationRequest.of(4, compiled=True), World(0, 2, CPU, group=None))
    seeded = GenerationRequest.of(4, seed=3, temperature=1.0)
    assert lockstep_settings(seeded, World(0, 2, CPU, group=None)) == seeded
    from engine.dspark.config import DSparkConfig
    shard = shard_model(tiny_model(torch.float32), World(0, 2, CPU, group=None))
    with pytest.raises(InputError, match="'auto' profiles one process"):
        DSparkConfig.from_settings("auto", model=shard)


def test_communication_volume_per_decode_token_of_v41_flash():
    a = resolve_config("deepseek-v4.1-flash")
    rows = {c.what.split(" ")[0]: c for c in decode_collectives(a)}
    assert [(c.op, c.count, c.payload) for c in rows.values()] == [
        ("all_reduce", 1, 5120 * 2), ("all_reduce", 40, 5120 * 2), ("all_reduce", 40, 5120 * 4),
        ("all_gather", 1, 129280 * 4)]
    assert rows["ffn"].sent_per_rank(8) == 40 * 5120 * 4 * 2 * 7 / 8
    assert volume_lines(a, 8)[-1] == "  total: 82 collectives, 1.67 MiB of payload, 2.50 MiB sent per rank (ring)"


# ---- torchrun launches (the slow stage) ---------------------------------------------------------------------
@pytest.mark.slow  # torchrun, 2 ranks, and the CLI in process [34 s at load average 9]
def test_torchrun_generate_prints_the_single_process_text(tmp_path, capsys):
    from engine.cli import main
    argv = ["generate", "--config", "tiny-v4.1", "--random-init", "--prompt", "hi", "--max-new-tokens", "16"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    run, errs = torchrun(2, ["-m", "engine", *argv], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == alone                                              # rank 0's stdout, once
    assert errs[0].count("split over 2 ranks") == 1 and errs[1] == ""       # rank 1 prints nothing


@pytest.mark.slow  # torchrun, 2 ranks [29 s at load average 9]
def test_torchrun_bench_reports_once(tmp_path):
    run, errs = torchrun(2, ["-m", "engine", "bench", "--config", "tiny-v4.1", "--prompt-len", "4", "--new-tokens",
                             "3", "--repeats", "1", "--json"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["decode_tokens_per_s"] > 0
    assert errs[1] == ""


@pytest.mark.slow  # torchrun, 4 ranks, and the same cases in one process [59 s at load average 9]
def test_four_ranks_in_float64_compute_what_one_process_does(tmp_path):
    """Heads, groups, experts and the vocabulary split four ways (o_groups 4), launched by torchrun."""
    a = tiny_args(o_groups=4)
    config = tmp_path / "tiny-4-groups.json"
    config.write_text(json.dumps({k: v for k, v in a.to_dict().items() if k != "name"}))
    run, _ = torchrun(4, ["tests/parallel_worker.py", "--config", str(config), "--out", str(tmp_path),
                          "--dtype", "float64"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    from safetensors.torch import load_file
    results = {r: load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(4)}
    assert_same_on_every_rank(results)
    model = tiny_model(torch.float64, o_groups=4)
    assert_close({**forward_cases(model), **generation_cases(model)}, results[0], 1e-9, "4 ranks, float64")


@pytest.mark.slow  # torchrun, 2 ranks, twice (one waits out a 3 s timeout) [2 x 21 s at load average 9]
@pytest.mark.parametrize("failure", ["raise", "hang"])
def test_torchrun_ends_every_rank_when_one_fails_or_hangs(tmp_path, failure):
    """Rank 1 raises, or stops answering, before its first collective: rank 0's collective fails (the peer is
    gone, or the 3 s process-group timeout passes), and torchrun ends the run with an error on every rank."""
    start = time.perf_counter()
    run, errs = torchrun(2, ["tests/parallel_worker.py", "--config", "configs/tiny-v4.1.json", "--out",
                             str(tmp_path), "--fail", failure], tmp_path, env={"ENGINE_DIST_TIMEOUT_S": "3"})
    assert run.returncode != 0
    assert time.perf_counter() - start < 90
    assert "error: rank 0 of 2: all_reduce for embed failed" in errs[0] or "stopped by the launcher" in errs[0], errs
    assert ("rank 1 failed on purpose" if failure == "raise" else "rank 1: stopped by the launcher") in errs[1], errs
