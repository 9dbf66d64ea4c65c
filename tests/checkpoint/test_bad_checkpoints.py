"""Corrupt and hostile checkpoints: each is refused with a CheckpointError (MissingFileError when nothing is there)
whose message names the file, the tensor and the problem, in bounded time and memory, through the checkpoint loader
(load_checkpoint, what Engine.load calls), Engine.load itself and the CLI (exit 2); NaN / Inf weights are refused in
both the project's layout and the official one."""
from __future__ import annotations

import functools
import json
import os
import shutil
import struct
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.accounting.inventory import inventory_tuple
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.header import MAX_HEADER_BYTES
from engine.checkpoint.index import MAX_INDEX_BYTES
from engine.checkpoint.official import OfficialCheckpoint
from engine.checkpoint.official_layout import INDEX_NAME
from engine.checkpoint.official_writer import write_official
from engine.checkpoint.store import load_checkpoint, load_weights, save_checkpoint
from engine.cli import main as cli_main
from engine.generation import Engine
from engine.model import Transformer, init_weights
from engine.spec.errors import MissingFileError
from engine.text.engram_map import load_token_map
from engine.text.tokenizer import NOISE_ID, load_tokenizer
from engine.text.vocab import IdMap
from tests.bounded import run_engine
from tests.model_helpers import tiny_args

WEIGHTS = "model.safetensors"
SINK = "layers.0.attn.attn_sink"
UNREADABLE = "not a readable safetensors file"


@functools.cache
def tiny_vocabulary() -> tuple[IdMap, np.ndarray]:
    """The reduced vocabulary of the tiny checkpoint (~60 ids) and its Engram token map."""
    tok = load_tokenizer()
    id_map = IdMap.from_counts(Counter(tok.encode("The quick brown fox")), tok, min_count=1)
    return id_map, id_map.engram_token_map(load_token_map(tok))


def token_map() -> np.ndarray:
    return tiny_vocabulary()[1]


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> Path:
    """A tiny V4.1 checkpoint over that vocabulary (2.7 MB, bf16 with the official F32 tensors), with its
    id_map.json: every corrupt case below is a damaged copy of it."""
    id_map, engram_map = tiny_vocabulary()
    args = tiny_args(vocab_size=id_map.vocab_size, dspark_noise_token_id=id_map.model_id(NOISE_ID))
    model = Transformer(args, engram_map)
    init_weights(model, 5)
    folder = tmp_path_factory.mktemp("good") / "ckpt"
    save_checkpoint(model, folder, dtype="bf16")
    id_map.save(folder)
    return folder


@pytest.fixture(scope="module")
def good_fp8(good, tmp_path_factory) -> Path:
    """The same model in the official layout: FP8 / MXFP4 weights with E8M0 scales, two shards and an index."""
    return write_official(good, tmp_path_factory.mktemp("good_fp8") / "ckpt", shards=2).folder


@pytest.fixture
def ckpt(good, tmp_path) -> Path:
    return Path(shutil.copytree(good, tmp_path / "ckpt"))


@pytest.fixture
def fp8(good_fp8, tmp_path) -> Path:
    return Path(shutil.copytree(good_fp8, tmp_path / "fp8"))


def refused(path: Path, *fragments: str, error: type[Exception] = CheckpointError, engine: bool = False) -> str:
    """Loading `path` raises `error` within a few seconds, its message holding every fragment. engine: through
    Engine.load (which also reads id_map.json and builds the tokenizer, ~1 s more); otherwise through the loader
    Engine.load calls (load_checkpoint: config beside the weights, the files, the model, the weights)."""
    start = time.perf_counter()
    with pytest.raises(error) as caught:
        if engine:
            Engine.load(checkpoint=path)
        else:
            load_checkpoint(path, token_map=token_map())
    message = str(caught.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in: {message}"
    assert time.perf_counter() - start < 30   # ~0.1-1 s here; generous for a loaded 2-core machine
    return message


def header_of(file: Path) -> tuple[dict, bytes]:
    """The raw safetensors header (JSON object) and data section of a file."""
    blob = file.read_bytes()
    length = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + length]), blob[8 + length:]


def write_raw(file: Path, header: dict, data: bytes, declared: int | None = None) -> None:
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    file.write_bytes(struct.pack("<Q", len(text) if declared is None else declared) + text + data)


def change_tensor(file: Path, name: str, change) -> None:
    tensors = load_file(file)
    tensors[name] = change(tensors[name].clone())
    save_file(tensors, file)


