"""The official layout's damage corpus (issue 46): NaN codes in FP8 weights (0x7F and 0xFF), E8M0 scales of 0xFF,
packed-FP4 expert tensors of the wrong shape, scales of the wrong block shape, an index naming a missing shard, a
shard whose header disagrees with the index, a tensor present in two shards, a truncated shard. Each is refused by
the loader (load_official_model, what Engine.load calls for an official folder) with a CheckpointError naming the
shard, the tensor and the problem, in bounded time; a few also through the CLI (exit 2, one line) and, in the slow
stage, under torchrun with 2 gloo ranks."""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.official_layout import INDEX_NAME
from engine.checkpoint.official_load import load_official_model
from engine.cli import main
from engine.spec.config import load_config
from tests.model_helpers import synthetic_token_map, tiny_args
from tests.official_helpers import write_tiny_official
from tests.parallel_helpers import torchrun

# 2 ranks split heads (4), output groups and experts (8, drafter 4) evenly, and each rank's wo_b columns fill whole
# [32, 32] scale blocks (as tests/parallel/test_official_parallel.py)
SPLITS = {"o_groups": 4, "o_lora_rank": 32}
WQ = "layers.0.attn.wq_a.weight"                 # an FP8 dense weight [q_lora_rank, dim]
EXPERT = "layers.3.ffn.experts.5.w1.weight"      # a packed-FP4 (I8) routed-expert weight, experts 4..7 on rank 1
SINK = "layers.0.attn.attn_sink"
# Each case writes a damaged copy of a 3-shard folder and builds the model to load it: 0.4-4 s, ~35 s in all on 2
# cores, too much for the fast stage's budget
pytestmark = pytest.mark.slow
REFUSE_MAX_S = 30.0   # ~0.1-1 s here; generous for a loaded 2-core machine


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("official") / "tiny-fp8"
    write_tiny_official(folder, tiny_args(**SPLITS), shards=3)
    return folder


@pytest.fixture
def fp8(good, tmp_path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "fp8"))


def weight_map(folder: Path) -> dict[str, str]:
    return json.loads((folder / INDEX_NAME).read_text())["weight_map"]


def edit_index(folder: Path, change) -> None:
    raw = json.loads((folder / INDEX_NAME).read_text())
    change(raw["weight_map"])
    (folder / INDEX_NAME).write_text(json.dumps(raw))


def rewrite(folder: Path, name: str, change) -> Path:
    """Apply change(tensors) to the shard that holds `name`; returns that shard."""
    shard = folder / weight_map(folder)[name]
    tensors = load_file(shard)
    change(tensors)
    save_file(tensors, shard, metadata={"format": "pt"})
    return shard


def first_code(name: str, code: int):
    def change(tensors):
        raw = tensors[name].view(torch.uint8).clone()
        raw.view(-1)[0] = code
        tensors[name] = raw.view(tensors[name].dtype)
    return change


def shaped(name: str, shape) -> callable:
    def change(tensors):
        tensors[name] = torch.zeros(shape, dtype=tensors[name].dtype)
    return change


def other_shard(folder: Path, name: str) -> str:
    return next(s for s in sorted(set(weight_map(folder).values())) if s != weight_map(folder)[name])


def copy_into_other_shard(folder: Path, name: str) -> None:
    """`name` also stored in a second shard (the index still names the first)."""
    value = load_file(folder / weight_map(folder)[name])[name]
    second = folder / other_shard(folder, name)
    tensors = load_file(second)
    tensors[name] = value
    save_file(tensors, second, metadata={"format": "pt"})


def move_to_other_shard(folder: Path, name: str) -> None:
    """`name` moved to another shard; the index still names the first."""
    value = load_file(folder / weight_map(folder)[name])[name]
    rewrite(folder, name, lambda t: t.pop(name))
    second = folder / other_shard(folder, name)
    tensors = load_file(second)
    tensors[name] = value
    save_file(tensors, second, metadata={"format": "pt"})


def truncate(folder: Path, name: str) -> None:
    shard = folder / weight_map(folder)[name]
    shard.write_bytes(shard.read_bytes()[:-5000])


def shard_of(name: str):
    return lambda folder: weight_map(folder)[name]


