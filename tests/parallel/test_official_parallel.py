"""Official-format (FP8 + E8M0, MXFP4) checkpoints split over ranks (engine.parallel.load.build_official_shard): each
rank holds its parts quantized, as stored, reads only them, computes what one process does, and a rank that
cannot read its part ends every rank with the same error.

The checkpoint: an initialised tiny V4.1 model written by `engine quantize`'s writer, with o_groups 4 and
o_lora_rank 32 so that 2 and 4 ranks divide its heads (4), output groups (4) and experts (8, drafter 4), and each
rank's wo_b columns fill whole [32, 32] scale blocks (tiny-v4.1's o_lora_rank 16 would split a block: refused).

Tolerances. fp32: the ranks sum partial products (wo_b, the routed experts) in an all-reduce, a different summation
order from one matmul: logits differ by float32 ulps (~2e-6 measured; 1e-4 as in test_parallel), and the
greedy text is the same byte for byte. bf16: each rank's partial products are rounded to bf16 before the
all-reduce adds them, one process rounds their sum once: the split moves bf16 roundings, so the ranks' logits
may differ from one process's by as much as bf16 differs from fp32 (max ~0.6 on logits of magnitude ~5 here,
mean ~0.04). So the ranks' bf16 logits are held to the fp32 model as one process's are: their largest error
against the fp32 logits within 2x one process's, their mean error within 1.25x (measured at 2 and 4 ranks:
max 1.0x and 1.44x, mean 0.86x and 0.98x)."""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.official import ShardRows
from engine.checkpoint.official_layout import INDEX_NAME, official_args
from engine.checkpoint.official_load import load_official_model
from engine.cli import main
from engine.model import Transformer
from engine.model.options import EngineOptions
from engine.parallel import World, build_shard, shard_model
from engine.parallel.experts import ExpertParallelQuantMoE
from engine.parallel.layers import ColumnParallelFP8Linear, RowParallelFP8Linear
from engine.quant.apply import quantize_model
from engine.quant.host_engram import HostEngramTable
from engine.spec.config import load_config
from engine.spec.errors import InputError
from engine.speedups.fast_quant_linear import FastFP4Linear
from tests.model_helpers import synthetic_token_map, tiny_args
from tests.official_helpers import DEFAULT, write_tiny_official
from tests.parallel_cases import forward_cases, generation_cases, teacher_forced_logits
from tests.parallel_helpers import CPU, assert_close, assert_same_on_every_rank, run_ranks, torchrun

SPLITS_FOUR_WAYS = {"o_groups": 4, "o_lora_rank": 32}
LOGITS = ("prefill", "decode0", "decode1", "decode2", "chunk", "redo")


@pytest.fixture(scope="module")
def official(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("official") / "tiny-fp8"
    write_tiny_official(folder, tiny_args(**SPLITS_FOUR_WAYS), shards=3)
    return folder


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The shipped trained checkpoint converted by `python -m engine quantize`: its o_groups 2 splits over 2 ranks."""
    out = tmp_path_factory.mktemp("trained") / "default-fp8"
    assert main(["quantize", "--checkpoint", str(DEFAULT), "--out", str(out), "--shards", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def token_map(official):
    return synthetic_token_map(load_config(official / "config.json"))


@pytest.fixture(scope="module")
def single(official, token_map):
    """The checkpoint in one process, kept quantized (load_official_model), fp32."""
    return load_official_model(official, token_map=token_map)[1]


def stored_part(whole: torch.Tensor, src) -> torch.Tensor:
    return whole if src.dim is None else whole.narrow(src.dim, src.start, src.stop - src.start)


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.uint8) if a.itemsize == 1 else a,
                                                                     b.view(torch.uint8) if b.itemsize == 1 else b)


# The forward comparison leaves out the reference's FP8 rounding of activations: the ranks sum split products in
# another order than one process, and that rounding can turn a last-bit difference into a whole FP8 step of an
# activation (scripts/verify_rows.py), a difference of the rounding's, not of the split. Generation keeps it.
UNROUNDED = EngineOptions(act_quant=False)


@pytest.mark.parametrize("ranks", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4 threads [7 s on 2 cores]
def test_ranks_hold_their_quantized_parts_and_compute_what_one_process_does(official, token_map, single, ranks):
    """Every tensor of a rank is, bit for bit, its Layout.source part of the single-process quantized model's (FP8
    weights with their scale blocks, whole MXFP4 experts, dequantized wo_a rows); the split modules are the
    quantized parallel classes; Engram tables are positioned-read sources on every rank; the forward cases (prefill,
    decode, a rolled-back chunk, caches, trace) equal one process's within the fp32 tolerance (UNROUNDED)."""
    args = load_config(official / "config.json")
    whole = single.state_dict()

    def work(world):
        shard = build_shard(args, world, checkpoint=official, token_map=token_map, options=UNROUNDED)
        attn, ffn = shard.layers[2].attn, shard.layers[2].ffn
        assert type(attn.wq_b) is ColumnParallelFP8Linear and type(attn.wo_b) is RowParallelFP8Linear
        assert attn.wo_a.weight.dtype == torch.float32 and attn.wo_b.weight.dtype == torch.float8_e4m3fn
        assert type(ffn) is ExpertParallelQuantMoE and ffn.n_experts == 8 // ranks
        assert type(ffn.experts[0].w1) is FastFP4Linear and type(shard.mtp[0].ffn) is ExpertParallelQuantMoE
        tables = [m for m in shard.modules() if isinstance(m, HostEngramTable)]
        assert tables and all(isinstance(t.weight_source, ShardRows) for t in tables)
        for name, t in shard.state_dict().items():
            if not t.is_meta:   # the host tables' state-dict entries are data-less stand-ins
                src = shard.layout.source(name)
                assert same_bits(t, stored_part(whole[src.name], src)), f"rank {world.rank}: {name} is not {src}"
        return forward_cases(shard)

    results, errors = run_ranks(ranks, work, timeout_s=120)
    assert not errors, errors
    assert_same_on_every_rank(results)
    one = load_official_model(official, token_map=token_map, options=UNROUNDED)[1]
    assert_close(forward_cases(one), results[0], 1e-4, f"{ranks} ranks, official checkpoint, fp32")