def set_code(t: torch.Tensor, code: int) -> torch.Tensor:
    """An FP8 / E8M0 tensor with its first byte replaced by `code`."""
    raw = t.view(torch.uint8).clone()
    raw.view(-1)[0] = code
    return raw.view(t.dtype)


def shard_of(folder: Path, name: str) -> Path:
    return folder / json.loads((folder / INDEX_NAME).read_text())["weight_map"][name]


def shard_index(ckpt: Path) -> Path:
    """Turn the copy into a two-shard checkpoint with an index (the project's layout); returns the index."""
    tensors = load_file(ckpt / WEIGHTS)
    names = sorted(tensors)
    shards = {"a.safetensors": names[::2], "b.safetensors": names[1::2]}
    for shard, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, ckpt / shard)
    (ckpt / WEIGHTS).unlink()
    index = ckpt / INDEX_NAME
    index.write_text(json.dumps({"weight_map": {k: s for s, keys in shards.items() for k in keys}}))
    return index


def edit_index(index: Path, change) -> None:
    raw = json.loads(index.read_text())
    change(raw["weight_map"])
    index.write_text(json.dumps(raw))


# ---- values: NaN / Inf anywhere is refused, naming the tensor and the file ------------------------------------

@pytest.mark.parametrize("name, index, value", [
    (SINK, 1, float("nan")),                             # one F32 value of one attention sink
    ("layers.1.attn.wq_a.weight", (0, 0), float("inf")),  # a bf16 weight
    ("layers.2.hc_ffn_base", 0, float("-inf")),           # an F32 mHC tensor
])
def test_a_non_finite_weight_is_refused(ckpt, name, index, value):
    def poison(t):
        t[index] = value
        return t
    change_tensor(ckpt / WEIGHTS, name, poison)
    first = list(index) if isinstance(index, tuple) else [index]
    message = f"{ckpt / WEIGHTS}: tensor '{name}' holds 1 NaN or infinite value(s), the first at {first}"
    refused(ckpt, message, engine=name == SINK)   # one through Engine.load, the others through its loader


def test_load_weights_changes_nothing_when_a_value_is_not_finite(good, ckpt):
    """The values are checked before anything is copied: a model already loaded keeps its weights."""
    model = load_checkpoint(good, token_map=token_map())[1]
    before = {n: t.clone() for n, t in model.state_dict().items() if not t.is_meta}
    change_tensor(ckpt / WEIGHTS, "norm.weight", lambda t: t.fill_(float("nan")))
    with pytest.raises(CheckpointError, match="tensor 'norm.weight' holds 64 NaN"):
        load_weights(model, ckpt)
    assert all(torch.equal(before[n], t) for n, t in model.state_dict().items() if n in before)


@pytest.mark.parametrize("name, code, message", [
    ("layers.0.attn.wq_a.weight", 0x7F, "holds 1 NaN or infinite code(s), the first at [0, 0]"),      # FP8 NaN
    ("layers.2.ffn.experts.3.w2.scale", 0xFF, "holds 1 NaN or infinite code(s), the first at [0, 0]"),  # E8M0 NaN
    ("layers.3.attn.wkv.scale", 127 + 120, "holds 2^120 (at [0, 0]), which makes its F8_E4M3 block overflow"),
    ("layers.3.attn.wo_a.scale", 0xFF, "tensor 'layers.3.attn.wo_a.weight' holds"),  # wo_a is held dequantized
])
def test_official_layout_refuses_nan_codes_and_overflowing_scales(fp8, name, code, message):
    shard = shard_of(fp8, name)
    change_tensor(shard, name, lambda t: set_code(t, code))
    refused(fp8, str(shard), message)


def test_official_layout_refuses_a_nan_sink(fp8):
    shard = shard_of(fp8, SINK)
    change_tensor(shard, SINK, lambda t: t.index_fill_(0, torch.tensor([2]), float("nan")))
    refused(fp8, f"{shard}: tensor '{SINK}' holds 1 NaN or infinite value(s), the first at [2]")


def row_source(folder: Path, name: str):
    """The RowSource the loader attaches for the host-resident tensor `name` of an official folder."""
    ckpt = OfficialCheckpoint(folder)
    inventory = {spec.name: spec for spec in inventory_tuple(ckpt.config())}
    return ckpt.row_source(ckpt.locate([name], inventory)[name])