# (case id, damage(folder), fragments the message must hold: str, or f(folder) -> str)
CORPUS = [
    ("fp8-nan-7f", lambda f: rewrite(f, WQ, first_code(WQ, 0x7F)),
     [shard_of(WQ), f"tensor '{WQ}' holds 1 NaN or infinite code(s), the first at [0, 0]"]),
    ("fp8-nan-ff", lambda f: rewrite(f, WQ, first_code(WQ, 0xFF)),
     [shard_of(WQ), f"tensor '{WQ}' holds 1 NaN or infinite code(s), the first at [0, 0]"]),
    ("e8m0-ff-dense", lambda f: rewrite(f, "layers.2.attn.wq_b.scale", first_code("layers.2.attn.wq_b.scale", 0xFF)),
     ["tensor 'layers.2.attn.wq_b.scale' holds 1 NaN or infinite code(s)"]),
    ("e8m0-ff-expert", lambda f: rewrite(f, "layers.3.ffn.experts.5.w2.scale",
                                         first_code("layers.3.ffn.experts.5.w2.scale", 0xFF)),
     ["tensor 'layers.3.ffn.experts.5.w2.scale' holds 1 NaN or infinite code(s)"]),
    ("fp4-unpacked-shape", lambda f: rewrite(f, EXPERT, shaped(EXPERT, (32, 64))),
     [f"'{EXPERT}' in shard", "has shape [32, 64]; the config needs [32, 32]"]),
    ("fp4-transposed-shape", lambda f: rewrite(f, EXPERT, shaped(EXPERT, (32, 16))),
     [f"'{EXPERT}' in shard", "has shape [32, 16]; the config needs [32, 32]"]),
    ("fp4-as-fp8", lambda f: rewrite(f, EXPERT, lambda t: t.update({EXPERT: t[EXPERT].view(torch.float8_e4m3fn)})),
     [f"'{EXPERT}' in shard", "is stored as F8_E4M3; the official format stores it as I8"]),
    ("scale-block-64", lambda f: rewrite(f, "layers.1.attn.wq_b.scale", shaped("layers.1.attn.wq_b.scale", (2, 1))),
     ["scale 'layers.1.attn.wq_b.scale' in shard", "has shape [2, 1], but its weight 'layers.1.attn.wq_b.weight'",
      "needs a scale of shape"]),
    ("fp4-scale-block-64", lambda f: rewrite(f, "layers.3.ffn.experts.5.w1.scale",
                                             shaped("layers.3.ffn.experts.5.w1.scale", (32, 1))),
     ["scale 'layers.3.ffn.experts.5.w1.scale' in shard", "has shape [32, 1]", "needs a scale of shape [32, 2]"]),
    ("index-names-missing-shard",
     lambda f: edit_index(f, lambda wm: wm.update({SINK: "model-00009-of-00009.safetensors"})),
     ["shard model-00009-of-00009.safetensors is missing from", f"it holds '{SINK}'"]),
    ("shard-file-deleted", lambda f: (f / "model-00002-of-00003.safetensors").unlink(),
     ["shard model-00002-of-00003.safetensors is missing from"]),
    ("header-lacks-indexed-tensor", lambda f: move_to_other_shard(f, SINK),
     ["the shards disagree with", f"'{SINK}' is stored in shard", ", but the index maps it to shard"]),
    ("index-lists-absent-tensor", lambda f: rewrite(f, SINK, lambda t: t.pop(SINK)),
     [f"'{SINK}' is missing from shard", "(the index maps it there)"]),
    ("header-holds-unlisted-tensor", lambda f: rewrite(f, SINK, lambda t: t.update(extra=torch.zeros(2))),
     ["holds 'extra', which", INDEX_NAME, "does not list"]),
    ("tensor-in-two-shards", lambda f: copy_into_other_shard(f, SINK),
     [f"'{SINK}' is stored in shard", "as well as in shard", "the index maps it to"]),
    ("truncated-shard", lambda f: truncate(f, SINK),
     ["not a readable safetensors file: truncated: tensor", "but the file holds only"]),
]


def refusal(folder: Path) -> str:
    args = load_config(folder / "config.json")
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as caught:
        load_official_model(folder, token_map=synthetic_token_map(args))
    assert time.perf_counter() - start < REFUSE_MAX_S
    return str(caught.value)


@pytest.mark.parametrize("damage, fragments", [c[1:] for c in CORPUS], ids=[c[0] for c in CORPUS])
def test_a_damaged_official_checkpoint_is_refused_naming_the_problem(fp8, damage, fragments):
    damage(fp8)
    message = refusal(fp8)
    for fragment in fragments:
        fragment = fragment(fp8) if callable(fragment) else fragment
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert str(fp8) in message and len(message) < 2000


def test_the_corpus_is_large_and_its_cases_distinct():
    assert len(CORPUS) >= 15 and len({c[0] for c in CORPUS}) == len(CORPUS)


@pytest.mark.parametrize("case", ["fp8-nan-ff", "tensor-in-two-shards"])
def test_the_cli_exits_2_with_one_line(fp8, capsys, case):
    next(c[1] for c in CORPUS if c[0] == case)(fp8)
    assert main(["generate", "--checkpoint", str(fp8), "--prompt", "The king", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err[-2000:]


@pytest.mark.slow  # torchrun, 2 gloo ranks, each importing torch and reading the folder [24-27 s on 2 cores]
@pytest.mark.parametrize("case", ["truncated-shard", "tensor-in-two-shards"])
def test_torchrun_ranks_refuse_a_damaged_folder_with_one_message(fp8, tmp_path, case):
    """Both ranks end, exit non-zero within the time limit, and rank 0 prints the one error naming the shard."""
    next(c[1] for c in CORPUS if c[0] == case)(fp8)
    start = time.perf_counter()
    run, errs = torchrun(2, ["-m", "engine", "generate", "--checkpoint", str(fp8), "--prompt", "The king",
                             "--max-new-tokens", "2"], tmp_path, timeout_s=180)
    assert run.returncode != 0 and time.perf_counter() - start < 180
    fragment = "truncated: tensor" if case == "truncated-shard" else f"'{SINK}' is stored in shard"
    assert fragment in errs[0] and "error: " in errs[0] and "Traceback" not in errs[0], errs[0][-3000:]