@pytest.mark.slow  # greedy, DSpark and sampled generation on 2 rank threads and in one process [12 s on 2 cores]
def test_two_ranks_generate_the_tokens_of_one_process(official, token_map, single):
    """Greedy, DSpark greedy (the drafter's quantized experts split too) and seeded sampling, token for token."""
    args = load_config(official / "config.json")
    results, errors = run_ranks(2, lambda world: generation_cases(build_shard(args, world, checkpoint=official,
                                                                              token_map=token_map)), timeout_s=120)
    assert not errors, errors
    assert_same_on_every_rank(results)
    assert_close(generation_cases(single), results[0], 0, "2 ranks, official checkpoint, generation")


def test_a_part_that_splits_fp8_scale_blocks_is_refused():
    """With [64, 64] scale blocks, 4 ranks would give each rank 32 rows of wq_b (one head of 32): half a block."""
    args = official_args(tiny_args(**SPLITS_FOUR_WAYS)).replace(weight_block_size=(64, 64))
    model = quantize_model(Transformer(args, device="meta"), from_values=False)
    with pytest.raises(InputError, match=r"layers\.0\.attn\.wq_b: this rank's rows 32\.\.64 of the FP8 weight "
                                         r"\[128, 32\] do not fill whole \[64, 64\] scale blocks; choose a number of "
                                         r"ranks that splits its 128 rows into multiples of 64"):
        shard_model(model, World(1, 4, CPU, group=None))


def rewrite(folder: Path, shard: str, change) -> None:
    tensors = load_file(folder / shard)
    change(tensors)
    save_file(tensors, folder / shard)


def test_a_rank_that_cannot_read_its_part_ends_every_rank_with_the_same_error(official, token_map, tmp_path):
    """A NaN scale code in an expert only rank 1 holds: rank 1's value check fails, rank 0 loads its part; both
    raise the same CheckpointError, which names rank 1, the tensor and the shard."""
    broken = Path(shutil.copytree(official, tmp_path / "broken"))
    name = "layers.3.ffn.experts.6.w1.scale"   # experts 4..7 are rank 1's
    shard = json.loads((broken / INDEX_NAME).read_text())["weight_map"][name]
    rewrite(broken, shard, lambda tensors: tensors[name].view(torch.uint8)[0, 0].fill_(0xFF))   # E8M0 NaN
    args = load_config(broken / "config.json")
    _, errors = run_ranks(2, lambda world: build_shard(args, world, checkpoint=broken, token_map=token_map))
    assert sorted(errors) == [0, 1] and all(isinstance(e, CheckpointError) for e in errors.values())
    assert str(errors[0]) == str(errors[1])
    assert str(errors[0]).startswith(f"rank 1 of 2 failed loading {broken}: {broken / shard}: tensor '{name}' "
                                     "holds 1 NaN or infinite code(s)")


def test_a_missing_shard_is_named_by_every_rank(official, token_map, tmp_path):
    broken = Path(shutil.copytree(official, tmp_path / "broken"))
    (broken / "model-00002-of-00003.safetensors").unlink()
    args = load_config(broken / "config.json")
    start = time.perf_counter()
    _, errors = run_ranks(2, lambda world: build_shard(args, world, checkpoint=broken, token_map=token_map))
    assert time.perf_counter() - start < 30
    assert str(errors[0]) == str(errors[1])
    assert str(errors[0]).startswith(f"rank 0 of 2 failed loading {broken} (rank 1 failed too): {broken} does not "
                                     "fit the model: shard model-00002-of-00003.safetensors is missing")


def test_bench_times_a_checkpoint_in_the_plain_rows_only(official, capsys):
    assert main(["bench", "--checkpoint", str(official), "--dspark", "--compile"]) == 2
    assert "--checkpoint times the plain rows; --compile, --dspark build random-init models" in capsys.readouterr().err