def test_engram_rows_are_checked_when_read(fp8, capsys):
    """The host tables are read row by row during generation (too big to scan at load for the released model):
    a damaged row is refused the first time a step reads it, naming the table, the row and the shard."""
    name = "layers.1.engram.embed.weight"
    shard = shard_of(fp8, name)
    change_tensor(shard, name, lambda t: t.view(torch.uint8).index_fill_(1, torch.tensor([0]), 0x7F)
                  .view(torch.float8_e4m3fn))  # every row's first code is NaN
    with pytest.raises(CheckpointError, match=rf"{shard}: tensor '{name}' holds 2 NaN .* the first at \[5, 0\]"):
        row_source(fp8, name).rows(torch.tensor([9, 5, 9]))
    # loading stays lazy (nothing of the table is read), generating reads rows: the CLI exits 2 naming the table
    assert cli_main(["generate", "--checkpoint", str(fp8), "--prompt", "The quick", "--max-new-tokens", "2"]) == 2
    err = capsys.readouterr().err
    last = err.splitlines()[-1]   # after the status line the CLI prints before generating
    assert last.startswith("error: ") and f"tensor '{name}' holds" in last and "Traceback" not in err


def test_engram_scale_rows_are_checked_when_read(fp8):
    name = "layers.4.engram.embed.scale"
    change_tensor(shard_of(fp8, name), name, lambda t: t.view(torch.uint8).index_fill_(0, torch.tensor([7]), 127 + 121)
                  .view(torch.float8_e8m0fnu))
    rows = row_source(fp8, name)
    assert rows.rows(torch.tensor([6, 8])).shape == (2, 1)
    with pytest.raises(CheckpointError, match=rf"scale '{name}' holds 2\^121 \(at \[7, 0\]\)"):
        rows.rows(torch.tensor([6, 7]))


def test_quantize_refuses_a_non_finite_source(ckpt, tmp_path):
    change_tensor(ckpt / WEIGHTS, SINK, lambda t: t.fill_(float("inf")))
    with pytest.raises(CheckpointError, match=f"tensor '{SINK}' holds 4 NaN or infinite value"):
        write_official(ckpt, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# ---- the file: headers, offsets, truncation, dtypes, sizes -----------------------------------------------------

def test_empty_file_and_folder_without_weights(ckpt):
    (ckpt / WEIGHTS).write_bytes(b"")
    refused(ckpt, f"{ckpt / WEIGHTS}: {UNREADABLE}: it is empty")
    (ckpt / WEIGHTS).unlink()
    refused(ckpt, f"{ckpt}: directory has neither model.safetensors nor model.safetensors.index.json")


def test_garbage_and_a_header_that_is_not_json(ckpt):
    (ckpt / WEIGHTS).write_bytes(b"this is not a safetensors file at all, just text")
    refused(ckpt, f"{ckpt / WEIGHTS}: {UNREADABLE} (truncated?): its first 8 bytes declare a header of")
    (ckpt / WEIGHTS).write_bytes(struct.pack("<Q", 8) + b"[1,2,3] ")
    refused(ckpt, "its header is a JSON list, not an object of tensors")
    (ckpt / WEIGHTS).write_bytes(struct.pack("<Q", 8) + b"{'a': 1}")
    refused(ckpt, f"{ckpt / WEIGHTS}: {UNREADABLE} (truncated?): its header is not JSON (Expecting property name")


def test_truncated_file_names_the_tensor_cut_off(ckpt):
    header, data = header_of(ckpt / WEIGHTS)
    held = len(data) - 1000
    entries = sorted((e["data_offsets"], n) for n, e in header.items() if n != "__metadata__")
    (begin, end), cut = next(((b, e), n) for (b, e), n in entries if e > held)   # the first tensor in file order
    (ckpt / WEIGHTS).write_bytes((ckpt / WEIGHTS).read_bytes()[:-1000])
    refused(ckpt, f"{ckpt / WEIGHTS}: {UNREADABLE}: truncated: tensor '{cut}' lies at data bytes {begin:,}..{end:,} "
                  f"but the file holds only {held:,} bytes of tensor data")


def test_a_declared_header_longer_than_the_file(ckpt):
    header, data = header_of(ckpt / WEIGHTS)
    write_raw(ckpt / WEIGHTS, header, data, declared=10 << 30)
    refused(ckpt, "first 8 bytes declare a header of 10,737,418,240 bytes but the file has only")


def test_a_header_beyond_the_limit_is_not_read(ckpt):
    """A 1 GiB sparse file whose header claims all of it: refused from its first 8 bytes, nothing else read."""
    with open(ckpt / WEIGHTS, "wb") as f:
        f.write(struct.pack("<Q", (1 << 30) - 8))
        f.truncate(1 << 30)
    start = time.perf_counter()
    refused(ckpt, f"its header declares {(1 << 30) - 8:,} bytes, more than the {MAX_HEADER_BYTES >> 20} MiB")
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("change, message", [
    (lambda h: h["norm.weight"].update(dtype="Q7"), "tensor 'norm.weight' has dtype 'Q7', which this engine cannot "
                                                    "load (it reads F64, F32"),
    (lambda h: h["norm.weight"].update(shape=[-64]), "tensor 'norm.weight' has shape [-64]; a shape is a list of"),
    (lambda h: h["norm.weight"].update(shape=[65]), "tensor 'norm.weight': BF16 [65] needs 130 bytes but its "
                                                    "data_offsets"),
    (lambda h: h["norm.weight"].pop("data_offsets"), "tensor 'norm.weight' needs exactly 'dtype', 'shape' and"),
])
def test_bad_header_entries_name_the_tensor(ckpt, change, message):
    header, data = header_of(ckpt / WEIGHTS)
    change(header)
    write_raw(ckpt / WEIGHTS, header, data)
    refused(ckpt, f"{ckpt / WEIGHTS}: {UNREADABLE}: {message}")


def test_overlapping_offsets(ckpt):
    header, data = header_of(ckpt / WEIGHTS)
    names = sorted((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][0])
    first, second = names[0], names[1]
    size = header[second]["data_offsets"][1] - header[second]["data_offsets"][0]
    header[second]["data_offsets"] = [header[first]["data_offsets"][0], header[first]["data_offsets"][0] + size]
    write_raw(ckpt / WEIGHTS, header, data)
    refused(ckpt, f"{ckpt / WEIGHTS}: {UNREADABLE}: tensors '{first}' and '{second}' overlap")


def test_offsets_beyond_the_file(good, ckpt):
    header, data = header_of(good / WEIGHTS)
    last = max((n for n in header if n != "__metadata__"), key=lambda n: header[n]["data_offsets"][1])
    begin, end = header[last]["data_offsets"]
    header[last]["data_offsets"] = [begin + 4096, end + 4096]
    write_raw(ckpt / WEIGHTS, header, data)
    refused(ckpt, f"truncated: tensor '{last}' lies at data bytes {begin + 4096:,}..{end + 4096:,}")


def test_a_tensor_listed_twice_in_the_header(ckpt):
    header, data = header_of(ckpt / WEIGHTS)
    text = json.dumps(header)
    entry = json.dumps({"norm.weight": header["norm.weight"]})[1:-1]
    blob = (text[:-1] + ", " + entry + "}").encode()
    blob += b" " * (-len(blob) % 8)
    (ckpt / WEIGHTS).write_bytes(struct.pack("<Q", len(blob)) + blob + data)
    refused(ckpt, "the header lists 'norm.weight' more than once")


@pytest.mark.parametrize("change, message", [
    (lambda t: t.pop("layers.3.ffn.gate.weight"), "missing 1 tensor(s): 'layers.3.ffn.gate.weight'"),
    (lambda t: t.update({"layers.3.ffn.extra": torch.zeros(2)}), "unexpected 1 tensor(s): 'layers.3.ffn.extra'"),
    (lambda t: t.update({"norm.weight": torch.zeros(7)}), "'norm.weight' has shape [7], the model expects [64]"),
])
def test_tensors_that_do_not_fit_the_config(ckpt, change, message):
    tensors = load_file(ckpt / WEIGHTS)
    change(tensors)
    save_file(tensors, ckpt / WEIGHTS)
    refused(ckpt, f"{ckpt} does not fit the model", message)


# ---- the folder: symlinks, the shard index, id_map.json -----------------------------------------------------

def test_missing_path_and_symlink_loop(tmp_path):
    refused(tmp_path / "nothing", f"{tmp_path / 'nothing'}: no such checkpoint", error=MissingFileError, engine=True)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    refused(loop, f"{loop}: symbolic link loop", engine=True)
    refused(loop, f"{loop}: symbolic link loop")


@pytest.mark.parametrize("target, message", [
    ("../../../../etc/passwd", "weight_map entry '../../../../etc/passwd' points outside the checkpoint folder"),
    ("/etc/passwd", "weight_map entry '/etc/passwd' points outside the checkpoint folder"),
    ("sub/../../b.safetensors", "weight_map entry 'sub/../../b.safetensors' points outside the checkpoint folder"),
])
def test_index_entries_outside_the_folder_are_refused(ckpt, target, message):
    index = shard_index(ckpt)
    edit_index(index, lambda wm: wm.update({"norm.weight": target}))
    refused(ckpt, f"{index}: {message}", engine=True)


def test_a_shard_symlinked_outside_the_folder_is_refused(ckpt, tmp_path):
    index = shard_index(ckpt)
    outside = Path(shutil.move(ckpt / "b.safetensors", tmp_path / "elsewhere.safetensors"))
    (ckpt / "b.safetensors").symlink_to(outside)
    refused(ckpt, f"{index}: shard b.safetensors is a symbolic link to {outside}, outside the checkpoint folder")
    (ckpt / "b.safetensors").unlink()
    (ckpt / "b.safetensors").symlink_to(ckpt / "b.safetensors")
    refused(ckpt, "shard b.safetensors is a symbolic link loop")


def test_a_symlink_inside_the_folder_and_a_hugging_face_cache_snapshot_load(good, tmp_path):
    plain = shard_index(Path(shutil.copytree(good, tmp_path / "plain"))).parent
    (plain / "store").mkdir()
    (plain / "b.safetensors").rename(plain / "store" / "b.safetensors")
    (plain / "b.safetensors").symlink_to(Path("store") / "b.safetensors")
    assert load_checkpoint(plain, token_map=token_map())[0].vocab_size == len(token_map())
    repo = tmp_path / "models--x--tiny"
    snapshot = repo / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for file in good.iterdir():   # the hub's layout: snapshot files are links into blobs/
        blob = Path(shutil.copy(file, repo / "blobs" / file.name))
        (snapshot / file.name).symlink_to(os.path.relpath(blob, snapshot))
    (snapshot / WEIGHTS).unlink()
    for shard in ("a.safetensors", "b.safetensors"):
        blob = Path(shutil.copy(plain / shard, repo / "blobs" / shard))
        (snapshot / shard).symlink_to(os.path.relpath(blob, snapshot))
    shutil.copy(plain / INDEX_NAME, snapshot / INDEX_NAME)
    assert load_checkpoint(snapshot, token_map=token_map())[0].vocab_size == len(token_map())


@pytest.mark.parametrize("content, message", [
    ("[]", "not a safetensors index: it is a JSON list, not an object with a 'weight_map'"),
    ('{"metadata": {}}', "not a safetensors index: it has no 'weight_map'"),
    ('{"weight_map": []}', "'weight_map' must be a non-empty object mapping tensor names to shard files"),
    ('{"weight_map": {"norm.weight": 3}}', "'weight_map' maps 'norm.weight' to 3"),
    ("[" * 100_000 + "]" * 100_000, "not a JSON shard index (nested too deeply)"),
    ('{"weight_map": {"norm.weight": "a.safetensors"', "not a JSON shard index"),
])
def test_malformed_index(ckpt, content, message):
    index = shard_index(ckpt)
    index.write_text(content)
    refused(ckpt, f"{index}: {message}")


def test_index_beyond_the_size_limit_is_not_read(ckpt):
    index = shard_index(ckpt)
    with open(index, "r+b") as f:
        f.truncate(MAX_INDEX_BYTES + 1)   # sparse: nothing of it is written
    refused(ckpt, f"{index}: more than the {MAX_INDEX_BYTES >> 20} MiB a shard index may have")


def test_index_naming_missing_shards_and_tensors(ckpt):
    index = shard_index(ckpt)
    other = {"a.safetensors": "b.safetensors", "b.safetensors": "a.safetensors"}
    elsewhere = other[json.loads(index.read_text())["weight_map"]["norm.weight"]]   # the shard without it
    edit_index(index, lambda wm: wm.update({"norm.weight": "c.safetensors"}))
    refused(ckpt, f"{index}: shard file(s) missing: c.safetensors (c.safetensors holds 'norm.weight')")
    edit_index(index, lambda wm: wm.update({"norm.weight": elsewhere}))
    refused(ckpt, f"{index} maps tensors to shards that do not hold them: 'norm.weight' is not in shard")


def test_official_index_outside_the_folder_and_a_truncated_shard(fp8):
    index = fp8 / INDEX_NAME
    edit_index(index, lambda wm: wm.update({SINK: "../outside.safetensors"}))
    refused(fp8, f"{index}: weight_map entry '../outside.safetensors' points outside the checkpoint folder")
    edit_index(index, lambda wm: wm.update({SINK: shard_of(fp8, "norm.weight").name}))
    shard = shard_of(fp8, SINK)
    shard.write_bytes(shard.read_bytes()[:-5000])
    with pytest.raises(CheckpointError, match=f"{shard}: {UNREADABLE}: truncated: tensor '.*' lies at data bytes"):
        OfficialCheckpoint(fp8).locate([SINK], {s.name: s for s in inventory_tuple(OfficialCheckpoint(fp8).config())})
    refused(fp8, f"{shard}: {UNREADABLE}: truncated")


@pytest.mark.parametrize("content, message", [
    ("[1, 2, 3]", "id_map.json: not a v41viz id map: it is a JSON list"),
    ('{"format": "v41viz-id-map/1", "ids": "0,1,2"}', "needs format 'v41viz-id-map/1' and an 'ids' list"),
    ("{", "id_map.json: not a JSON id map"),
    ("[" * 100_000 + "]" * 100_000, "id_map.json: not a JSON id map (nested too deeply)"),
])
def test_malformed_id_map(ckpt, content, message):
    (ckpt / "id_map.json").write_text(content)
    refused(ckpt, message, engine=True)


@pytest.mark.parametrize("change, message", [
    (lambda m: m.update(ids=["a"] * len(m["ids"])), "'ids' must list integer tokenizer ids; item 0 is 'a'"),
    (lambda m: m["ids"].__setitem__(3, 2.5), "item 3 is '2.5'"),
    (lambda m: m["ids"].__setitem__(-1, 10 ** 30), f"'ids' holds {10 ** 30}, outside the tokenizer's ids"),
    (lambda m: m.update(min_count="many"), "'min_count' must be an integer or null"),
    (lambda m: m["ids"].reverse(), "IdMap ids must be strictly increasing"),
])
def test_id_map_with_wrong_types(ckpt, change, message):
    raw = json.loads((ckpt / "id_map.json").read_text())
    change(raw)
    (ckpt / "id_map.json").write_text(json.dumps(raw))
    refused(ckpt, f"{ckpt / 'id_map.json'}: ", message, engine=True)


def test_a_missing_id_map_is_named(ckpt):
    (ckpt / "id_map.json").unlink()
    message = refused(ckpt, f"{ckpt}: id_map.json is missing", engine=True)
    assert "vocab_size" in message and "token map covers" not in message


# ---- the CLI: exit 2 and the message ----------------------------------------------------------------------

@pytest.mark.parametrize("damage, fragment", [
    (lambda c: change_tensor(c / WEIGHTS, SINK, lambda t: t.fill_(float("nan"))), f"tensor '{SINK}' holds 4 NaN"),
    (lambda c: edit_index(shard_index(c), lambda wm: wm.update({"norm.weight": "../../../../etc/passwd"})),
     "points outside the checkpoint folder"),
    (lambda c: (c / "id_map.json").write_text("[0, 1, 2]"), "id_map.json: not a v41viz id map"),
])
def test_cli_exits_2_naming_the_problem(ckpt, capsys, damage, fragment):
    damage(ckpt)
    assert cli_main(["generate", "--checkpoint", str(ckpt), "--prompt", "hi", "--max-new-tokens", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: ") and fragment in err and "Traceback" not in err


# ---- memory bombs, in a child process under an address-space cap ------------------------------------------

@pytest.mark.slow  # a capped fresh process [5 s]
def test_huge_declared_header_is_refused_in_bounded_time_and_memory(ckpt):
    """An 8 GiB sparse weights file whose first 8 bytes claim an 8 GiB header: the CLI refuses it from those 8
    bytes (exit 2) without reading or allocating anything near that size."""
    with open(ckpt / WEIGHTS, "wb") as f:
        f.write(struct.pack("<Q", (8 << 30) - 8))
        f.truncate(8 << 30)
    outcome = run_engine("generate", "--checkpoint", str(ckpt), "--prompt", "hi", timeout_s=60, memory_cap_mib=3072)
    print(f"rc {outcome.returncode}, {outcome.wall_s:.1f} s, peak RSS {outcome.peak_rss_mib:.0f} MiB")
    assert outcome.returncode == 2, outcome.stderr
    assert outcome.stderr.startswith("error: ") and str(ckpt / WEIGHTS) in outcome.stderr
    assert "more than the 16 MiB this engine reads" in outcome.stderr
    assert outcome.wall_s < 30 and outcome.peak_rss_mib < 800