# ---- torchrun launches (the slow stage) ---------------------------------------------------------------------
@pytest.mark.slow  # torchrun 2 / 4 ranks, and the CLI in process [10 s / 20 s on 2 cores; trained: 13 s]
@pytest.mark.parametrize("ranks, checkpoint", [(2, "official"), (4, "official"), (2, "trained")])
def test_torchrun_generate_prints_the_single_process_text(request, tmp_path, capsys, ranks, checkpoint):
    """`torchrun -m engine generate --checkpoint <official folder>`: fp32 greedy text byte for byte, from the
    initialised tiny model and from the shipped trained one (readable text)."""
    folder = request.getfixturevalue(checkpoint)
    argv = ["generate", "--checkpoint", str(folder), "--prompt", "The king", "--max-new-tokens", "16"]
    assert main(argv) == 0
    alone = capsys.readouterr().out
    run, errs = torchrun(ranks, ["-m", "engine", *argv], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout == alone                                              # rank 0's stdout, once
    assert errs[0].count(f"split over {ranks} ranks") == 1 and all(errs[r] == "" for r in range(1, ranks))


@pytest.mark.slow  # torchrun, 2 ranks [8 s on 2 cores]
def test_torchrun_bench_times_an_official_checkpoint(official, tmp_path):
    run, errs = torchrun(2, ["-m", "engine", "bench", "--checkpoint", str(official), "--prompt-len", "4",
                             "--new-tokens", "3", "--repeats", "1", "--json"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout)["decode_tokens_per_s"] > 0
    assert errs[1] == ""


@pytest.mark.slow  # torchrun 2 / 4 ranks in bf16, and the model in one process in bf16 and fp32 [9 s / 14 s]
@pytest.mark.parametrize("ranks", [2, 4])
def test_torchrun_bf16_logits_are_as_close_to_fp32_as_one_process(official, token_map, tmp_path, ranks):
    """The tolerance of the module docstring: a split bf16 run's error against the fp32 model is at most 2x (max)
    and 1.25x (mean) one bf16 process's, on the same teacher-forced inputs."""
    run, _ = torchrun(ranks, ["tests/official_worker.py", "--checkpoint", str(official), "--out", str(tmp_path),
                              "--dtype", "bfloat16"], tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    results = {r: load_file(str(tmp_path / f"rank{r}.safetensors")) for r in range(ranks)}
    assert_same_on_every_rank(results)
    split = results[0]["logits"]
    one_bf16, fp32 = (teacher_forced_logits(load_official_model(official, token_map=token_map, dtype=dtype)[1])
                      for dtype in (torch.bfloat16, torch.float32))
    one_err, split_err = (one_bf16 - fp32).abs(), (split - fp32).abs()
    print(f"\n{ranks} ranks, bf16, logits up to {fp32.abs().max():.2f}: one process vs fp32 max {one_err.max():.3f} "
          f"mean {one_err.mean():.4f}; {ranks} ranks vs fp32 max {split_err.max():.3f} mean {split_err.mean():.4f}; "
          f"{ranks} ranks vs one process max {(split - one_bf16).abs().max():.3f}")
    assert split_err.max() <= 2 * one_err.max() and split_err.mean() <= 1.25 * one_err.mean()


def own_shard(folder: Path, names: list[str], shard: str) -> None:
    """Move the tensors `names` out of the shards that hold them into a new shard `shard`, index updated."""
    index = json.loads((folder / INDEX_NAME).read_text())
    moved = {}
    for old in sorted({index["weight_map"][n] for n in names}):
        rewrite(folder, old, lambda tensors: moved.update({n: tensors.pop(n) for n in names if n in tensors}))
    save_file(moved, folder / shard)
    index["weight_map"].update(dict.fromkeys(names, shard))
    (folder / INDEX_NAME).write_text(json.dumps(index))


@pytest.mark.slow  # torchrun, 2 ranks, one of them failing at load [9 s on 2 cores]
def test_torchrun_a_truncated_shard_ends_every_rank_with_the_same_error(official, tmp_path):
    """A shard only rank 1 reads (two of its experts' weights and scales), cut short: rank 1 refuses its header,
    rank 0 loads its part, and both end with the same error naming rank 1, the shard and its last tensor."""
    broken = Path(shutil.copytree(official, tmp_path / "broken"))
    names = [f"layers.3.ffn.experts.{e}.w1.{leaf}" for e in (6, 7) for leaf in ("weight", "scale")]
    own_shard(broken, names, "rank1-experts.safetensors")
    shard = broken / "rank1-experts.safetensors"
    os.truncate(shard, shard.stat().st_size - 16)
    start = time.perf_counter()
    run, errs = torchrun(2, ["-m", "engine", "generate", "--checkpoint", str(broken), "--prompt", "hi",
                             "--max-new-tokens", "2"], tmp_path)
    assert run.returncode != 0
    assert time.perf_counter() - start < 90
    lines = [[line for line in errs[r].splitlines() if line.startswith("error: ")] for r in (0, 1)]
    assert len(lines[0]) == 1 and lines[0] == lines[1], errs
    assert lines[0][0].startswith(f"error: rank 1 of 2 failed loading {broken}: {shard}: not a readable safetensors "
                                  "file: truncated: tensor 'layers.3.ffn.experts.7.w1.")
